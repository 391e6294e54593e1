//! Access times. The kernel never moves a FUSE file's atime itself (it marks FUSE inodes
//! S_NOATIME) and serves reads of cached pages without asking the daemon, so the daemon moves
//! the lower file's atime for the reads it is sent, and keeps the reads the kernel would answer
//! from its cache few: an open whose read may move the atime drops the cached pages (no
//! FOPEN_KEEP_CACHE), so that its first read reaches the daemon. Every lower descriptor the
//! daemon reads through is O_NOATIME (headers, hints, records, recompress, scrub); a user's read
//! moves the atime by a one-byte read of the lower file opened, by its file handle, under a
//! private clone of the lower's mount that carries the mount's mode (`relatime`, `strictatime`):
//! the lower kernel then applies the rule exactly as for a local read, and leaves mtime and
//! ctime alone (utimensat would move the ctime). Without CAP_SYS_ADMIN, and for files of other
//! file systems mounted inside the lower, the byte is read under the lower's own mount, whose
//! mode then applies.

use super::lower;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// When reads move a file's access time (the mount options of the same names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Atime {
    /// `noatime` (and `ro`): never.
    Never,
    /// `relatime`, the default: when the atime is not newer than the mtime or the ctime, or is
    /// a day old.
    #[default]
    Relative,
    /// `strictatime`: at every read.
    Strict,
}

pub struct AtimeKeeper {
    mode: Atime,
    /// The lower's mount, cloned with `mode` (None: reads go through the lower's own mount).
    view: Option<OwnedFd>,
    /// The lower root's device: files of other devices are not under `view`.
    dev: u64,
}

impl AtimeKeeper {
    pub fn new(mode: Atime, root: RawFd, dev: u64) -> AtimeKeeper {
        let attr = match mode {
            Atime::Never => return AtimeKeeper { mode, view: None, dev },
            Atime::Relative => lower::MOUNT_ATTR_RELATIME,
            Atime::Strict => lower::MOUNT_ATTR_STRICTATIME,
        };
        let view = lower::clone_mount_with_atime(root, attr)
            .inspect_err(|e| tracing::info!("access times follow the lower's own mount options (cannot clone its mount: {e})"))
            .ok();
        AtimeKeeper { mode, view, dev }
    }

    pub fn mode(&self) -> Atime {
        self.mode
    }

    /// A user read `file` (lower device `dev`): its atime moves as the mode says.
    pub fn read(&self, file: RawFd, dev: u64) {
        let opened = match &self.view {
            _ if self.mode == Atime::Never => return,
            Some(view) if dev == self.dev => lower::reopen_under(view.as_raw_fd(), file),
            _ => lower::reopen_read(file, false),
        };
        match opened {
            Ok(f) => {
                let _ = lower::pread_full(&f, &mut [0u8; 1], 0);
            }
            Err(e) => tracing::debug!("cannot move an access time: {e}"),
        }
    }

    /// Whether a read now may move the atime of a file with status `st` (so the open drops
    /// the kernel's cached pages): the kernel's rule for the mode (fs/inode.c,
    /// `relatime_need_update`).
    pub fn read_may_move(&self, st: &libc::stat, now: i64) -> bool {
        let at = (st.st_atime, st.st_atime_nsec);
        match self.mode {
            Atime::Never => false,
            Atime::Strict => true,
            Atime::Relative => {
                (st.st_mtime, st.st_mtime_nsec) >= at || (st.st_ctime, st.st_ctime_nsec) >= at || now - st.st_atime >= 24 * 60 * 60
            }
        }
    }
}

//! Shutting the file system down (FS_IOC_SHUTDOWN, as `xfs_io -x -c shutdown` or `godown` ask of
//! ext4 and XFS): test tools stop a file system as a crash would, administrators fence a dying
//! disk. Afterwards every request fails with EIO and nothing the daemon still holds reaches the
//! lower (the fence in `lower::fence`) until the file system is mounted again; the next mount
//! finds a run that did not end cleanly, as after a kill -9 (size hints not trusted, statistics
//! rebuilt by a walk).

use super::error::{FsError, FsResult};
use super::{lower, DenseFs};

/// What lands before the fence goes up: the ioctl's flags (`FSOP_GOING_FLAGS_*`, linux/fs.h's
/// `EXT4_GOING_FLAGS_*` and xfs_fs.h's `XFS_FSOP_GOING_FLAGS_*` are the same numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// 0: everything written before it, on stable storage (the lower synced).
    Sync,
    /// 1 (the journal's flush): everything the daemon was given lands first.
    Land,
    /// 2: nothing more lands, as in a crash at this instant; what an fsync made durable stays.
    Now,
}

impl Shutdown {
    pub fn from_flags(flags: u32) -> Option<Shutdown> {
        match flags {
            0 => Some(Shutdown::Sync),
            1 => Some(Shutdown::Land),
            2 => Some(Shutdown::Now),
            _ => None,
        }
    }
}

/// CAP_SYS_ADMIN (linux/capability.h): what ext4 and XFS ask of the caller.
const CAP_SYS_ADMIN: u32 = 21;

impl DenseFs {
    /// Shuts the file system down for caller thread `pid` (EPERM without CAP_SYS_ADMIN). A
    /// second shutdown changes nothing.
    pub fn shut_down(&self, how: Shutdown, pid: u32) -> FsResult<()> {
        let admin = lower::credentials(pid).is_ok_and(|c| c.has_capability(CAP_SYS_ADMIN));
        if !admin {
            return Err(FsError::new(libc::EPERM, "shutdown needs CAP_SYS_ADMIN"));
        }
        if lower::fence::raised() {
            return Ok(());
        }
        if how != Shutdown::Now {
            self.flush_all();
        }
        if how == Shutdown::Sync {
            let root = self.lower_root_dir()?;
            lower::syncfs(&root)?;
        }
        lower::fence::raise();
        self.stop_background();
        self.forget_kernel_caches();
        tracing::warn!(
            "shut down ({how:?}): every request fails with EIO and the lower is left as it is until the file system is mounted again"
        );
        Ok(())
    }

    /// Has the kernel drop what it keeps of every node, so that a cached `stat`, listing or
    /// page fails as every request does. On a thread of its own: dropping a file's pages waits
    /// for any write into them, which this request must not.
    fn forget_kernel_caches(&self) {
        let nodes: Vec<u64> = self.inodes.inodes().iter().map(|inode| inode.nodeid).collect();
        let Some(drop) = self.drop_kernel_cache.get().cloned() else { return };
        let spawned = std::thread::Builder::new().name("densefs-shutdown".into()).spawn(move || {
            for nodeid in nodes {
                drop(nodeid, super::KernelCache::Everything);
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("shutdown: the kernel keeps what it cached ({e})");
        }
    }

    /// EIO once the file system is shut down: asked by every request (through `inode`,
    /// `handle` and `statfs`).
    pub(super) fn check_running(&self) -> FsResult<()> {
        if lower::fence::raised() {
            Err(FsError::new(libc::EIO, "the file system is shut down"))
        } else {
            Ok(())
        }
    }
}

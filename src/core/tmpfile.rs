//! O_TMPFILE (FUSE_TMPFILE, Linux 6.1+): an unnamed file in a directory, which `linkat` can
//! give a name (systemd, package managers and editors create files atomically this way) and
//! which otherwise vanishes with its last descriptor. The lower file system's own O_TMPFILE
//! makes it: an unnamed lower inode, freed by the lower when its last descriptor closes or,
//! after a crash, by the lower's own recovery (ext4's orphan list); `link` names it as it
//! names any inode, through /proc/self/fd.

use super::lower;
use super::{Attr, Caller, DenseFs, FsResult};
use std::ffi::OsStr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl DenseFs {
    /// Creates and opens an unnamed regular file in directory `parent`, read-write. Its
    /// attributes say no link (the lower's): the kernel keeps that count, and refuses `linkat`
    /// of one opened with O_EXCL by it.
    pub fn tmpfile(&self, parent: u64, mode: u32, caller: Caller) -> FsResult<(Attr, u64)> {
        let dir = self.inode(parent)?;
        // Never O_EXCL: the lower file must stay linkable (the caller's O_EXCL the kernel keeps).
        let lower_flags = libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOATIME;
        let open = |flags: i32| lower::with_umask(caller.umask, || lower::openat(dir.raw_fd(), c".", flags, mode));
        let created = match open(lower_flags) {
            // A directory the daemon does not own (O_NOATIME needs the owner).
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(lower_flags & !libc::O_NOATIME),
            other => other,
        };
        let created = Arc::new(created?);
        self.give_to_caller(&dir, caller, |uid, gid| lower::fchown(&created, uid, gid))?;
        let before = self.written_back_count();
        let stat = lower::stat_fd(created.as_raw_fd())?;
        // No name to reopen it by: it is never evicted while open, and gone once closed.
        let nodeid = self.inodes.remember_created(parent, OsStr::new(""), &created, &stat).nodeid;
        let inode = match self.inode(nodeid) {
            Ok(inode) => inode,
            Err(e) => {
                self.forget(nodeid, 1);
                return Err(e);
            }
        };
        inode.no_capability.store(true, Ordering::Relaxed);
        // Until `linkat` names it, its last close lands nothing (`Content::nameless`).
        inode.lost_a_name.store(true, Ordering::Relaxed);
        self.inodes.deleted_but_held(&inode);
        drop(created);
        let fh = match self.open_inode(&inode, true, Some(stat)) {
            Ok(fh) => fh,
            Err(e) => {
                self.forget(nodeid, 1);
                return Err(e);
            }
        };
        Ok((self.attr_with(&inode, &stat, before)?, fh))
    }
}

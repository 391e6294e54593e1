//! Names: lookup, create and remove directory entries, links, renames (listings: `listing.rs`).

use super::inodes::Node;
use super::lower::{self, cstr};
use super::usage::{Usage, Within};
use super::{Attr, Caller, DenseFs, FsError, FsResult};
use crate::format::hints::SizeHint;
use std::ffi::{CStr, OsStr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Names densefs keeps in the lower tree (its property file) do not exist through the mount.
fn hidden(name: &OsStr, errno: i32) -> FsResult<()> {
    if super::props::is_reserved_name(name) {
        Err(FsError::new(errno, "name reserved by densefs"))
    } else {
        Ok(())
    }
}

impl DenseFs {
    /// Looks a name up and registers the kernel's reference to it.
    /// "." and ".." come from the kernel resolving file handles (NFS export): the node itself,
    /// possibly unknown to us since a forget or a restart, and a directory's parent.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<Attr> {
        hidden(name, libc::ENOENT)?;
        let inode = match name.as_bytes() {
            b"." => self.inodes.lookup_self(parent)?,
            b".." => self.inodes.lookup_parent(parent)?,
            _ => return self.lookup_child(parent, &self.inode(parent)?, name, None, None, self.written_back_count()),
        };
        match self.inode(inode.nodeid).and_then(|node| self.attr_of(&node)) {
            Ok(attr) => Ok(attr),
            Err(e) => {
                self.inodes.forget(inode.nodeid, 1);
                Err(e)
            }
        }
    }

    /// Looks `name` up in directory `dir` (node `parent`) and registers one kernel lookup.
    /// An inode the table holds open costs one fstatat (the kernel looks names up again each
    /// time its entry expires). `listed`: what readdir said of it, (inode number, is a regular
    /// file): an inode the table does not hold is then opened at once, and a regular file for
    /// reading, so that one descriptor serves as its handle and to read its header.
    /// `opened`: that regular file, already opened for reading (its header read started), and
    /// its stat. `before`: `written_back_count` read before that stat, or now if none was taken.
    pub(super) fn lookup_child(
        &self,
        parent: u64,
        dir: &Node,
        name: &OsStr,
        listed: Option<(u64, bool)>,
        opened: Option<(OwnedFd, libc::stat, Option<SizeHint>)>,
        before: u64,
    ) -> FsResult<Attr> {
        let dev = dir.lower_id().0;
        let surely_regular = match listed {
            Some((ino, regular)) if self.inodes.find(dev, ino).is_none() => regular,
            _ => {
                let st = lower::stat_at(dir.raw_fd(), name)?;
                if let Some(node) = self.inodes.remember_known(parent, name, st.st_dev, st.st_ino) {
                    return match self.attr_with(&node, &st, before) {
                        Ok(attr) => Ok(attr),
                        Err(e) => {
                            self.inodes.forget(node.nodeid, 1);
                            Err(e)
                        }
                    };
                }
                st.st_mode & libc::S_IFMT == libc::S_IFREG
            }
        };
        let (readable, listed_hint) = match opened {
            Some((fd, st, hint)) => (Some((fd, st)), hint),
            None if surely_regular => (
                lower::open_readable(dir.raw_fd(), name).ok().map(|fd| lower::stat_fd(fd.as_raw_fd()).map(|st| (fd, st))).transpose()?,
                None,
            ),
            None => (None, None),
        };
        let (fd, st, readable) = match readable {
            // Replaced by something else since the listing: a directory open for reading is
            // harmless, anything else (a FIFO, a device) is let go at once and opened as O_PATH.
            Some((fd, st)) if matches!(st.st_mode & libc::S_IFMT, libc::S_IFREG | libc::S_IFDIR) => (fd, st, true),
            _ => {
                let fd = lower::open_path(dir.raw_fd(), name)?;
                let st = lower::stat_fd(fd.as_raw_fd())?;
                (fd, st, false)
            }
        };
        let inode = self.inodes.remember(parent, name, fd, readable, &st);
        if let Some(hint) = listed_hint {
            self.keep_listed_size(&inode, &st, &hint);
        }
        match self.inode(inode.nodeid).and_then(|node| self.attr_with(&node, &st, before)) {
            Ok(attr) => Ok(attr),
            Err(e) => {
                self.inodes.forget(inode.nodeid, 1);
                Err(e)
            }
        }
    }

    /// The generation to report with a node's entry (the lower inode's; 0 if unknown).
    pub fn generation(&self, nodeid: u64) -> u64 {
        self.inodes.get(nodeid).map_or(0, |inode| inode.generation as u64)
    }

    /// Gives a just-created entry to the caller (the daemon runs as root) and looks it up.
    pub(super) fn adopt(&self, parent: u64, name: &OsStr, caller: Caller) -> FsResult<Attr> {
        let dir = self.inode(parent)?;
        let c = cstr(name)?;
        self.give_to_caller(&dir, caller, |uid, gid| lower::fchownat(dir.raw_fd(), &c, uid, gid, libc::AT_SYMLINK_NOFOLLOW))?;
        self.lookup(parent, name)
    }

    /// The lower file system made a new entry in `dir` as the daemon: `chown` gives it to the
    /// caller's user and group. A caller who is the daemon's own user and group needs no chown
    /// (one round trip less on a network lower), nor does a daemon that is not root (it cannot).
    pub(super) fn give_to_caller(&self, dir: &Node, caller: Caller, chown: impl FnOnce(u32, u32) -> std::io::Result<()>) -> FsResult<()> {
        if self.daemon_ids.0 == 0 && (caller.uid, caller.gid) != self.daemon_ids {
            let dir_st = lower::stat_fd(dir.raw_fd())?;
            // Under a setgid directory the lower file system already chose the group.
            let gid = if dir_st.st_mode & libc::S_ISGID != 0 { u32::MAX } else { caller.gid };
            chown(caller.uid, gid)?;
        }
        Ok(())
    }

    pub fn mkdir(&self, parent: u64, name: &OsStr, mode: u32, caller: Caller) -> FsResult<Attr> {
        hidden(name, libc::EPERM)?;
        let dir = self.inode(parent)?;
        let c = cstr(name)?;
        let _change = self.usage.begin();
        lower::with_umask(caller.umask, || lower::mkdirat(dir.raw_fd(), &c, mode))?;
        self.usage.apply(&self.within(parent), &Usage::directory(), &Usage::default());
        self.adopt(parent, name, caller)
    }

    pub fn mknod(&self, parent: u64, name: &OsStr, mode: u32, rdev: u32, caller: Caller) -> FsResult<Attr> {
        hidden(name, libc::EPERM)?;
        let dir = self.inode(parent)?;
        let c = cstr(name)?;
        let _change = self.usage.begin();
        lower::with_umask(caller.umask, || lower::mknodat(dir.raw_fd(), &c, mode, u64::from(rdev)))?;
        if mode & libc::S_IFMT == libc::S_IFREG {
            // A new empty plain file.
            let blocks = lower::stat_at(dir.raw_fd(), name).map_or(0, |st| st.st_blocks as u64);
            let stats = crate::inspect::FileStats { physical: blocks * 512, ..Default::default() };
            self.usage.apply(&self.within(parent), &Usage::of_file(&stats), &Usage::default());
        }
        self.adopt(parent, name, caller)
    }

    pub fn symlink(&self, parent: u64, name: &OsStr, target: &Path, caller: Caller) -> FsResult<Attr> {
        hidden(name, libc::EPERM)?;
        let dir = self.inode(parent)?;
        let c = cstr(name)?;
        let t = cstr(target.as_os_str())?;
        lower::symlinkat(&t, dir.raw_fd(), &c)?;
        self.adopt(parent, name, caller)
    }

    pub fn readlink(&self, nodeid: u64) -> FsResult<Vec<u8>> {
        let inode = self.inode(nodeid)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        let n = lower::readlinkat(inode.raw_fd(), c"", &mut buf)?;
        buf.truncate(n);
        Ok(buf)
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        hidden(name, libc::ENOENT)?;
        let dir = self.inode(parent)?;
        let c = cstr(name)?;
        let st = lower::entry_stat_at(dir.raw_fd(), &c);
        if let Some(st) = st.as_ref().filter(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG) {
            self.protected.check_entry(dir.raw_fd(), &c, st.st_ino)?;
        }
        let unlinked = st.as_ref().map(lower::id_and_links);
        let _change = self.usage.begin();
        let leaving = self.leaving_counters(dir.raw_fd(), &c, st, self.within(parent));
        lower::unlinkat(dir.raw_fd(), &c, 0)?;
        self.left_counters(leaving);
        if let Some((dev, ino, links)) = unlinked {
            self.let_go_if_unlinked(dev, ino, links <= 1);
        }
        Ok(())
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        let dir = self.inode(parent)?;
        let c = cstr(name)?;
        let _change = self.usage.begin();
        let removed = lower::id_at(dir.raw_fd(), &c);
        lower::unlinkat(dir.raw_fd(), &c, libc::AT_REMOVEDIR)?;
        self.usage.apply(&self.within(parent), &Usage::default(), &Usage::directory());
        if let Some(id) = removed {
            // Had it properties, it was a dataset: a directory made later may get its number.
            self.usage.forget_datasets(&Some(std::sync::Arc::from([id])));
        }
        Ok(())
    }

    /// rename(2) with renameat2's flags (RENAME_NOREPLACE, RENAME_EXCHANGE) passed to the lower.
    pub fn rename(&self, parent: u64, name: &OsStr, new_parent: u64, new_name: &OsStr, flags: u32) -> FsResult<()> {
        hidden(name, libc::ENOENT)?;
        hidden(new_name, libc::EPERM)?;
        let from = self.inode(parent)?;
        let to = self.inode(new_parent)?;
        let a = cstr(name)?;
        let b = cstr(new_name)?;
        let _change = self.usage.begin();
        let moving_st = lower::entry_stat_at(from.raw_fd(), &a);
        let moving = moving_st.as_ref().map(|st| (st.st_dev, st.st_ino));
        let displaced_st = lower::entry_stat_at(to.raw_fd(), &b);
        if let Some((_, ino)) = moving {
            self.protected.check_entry(from.raw_fd(), &a, ino)?;
        }
        if let Some(st) = displaced_st.as_ref().filter(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG) {
            self.protected.check_entry(to.raw_fd(), &b, st.st_ino)?;
        }
        let displaced = displaced_st.as_ref().map(lower::id_and_links);
        let replaced = displaced_st.filter(|st| flags & libc::RENAME_EXCHANGE == 0 && moving != Some((st.st_dev, st.st_ino)));
        let (from_within, to_within) = (self.within(parent), self.within(new_parent));
        let leaving = self.leaving_counters(to.raw_fd(), &b, replaced, to_within.clone());
        lower::renameat2(from.raw_fd(), &a, to.raw_fd(), &b, flags)?;
        // A walk counting meanwhile may have met what moved twice or not at all.
        self.usage.changed();
        self.left_counters(leaving);
        if from_within.as_deref() != to_within.as_deref() {
            match moving_st {
                // A file of one name: what it contributes moves between the datasets.
                Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_nlink <= 1 && flags & libc::RENAME_EXCHANGE == 0 => {
                    let measure = || {
                        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
                        lower::openat(to.raw_fd(), &b, flags, 0).map(Usage::measure_owned).unwrap_or_default()
                    };
                    self.usage.moved_file((st.st_dev, st.st_ino), &from_within, &to_within, measure);
                }
                // A directory's subtree, a hard-linked file, an exchange: not followed.
                Some(_) => self.usage.forget_datasets_between(&from_within, &to_within),
                None => {}
            }
        }
        // Keep the inode table's idea of where things live (it reopens evicted inodes by name).
        if let Some((dev, ino)) = moving {
            self.inodes.moved(dev, ino, new_parent, new_name);
        }
        if let Some((dev, ino, links)) = displaced {
            if flags & libc::RENAME_EXCHANGE != 0 {
                self.inodes.moved(dev, ino, parent, name);
            } else if moving != Some((dev, ino)) {
                self.let_go_if_unlinked(dev, ino, links <= 1);
            }
        }
        Ok(())
    }

    /// What the entry `name` in `dir` (`st`: its lower status) takes from the mount's
    /// counters when it goes: a directory, or a regular file's last name (held open by the
    /// returned descriptor, to be measured once it went).
    fn leaving_counters(&self, dir: RawFd, name: &CStr, st: Option<libc::stat>, within: Within) -> Option<Leaving> {
        let st = st?;
        let (dev, ino, links) = lower::id_and_links(&st);
        if !self.usage.known() {
            // A walk counting meanwhile must not be taken (`Accounting::adopt_walk`).
            self.usage.changed();
            return None;
        }
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => Some(Leaving::Directory(within)),
            libc::S_IFREG if links <= 1 => {
                // Opened even where a container tracks it: that one may go before the unlink ends.
                let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NOATIME | libc::O_NONBLOCK | libc::O_CLOEXEC;
                let file = lower::openat(dir, name, flags, 0).or_else(|_| lower::openat(dir, name, flags & !libc::O_NOATIME, 0)).ok();
                // Measured on another thread: a small file's blocks are few to wait for.
                let pin = self.usage.pin((dev, ino));
                Some(Leaving::File((dev, ino), file, st.st_size <= MEASURE_LATER_BELOW, within, pin))
            }
            // One name of a hard-linked file: the datasets that held no other lose it.
            libc::S_IFREG => Some(Leaving::Name(within)),
            _ => None,
        }
    }

    fn left_counters(&self, leaving: Option<Leaving>) {
        match leaving {
            Some(Leaving::Directory(within)) => self.usage.apply(&within, &Usage::default(), &Usage::directory()),
            Some(Leaving::File(key, file, later, within, pin)) => {
                self.usage.remove_leaving(key, file, later, within);
                drop(pin);
            }
            Some(Leaving::Name(within)) => self.usage.forget_datasets(&within),
            None => {}
        }
    }

    pub fn link(&self, nodeid: u64, new_parent: u64, new_name: &OsStr) -> FsResult<Attr> {
        hidden(new_name, libc::EPERM)?;
        let inode = self.inode(nodeid)?;
        self.check_protection(&inode, super::fileattr::Change::Name)?;
        let dir = self.inode(new_parent)?;
        let c = cstr(new_name)?;
        let src = lower::proc_path(inode.raw_fd());
        let _change = self.usage.begin();
        let links_before = lower::stat_fd(inode.raw_fd())?.st_nlink;
        lower::linkat(libc::AT_FDCWD, &src, dir.raw_fd(), &c, libc::AT_SYMLINK_FOLLOW)?;
        self.usage.changed();
        let (from, to) = (self.within_parent_of(nodeid), self.within(new_parent));
        if links_before == 0 {
            // An O_TMPFILE file's first name: it counts from its container's next measure on,
            // in the datasets of that name.
            self.usage.moved_file(inode.lower_id(), &from, &to, Usage::default);
        } else if links_before == 1 {
            // The datasets of the new name that did not hold the old one walk again.
            self.usage.forget_datasets_gained(&from, &to);
        } else {
            // Which datasets hold its other names is not known.
            self.usage.forget_datasets(&to);
        }
        self.lookup(new_parent, new_name)
    }

    pub fn fsyncdir(&self, nodeid: u64) -> FsResult<()> {
        let inode = self.inode(nodeid)?;
        let dir = lower::reopen_dir(inode.raw_fd())?;
        lower::fsync(&dir)?;
        Ok(())
    }

    /// Where a node lives on the lower file system (for tools and logs).
    pub fn lower_path(&self, nodeid: u64) -> FsResult<PathBuf> {
        let inode = self.inode(nodeid)?;
        Ok(std::fs::read_link(format!("/proc/self/fd/{}", inode.raw_fd()))?)
    }
}

/// An entry leaving the tree, for the mount's counters (`DenseFs::leaving_counters`).
enum Leaving {
    Directory(Within),
    /// A regular file's last name: its lower id, its lower file, whether it is small enough
    /// to be measured after the unlink answered, and its pin where a container tracks it
    /// (`Accounting::pin`).
    File((u64, u64), Option<std::fs::File>, bool, Within, Option<crate::core::usage::UsageHold>),
    /// One of several names of a regular file.
    Name(Within),
}

/// Files up to this lower length are measured after their unlink answered.
const MEASURE_LATER_BELOW: i64 = 1 << 20;

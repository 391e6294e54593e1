//! Names: lookup, create and remove directory entries, links, renames, directory listings.

use super::inodes::Node;
use super::lower::{self, cstr};
use super::{Attr, Caller, DenseFs, DirEntry, FsError, FsResult, Handle, Kind};
use crate::format::layout::HEADER_BLOCK;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Names densefs keeps in the lower tree (its property file) do not exist through the mount.
fn hidden(name: &OsStr, errno: i32) -> FsResult<()> {
    if super::props::is_reserved_name(name) {
        Err(FsError::new(errno, "name reserved by densefs"))
    } else {
        Ok(())
    }
}

/// How many directory entries ahead of the one READDIRPLUS is at have their headers read.
const HEADERS_AHEAD: usize = 32;

/// READDIRPLUS's read-ahead of headers: the entries up to `until` were started; `opened` holds
/// the descriptors (by entry index) not yet taken by their lookup.
#[derive(Default)]
pub struct HeadersAhead {
    until: usize,
    opened: HashMap<usize, OwnedFd>,
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
    fn lookup_child(
        &self,
        parent: u64,
        dir: &Node,
        name: &OsStr,
        listed: Option<(u64, bool)>,
        opened: Option<(OwnedFd, libc::stat)>,
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
        let readable = match opened {
            Some(opened) => Some(opened),
            None if surely_regular => {
                lower::open_readable(dir.raw_fd(), name).ok().map(|fd| lower::stat_fd(fd.as_raw_fd()).map(|st| (fd, st))).transpose()?
            }
            None => None,
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
        lower::with_umask(caller.umask, || lower::mkdirat(dir.raw_fd(), &c, mode))?;
        self.adopt(parent, name, caller)
    }

    pub fn mknod(&self, parent: u64, name: &OsStr, mode: u32, rdev: u32, caller: Caller) -> FsResult<Attr> {
        hidden(name, libc::EPERM)?;
        let dir = self.inode(parent)?;
        let c = cstr(name)?;
        lower::with_umask(caller.umask, || lower::mknodat(dir.raw_fd(), &c, mode, u64::from(rdev)))?;
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
        let unlinked = lower::id_at(dir.raw_fd(), &c);
        lower::unlinkat(dir.raw_fd(), &c, 0)?;
        if let Some((dev, ino)) = unlinked {
            self.let_go_if_unlinked(dev, ino);
        }
        Ok(())
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        let dir = self.inode(parent)?;
        let c = cstr(name)?;
        lower::unlinkat(dir.raw_fd(), &c, libc::AT_REMOVEDIR)?;
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
        let moving = lower::id_at(from.raw_fd(), &a);
        let displaced = lower::id_at(to.raw_fd(), &b);
        lower::renameat2(from.raw_fd(), &a, to.raw_fd(), &b, flags)?;
        // Keep the inode table's idea of where things live (it reopens evicted inodes by name).
        if let Some((dev, ino)) = moving {
            self.inodes.moved(dev, ino, new_parent, new_name);
        }
        if let Some((dev, ino)) = displaced {
            if flags & libc::RENAME_EXCHANGE != 0 {
                self.inodes.moved(dev, ino, parent, name);
            } else {
                self.let_go_if_unlinked(dev, ino);
            }
        }
        Ok(())
    }

    pub fn link(&self, nodeid: u64, new_parent: u64, new_name: &OsStr) -> FsResult<Attr> {
        hidden(new_name, libc::EPERM)?;
        let inode = self.inode(nodeid)?;
        let dir = self.inode(new_parent)?;
        let c = cstr(new_name)?;
        let src = lower::proc_path(inode.raw_fd());
        lower::linkat(libc::AT_FDCWD, &src, dir.raw_fd(), &c, libc::AT_SYMLINK_FOLLOW)?;
        self.lookup(new_parent, new_name)
    }

    /// Snapshots the directory's entries; offsets into the snapshot stay valid for the handle.
    pub fn opendir(&self, nodeid: u64) -> FsResult<u64> {
        let inode = self.inode(nodeid)?;
        let dir = lower::reopen(inode.raw_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?;
        let mut stream = lower::DirStream::new(dir.into())?;
        let mut entries = Vec::new();
        while let Some(ent) = stream.next_entry() {
            let name = OsStr::from_bytes(ent.name).to_os_string();
            if super::props::is_reserved_name(&name) {
                continue;
            }
            let surely_regular = ent.kind == libc::DT_REG;
            let kind = match ent.kind {
                libc::DT_DIR => Kind::Dir,
                libc::DT_LNK => Kind::Symlink,
                libc::DT_FIFO => Kind::Fifo,
                libc::DT_SOCK => Kind::Socket,
                libc::DT_CHR => Kind::CharDevice,
                libc::DT_BLK => Kind::BlockDevice,
                _ => Kind::File,
            };
            let ino = if name == "." || name == ".." { nodeid } else { ent.ino };
            entries.push(DirEntry { ino, kind, name, surely_regular });
        }
        drop(stream); // closedir
        Ok(self.new_handle(Handle::Dir { nodeid, entries: Arc::new(entries), headers_ahead: Default::default() }))
    }

    /// Entries from `offset` on, each with the offset of the next one, handed to `emit` until it
    /// answers that the reply is full. (Not a list of every remaining entry: the kernel asks a
    /// page at a time, and copying the rest of a directory of 600,000 names for each page took
    /// `ls -f` 14 s instead of 2.)
    pub fn readdir(&self, fh: u64, offset: u64, mut emit: impl FnMut(u64, &DirEntry) -> bool) -> FsResult<()> {
        let handle = self.handle(fh)?;
        let Handle::Dir { entries, .. } = &*handle else { return Err(FsError::errno(libc::ENOTDIR)) };
        for (i, entry) in entries.iter().enumerate().skip(offset as usize) {
            if emit(i as u64 + 1, entry) {
                break;
            }
        }
        Ok(())
    }

    /// READDIRPLUS: entries from `offset` on with their attributes, handed to `emit` (with the
    /// offset of the next entry) until it answers that the reply is full. The kernel takes a
    /// reference (a lookup it will forget) on every entry it receives except "." and "..", so
    /// each other entry is looked up here, and the one `emit` could not take is forgotten
    /// again. An entry gone since opendir is left out.
    pub fn readdirplus(&self, fh: u64, offset: u64, mut emit: impl FnMut(u64, &DirEntry, &Attr) -> bool) -> FsResult<()> {
        let handle = self.handle(fh)?;
        let Handle::Dir { nodeid, entries, headers_ahead } = &*handle else { return Err(FsError::errno(libc::ENOTDIR)) };
        let dir = self.inode(*nodeid)?;
        let mut dir_attr = None;
        let mut emitted = false;
        let mut headers_ahead = headers_ahead.lock();
        for (i, entry) in entries.iter().enumerate().skip(offset as usize) {
            let next = i as u64 + 1;
            self.read_headers_ahead(&dir, entries, &mut headers_ahead, i);
            if entry.name == "." || entry.name == ".." {
                // Not linked by the kernel: no lookup. Both carry the directory's own number
                // (as in readdir), so its attributes.
                let attr = match dir_attr {
                    Some(attr) => attr,
                    None => *dir_attr.insert(self.attr_of(&dir)?),
                };
                if emit(next, entry, &attr) {
                    break;
                }
                emitted = true;
                continue;
            }
            // Opened ahead: the name may lead elsewhere by now (renamed, replaced or removed).
            let before = self.written_back_count();
            let opened = headers_ahead.opened.remove(&i).and_then(|fd| {
                let st = lower::stat_fd(fd.as_raw_fd()).ok()?;
                let c = cstr(&entry.name).ok()?;
                (lower::id_at(dir.raw_fd(), &c) == Some((st.st_dev, st.st_ino))).then_some((fd, st))
            });
            let attr = match self.lookup_child(*nodeid, &dir, &entry.name, Some((entry.ino, entry.surely_regular)), opened, before) {
                Ok(attr) => attr,
                Err(e) if matches!(e.errno, libc::ENOENT | libc::ESTALE) => continue,
                // The kernel asks again from the entry that failed.
                Err(e) if emitted => {
                    tracing::debug!("readdirplus stops before {:?}: {e}", entry.name);
                    break;
                }
                Err(e) => return Err(e),
            };
            if emit(next, entry, &attr) {
                self.inodes.forget(attr.ino, 1);
                break;
            }
            emitted = true;
        }
        Ok(())
    }

    /// Opens the regular files among the next `HEADERS_AHEAD` entries from `at` that no inode
    /// holds yet, and starts reading their header blocks without waiting: a cold `ls -l` waits
    /// for one header read per file, and these are in flight together instead of one by one.
    fn read_headers_ahead(&self, dir: &Node, entries: &[DirEntry], ahead: &mut HeadersAhead, at: usize) {
        let dev = dir.lower_id().0;
        let from = ahead.until.max(at);
        let until = (at + HEADERS_AHEAD).min(entries.len());
        for (i, entry) in entries.iter().enumerate().take(until).skip(from) {
            if !entry.surely_regular || self.inodes.find(dev, entry.ino).is_some() {
                continue;
            }
            if let Ok(fd) = lower::open_readable(dir.raw_fd(), &entry.name) {
                let _ = lower::will_need(&fd, 0, HEADER_BLOCK);
                ahead.opened.insert(i, fd);
            }
        }
        ahead.until = ahead.until.max(until);
        // Entries the kernel skipped (it asks from an offset) close their descriptors.
        ahead.opened.retain(|&i, _| i >= at);
    }

    pub fn release_handle(&self, fh: u64) {
        self.handles.lock().remove(&fh);
    }

    pub fn fsyncdir(&self, nodeid: u64) -> FsResult<()> {
        let inode = self.inode(nodeid)?;
        let dir = lower::reopen(inode.raw_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?;
        lower::fsync(&dir)?;
        Ok(())
    }

    /// Where a node lives on the lower file system (for tools and logs).
    pub fn lower_path(&self, nodeid: u64) -> FsResult<PathBuf> {
        let inode = self.inode(nodeid)?;
        Ok(std::fs::read_link(format!("/proc/self/fd/{}", inode.raw_fd()))?)
    }
}

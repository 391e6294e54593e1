//! Inodes found without a name: by number alone (LOOKUP(node, "."), which the kernel sends to
//! resolve a file handle whose inode it no longer holds: NFS export) and as a directory's "..".

use super::{errno, lower, Inode, InodeTable, REMAPPED_BASE, ROOT};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

impl InodeTable {
    /// Opens a lower inode by number (and generation, 0 = any), if the lower file system allows.
    pub(super) fn open_by_number(&self, dev: u64, ino: u64, generation: u32) -> Option<OwnedFd> {
        let root = self.handle_root.as_ref()?;
        if dev != self.root_dev || ino > u32::MAX as u64 {
            return None;
        }
        lower::open_by_number(root.as_raw_fd(), ino as u32, generation).ok()
    }

    /// Registers a lower inode found without a name (by number, or as a directory's ".."),
    /// with `lookups` kernel lookups. A directory's place is found by walking "..".
    fn register(&self, fd: OwnedFd, st: &libc::stat, lookups: u64) -> io::Result<Arc<Inode>> {
        let link = if st.st_mode & libc::S_IFMT == libc::S_IFDIR { Some(self.link_of_dir(&fd, st)?) } else { None };
        Ok(self.insert(link, Arc::new(File::from(fd)), false, st, lookups))
    }

    /// A directory's parent node and name: its ".." (registered, without a kernel lookup, if
    /// unknown) and the entry there with its number. ESTALE if the walk leaves the lower tree.
    fn link_of_dir(&self, fd: &OwnedFd, st: &libc::stat) -> io::Result<(u64, OsString)> {
        let parent_fd = lower::open_path(fd.as_raw_fd(), OsStr::new(".."))?;
        let pst = lower::stat_fd(parent_fd.as_raw_fd())?;
        let name = lower::name_of_ino(parent_fd.as_raw_fd(), st.st_ino).map_err(|_| errno(libc::ESTALE))?;
        if let Some(id) = self.known(pst.st_dev, pst.st_ino) {
            return Ok((id, name));
        }
        if (pst.st_dev, pst.st_ino) == (st.st_dev, st.st_ino) || pst.st_dev != self.root_dev {
            return Err(errno(libc::ESTALE)); // reached the file system's root: not below ours
        }
        Ok((self.register(parent_fd, &pst, 0)?.nodeid, name))
    }

    /// One kernel lookup of a node by number alone (LOOKUP(node, "."), sent to resolve a file
    /// handle whose inode the kernel does not hold). ESTALE if it cannot be found (deleted, or
    /// a lower file system that cannot reopen inodes by number).
    pub fn lookup_self(&self, nodeid: u64) -> io::Result<Arc<Inode>> {
        if let Some(inode) = self.add_lookup(nodeid) {
            return Ok(inode);
        }
        // The lower inode a high id was given to in this mount, or the one the id is the number of.
        let ino = if nodeid >= REMAPPED_BASE {
            let t = self.inner.lock();
            let given = t.remapped.iter().find(|(_, id)| **id == nodeid).map(|(lower, _)| *lower);
            match given {
                Some((dev, ino)) if dev == self.root_dev => ino,
                _ => return Err(errno(libc::ESTALE)),
            }
        } else {
            nodeid
        };
        let fd = self.open_by_number(self.root_dev, ino, 0).ok_or_else(|| errno(libc::ESTALE))?;
        let st = lower::stat_fd(fd.as_raw_fd())?;
        if (st.st_dev, st.st_ino) != (self.root_dev, ino) {
            return Err(errno(libc::ESTALE));
        }
        let inode = self.register(fd, &st, 1)?;
        if inode.nodeid != nodeid {
            self.forget(inode.nodeid, 1);
            return Err(errno(libc::ESTALE));
        }
        Ok(inode)
    }

    /// One kernel lookup of a directory's parent (LOOKUP(node, "..")); the root's is the root.
    pub fn lookup_parent(&self, nodeid: u64) -> io::Result<Arc<Inode>> {
        if nodeid == ROOT {
            return self.add_lookup(ROOT).ok_or_else(|| errno(libc::ESTALE));
        }
        let node = self.node(nodeid)?;
        if node.kind != libc::S_IFDIR {
            return Err(errno(libc::ENOTDIR));
        }
        let parent_fd = lower::open_path(node.raw_fd(), OsStr::new(".."))?;
        let pst = lower::stat_fd(parent_fd.as_raw_fd())?;
        if let Some(inode) = self.known(pst.st_dev, pst.st_ino).and_then(|id| self.add_lookup(id)) {
            return Ok(inode);
        }
        if (pst.st_dev, pst.st_ino) == (node.dev, node.ino) || pst.st_dev != self.root_dev {
            return Err(errno(libc::ESTALE));
        }
        self.register(parent_fd, &pst, 1)
    }

    /// The node for a regular file the daemon finds on its own (the background pass, after a
    /// remount): by `path` below the lower root, else by number; with no kernel lookup (the
    /// caller lets go of it with `forget(id, 0)`). None where neither reaches that very inode
    /// (deleted, or its number reused: the generation tells where the lower keeps one).
    pub fn find_file(&self, path: &OsStr, dev: u64, ino: u64, generation: u32) -> Option<Arc<Inode>> {
        if let Some(inode) = self.find(dev, ino).filter(|i| generation == 0 || i.generation == 0 || i.generation == generation) {
            return Some(inode);
        }
        let root = self.get(ROOT)?.cached_fd()?;
        let same = |fd: &OwnedFd| {
            lower::stat_fd(fd.as_raw_fd())
                .is_ok_and(|st| (st.st_dev, st.st_ino) == (dev, ino) && st.st_mode & libc::S_IFMT == libc::S_IFREG)
                && (generation == 0 || lower::generation(fd.as_raw_fd()) == generation)
        };
        let fd = match lower::open_path(root.as_raw_fd(), path) {
            Ok(fd) if !path.is_empty() && same(&fd) => fd,
            _ => self.open_by_number(dev, ino, generation).filter(same)?,
        };
        let st = lower::stat_fd(fd.as_raw_fd()).ok()?;
        self.register(fd, &st, 0).ok()
    }
}

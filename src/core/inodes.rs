//! The inode table: FUSE node ids ↔ lower inodes, each held by an O_PATH descriptor so renames
//! and hard links on the lower tree never confuse it.
//!
//! Node ids (which FUSE also reports as st_ino) are the lower inode numbers, so `ls -i` agrees
//! with the lower tree and stays the same across remounts. Exceptions get ids from a high range
//! that is stable for the life of the mount: the root (always 1), a lower inode numbered 1, and
//! inodes on another file system mounted below the lower directory.

use super::container::Container;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

pub const ROOT: u64 = 1;
const REMAPPED_BASE: u64 = 1 << 62;

/// Data access to a regular file, shared by all its open handles.
#[derive(Clone)]
pub enum Content {
    /// A lower file that is not a container: served byte for byte.
    Plain(Arc<File>),
    Container(Arc<Container>),
}

pub struct Inode {
    pub nodeid: u64,
    pub fd: OwnedFd,
    /// File type bits (S_IFMT) of the lower inode.
    pub kind: u32,
    /// Open handles and their shared content. Guarded by its own lock, held while opening.
    pub open: Mutex<OpenState>,
}

#[derive(Default)]
pub struct OpenState {
    pub handles: usize,
    pub content: Option<Content>,
}

impl Inode {
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The content of an open file, if some handle has it open.
    pub fn open_content(&self) -> Option<Content> {
        self.open.lock().content.clone()
    }
}

struct Entry {
    inode: Arc<Inode>,
    lookups: u64,
}

/// Lock rule: one mutex guards all three maps.
pub struct InodeTable {
    inner: Mutex<Tables>,
    root_dev: u64,
}

struct Tables {
    by_id: HashMap<u64, Entry>,
    remapped: HashMap<(u64, u64), u64>,
    next_remapped: u64,
}

impl InodeTable {
    pub fn new(root_fd: OwnedFd, root_dev: u64, root_ino: u64) -> InodeTable {
        let root = Arc::new(Inode { nodeid: ROOT, fd: root_fd, kind: libc::S_IFDIR, open: Mutex::new(OpenState::default()) });
        let mut by_id = HashMap::new();
        by_id.insert(ROOT, Entry { inode: root, lookups: 1 });
        let mut remapped = HashMap::new();
        remapped.insert((root_dev, root_ino), ROOT);
        InodeTable { inner: Mutex::new(Tables { by_id, remapped, next_remapped: REMAPPED_BASE }), root_dev }
    }

    pub fn get(&self, nodeid: u64) -> Option<Arc<Inode>> {
        self.inner.lock().by_id.get(&nodeid).map(|e| e.inode.clone())
    }

    fn nodeid_for(&self, t: &mut Tables, dev: u64, ino: u64) -> u64 {
        if let Some(&id) = t.remapped.get(&(dev, ino)) {
            return id;
        }
        if dev == self.root_dev && ino != ROOT && ino < REMAPPED_BASE {
            return ino;
        }
        let id = t.next_remapped;
        t.next_remapped += 1;
        t.remapped.insert((dev, ino), id);
        id
    }

    /// Registers one kernel lookup of the inode behind `fd`; returns the (possibly existing) inode.
    pub fn remember(&self, fd: OwnedFd, st: &libc::stat) -> Arc<Inode> {
        let mut t = self.inner.lock();
        let id = self.nodeid_for(&mut t, st.st_dev, st.st_ino);
        if let Some(e) = t.by_id.get_mut(&id) {
            e.lookups += 1;
            return e.inode.clone();
        }
        let inode = Arc::new(Inode { nodeid: id, fd, kind: st.st_mode & libc::S_IFMT, open: Mutex::new(OpenState::default()) });
        t.by_id.insert(id, Entry { inode: inode.clone(), lookups: 1 });
        inode
    }

    pub fn forget(&self, nodeid: u64, n: u64) {
        let mut t = self.inner.lock();
        if nodeid == ROOT {
            return;
        }
        if let Some(e) = t.by_id.get_mut(&nodeid) {
            e.lookups = e.lookups.saturating_sub(n);
            if e.lookups == 0 {
                t.by_id.remove(&nodeid);
            }
        }
    }

    /// Every inode with content open (for a final flush).
    pub fn open_contents(&self) -> Vec<Content> {
        self.inner.lock().by_id.values().filter_map(|e| e.inode.open_content()).collect()
    }
}

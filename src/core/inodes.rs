//! The inode table: FUSE node ids ↔ lower inodes.
//!
//! Each inode remembers where it lives (parent node and name) and caches an O_PATH descriptor
//! to it. Descriptors are bounded: past a budget the least recently used ones are closed (never
//! the root's, never those of files with open handles) and reopened from parent and name when
//! needed again, checking that the same lower inode is found (else ESTALE). So a mount over a
//! tree of millions of files needs no more descriptors than the budget.
//!
//! Node ids (which FUSE also reports as st_ino) are the lower inode numbers, so `ls -i` agrees
//! with the lower tree and stays the same across remounts. Exceptions get ids from a high range
//! that is stable for the life of the mount: the root (always 1), a lower inode numbered 1, and
//! inodes on another file system mounted below the lower directory.

use super::container::Container;
use super::lower;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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

struct Place {
    parent: u64,
    name: OsString,
    fd: Option<Arc<OwnedFd>>,
}

pub struct Inode {
    pub nodeid: u64,
    /// File type bits (S_IFMT) of the lower inode.
    pub kind: u32,
    dev: u64,
    ino: u64,
    place: Mutex<Place>,
    last_used: AtomicU64,
    /// Open handles and their shared content. Guarded by its own lock, held while opening.
    pub open: Mutex<OpenState>,
}

/// `content` is set while handles are open, and also after the last close when writing it back
/// failed (a full disk, an I/O error): the data stays in memory, readable, and background
/// writeback retries until it lands.
#[derive(Default)]
pub struct OpenState {
    pub handles: usize,
    pub content: Option<Content>,
}

impl Inode {
    /// The lower inode's (device, inode number).
    pub fn lower_id(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    /// The content of an open file, if some handle has it open.
    pub fn open_content(&self) -> Option<Content> {
        self.open.lock().content.clone()
    }
}

/// An inode with its descriptor pinned for the duration of one operation.
pub struct Node {
    pub inode: Arc<Inode>,
    fd: Arc<OwnedFd>,
}

impl Node {
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl std::ops::Deref for Node {
    type Target = Inode;
    fn deref(&self) -> &Inode {
        &self.inode
    }
}

struct Entry {
    inode: Arc<Inode>,
    lookups: u64,
}

/// Lock order: an inode's `open`, then this table's `inner`, then an inode's `place`. Code
/// holding `inner` only try-locks `open` (eviction) or does not touch it.
pub struct InodeTable {
    /// One mutex guards the maps; an inode's `place` has its own lock, taken after this one.
    inner: Mutex<Tables>,
    root_dev: u64,
    clock: AtomicU64,
    open_fds: AtomicUsize,
    fd_budget: usize,
}

struct Tables {
    by_id: HashMap<u64, Entry>,
    remapped: HashMap<(u64, u64), u64>,
    next_remapped: u64,
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

impl InodeTable {
    pub fn new(root_fd: OwnedFd, root_dev: u64, root_ino: u64, fd_budget: usize) -> InodeTable {
        let root = Arc::new(Inode {
            nodeid: ROOT,
            kind: libc::S_IFDIR,
            dev: root_dev,
            ino: root_ino,
            place: Mutex::new(Place { parent: ROOT, name: OsString::new(), fd: Some(Arc::new(root_fd)) }),
            last_used: AtomicU64::new(u64::MAX),
            open: Mutex::new(OpenState::default()),
        });
        let mut by_id = HashMap::new();
        by_id.insert(ROOT, Entry { inode: root, lookups: 1 });
        let mut remapped = HashMap::new();
        remapped.insert((root_dev, root_ino), ROOT);
        InodeTable {
            inner: Mutex::new(Tables { by_id, remapped, next_remapped: REMAPPED_BASE }),
            root_dev,
            clock: AtomicU64::new(0),
            open_fds: AtomicUsize::new(1),
            fd_budget: fd_budget.max(64),
        }
    }

    pub fn get(&self, nodeid: u64) -> Option<Arc<Inode>> {
        self.inner.lock().by_id.get(&nodeid).map(|e| e.inode.clone())
    }

    /// The inode with a usable descriptor, reopened from its parent if it was evicted.
    pub fn node(&self, nodeid: u64) -> io::Result<Node> {
        let inode = self.get(nodeid).ok_or_else(|| errno(libc::ESTALE))?;
        let fd = self.fd(&inode)?;
        Ok(Node { inode, fd })
    }

    fn fd(&self, inode: &Inode) -> io::Result<Arc<OwnedFd>> {
        if inode.nodeid != ROOT {
            inode.last_used.store(self.clock.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        }
        let (parent, name) = {
            let place = inode.place.lock();
            if let Some(fd) = &place.fd {
                return Ok(fd.clone());
            }
            (place.parent, place.name.clone())
        };
        let parent = self.get(parent).ok_or_else(|| errno(libc::ESTALE))?;
        let parent_fd = self.fd(&parent)?;
        let fd = lower::open_path(parent_fd.as_raw_fd(), &name)?;
        let st = lower::stat_fd(fd.as_raw_fd())?;
        if (st.st_dev, st.st_ino) != (inode.dev, inode.ino) {
            return Err(errno(libc::ESTALE)); // renamed or replaced behind our back
        }
        let fd = Arc::new(fd);
        {
            let mut place = inode.place.lock();
            if let Some(existing) = &place.fd {
                return Ok(existing.clone());
            }
            place.fd = Some(fd.clone());
        }
        self.opened_fd();
        Ok(fd)
    }

    fn opened_fd(&self) {
        if self.open_fds.fetch_add(1, Ordering::Relaxed) + 1 > self.fd_budget {
            self.evict();
        }
    }

    /// Closes the least recently used quarter of the cached descriptors.
    fn evict(&self) {
        let t = self.inner.lock();
        let mut candidates: Vec<(u64, &Arc<Inode>)> = t
            .by_id
            .values()
            .filter(|e| e.inode.nodeid != ROOT)
            .map(|e| (e.inode.last_used.load(Ordering::Relaxed), &e.inode))
            .collect();
        candidates.sort_by_key(|(used, _)| *used);
        let mut to_close = self.fd_budget / 4;
        for (_, inode) in candidates {
            if to_close == 0 {
                break;
            }
            let Some(open) = inode.open.try_lock() else { continue };
            if open.handles > 0 {
                continue;
            }
            let Some(mut place) = inode.place.try_lock() else { continue };
            if place.fd.take().is_some() {
                self.open_fds.fetch_sub(1, Ordering::Relaxed);
                to_close -= 1;
            }
        }
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

    /// Registers one kernel lookup of `name` in `parent`, found as `fd`.
    pub fn remember(&self, parent: u64, name: &OsStr, fd: OwnedFd, st: &libc::stat) -> Arc<Inode> {
        let mut t = self.inner.lock();
        let id = self.nodeid_for(&mut t, st.st_dev, st.st_ino);
        if let Some(e) = t.by_id.get_mut(&id) {
            e.lookups += 1;
            let inode = e.inode.clone();
            drop(t);
            let cached_now = {
                let mut place = inode.place.lock();
                place.parent = parent;
                place.name = name.to_os_string();
                let empty = place.fd.is_none();
                if empty {
                    place.fd = Some(Arc::new(fd));
                }
                empty
            };
            if cached_now {
                self.opened_fd();
            }
            return inode;
        }
        let inode = Arc::new(Inode {
            nodeid: id,
            kind: st.st_mode & libc::S_IFMT,
            dev: st.st_dev,
            ino: st.st_ino,
            place: Mutex::new(Place { parent, name: name.to_os_string(), fd: Some(Arc::new(fd)) }),
            last_used: AtomicU64::new(self.clock.fetch_add(1, Ordering::Relaxed)),
            open: Mutex::new(OpenState::default()),
        });
        t.by_id.insert(id, Entry { inode: inode.clone(), lookups: 1 });
        drop(t);
        self.opened_fd();
        inode
    }

    /// Records that the entry `name` in `parent` now lives at `new_parent`/`new_name`.
    pub fn moved(&self, dev: u64, ino: u64, new_parent: u64, new_name: &OsStr) {
        let inode = {
            let mut t = self.inner.lock();
            let id = self.nodeid_for(&mut t, dev, ino);
            t.by_id.get(&id).map(|e| e.inode.clone())
        };
        if let Some(inode) = inode {
            let mut place = inode.place.lock();
            place.parent = new_parent;
            place.name = new_name.to_os_string();
        }
    }

    /// The directory an inode was last seen in (the root is its own parent).
    pub fn parent_of(&self, nodeid: u64) -> Option<u64> {
        self.get(nodeid).map(|inode| inode.place.lock().parent)
    }

    /// The name an inode was last seen under.
    pub fn name_of(&self, nodeid: u64) -> Option<OsString> {
        self.get(nodeid).map(|inode| inode.place.lock().name.clone())
    }

    pub fn forget(&self, nodeid: u64, n: u64) {
        if nodeid == ROOT {
            return;
        }
        let mut t = self.inner.lock();
        if let Some(e) = t.by_id.get_mut(&nodeid) {
            e.lookups = e.lookups.saturating_sub(n);
            // An inode whose content is still in memory stays, so that a new lookup finds that
            // content rather than the stale lower file. (try_lock: the lock order is open →
            // table, and a busy inode is in use anyway.)
            let pinned = e.inode.open.try_lock().is_none_or(|open| open.content.is_some());
            if e.lookups == 0 && !pinned {
                let e = t.by_id.remove(&nodeid).expect("BUG: entry present");
                if e.inode.place.lock().fd.take().is_some() {
                    self.open_fds.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// The inode the kernel knows for a lower (device, inode number), if any.
    pub fn find(&self, dev: u64, ino: u64) -> Option<Arc<Inode>> {
        let t = self.inner.lock();
        let id = match t.remapped.get(&(dev, ino)) {
            Some(&id) => id,
            None if dev == self.root_dev && ino != ROOT && ino < REMAPPED_BASE => ino,
            None => return None,
        };
        t.by_id.get(&id).map(|e| e.inode.clone())
    }

    /// Inodes whose content is in memory with no handle open: data a failed close left behind.
    pub fn unwritten(&self) -> Vec<Arc<Inode>> {
        let inodes: Vec<Arc<Inode>> = self.inner.lock().by_id.values().map(|e| e.inode.clone()).collect();
        inodes
            .into_iter()
            .filter(|inode| {
                let open = inode.open.lock();
                open.handles == 0 && open.content.is_some()
            })
            .collect()
    }

    /// Every inode with content open (for a final flush).
    pub fn open_contents(&self) -> Vec<Content> {
        // Collect first: an inode's `open` lock is taken before this table's lock elsewhere
        // (opening resolves properties up the parent chain), never after it.
        let inodes: Vec<Arc<Inode>> = self.inner.lock().by_id.values().map(|e| e.inode.clone()).collect();
        inodes.iter().filter_map(|inode| inode.open_content()).collect()
    }
}

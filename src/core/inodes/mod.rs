//! The inode table: FUSE node ids ↔ lower inodes.
//!
//! Each inode remembers where it lives (parent node and name) and caches an O_PATH descriptor
//! to it (or a read-only one, for a regular file first met in a listing: see `readable`). While
//! a regular file is open, its content's lower file is that descriptor (`share`): one per open
//! file. Descriptors are bounded: past a budget the least recently used ones are closed (never
//! the root's, never those of files with open handles) and reopened from parent and name when
//! needed again, checking that the same lower inode is found (else ESTALE). So a mount over a
//! tree of millions of files needs no more descriptors than the budget.
//!
//! File handles (NFS export, `by_number.rs`): the kernel may ask for a node it no longer has, by number alone
//! (LOOKUP(node, ".")), after it forgot it or after a restart of the daemon. On an ext2/3/4
//! lower such an inode is reopened by a constructed lower handle (FILEID_INO32_GEN, generation
//! 0 = "any"); the kernel then compares the generation we report with its handle's. A directory
//! found that way gets its place by walking ".." up to a known inode (and scanning each parent
//! for the child's number); a non-directory has no known place: it is reopened by handle again
//! after eviction, and properties resolve as at the root. Known inodes whose place is stale
//! (renamed behind our back) are reopened the same way.
//!
//! Identity (docs/ARCHITECTURE.md, "Node ids"): a node id names one lower inode — device,
//! number and generation — from the reply that hands it out until the kernel's FORGETs bring
//! its lookups to zero; it never comes to name another file meanwhile, whatever the lower does
//! with the number. Node ids (which FUSE also reports as st_ino) are the lower inode numbers, so
//! `ls -i` agrees with the lower tree and stays the same across remounts, except where that id
//! is taken: the root (always 1), a lower inode numbered 1, inodes on another file system
//! mounted below the lower directory, and a lower inode whose number the kernel still holds for
//! the file that had it before (a file densefs replaced, `retire`, or one a generation shows is
//! gone) get ids from a high range that are stable for the life of the mount.

use super::admission::DeletedHeld;
use super::lower;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

mod by_number;
mod inode;
#[cfg(test)]
mod tests;

use inode::Place;
pub use inode::{ClosedSize, Content, Inode, Node, OpenState};

pub const ROOT: u64 = 1;
const REMAPPED_BASE: u64 = 1 << 62;

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
    /// A plain descriptor of the lower root for open_by_handle_at, when the lower file system
    /// reopens inodes by number (ext2/3/4).
    handle_root: Option<OwnedFd>,
    clock: AtomicU64,
    open_fds: AtomicUsize,
    /// `Tables::forgets_deferred` may hold inodes.
    forgets_deferred: AtomicBool,
    fd_budget: usize,
    /// Evict when `open_fds` passes this: the budget, or above it after an eviction that found
    /// too few descriptors to close (files held open), so that each further open does not scan
    /// the whole table again.
    evict_above: AtomicUsize,
    /// Deleted files whose descriptor is still held (until their FORGET): admission waits for
    /// their space before it refuses a write.
    pub deleted: DeletedHeld,
}

struct Tables {
    by_id: HashMap<u64, Entry>,
    remapped: HashMap<(u64, u64), u64>,
    next_remapped: u64,
    /// Inodes the kernel forgot while their `open` lock was busy (`forget`), to let go of again
    /// once it is free.
    forgets_deferred: Vec<u64>,
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

impl InodeTable {
    pub fn new(root_fd: OwnedFd, root_dev: u64, root_ino: u64, fd_budget: usize) -> InodeTable {
        let handle_root = lower::reopen(root_fd.as_raw_fd(), libc::O_RDONLY | libc::O_DIRECTORY)
            .ok()
            .filter(|f| lower::geteuid() == 0 && lower::reopens_by_number(f.as_raw_fd()))
            .map(OwnedFd::from);
        // The kernel made the root inode with generation 0.
        let place = Place { link: Some((ROOT, OsString::new())), fd: Some(Arc::new(File::from(root_fd))), readable: false };
        let root = Arc::new(Inode::new(ROOT, libc::S_IFDIR, (root_dev, root_ino), 0, place, u64::MAX));
        let mut by_id = HashMap::new();
        by_id.insert(ROOT, Entry { inode: root, lookups: 1 });
        let mut remapped = HashMap::new();
        remapped.insert((root_dev, root_ino), ROOT);
        InodeTable {
            inner: Mutex::new(Tables { by_id, remapped, next_remapped: REMAPPED_BASE, forgets_deferred: Vec::new() }),
            root_dev,
            handle_root,
            clock: AtomicU64::new(0),
            open_fds: AtomicUsize::new(1),
            forgets_deferred: AtomicBool::new(false),
            fd_budget: fd_budget.max(64),
            evict_above: AtomicUsize::new(fd_budget.max(64)),
            deleted: DeletedHeld::default(),
        }
    }

    /// `inode` has no name left: its blocks come back when its descriptor is closed.
    pub fn deleted_but_held(&self, inode: &Inode) {
        if inode.place.lock().fd.is_some() && !inode.deleted_held.swap(true, Ordering::Relaxed) {
            self.deleted.held();
        }
    }

    /// `inode`'s descriptor was closed (the table's lock released first).
    fn closed_fd_of(&self, inode: &Inode) {
        if inode.deleted_held.swap(false, Ordering::Relaxed) {
            self.deleted.closed();
        }
    }

    pub fn get(&self, nodeid: u64) -> Option<Arc<Inode>> {
        self.inner.lock().by_id.get(&nodeid).map(|e| e.inode.clone())
    }

    /// The inode with a usable descriptor, reopened from its parent if it was evicted.
    pub fn node(&self, nodeid: u64) -> io::Result<Node> {
        let inode = self.get(nodeid).ok_or_else(|| errno(libc::ESTALE))?;
        let (fd, readable) = self.fd(&inode)?;
        Ok(Node { inode, fd, readable })
    }

    /// The inode's descriptor, and whether it is open for reading (else O_PATH).
    fn fd(&self, inode: &Inode) -> io::Result<(Arc<File>, bool)> {
        if inode.nodeid != ROOT {
            inode.last_used.store(self.clock.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        }
        let link = {
            let place = inode.place.lock();
            if let Some(fd) = &place.fd {
                return Ok((fd.clone(), place.readable));
            }
            if inode.is_retired() {
                return Err(errno(libc::ESTALE));
            }
            place.link.clone()
        };
        let by_name = match &link {
            Some((parent, name)) => match self.get(*parent) {
                Some(parent) => self.fd(&parent).and_then(|(dir, _)| lower::open_path(dir.as_raw_fd(), name)),
                None => Err(errno(libc::ESTALE)),
            },
            None => Err(errno(libc::ESTALE)),
        };
        // The same number may be another file by now; where the lower has generations they tell.
        let same = |fd: &OwnedFd| {
            lower::stat_fd(fd.as_raw_fd()).is_ok_and(|st| (st.st_dev, st.st_ino) == (inode.dev, inode.ino))
                && (inode.generation == 0 || lower::generation(fd.as_raw_fd()) == inode.generation)
        };
        let fd = match by_name {
            Ok(fd) if same(&fd) => fd,
            // Renamed or replaced behind our back, or found by number: reopen it by number.
            _ => match self.open_by_number(inode.dev, inode.ino, inode.generation) {
                Some(fd) if same(&fd) => fd,
                _ => return Err(errno(libc::ESTALE)),
            },
        };
        let fd = Arc::new(File::from(fd));
        {
            let mut place = inode.place.lock();
            if let Some(existing) = &place.fd {
                return Ok((existing.clone(), place.readable));
            }
            place.fd = Some(fd.clone());
            place.readable = false;
        }
        self.opened_fd();
        Ok((fd, false))
    }

    fn opened_fd(&self) {
        if self.open_fds.fetch_add(1, Ordering::Relaxed) + 1 > self.evict_above.load(Ordering::Relaxed) {
            self.evict();
            // Back under the budget: evict again when past it. Still over (descriptors of open
            // files cannot be closed): when a quarter of the budget more is open, so that each
            // further open does not scan the table again.
            let now = self.open_fds.load(Ordering::Relaxed);
            let above = if now < self.fd_budget { self.fd_budget } else { now + self.fd_budget / 4 };
            self.evict_above.store(above, Ordering::Relaxed);
        }
    }

    /// Closes the least recently used cached descriptors, down to three quarters of the budget
    /// where that many are not held by open files. (Closing a fixed quarter let the count creep
    /// up by one with every eviction, the open that crossed the threshold, until the process ran
    /// out of descriptors.)
    fn evict(&self) {
        // Closed once the table is unlocked (see `forget`).
        let mut closing = Vec::new();
        let t = self.inner.lock();
        // Only the inodes holding a descriptor (at most about the budget) are sorted: the kernel
        // may know millions of inodes, and sorting them all at every eviction took a sixth of
        // the daemon's time in `ls -l` of a directory of 600,000 files.
        let holds_fd = |inode: &Inode| inode.place.try_lock().is_some_and(|place| place.fd.is_some());
        let mut candidates: Vec<(u64, &Arc<Inode>)> = t
            .by_id
            .values()
            .filter(|e| e.inode.nodeid != ROOT && holds_fd(&e.inode))
            .map(|e| (e.inode.last_used.load(Ordering::Relaxed), &e.inode))
            .collect();
        candidates.sort_unstable_by_key(|(used, _)| *used);
        let mut to_close = self.open_fds.load(Ordering::Relaxed).saturating_sub(self.fd_budget - self.fd_budget / 4);
        for (_, inode) in candidates {
            if to_close == 0 {
                break;
            }
            let Some(open) = inode.open.try_lock() else { continue };
            if open.handles > 0 {
                continue;
            }
            let Some(mut place) = inode.place.try_lock() else { continue };
            if let Some(fd) = place.fd.take() {
                closing.push((fd, inode.clone()));
                self.open_fds.fetch_sub(1, Ordering::Relaxed);
                to_close -= 1;
            }
        }
        drop(t);
        for (fd, inode) in closing {
            drop(fd);
            self.closed_fd_of(&inode);
        }
    }

    /// The id lower inode (dev, ino) has unless it is taken: its number, or the high id it got
    /// earlier in this mount.
    fn usual_id(&self, t: &Tables, dev: u64, ino: u64) -> Option<u64> {
        t.remapped.get(&(dev, ino)).copied().or((dev == self.root_dev && ino != ROOT && ino < REMAPPED_BASE).then_some(ino))
    }

    /// The node standing for lower inode (dev, ino) now, if the table holds one that is not
    /// retired. (Whether the number still names the same file is the caller's to check where it
    /// has no descriptor of the node's open: `insert`.)
    fn live_id(&self, t: &Tables, dev: u64, ino: u64) -> Option<u64> {
        let id = self.usual_id(t, dev, ino)?;
        t.by_id.get(&id).is_some_and(|e| e.inode.names(dev, ino, 0)).then_some(id)
    }

    /// An id for a lower inode no live node stands for: its usual one unless the kernel may
    /// still hold that id for another file (a retired node not forgotten yet), else a new one
    /// from the high range, which this inode then keeps for the life of the mount.
    fn new_id(&self, t: &mut Tables, dev: u64, ino: u64) -> u64 {
        if let Some(id) = self.usual_id(t, dev, ino).filter(|id| !t.by_id.contains_key(id)) {
            return id;
        }
        let id = t.next_remapped;
        t.next_remapped += 1;
        t.remapped.insert((dev, ino), id);
        id
    }

    /// Registers one kernel lookup of `name` in `parent`, found as `fd` (`readable`: opened for
    /// reading, else O_PATH).
    pub fn remember(&self, parent: u64, name: &OsStr, fd: OwnedFd, readable: bool, st: &libc::stat) -> Arc<Inode> {
        self.insert(Some((parent, name.to_os_string())), Arc::new(File::from(fd)), readable, st, 1)
    }

    /// Registers one kernel lookup of `name` in `parent`, a file the daemon just created and
    /// holds open read-write: `file` becomes the inode's descriptor (and its content's), unless
    /// the table already held one for that inode.
    pub fn remember_created(&self, parent: u64, name: &OsStr, file: &Arc<File>, st: &libc::stat) -> Arc<Inode> {
        self.insert(Some((parent, name.to_os_string())), file.clone(), true, st, 1)
    }

    /// While a regular file is open, the lower file its content reads and writes through is
    /// also the inode's descriptor: the O_PATH or read-only one it replaces is closed, so an
    /// open file costs one descriptor (a server keeping thousands of files open, as
    /// nfs-ganesha does, would otherwise run the daemon out of them).
    pub fn share(&self, inode: &Inode, file: &Arc<File>) {
        let mut place = inode.place.lock();
        if place.fd.as_ref().is_some_and(|fd| Arc::ptr_eq(fd, file)) {
            return;
        }
        let was_closed = place.fd.replace(file.clone()).is_none();
        place.readable = true;
        drop(place);
        if was_closed {
            self.opened_fd();
        }
    }

    /// Adds one kernel lookup to the inode at lower (dev, ino), found as `name` in `parent`, if
    /// the table holds it with its descriptor open: a lookup that needs no open.
    pub fn remember_known(&self, parent: u64, name: &OsStr, dev: u64, ino: u64) -> Option<Node> {
        let inode = {
            let mut t = self.inner.lock();
            let id = self.live_id(&t, dev, ino)?;
            let entry = t.by_id.get_mut(&id)?;
            let mut place = entry.inode.place.lock();
            let fd = place.fd.clone()?;
            let readable = place.readable;
            place.link = Some((parent, name.to_os_string()));
            drop(place);
            entry.lookups += 1;
            Node { inode: entry.inode.clone(), fd, readable }
        };
        inode.last_used.store(self.clock.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        Some(inode)
    }

    /// The node id a listing shows for lower inode (dev, ino): the one its lookup gives it.
    pub fn listed_id(&self, dev: u64, ino: u64) -> u64 {
        let mut t = self.inner.lock();
        match self.live_id(&t, dev, ino) {
            Some(id) => id,
            None => self.new_id(&mut t, dev, ino),
        }
    }

    /// Adds `lookups` kernel lookups to the inode `fd` (registering it if new); `link`, where
    /// known, replaces its place.
    fn insert(&self, link: Option<(u64, OsString)>, fd: Arc<File>, readable: bool, st: &libc::stat, lookups: u64) -> Arc<Inode> {
        let (dev, ino) = (st.st_dev, st.st_ino);
        // A live node holding a descriptor stands for this very inode: both descriptors are open,
        // so the number cannot belong to two files. (The root always holds one.)
        {
            let t = self.inner.lock();
            if let Some(id) = self.live_id(&t, dev, ino) {
                if t.by_id[&id].inode.place.lock().fd.is_some() {
                    return self.adopt(t, id, link, fd, readable, lookups);
                }
            }
        }
        let generation = lower::generation(fd.as_raw_fd());
        let mut t = self.inner.lock();
        if let Some(id) = self.live_id(&t, dev, ino) {
            let inode = t.by_id[&id].inode.clone();
            if inode.place.lock().fd.is_some() || inode.names(dev, ino, generation) {
                return self.adopt(t, id, link, fd, readable, lookups);
            }
            // The file the node stood for is gone and the lower gave its number to this one.
            inode.retired.store(true, Ordering::SeqCst);
            tracing::debug!(node = id, ino, "lower inode number reused: the old node is retired");
        }
        let id = self.new_id(&mut t, dev, ino);
        let place = Place { link, fd: Some(fd), readable };
        let inode =
            Arc::new(Inode::new(id, st.st_mode & libc::S_IFMT, (dev, ino), generation, place, self.clock.fetch_add(1, Ordering::Relaxed)));
        t.by_id.insert(id, Entry { inode: inode.clone(), lookups });
        drop(t);
        self.opened_fd();
        inode
    }

    /// Adds `lookups` to live node `id`, which stands for the inode `fd` (table locked as `t`).
    fn adopt(
        &self,
        mut t: parking_lot::MutexGuard<'_, Tables>,
        id: u64,
        link: Option<(u64, OsString)>,
        fd: Arc<File>,
        readable: bool,
        lookups: u64,
    ) -> Arc<Inode> {
        let e = t.by_id.get_mut(&id).expect("BUG: adopting a node the table does not hold");
        e.lookups += lookups;
        let inode = e.inode.clone();
        drop(t);
        let cached_now = {
            let mut place = inode.place.lock();
            if link.is_some() {
                place.link = link;
            }
            let empty = place.fd.is_none();
            if empty {
                place.fd = Some(fd);
                place.readable = readable;
            }
            empty
        };
        if cached_now {
            self.opened_fd();
        }
        inode
    }

    /// The node id of a lower inode the table holds, without assigning one.
    fn known(&self, dev: u64, ino: u64) -> Option<u64> {
        self.live_id(&self.inner.lock(), dev, ino)
    }

    /// Adds one kernel lookup to a known node.
    fn add_lookup(&self, nodeid: u64) -> Option<Arc<Inode>> {
        let mut t = self.inner.lock();
        let e = t.by_id.get_mut(&nodeid)?;
        e.lookups += 1;
        Some(e.inode.clone())
    }

    /// Records that the entry `name` in `parent` now lives at `new_parent`/`new_name`.
    pub fn moved(&self, dev: u64, ino: u64, new_parent: u64, new_name: &OsStr) {
        if let Some(inode) = self.find(dev, ino) {
            inode.place.lock().link = Some((new_parent, new_name.to_os_string()));
        }
    }

    /// The directory an inode was last seen in (the root is its own parent); None if unknown
    /// (a non-directory found through a file handle).
    pub fn parent_of(&self, nodeid: u64) -> Option<u64> {
        self.get(nodeid).and_then(|inode| inode.place.lock().link.as_ref().map(|(parent, _)| *parent))
    }

    /// The name an inode was last seen under.
    pub fn name_of(&self, nodeid: u64) -> Option<OsString> {
        self.get(nodeid).and_then(|inode| inode.place.lock().link.as_ref().map(|(_, name)| name.clone()))
    }

    /// Its lower inode is gone or about to be (recompress renamed a new file over its name; its
    /// last name was removed): the node answers ESTALE from now on (the kernel, which retries a
    /// path with a fresh LOOKUP on ESTALE, finds the new file instead of writing into the old
    /// one) and no lookup finds it again, so the lower inode's number, free to name another
    /// file, never leads to this node.
    pub fn retire(&self, inode: &Inode) {
        inode.retired.store(true, Ordering::SeqCst);
        let fd = inode.place.lock().fd.take();
        if fd.is_some() {
            self.open_fds.fetch_sub(1, Ordering::Relaxed);
        }
        drop(fd);
        self.closed_fd_of(inode);
    }

    pub fn forget(&self, nodeid: u64, n: u64) {
        if nodeid == ROOT {
            return;
        }
        let mut t = self.inner.lock();
        let Some(e) = t.by_id.get_mut(&nodeid) else { return };
        e.lookups = e.lookups.saturating_sub(n);
        if e.lookups != 0 {
            return;
        }
        // An inode whose content is still in memory stays, so that a new lookup finds that
        // content rather than the stale lower file. (try_lock: the lock order is open →
        // table. A busy inode is let go of once its lock is free, `retry_deferred_forgets`:
        // kept until some later FORGET, an unlinked file's descriptor kept its blocks from the
        // lower, and a full disk stayed full after the rm.)
        let Some(open) = e.inode.open.try_lock() else {
            if !t.forgets_deferred.contains(&nodeid) {
                t.forgets_deferred.push(nodeid);
                self.forgets_deferred.store(true, Ordering::Relaxed);
            }
            return;
        };
        let pinned = open.content.is_some();
        drop(open);
        if !pinned {
            let e = t.by_id.remove(&nodeid).expect("BUG: entry present");
            // Closed with the table unlocked: the last close of an unlinked file frees its
            // blocks on the lower (a journal transaction), and `rm -rf` sends the FORGET of
            // each file beside its next request, which needs the table.
            drop(t);
            let fd = e.inode.place.lock().fd.take();
            if fd.is_some() {
                self.open_fds.fetch_sub(1, Ordering::Relaxed);
            }
            drop(fd);
            self.closed_fd_of(&e.inode);
        }
    }

    /// Lets go of the inodes `forget` found busy, where they are free now (a closing handle
    /// and the writeback tick call this).
    pub fn retry_deferred_forgets(&self) {
        if !self.forgets_deferred.swap(false, Ordering::Relaxed) {
            return;
        }
        let deferred = std::mem::take(&mut self.inner.lock().forgets_deferred);
        for nodeid in deferred {
            self.forget(nodeid, 0);
        }
    }

    /// How many inodes the table holds (the root included), and how many descriptors it keeps
    /// open: what `densefs iostat` shows, and how tests see that the kernel's lookups and
    /// forgets balance.
    pub fn census(&self) -> (usize, usize) {
        (self.inner.lock().by_id.len(), self.open_fds.load(Ordering::Relaxed))
    }

    /// The inode the kernel knows for a lower (device, inode number), if any.
    pub fn find(&self, dev: u64, ino: u64) -> Option<Arc<Inode>> {
        let t = self.inner.lock();
        self.live_id(&t, dev, ino).map(|id| t.by_id[&id].inode.clone())
    }

    /// Inodes whose content is in memory with no handle open: data a failed close left behind.
    pub fn unwritten(&self) -> Vec<Arc<Inode>> {
        self.inodes()
            .into_iter()
            .filter(|inode| {
                let open = inode.open.lock();
                open.handles == 0 && open.content.is_some() && !open.background
            })
            .collect()
    }

    /// Every inode with content open (for a final flush).
    pub fn open_contents(&self) -> Vec<Content> {
        self.inodes().iter().filter_map(|inode| inode.open_content()).collect()
    }

    /// Every inode the table holds.
    pub fn inodes(&self) -> Vec<Arc<Inode>> {
        // Collect first: an inode's `open` lock is taken before this table's lock elsewhere
        // (opening resolves properties up the parent chain), never after it.
        self.inner.lock().by_id.values().map(|e| e.inode.clone()).collect()
    }
}

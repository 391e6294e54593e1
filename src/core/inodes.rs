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
//! File handles (NFS export): the kernel may ask for a node it no longer has, by number alone
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
use super::container::Container;
use super::lower;
use super::props::LocalProps;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// The directory and name it was last seen under; None for a non-directory found by its
    /// number (a file handle) whose directory is unknown.
    link: Option<(u64, OsString)>,
    /// O_PATH, or open for reading or writing: while a regular file is open, the descriptor
    /// its content reads and writes through (one descriptor per open file, not two).
    fd: Option<Arc<File>>,
    /// `fd` is open for reading (a regular file found through readdir, or open content), not
    /// O_PATH: the container header can be read through it directly.
    readable: bool,
}

/// What a closed regular file's header said, and the lower status it was read under.
#[derive(Clone, Copy)]
pub struct ClosedSize {
    /// The lower file's (size, mtime, ctime) when the header was read: every change the daemon
    /// makes to a lower file (records, header, futimens) moves its ctime, so an equal stamp
    /// means the same header (kept only for a ctime over a second old, so that a coarse clock
    /// cannot give a change the same ctime).
    pub stamp: (i64, i64, i64, i64, i64),
    /// The logical size and record size; None for a file that is not a container.
    pub size: Option<(u64, u32)>,
}

impl ClosedSize {
    pub fn stamp_of(st: &libc::stat) -> (i64, i64, i64, i64, i64) {
        (st.st_size, st.st_mtime, st.st_mtime_nsec, st.st_ctime, st.st_ctime_nsec)
    }
}

pub struct Inode {
    pub nodeid: u64,
    /// File type bits (S_IFMT) of the lower inode.
    pub kind: u32,
    dev: u64,
    ino: u64,
    /// The lower inode's generation (ext4's i_generation; 0 where unknown, and for the root),
    /// reported to the kernel with each entry so that file handles detect reused numbers.
    pub generation: u32,
    place: Mutex<Place>,
    last_used: AtomicU64,
    /// Open handles and their shared content. Guarded by its own lock, held while opening.
    pub open: Mutex<OpenState>,
    /// A directory's own properties, once read: every change to them goes through
    /// `DenseFs::set_property`, so creating a file reads no xattrs of its ancestors.
    pub local_props: Mutex<Option<LocalProps>>,
    /// The logical size of a closed regular file, so a second lookup or getattr does not read
    /// the header again (checked against the lower file's status before use).
    pub closed_size: Mutex<Option<ClosedSize>>,
    /// The lower inode is known to have no `security.capability`, which the kernel asks for
    /// before a file's first write and chmod/chown: a file this daemon created, or one the
    /// lower answered ENODATA for. Any setxattr through densefs forgets it.
    pub no_capability: AtomicBool,
    /// A name of it was removed through densefs (unlink, a rename over it): only then can the
    /// lower file have no name left, which the last close checks (a stat it saves otherwise).
    pub lost_a_name: AtomicBool,
    /// The kernel may hold this file's attributes from a reply, and the daemon's own writes
    /// (landing after close, the writeback tick, recompress) would make them stale: set where
    /// attributes are handed out (`DenseFs::attr_with`), cleared when the kernel is told to drop
    /// them and by a WRITE (after which the kernel drops them itself).
    pub kernel_has_attrs: AtomicBool,
    /// The lower's block count in the last attributes handed out (`DenseFs::attr_with`).
    pub blocks_told: AtomicU64,
    /// Its lower inode is gone (densefs replaced it: recompress), or its number now belongs to
    /// another file: the node answers ESTALE until the kernel forgets it, and no lookup finds
    /// it again (the lower inode's number may name another file by now).
    retired: AtomicBool,
    /// Counted in `InodeTable::deleted`: no name left, its descriptor still held.
    deleted_held: AtomicBool,
}

/// `content` is set while handles are open, and also after the last close when writing it back
/// failed (a full disk, an I/O error): the data stays in memory, readable, and background
/// writeback retries until it lands.
#[derive(Default)]
pub struct OpenState {
    pub handles: usize,
    pub content: Option<Content>,
    /// When a content last wrote the file back and let go of it (`DenseFs::written_back`'s
    /// count then): a lower stat taken before may show what it replaced.
    pub written_back_at: u64,
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

    /// The descriptor the table keeps for it, if it keeps one now (none is opened for this).
    pub fn cached_fd(&self) -> Option<Arc<File>> {
        self.place.lock().fd.clone()
    }

    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::SeqCst)
    }

    /// Whether this node stands for the lower inode (dev, ino) with `generation` (0: unknown).
    fn names(&self, dev: u64, ino: u64, generation: u32) -> bool {
        (self.dev, self.ino) == (dev, ino)
            && !self.is_retired()
            && (generation == 0 || self.generation == 0 || generation == self.generation)
    }
}

/// An inode with its descriptor pinned for the duration of one operation.
pub struct Node {
    pub inode: Arc<Inode>,
    fd: Arc<File>,
    readable: bool,
}

impl Node {
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The descriptor itself, to share (see `InodeTable::share`).
    pub fn file(&self) -> &Arc<File> {
        &self.fd
    }

    /// The cached descriptor when it is open for reading (not O_PATH).
    pub fn readable_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.readable.then(|| self.fd.as_fd())
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
        let root = Arc::new(Inode {
            nodeid: ROOT,
            kind: libc::S_IFDIR,
            dev: root_dev,
            ino: root_ino,
            generation: 0, // the kernel made the root inode with generation 0
            place: Mutex::new(Place { link: Some((ROOT, OsString::new())), fd: Some(Arc::new(File::from(root_fd))), readable: false }),
            last_used: AtomicU64::new(u64::MAX),
            open: Mutex::new(OpenState::default()),
            local_props: Mutex::new(None),
            closed_size: Mutex::new(None),
            no_capability: AtomicBool::new(false),
            lost_a_name: AtomicBool::new(false),
            kernel_has_attrs: AtomicBool::new(false),
            blocks_told: AtomicU64::new(0),
            retired: AtomicBool::new(false),
            deleted_held: AtomicBool::new(false),
        });
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
        let inode = Arc::new(Inode {
            nodeid: id,
            kind: st.st_mode & libc::S_IFMT,
            dev,
            ino,
            generation,
            place: Mutex::new(Place { link, fd: Some(fd), readable }),
            last_used: AtomicU64::new(self.clock.fetch_add(1, Ordering::Relaxed)),
            open: Mutex::new(OpenState::default()),
            local_props: Mutex::new(None),
            closed_size: Mutex::new(None),
            no_capability: AtomicBool::new(false),
            lost_a_name: AtomicBool::new(false),
            kernel_has_attrs: AtomicBool::new(false),
            blocks_told: AtomicU64::new(0),
            retired: AtomicBool::new(false),
            deleted_held: AtomicBool::new(false),
        });
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

    /// Opens a lower inode by number (and generation, 0 = any), if the lower file system allows.
    fn open_by_number(&self, dev: u64, ino: u64, generation: u32) -> Option<OwnedFd> {
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
                open.handles == 0 && open.content.is_some()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A table over a temporary directory of `files` files, with room for `budget` descriptors.
    fn table_over(files: usize, budget: usize) -> (tempfile::TempDir, InodeTable) {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..files {
            std::fs::write(dir.path().join(format!("f{i}")), b"x").unwrap();
        }
        let root = lower::open_root(dir.path()).unwrap();
        let st = lower::stat_fd(root.as_raw_fd()).unwrap();
        (dir, InodeTable::new(root, st.st_dev, st.st_ino, budget))
    }

    /// Looks up `f{i}` as the kernel's LOOKUP does: an O_PATH descriptor for the table.
    fn look_up(table: &InodeTable, i: usize) -> Arc<Inode> {
        let root = table.node(ROOT).unwrap();
        let name = OsString::from(format!("f{i}"));
        let fd = lower::open_path(root.raw_fd(), &name).unwrap();
        let st = lower::stat_fd(fd.as_raw_fd()).unwrap();
        table.remember(ROOT, &name, fd, false, &st)
    }

    #[test]
    fn cached_descriptors_stay_within_the_budget_however_many_files_are_looked_up() {
        // 64 a quarter at a time: before the fix the threshold crept up by one per eviction,
        // past 200 descriptors after these 4,000 lookups (a daemon with `ulimit -n 256` ran out).
        let (_dir, table) = table_over(4000, 64);
        let first = look_up(&table, 0);
        for i in 1..4000 {
            look_up(&table, i);
            let (_, open) = table.census();
            assert!(open <= 64, "after {} lookups the table keeps {open} descriptors, over its budget of 64", i + 1);
        }
        // The first file's descriptor went long ago; using it opens it again.
        assert!(first.place.lock().fd.is_none());
        let node = table.node(first.nodeid).unwrap();
        assert_eq!(lower::stat_fd(node.raw_fd()).unwrap().st_ino, first.ino);
    }

    #[test]
    fn open_files_over_the_budget_do_not_make_every_lookup_scan_and_the_budget_returns_when_they_close() {
        let (_dir, table) = table_over(1000, 64);
        // 100 files held open (their descriptors cannot be closed): more than the budget.
        let held: Vec<Arc<Inode>> = (0..100)
            .map(|i| {
                let inode = look_up(&table, i);
                inode.open.lock().handles = 1;
                inode
            })
            .collect();
        for i in 100..600 {
            look_up(&table, i);
            let (_, open) = table.census();
            // Held, the root's, and a quarter of the budget between scans.
            assert!(open <= 100 + 1 + 16, "{open} descriptors with 100 held open and a budget of 64");
        }
        assert!(table.evict_above.load(Ordering::Relaxed) > 100, "evicts again only past what is held open");
        for inode in &held {
            inode.open.lock().handles = 0;
        }
        for i in 600..1000 {
            look_up(&table, i);
        }
        let (_, open) = table.census();
        assert!(open <= 64, "{open} descriptors once the files closed");
        assert_eq!(table.evict_above.load(Ordering::Relaxed), 64);
    }

    /// What the kernel would get for lower file `f{i}` if the lower had given it number `ino`
    /// (a number freed by another file and reused).
    fn look_up_as(table: &InodeTable, i: usize, ino: u64) -> Arc<Inode> {
        let root = table.node(ROOT).unwrap();
        let name = OsString::from(format!("f{i}"));
        let fd = lower::open_path(root.raw_fd(), &name).unwrap();
        let mut st = lower::stat_fd(fd.as_raw_fd()).unwrap();
        st.st_ino = ino;
        table.remember(ROOT, &name, fd, false, &st)
    }

    #[test]
    fn a_reused_number_never_leads_to_the_node_the_kernel_holds_for_the_file_that_had_it() {
        let (_dir, table) = table_over(4, 64);
        // f0 replaced (recompress): its node is retired, the kernel has not forgotten it yet,
        // and the lower gives its number to f1.
        let old = look_up(&table, 0);
        assert_eq!(old.nodeid, old.ino, "node ids are lower inode numbers where free");
        table.retire(&old);
        let new = look_up_as(&table, 1, old.ino);
        assert_ne!(new.nodeid, old.nodeid, "the reused number got the retired node's id");
        assert!(new.nodeid >= REMAPPED_BASE);
        assert!(table.node(old.nodeid).is_err_and(|e| e.raw_os_error() == Some(libc::ESTALE)), "a retired node answers ESTALE");
        assert_eq!(table.node(new.nodeid).unwrap().nodeid, new.nodeid);
        assert_eq!(look_up_as(&table, 1, old.ino).nodeid, new.nodeid, "the new file keeps its id");
        // Once the kernel forgets the old node, the new file still keeps its id for the mount.
        table.forget(old.nodeid, 1);
        assert_eq!(look_up_as(&table, 1, old.ino).nodeid, new.nodeid);

        // f2's number reused behind densefs's back while its node held no descriptor (evicted):
        // the lower's generation tells the files apart, where it has generations.
        let gone = look_up(&table, 2);
        let fd3 = lower::open_path(table.node(ROOT).unwrap().raw_fd(), OsStr::new("f3")).unwrap();
        if gone.generation == 0 || lower::generation(fd3.as_raw_fd()) == gone.generation {
            println!("SKIP: the temporary directory's file system reports no generations");
            return;
        }
        let evicted = gone.place.lock().fd.take();
        drop(evicted);
        let other = look_up_as(&table, 3, gone.ino);
        assert_ne!(other.nodeid, gone.nodeid, "another generation got the old node");
        assert!(gone.is_retired());
        assert!(table.node(gone.nodeid).is_err());
    }

    #[test]
    fn an_inode_forgotten_while_busy_is_let_go_of_once_free() {
        let (dir, table) = table_over(1, 64);
        let inode = look_up(&table, 0);
        let (inodes, fds) = table.census();
        // The kernel forgets it while a request holds its lock (a RELEASE closing it, say): an
        // unlinked file kept its blocks from the lower until some later FORGET, if any came.
        let busy = inode.open.lock();
        table.forget(inode.nodeid, 1);
        assert_eq!(table.census(), (inodes, fds), "kept while busy");
        table.retry_deferred_forgets();
        assert_eq!(table.census(), (inodes, fds), "still busy: kept again");
        drop(busy);
        table.retry_deferred_forgets();
        assert_eq!(table.census(), (inodes - 1, fds - 1), "let go of once free");
        assert!(inode.place.lock().fd.is_none(), "its descriptor is closed");
        assert!(table.node(inode.nodeid).is_err(), "gone from the table");
        drop(dir);
    }
}

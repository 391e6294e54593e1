//! One inode of the table: what densefs knows of a lower inode the kernel holds, and a node
//! pinned with its descriptor for one operation.

use super::super::container::Container;
use super::super::props::LocalProps;
use parking_lot::Mutex;
use std::ffi::OsString;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Data access to a regular file, shared by all its open handles.
#[derive(Clone)]
pub enum Content {
    /// A lower file that is not a container: served byte for byte.
    Plain(Arc<File>),
    Container(Arc<Container>),
}

pub(super) struct Place {
    /// The directory and name it was last seen under; None for a non-directory found by its
    /// number (a file handle) whose directory is unknown.
    pub(super) link: Option<(u64, OsString)>,
    /// O_PATH, or open for reading or writing: while a regular file is open, the descriptor
    /// its content reads and writes through (one descriptor per open file, not two).
    pub(super) fd: Option<Arc<File>>,
    /// `fd` is open for reading (a regular file found through readdir, or open content), not
    /// O_PATH: the container header can be read through it directly.
    pub(super) readable: bool,
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
    pub(super) dev: u64,
    pub(super) ino: u64,
    /// The lower inode's generation (ext4's i_generation; 0 where unknown, and for the root),
    /// reported to the kernel with each entry so that file handles detect reused numbers.
    pub generation: u32,
    pub(super) place: Mutex<Place>,
    pub(super) last_used: AtomicU64,
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
    pub(super) retired: AtomicBool,
    /// Counted in `InodeTable::deleted`: no name left, its descriptor still held.
    pub(super) deleted_held: AtomicBool,
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
    /// The background pass has `content` (opened for it, no handle): a user's open shares it,
    /// a last close leaves it there, and the pass lets go of it when done.
    pub background: bool,
    /// Opens so far (the background pass stops where a user opened the file since it began).
    pub opens: u64,
}

impl Inode {
    /// A node `nodeid` for lower inode (dev, ino) of type `kind`, known by `place`, with nothing
    /// else known of it yet.
    pub(super) fn new(nodeid: u64, kind: u32, (dev, ino): (u64, u64), generation: u32, place: Place, last_used: u64) -> Inode {
        Inode {
            nodeid,
            kind,
            dev,
            ino,
            generation,
            place: Mutex::new(place),
            last_used: AtomicU64::new(last_used),
            open: Mutex::new(OpenState::default()),
            local_props: Mutex::new(None),
            closed_size: Mutex::new(None),
            no_capability: AtomicBool::new(false),
            lost_a_name: AtomicBool::new(false),
            kernel_has_attrs: AtomicBool::new(false),
            blocks_told: AtomicU64::new(0),
            retired: AtomicBool::new(false),
            deleted_held: AtomicBool::new(false),
        }
    }

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
    pub(super) fn names(&self, dev: u64, ino: u64, generation: u32) -> bool {
        (self.dev, self.ino) == (dev, ino)
            && !self.is_retired()
            && (generation == 0 || self.generation == 0 || generation == self.generation)
    }
}

/// An inode with its descriptor pinned for the duration of one operation.
pub struct Node {
    pub inode: Arc<Inode>,
    pub(super) fd: Arc<File>,
    pub(super) readable: bool,
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

//! The file-system core: every operation on the visible tree, independent of FUSE.
//!
//! Operations take node ids and names and return plain values or an [`FsError`]; the FUSE
//! adapter (`crate::fuse`) only translates. Directories, names, links, modes, owners, times and
//! xattrs pass straight through to the lower tree; only regular-file contents are transformed
//! (see [`container`]).

mod admission;
pub mod atime;
mod background;
pub mod buffers;
mod changed;
pub mod container;
pub mod data;
pub mod error;
mod fileattr;
mod hints;
mod inodes;
mod landing;
mod listing;
pub mod lower;
pub mod memory;
mod namespace;
pub mod privileges;
pub mod props;
mod recompress;
mod report;
mod shutdown;
pub mod store;
mod tmpfile;
mod usage;
mod xattr;

use crate::engine::{Engine, RecordPolicy};
use container::{CreateSettings, Writeback};
pub use error::{FsError, FsResult};
use inodes::{Content, Inode, InodeTable, Node, OpenState};
use parking_lot::Mutex;
use props::PropertyValues;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use inodes::ROOT;
pub use report::{Effective, ReportKind, Source};
pub use shutdown::Shutdown;

/// What the mount was asked for; applies to files created from now on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// The root directory's properties (`props::PROPERTIES`).
    pub properties: PropertyValues,
    /// File data all open files may hold in memory (dirty, in flight, cached), in bytes.
    pub cache_size: usize,
    /// When users' reads move access times (`noatime`, `relatime`, `strictatime`; `ro`: never).
    pub atime: atime::Atime,
    /// How long a file stays closed before background compression re-encodes it.
    pub background_delay: Duration,
    /// The background pass's lower I/O, bytes per second read and written (0: unbounded).
    pub background_rate: u64,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            properties: PropertyValues::default(),
            cache_size: 256 << 20,
            atime: atime::Atime::Relative,
            background_delay: Duration::from_millis(500),
            background_rate: 128 << 20,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl Kind {
    pub fn from_mode(mode: u32) -> Kind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDevice,
            libc::S_IFBLK => Kind::BlockDevice,
            _ => Kind::File,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    /// 512-byte blocks the lower file really occupies.
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub kind: Kind,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

/// Who is asking (for the owner of what they create).
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// The caller's umask, for what it creates (FUSE sends it with create, mkdir and mknod):
    /// the lower file system applies it, or the parent's default ACL instead, as for a local
    /// caller (`lower::with_umask`).
    pub umask: u32,
}

pub struct DirEntry {
    pub ino: u64,
    pub kind: Kind,
    pub name: std::ffi::OsString,
    /// The lower directory said it is a regular file (DT_REG; `kind` is File for DT_UNKNOWN too).
    pub surely_regular: bool,
}

pub struct Statfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// An open file. (Directories have none: listings keep no state between requests.)
struct Handle {
    inode: Arc<Inode>,
    content: Content,
    /// Opened for writing; only those handles hear of write-back errors at close.
    writable: bool,
    /// A read through it has moved the atime as `relatime` says (once per open is enough).
    atime_moved: std::sync::atomic::AtomicBool,
    /// A close(2) of it reached the daemon (a FLUSH): its RELEASE is likely on its way (unless
    /// a duplicate descriptor keeps it open).
    closing: std::sync::atomic::AtomicBool,
}

/// A report kept between a size probe and the read that follows: (node, name, when, JSON).
type CachedReport = (u64, String, std::time::Instant, Vec<u8>);

pub struct DenseFs {
    options: Options,
    /// The lower directory's path, for mount-relative names in reports.
    lower_root: std::path::PathBuf,
    engine: Arc<Engine>,
    memory: Arc<memory::Memory>,
    inodes: InodeTable,
    atime: atime::AtimeKeeper,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    /// Handles whose RELEASE is being handled (out of `handles`, their last landing and
    /// measure still to come): counted as open until done (`open_handles`).
    releasing: AtomicU64,
    next_handle: AtomicU64,
    /// The daemon's effective (uid, gid): what the lower gives the entries it creates.
    daemon_ids: (u32, u32),
    /// The last report computed for a size probe: (node, name, when, JSON).
    last_report: Mutex<Option<CachedReport>>,
    /// Counts the daemon's own writes to files (a last close writing one back, landings the
    /// writeback tick published): read before a lower stat, it tells `attr_with` whether that
    /// stat may predate such a write.
    written_back: AtomicU64,
    /// Tells the kernel to drop what it keeps of a node (set by the FUSE adapter, which lets the
    /// kernel keep attributes and listings long, `fuse::WRITABLE_TTL`): the daemon is the only
    /// writer of the lower, so only its own changes behind a reply's back can outdate them.
    drop_kernel_cache: std::sync::OnceLock<Arc<dyn Fn(u64, KernelCache) + Send + Sync>>,
    /// The transport's count of requests by kind (`engine.requests.*`), once a transport runs.
    request_census: std::sync::OnceLock<RequestCensus>,
    /// How many times the kernel was told so (`user.densefs.engine`: `kernel.attr_drops`).
    kernel_attr_drops: AtomicU64,
    /// Files the daemon wrote lately, until when their lower file system may still change
    /// their block count on its own (`LOWER_SETTLE`): the writeback tick compares it with what
    /// the kernel was told. Weak: a file the kernel forgot has no attributes there to drop.
    /// By node id; written again, a file's deadline moves.
    settling: Mutex<HashMap<u64, (std::sync::Weak<Inode>, std::time::Instant)>>,
    /// Listings read further than their replies took, for the READDIRs that go on with them.
    cursors: listing::Cursors,
    /// Files listings spared header reads, for the opens that follow (`read_listed_ahead`).
    listed: listing::Listed,
    /// Size hints: set by `begin_run` (none for a core without a mount, or a lower that keeps
    /// no run record).
    hints: std::sync::OnceLock<hints::Hints>,
    /// Background compression, once `start_background` ran (a writable mount).
    background: std::sync::OnceLock<Arc<background::Background>>,
    /// The mount's statistics as counters (`usage/`).
    usage: Arc<usage::Accounting>,
    /// The regular files `chattr +i`/`+a` protect (`fileattr.rs`).
    protected: fileattr::Protected,
}

/// The requests of one kind a transport received (the kernel's name of the kind).
#[derive(Clone, Debug)]
pub struct RequestCount {
    pub kind: &'static str,
    pub count: u64,
    /// The time their handling took in all.
    pub handled: std::time::Duration,
    /// How many took at most each bound (seconds), cumulative, as a Prometheus histogram's
    /// buckets.
    pub latency: Vec<(f64, u64)>,
    /// How many were answered (`count` less those in flight): the +Inf bucket.
    pub answered: u64,
}

/// Where the requests a transport received are counted, by kind.
pub type RequestCensus = Box<dyn Fn() -> Vec<RequestCount> + Send + Sync>;

/// What the kernel keeps of a node that the daemon can tell it to drop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelCache {
    /// A file's attributes.
    Attrs,
    /// A directory's listing (and its attributes).
    Listing,
    /// A name in a directory, and the node it led to (told from another thread than the
    /// request's: the kernel locks the directory for it).
    Entry(std::ffi::OsString),
    /// Everything of a node: attributes, cached pages, a listing.
    Everything,
}

/// How long after the daemon writes a file its lower file system may still change the file's
/// block count on its own: ext4 allocates at writeback (30 s after the write, by default), and
/// its extent blocks count in st_blocks from then on.
const LOWER_SETTLE: Duration = Duration::from_secs(60);

fn time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::new((-sec) as u64, 0) + Duration::from_nanos(nsec as u64)
    }
}

/// Descriptors the inode table may keep open: half the process limit (an open file's is one of
/// them), leaving the rest for open directories, listings' header read-ahead and the lower
/// files of contents kept in memory after a failed close.
fn fd_budget() -> usize {
    let Ok(limit) = lower::nofile_limit() else { return 512 };
    (limit / 2).min(1 << 20) as usize
}

impl DenseFs {
    pub fn new(lower_root: &Path, options: Options, engine: Arc<Engine>) -> FsResult<DenseFs> {
        let fd = lower::open_root(lower_root)
            .map_err(|e| FsError::new(e.raw_os_error().unwrap_or(libc::EIO), format!("cannot open {}: {e}", lower_root.display())))?;
        let st = lower::stat_fd(std::os::fd::AsRawFd::as_raw_fd(&fd))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(FsError::new(libc::ENOTDIR, format!("{} is not a directory", lower_root.display())));
        }
        let protected = fileattr::Protected::load(std::os::fd::AsRawFd::as_raw_fd(&fd));
        Ok(DenseFs {
            options,
            lower_root: std::fs::canonicalize(lower_root).unwrap_or_else(|_| lower_root.to_path_buf()),
            engine,
            memory: Arc::new(memory::Memory::new(options.cache_size)),
            atime: atime::AtimeKeeper::new(options.atime, std::os::fd::AsRawFd::as_raw_fd(&fd), st.st_dev),
            inodes: InodeTable::new(fd, st.st_dev, st.st_ino, fd_budget()),
            handles: Mutex::new(HashMap::new()),
            releasing: AtomicU64::new(0),
            next_handle: AtomicU64::new(1),
            written_back: AtomicU64::new(0),
            drop_kernel_cache: std::sync::OnceLock::new(),
            request_census: std::sync::OnceLock::new(),
            kernel_attr_drops: AtomicU64::new(0),
            cursors: Default::default(),
            listed: Default::default(),
            settling: Mutex::new(HashMap::new()),
            daemon_ids: (lower::geteuid(), lower::getegid()),
            last_report: Mutex::new(None),
            hints: std::sync::OnceLock::new(),
            background: std::sync::OnceLock::new(),
            usage: Arc::default(),
            protected,
        })
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    fn inode(&self, nodeid: u64) -> FsResult<Node> {
        self.check_running()?;
        self.inodes.node(nodeid).map_err(|e| FsError::new(e.raw_os_error().unwrap_or(libc::EIO), format!("inode {nodeid}")))
    }

    fn new_handle(&self, handle: Handle) -> u64 {
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, Arc::new(handle));
        fh
    }

    /// Files open now, counting those whose RELEASE is still being handled: the kernel sends
    /// a last close's RELEASE after close(2) returns, so a tree is at rest only once this is 0.
    pub fn open_handles(&self) -> u64 {
        self.releasing.load(Ordering::SeqCst) + self.handles.lock().len() as u64
    }

    fn handle(&self, fh: u64) -> FsResult<Arc<Handle>> {
        self.check_running()?;
        self.handles.lock().get(&fh).cloned().ok_or_else(|| FsError::new(libc::EBADF, format!("unknown handle {fh}")))
    }

    fn create_settings(options: &PropertyValues) -> CreateSettings {
        CreateSettings { compression: options.compression, layout: options.layout, checksum: options.checksum }
    }

    fn label(&self, inode: &Node) -> String {
        lower::fd_path(inode.raw_fd())
    }

    /// The logical size and record size of a regular file that is not open: from its size hint
    /// (`hints`), else its header (read without moving the access time), or the lower file's
    /// own (None). The answer is
    /// kept on the inode with the lower status it was read under, and reused while that status
    /// is unchanged.
    fn closed_file_size(&self, inode: &Node, st: &libc::stat) -> Option<(u64, u32)> {
        if st.st_size == 0 {
            return None;
        }
        let stamp = inodes::ClosedSize::stamp_of(st);
        if let Some(known) = *inode.closed_size.lock() {
            if known.stamp == stamp {
                return known.size;
            }
        }
        let hinted = match inode.readable_fd() {
            _ if !self.uses_hints() => None,
            Some(fd) => self.hinted_size(lower::XattrOn::Fd(fd), st),
            None => self.hinted_size(lower::XattrOn::Path(&lower::proc_path(inode.raw_fd())), st),
        };
        let probed = match (hinted, inode.readable_fd()) {
            (Some((size, record_size)), _) => Ok(Some((size, record_size))),
            (None, Some(fd)) => container::Container::probe_fd(fd).map(|h| h.map(|h| (h.size, h.layout.record_size() as u32))),
            (None, None) => match lower::reopen_read(inode.raw_fd(), true) {
                Ok(file) => container::Container::probe(&file).map(|h| h.map(|h| (h.size, h.layout.record_size() as u32))),
                // Unreadable by the daemon (not root, mode 000): show the lower size.
                Err(_) => return None,
            },
        };
        let size = match probed {
            Ok(sized) => sized,
            // Unreadable (an I/O error) or damaged: the lower size, and no caching.
            Err(e) => {
                tracing::error!(file = %self.label(inode), "damaged container header: {e}");
                return None;
            }
        };
        if settled_status(st) {
            *inode.closed_size.lock() = Some(inodes::ClosedSize { stamp, size });
        }
        size
    }

    /// A listing read `hint` of a file just before taking its lower status `st`: the size it
    /// gives is kept as `closed_file_size` keeps the one it reads after its stat, sparing that
    /// second read. A status a second old shows that nothing (no hint written or removed: both
    /// move the ctime) changed between the two.
    fn keep_listed_size(&self, inode: &inodes::Inode, st: &libc::stat, hint: &crate::format::hints::SizeHint) {
        if st.st_size > 0 && hint.lower_len == st.st_size as u64 && settled_status(st) {
            let size = Some((hint.size, 1u32 << hint.record_shift));
            *inode.closed_size.lock() = Some(inodes::ClosedSize { stamp: inodes::ClosedSize::stamp_of(st), size });
        }
    }

    fn attr_of(&self, inode: &Node) -> FsResult<Attr> {
        let before = self.written_back_count();
        let st = lower::stat_fd(inode.raw_fd())?;
        self.attr_with(inode, &st, before)
    }

    /// What `attr_with` needs read before the caller's lower stat.
    fn written_back_count(&self) -> u64 {
        self.written_back.load(Ordering::SeqCst)
    }

    /// The daemon wrote `open`'s file (the caller holds its `open` lock): a content wrote it
    /// back and let go of it, or published its landings.
    fn note_written_back(&self, open: &mut OpenState) {
        open.written_back_at = self.written_back.fetch_add(1, Ordering::SeqCst) + 1;
    }

    /// Where the requests the kernel sent are counted, by kind (the FUSE adapter's transport).
    pub fn count_requests_with(&self, census: RequestCensus) {
        let _ = self.request_census.set(census);
    }

    /// Requests received so far by kind (how many, time spent on them), where a transport
    /// counts them.
    pub fn request_census(&self) -> Vec<RequestCount> {
        self.request_census.get().map(|census| census()).unwrap_or_default()
    }

    /// How the kernel is told to drop what it keeps of a node (the FUSE adapter's notifier).
    pub fn on_kernel_cache_stale(&self, drop: Box<dyn Fn(u64, KernelCache) + Send + Sync>) {
        let _ = self.drop_kernel_cache.set(Arc::from(drop));
    }

    /// The daemon's own writes changed `inode`'s lower file (the caller holds its `open` lock):
    /// a stat taken before is taken again (`attr_with`), and attributes the kernel holds
    /// from an earlier reply are dropped.
    fn lower_changed(&self, inode: &Arc<Inode>, open: &mut OpenState) {
        self.note_written_back(open);
        self.kernel_attrs_stale(inode);
        self.settling.lock().insert(inode.nodeid, (Arc::downgrade(inode), std::time::Instant::now() + LOWER_SETTLE));
    }

    /// Files whose lower block count moved on its own since the kernel was told it (the lower
    /// allocating at its writeback): the kernel drops their attributes. Run by the tick.
    fn recheck_settling(&self) {
        let now = std::time::Instant::now();
        // Checked with the list unlocked: landings add to it meanwhile.
        let mut settling = std::mem::take(&mut *self.settling.lock());
        settling.retain(|_, (file, until)| {
            let Some(inode) = file.upgrade().filter(|_| *until > now) else { return false };
            if inode.kernel_has_attrs.load(Ordering::SeqCst) {
                let blocks = inode
                    .cached_fd()
                    .and_then(|fd| lower::stat_fd(std::os::fd::AsRawFd::as_raw_fd(&*fd)).ok())
                    .map(|st| st.st_blocks as u64);
                if blocks.is_some_and(|b| b != inode.blocks_told.load(Ordering::SeqCst)) {
                    self.kernel_attrs_stale(&inode);
                }
            }
            true
        });
        let mut current = self.settling.lock();
        for (nodeid, entry) in settling {
            current.entry(nodeid).or_insert(entry); // one added meanwhile has the later deadline
        }
    }

    /// Attributes the kernel may hold of `inode` went stale: it is told to drop them.
    fn kernel_attrs_stale(&self, inode: &Inode) {
        if inode.kernel_has_attrs.swap(false, Ordering::SeqCst) {
            if let Some(drop) = self.drop_kernel_cache.get() {
                self.kernel_attr_drops.fetch_add(1, Ordering::Relaxed);
                drop(inode.nodeid, KernelCache::Attrs);
            }
        }
    }

    /// The daemon changed what the kernel may keep of node `nodeid` (a directory's listing, a
    /// name in it that now leads to another lower inode): the kernel drops it.
    fn kernel_cache_stale(&self, nodeid: u64, what: KernelCache) {
        if let Some(drop) = self.drop_kernel_cache.get() {
            drop(nodeid, what);
        }
    }

    /// Publishes what the daemon's own writes changed in `c`'s file since the last call.
    fn publish_lower_changes(&self, inode: &Arc<Inode>, c: &container::Container) {
        if c.take_lower_changed() {
            self.lower_changed(inode, &mut inode.open.lock());
        }
    }

    /// The attributes of `inode`, whose lower status `st` the caller just read, having read
    /// `written_back_count` (`before`) first.
    fn attr_with(&self, inode: &Node, st: &libc::stat, before: u64) -> FsResult<Attr> {
        let kind = Kind::from_mode(st.st_mode);
        let open = (kind == Kind::File).then(|| inode.open.lock());
        // A last close may have written the file back (say, emptied it) after that stat: the
        // header read below would then not match the stat, and the kernel would keep a size
        // the file no longer has. Its `open` lock, held, waits for a close under way.
        if open.is_some() {
            // Under the `open` lock, which `lower_changed` holds: either it comes after this
            // and drops what this reply tells, or before it and this stat is taken again.
            inode.kernel_has_attrs.store(true, Ordering::SeqCst);
        }
        let restat;
        let st = match &open {
            Some(open) if open.written_back_at > before => {
                restat = lower::stat_fd(inode.raw_fd())?;
                &restat
            }
            _ => st,
        };
        let mut size = st.st_size as u64;
        // A container's record size, once it holds data; an empty file shows the lower's, as
        // in every reply (a new file's CREATE, a closed one's LOOKUP, a read-only open, where
        // an empty lower file is plain).
        let mut blksize = st.st_blksize as u32;
        let mut mtime = time(st.st_mtime, st.st_mtime_nsec);
        let mut ctime = time(st.st_ctime, st.st_ctime_nsec);
        if let Some(open) = &open {
            match &open.content {
                Some(Content::Container(c)) => {
                    size = c.size();
                    if size > 0 {
                        blksize = c.layout().record_size() as u32;
                    }
                    // The times the user's operations set, not those of landing records.
                    let (m, c) = c.times();
                    mtime = time(m.tv_sec, m.tv_nsec);
                    if let Some(c) = c {
                        ctime = ctime.max(time(c.tv_sec, c.tv_nsec));
                    }
                }
                Some(Content::Plain(_)) => {}
                None => {
                    if let Some((logical, record_size)) = self.closed_file_size(inode, st) {
                        size = logical;
                        if size > 0 {
                            blksize = record_size;
                        }
                    }
                }
            }
        }
        inode.blocks_told.store(st.st_blocks as u64, Ordering::SeqCst);
        Ok(Attr {
            ino: inode.nodeid,
            size,
            blocks: st.st_blocks as u64,
            atime: time(st.st_atime, st.st_atime_nsec),
            mtime,
            ctime,
            kind,
            perm: (st.st_mode & 0o7777) as u16,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: st.st_rdev as u32,
            blksize,
        })
    }

    pub fn getattr(&self, nodeid: u64) -> FsResult<Attr> {
        self.attr_of(&self.inode(nodeid)?)
    }

    /// The attributes and the lower inode's birth time, where its file system keeps one.
    pub fn statx(&self, nodeid: u64) -> FsResult<(Attr, Option<SystemTime>)> {
        let inode = self.inode(nodeid)?;
        let attr = self.attr_of(&inode)?;
        Ok((attr, lower::birth_time(inode.raw_fd()).map(|(sec, nsec)| time(sec, nsec as i64))))
    }

    pub fn forget(&self, nodeid: u64, n: u64) {
        self.inodes.forget(nodeid, n);
    }

    pub fn statfs(&self) -> FsResult<Statfs> {
        let root = self.inode(ROOT)?;
        let sv = lower::fstatvfs(root.raw_fd())?;
        // Data acknowledged and not landed yet will take room (at most its uncompressed size):
        // `df` counts it as used, as a local file system's would.
        let unlanded = self.memory.admission().unlanded().div_ceil(sv.f_frsize.max(1));
        Ok(Statfs {
            blocks: sv.f_blocks,
            bfree: sv.f_bfree.saturating_sub(unlanded),
            bavail: sv.f_bavail.saturating_sub(unlanded),
            files: sv.f_files,
            ffree: sv.f_ffree,
            bsize: sv.f_bsize as u32,
            namelen: sv.f_namemax as u32,
            frsize: sv.f_frsize as u32,
        })
    }

    /// Starts writing back what has sat in memory (called every few seconds, like the kernel's
    /// dirty writeback or a ZFS transaction group).
    /// Lets writers that find the memory budget spent start writeback of every open file, and
    /// writers short of room on the lower free what syncs would free.
    pub fn connect_memory_budget(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        self.memory.set_kick(Box::new(move || {
            if let Some(fs) = weak.upgrade() {
                fs.start_writeback();
            }
        }));
        let weak = Arc::downgrade(self);
        self.memory.set_reclaim(Box::new(move || {
            if let Some(fs) = weak.upgrade() {
                fs.reclaim_old_copies();
                fs.inodes.deleted.wait(|| fs.inodes.retry_deferred_forgets());
            }
        }));
    }

    /// Syncs every file that keeps old copies (of records rewritten or cut off since its last
    /// sync) so that they are freed; not one whose writer has a landing's error still to hear
    /// (its sync would only take that error).
    fn reclaim_old_copies(&self) {
        for inode in self.inodes.inodes() {
            if let Some(Content::Container(c)) = inode.open_content() {
                if c.has_stale() && !c.has_write_error() {
                    if let Err(e) = c.sync(true) {
                        tracing::warn!("freeing old copies for room: {e}");
                    }
                }
            }
        }
    }

    /// File data held in memory now, and the budget.
    pub fn memory_use(&self) -> (usize, usize) {
        (self.memory.used(), self.memory.limit())
    }

    /// Hands every dirty record of every open file to the engine, without waiting. Over the
    /// budget, the decoded records open files keep for their next reads go too: they are the
    /// only memory freed without I/O, and thousands of open files each keeping its last landed
    /// record would otherwise hold the whole budget, leaving every writer to wait it out.
    fn start_writeback(&self) {
        let over = self.memory.over();
        for content in self.inodes.open_contents() {
            if let Content::Container(c) = content {
                if over {
                    c.drop_cached_records();
                }
                if let Err(e) = c.writeback(Writeback::Everything) {
                    tracing::warn!("writeback: {e}");
                }
            }
        }
    }

    pub fn writeback_tick(&self) {
        // Shut down: what is in memory stays there (`shutdown.rs`).
        if lower::fence::raised() {
            return;
        }
        for inode in self.inodes.inodes() {
            if let Some(Content::Container(c)) = inode.open_content() {
                if let Err(e) = c.writeback(Writeback::Aged) {
                    tracing::warn!("background writeback: {e}");
                }
                // Only here, not in the memory budget's kick: re-encoding loads records, and a
                // record counts as quiet after one whole tick without an fsync.
                if let Err(e) = c.settle_interim(false) {
                    tracing::warn!("re-encoding records an fsync landed: {e}");
                }
                // What landed so far (the landings this tick started are published by the next).
                self.publish_lower_changes(&inode, &c);
            }
        }
        self.recheck_settling();
        self.retry_unwritten();
        self.inodes.retry_deferred_forgets();
    }

    /// Files closed while their data could not be written: retries them, lets go of those that
    /// land, and returns how many are still held in memory only.
    pub fn retry_unwritten(&self) -> usize {
        let mut held = 0;
        for inode in self.inodes.unwritten() {
            let mut open = inode.open.lock();
            let Some(Content::Container(c)) = open.content.clone() else { continue };
            if open.handles > 0 {
                continue;
            }
            c.forget_write_error();
            match c.sync(true) {
                Ok(()) => {
                    open.content = None;
                    self.lower_changed(&inode, &mut open);
                    drop(open);
                    tracing::info!(inode = inode.nodeid, "data kept after a failed close is now written");
                    self.inodes.forget(inode.nodeid, 0);
                }
                Err(e) => {
                    held += 1;
                    tracing::warn!(inode = inode.nodeid, "still cannot write back a closed file: {e}");
                }
            }
        }
        held
    }

    /// Lands everything still in memory (unmount). The background pass stops first, between
    /// two records; what it had not done stays in its work log for the next mount.
    pub fn flush_all(&self) {
        self.stop_background();
        if lower::fence::raised() {
            tracing::warn!("shut down: what was written after the last landing is not written back");
            return;
        }
        for content in self.inodes.open_contents() {
            if let Content::Container(c) = content {
                if let Err(e) = c.sync(false) {
                    tracing::error!("flush at unmount failed: {e}");
                }
            }
        }
    }
}

/// Whether a lower status's ctime is over a second old, so that what was read under it may be
/// kept with its stamp: a change within the same tick of a coarse clock (file systems without
/// fine-grained ctime) could leave an equal stamp.
fn settled_status(st: &libc::stat) -> bool {
    let now = lower::now();
    let ctime_age_ns = (now.tv_sec - st.st_ctime) as i128 * 1_000_000_000 + (now.tv_nsec - st.st_ctime_nsec) as i128;
    ctime_age_ns > 1_000_000_000
}

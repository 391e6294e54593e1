//! The FUSE adapter: one uniform translation per operation (call the core, reply or log+errno).

use crate::core::data::{SetAttr, SetTime};
use crate::core::privileges::Changer;
use crate::core::{lower, Attr, Caller, DenseFs, FsError, Kind, Shutdown};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyLseek, ReplyOpen, ReplyStatfs, ReplyStatx, ReplyWrite, ReplyXattr, Request, SetXattrFlags, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How long the kernel keeps entries and attributes of a writable mount, which also lets it keep
/// directory listings (`opendir`). Every change to the lower goes through the daemon (one
/// writer per lower directory, README "multihost"), and the kernel drops what a request changes;
/// what the daemon changes on its own (blocks and ctime as records land after a reply, the entry
/// recompress renames over) it drops on the daemon's word (`DenseFs::on_kernel_cache_stale`).
/// So a warm `stat`, `git status`, `find` or `du` asks the daemon nothing, where a 1 s timeout
/// cost a LOOKUP or GETATTR per file and a READDIRPLUS per directory each time.
const WRITABLE_TTL: Duration = Duration::from_secs(3600);
/// A read-only mount may look at a lower another machine's densefs writes (`-o ro` is allowed
/// beside it): names and attributes are asked again after a second.
const READ_ONLY_TTL: Duration = Duration::from_secs(1);
/// Largest FUSE request (the kernel's default cap, `fs.fuse.max_pages_limit`, is 1 MiB).
pub const MAX_WRITE: u32 = 1 << 20;

/// The kernel's read-ahead for the mount, in KiB: sequential readers get two of the largest
/// requests in flight, so the daemon decodes one batch while the next is on its way. (The
/// kernel offers FUSE only its 128 KiB default at INIT.) Since large READs are served from any
/// core, more is slower: a cold 1 GiB read took 3-5% longer at 4 MiB (six pairs in turns) and
/// 10-15% longer at 16 MiB, with more system time (more pages in flight).
pub const READ_AHEAD_KB: u32 = 2048;

pub struct FuseAdapter {
    fs: Arc<DenseFs>,
    read_only: bool,
    /// Writes through a write-only open go straight to the daemon (FOPEN_DIRECT_IO), not
    /// through the kernel's page cache, where the kernel keeps other opens' cached pages right
    /// (see `init`).
    direct_writes: bool,
    /// WRITABLE_TTL or READ_ONLY_TTL.
    ttl: Duration,
    /// The mount's `read_ahead_kb` in sysfs, written once INIT is done (the kernel sets it at
    /// INIT); taken by the first open.
    read_ahead_knob: Arc<parking_lot::Mutex<Option<std::path::PathBuf>>>,
}

impl FuseAdapter {
    pub fn new(fs: Arc<DenseFs>, read_only: bool) -> FuseAdapter {
        let ttl = if read_only { READ_ONLY_TTL } else { WRITABLE_TTL };
        fs.count_requests_with(Box::new(request_census));
        FuseAdapter { fs, read_only, ttl, direct_writes: false, read_ahead_knob: Arc::default() }
    }

    /// Where to raise the mount's read-ahead to [`READ_AHEAD_KB`] (`/sys/class/bdi/MAJ:MIN/read_ahead_kb`),
    /// once the mount exists; the adapter does it after INIT.
    pub fn read_ahead_knob(&self) -> Arc<parking_lot::Mutex<Option<std::path::PathBuf>>> {
        self.read_ahead_knob.clone()
    }

    /// The open flags of a file's open: see `open`, `create` and `direct_writes`.
    fn file_open_flags(&self, flags: i32) -> FopenFlags {
        // Every change to a file's contents passes through this mount, so the kernel's cached
        // pages stay right across opens.
        let mut open_flags = FopenFlags::FOPEN_KEEP_CACHE;
        match flags & libc::O_ACCMODE {
            // A reader's close has nothing to land: the kernel need not send its FLUSH (a round
            // trip per file read, as `cat` of a tree makes).
            libc::O_RDONLY => open_flags |= FopenFlags::FOPEN_NOFLUSH,
            // A write-only open cannot read or map what it writes: caching it would only copy
            // every byte once more into pages nobody asked for (`cp` of a 3 GB file touched
            // 3 GB of page cache besides the lower file's).
            libc::O_WRONLY if self.direct_writes => open_flags |= FopenFlags::FOPEN_DIRECT_IO,
            _ => {}
        }
        open_flags
    }

    /// The answer to CREATE and TMPFILE: the new entry, opened with `flags`.
    fn reply_created(&self, reply: ReplyCreate, op: &str, flags: i32, result: Result<(Attr, u64), FsError>) {
        match result {
            Ok((attr, fh)) => {
                let generation = Generation(self.fs.generation(attr.ino));
                reply.created(&self.ttl, &fuse_attr(&attr), generation, FileHandle(fh), self.file_open_flags(flags))
            }
            Err(e) => reply.error(errno(op, e)),
        }
    }

    fn tune_read_ahead(&self) {
        if let Some(knob) = self.read_ahead_knob.lock().take() {
            if let Err(e) = std::fs::write(&knob, READ_AHEAD_KB.to_string()) {
                tracing::info!("cannot raise the mount's read-ahead ({}): {e}", knob.display());
            }
        }
    }
}

/// The transport's request census in the core's terms: cumulative latency buckets in seconds.
fn request_census() -> Vec<crate::core::RequestCount> {
    fuser::request_census()
        .into_iter()
        .map(|k| {
            let mut below = 0;
            let latency = fuser::LATENCY_BOUNDS_US
                .iter()
                .zip(k.buckets)
                .map(|(&bound, n)| {
                    below += n;
                    (bound as f64 / 1e6, below)
                })
                .collect();
            crate::core::RequestCount { kind: k.name, count: k.count, handled: k.handled, latency, answered: k.buckets.iter().sum() }
        })
        .collect()
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDevice => FileType::CharDevice,
        Kind::BlockDevice => FileType::BlockDevice,
    }
}

fn fuse_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: SystemTime::UNIX_EPOCH,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

/// Who changes a file's contents, for what that takes of setuid/setgid (`core::privileges`):
/// `fsetid` where the kernel says whether the caller has CAP_FSETID (a write's flag). Truncates
/// and O_TRUNC opens carry it in fields fuser does not pass on, FALLOCATE nowhere: the daemon
/// reads it from /proc then.
fn changer(req: &Request, fsetid: Option<bool>) -> Changer {
    Changer { uid: req.uid(), gid: req.gid(), pid: req.pid(), fsetid }
}

fn caller(req: &Request) -> Caller {
    Caller { uid: req.uid(), gid: req.gid(), umask: 0 }
}

/// The caller of a request that creates an entry, with the umask the request carries.
fn creator(req: &Request, umask: u32) -> Caller {
    Caller { umask, ..caller(req) }
}

use lower::{FSXATTR_SIZE, FS_IOC_FSGETXATTR, FS_IOC_FSSETXATTR, FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_IOC_SHUTDOWN};

/// Logs an error the way its kind deserves and turns it into an errno.
fn errno(op: &str, e: FsError) -> Errno {
    match e.errno {
        // After a shutdown every request fails: one line said why.
        libc::EIO if lower::fence::raised() => tracing::debug!("{op}: {e}"),
        libc::EIO | libc::ENOSPC | libc::EDQUOT | libc::ESTALE => tracing::warn!("{op}: {e}"),
        _ => tracing::debug!("{op}: {e}"),
    }
    Errno::from_i32(e.errno)
}

fn set_time(t: Option<TimeOrNow>) -> Option<SetTime> {
    t.map(|t| match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(t),
    })
}

/// Entries carry the lower inode's generation, which the kernel puts in file handles and checks
/// when it resolves one (NFS export).
macro_rules! entry_reply {
    ($self:expr, $reply:expr, $op:expr, $result:expr) => {
        match $result {
            Ok(attr) => $reply.entry(&$self.ttl, &fuse_attr(&attr), Generation($self.fs.generation(attr.ino))),
            Err(e) => $reply.error(errno($op, e)),
        }
    };
}

macro_rules! empty_reply {
    ($reply:expr, $op:expr, $result:expr) => {
        match $result {
            Ok(()) => $reply.ok(),
            Err(e) => $reply.error(errno($op, e)),
        }
    };
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        // An O_TRUNC open truncates in OPEN itself, not in a SETATTR after it (a round trip
        // per `cp` or `>` over an existing file).
        let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
        // Writers without CAP_FSETID are flagged and the daemon drops setuid/setgid/capabilities
        // itself (DenseFs::write), so the kernel asks for security.capability before no write.
        let _ = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        // File handles that outlive the kernel's inode cache and the daemon (NFS export): the
        // kernel resolves them with LOOKUP(node, ".") and LOOKUP(node, "..").
        let _ = config.add_capabilities(InitFlags::FUSE_EXPORT_SUPPORT);
        // Directory listings carry each entry's attributes (READDIRPLUS), so `ls -l` and `find`
        // cost one request per few dozen entries instead of one LOOKUP each.
        let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS);
        // POSIX ACLs count in permission checks, as on the lower file system: the kernel reads
        // them through getxattr (and caches them). DONT_MASK: the kernel leaves the umask to
        // the daemon, which has the lower apply it, or the parent's default ACL instead
        // (`Caller::umask`).
        let _ = config.add_capabilities(InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK);
        // An ACL change by a caller outside the file's group takes setgid, as chmod does; the
        // kernel says so in SETXATTR's extended flags (FUSE_SETXATTR_ACL_KILL_SGID).
        let _ = config.add_capabilities(InitFlags::FUSE_SETXATTR_EXT);
        // Idmapped mounts of the mount (Linux 6.12+; container runtimes bind a host directory
        // into a container with shifted ids): the kernel maps ids itself, permissions being
        // checked by it (default_permissions), and sends the owner a new entry gets on disk.
        if config.add_capabilities(InitFlags::FUSE_ALLOW_IDMAP).is_err() {
            tracing::info!("this kernel offers no idmapped FUSE mounts (Linux 6.12+)");
        }
        // A direct write drops the pages other opens cached of its range since Linux 6.6, the
        // release that also offers DIRECT_IO_ALLOW_MMAP (not asked for: write-only opens cannot
        // map anyway). Before it, a reader could go on seeing what a direct write replaced.
        self.direct_writes = config.capabilities().contains(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        if self.direct_writes {
            tracing::info!("writes through write-only opens bypass the kernel's page cache");
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.fs.flush_all();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry_reply!(self, reply, "lookup", self.fs.lookup(parent.0, name))
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(attr) => reply.attr(&self.ttl, &fuse_attr(&attr)),
            Err(e) => reply.error(errno("getattr", e)),
        }
    }

    /// `stat` asking for the birth time (FUSE_STATX): the lower inode's.
    fn statx(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, _mask: u32, reply: ReplyStatx) {
        match self.fs.statx(ino.0) {
            Ok((attr, btime)) => reply.statx(&self.ttl, &fuse_attr(&attr), btime),
            Err(e) => reply.error(errno("statx", e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr { mode, uid, gid, size, atime: set_time(atime), mtime: set_time(mtime), changer: changer(req, None) };
        match self.fs.setattr(ino.0, fh.map(|f| f.0), set) {
            Ok(attr) => reply.attr(&self.ttl, &fuse_attr(&attr)),
            Err(e) => reply.error(errno("setattr", e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno("readlink", e)),
        }
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        entry_reply!(self, reply, "mknod", self.fs.mknod(parent.0, name, mode, rdev, creator(req, umask)))
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        entry_reply!(self, reply, "mkdir", self.fs.mkdir(parent.0, name, mode, creator(req, umask)))
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty_reply!(reply, "unlink", self.fs.unlink(parent.0, name))
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty_reply!(reply, "rmdir", self.fs.rmdir(parent.0, name))
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        entry_reply!(self, reply, "symlink", self.fs.symlink(parent.0, link_name, target, caller(req)))
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        empty_reply!(reply, "rename", self.fs.rename(parent.0, name, newparent.0, newname, flags.bits()))
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        entry_reply!(self, reply, "link", self.fs.link(ino.0, newparent.0, newname))
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.tune_read_ahead();
        let mut open_flags = self.file_open_flags(flags.0);
        // A read that may move the atime must reach the daemon, not the kernel's cached pages.
        if flags.0 & libc::O_ACCMODE != libc::O_WRONLY && self.fs.read_may_move_atime(ino.0) {
            open_flags.remove(FopenFlags::FOPEN_KEEP_CACHE);
        }
        match self.fs.open(ino.0, flags.0, changer(req, None)) {
            Ok(fh) => reply.opened(FileHandle(fh), open_flags),
            Err(e) => reply.error(errno("open", e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.read(fh.0, offset, size) {
            Ok(data) => reply.data_parts(&data.slices()),
            Err(e) => reply.error(errno("read", e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let fsetid = !write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        match self.fs.write(fh.0, offset, data, changer(req, Some(fsetid))) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno("write", e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        empty_reply!(reply, "flush", self.fs.flush(fh.0))
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.fs.release(fh.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        empty_reply!(reply, "fsync", self.fs.fsync(fh.0, datasync))
    }

    /// A writable mount answers ENOSYS, after which the kernel sends no OPENDIR or RELEASEDIR at
    /// all and keeps each listing it reads (FOPEN_CACHE_DIR, its default then) until a change
    /// through the mount or the directory's mtime outdates it, or the daemon says so
    /// (`KernelCache::Listing`): a warm `find` or `du` costs no request per directory. A
    /// read-only mount opens (no handle: listings need no state) without caching, since
    /// another machine may change the lower.
    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.read_only {
            reply.opened(FileHandle(0), FopenFlags::empty());
        } else {
            reply.error(Errno::ENOSYS);
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        match self.fs.readdir(ino.0, offset, |next, e| reply.add(INodeNo(e.ino), next, file_type(e.kind), &e.name)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("readdir", e)),
        }
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let result = self.fs.readdirplus(ino.0, offset, |next, e, attr| {
            reply.add(INodeNo(e.ino), next, &e.name, &self.ttl, &fuse_attr(attr), Generation(self.fs.generation(attr.ino)))
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("readdirplus", e)),
        }
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        empty_reply!(reply, "fsyncdir", self.fs.fsyncdir(ino.0))
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize),
            Err(e) => reply.error(errno("statfs", e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        setxattr_flags: SetXattrFlags,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let kill_sgid = setxattr_flags.contains(SetXattrFlags::FUSE_SETXATTR_ACL_KILL_SGID);
        empty_reply!(reply, "setxattr", self.fs.setxattr(ino.0, name, value, flags, kill_sgid))
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        xattr_reply(reply, size, self.fs.getxattr(ino.0, name, size == 0))
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        xattr_reply(reply, size, self.fs.listxattr(ino.0))
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty_reply!(reply, "removexattr", self.fs.removexattr(ino.0, name))
    }

    fn create(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        self.reply_created(reply, "create", flags, self.fs.create(parent.0, name, mode, flags, creator(req, umask)))
    }

    /// O_TMPFILE (`core/tmpfile.rs`).
    fn tmpfile(&self, req: &Request, parent: INodeNo, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        self.reply_created(reply, "tmpfile", flags, self.fs.tmpfile(parent.0, mode, creator(req, umask)))
    }

    fn fallocate(&self, req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        empty_reply!(reply, "fallocate", self.fs.fallocate(fh.0, offset, length, mode, changer(req, None)))
    }

    /// File attributes (`lsattr`, `chattr`: `core/fileattr.rs`) and FS_IOC_SHUTDOWN; every
    /// other ioctl is not this file system's (ENOTTY, as a local file system answers one it
    /// does not know).
    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        arg: u64,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        match cmd {
            FS_IOC_GETFLAGS => match self.fs.file_flags(ino.0) {
                Ok(flags) => reply.ioctl(0, &flags.to_ne_bytes()),
                Err(e) => reply.error(errno("getflags", e)),
            },
            FS_IOC_SETFLAGS => {
                let Some(flags) = in_data.get(..4) else { return reply.error(Errno::EINVAL) };
                let flags = u32::from_ne_bytes(flags.try_into().expect("4 bytes"));
                match self.fs.set_file_flags(ino.0, flags) {
                    Ok(()) => reply.ioctl(0, &[]),
                    Err(e) => {
                        // chattr prints only the errno: the log says what to do instead.
                        if e.errno == libc::EOPNOTSUPP {
                            tracing::info!("chattr: {e}");
                        }
                        reply.error(errno("setflags", e))
                    }
                }
            }
            FS_IOC_FSGETXATTR => match self.fs.file_xattr_flags(ino.0) {
                Ok(fsx) => reply.ioctl(0, &fsx),
                Err(e) => reply.error(errno("fsgetxattr", e)),
            },
            FS_IOC_FSSETXATTR => {
                let Some(fsx) = in_data.get(..FSXATTR_SIZE) else { return reply.error(Errno::EINVAL) };
                match self.fs.set_file_xattr_flags(ino.0, fsx) {
                    Ok(()) => reply.ioctl(0, &[]),
                    Err(e) => reply.error(errno("fssetxattr", e)),
                }
            }
            FS_IOC_SHUTDOWN => {
                // The kernel passes no data for an `_IOR` number: the flags are read where the
                // caller keeps them.
                let mut flags = [0u8; 4];
                let how = match lower::read_process_memory(req.pid(), arg, &mut flags) {
                    Ok(()) => Shutdown::from_flags(u32::from_ne_bytes(flags)),
                    Err(e) => {
                        tracing::warn!("shutdown: cannot read the caller's flags ({e}): landing everything first");
                        Some(Shutdown::Sync)
                    }
                };
                let Some(how) = how else { return reply.error(Errno::EINVAL) };
                match self.fs.shut_down(how, req.pid()) {
                    Ok(()) => reply.ioctl(0, &[]),
                    Err(e) => reply.error(errno("shutdown", e)),
                }
            }
            _ => reply.error(Errno::ENOTTY),
        }
    }

    fn lseek(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        match self.fs.lseek(fh.0, offset, whence) {
            Ok(off) => reply.offset(off),
            Err(e) => reply.error(errno("lseek", e)),
        }
    }
}

fn xattr_reply(reply: ReplyXattr, size: u32, result: Result<Vec<u8>, FsError>) {
    match result {
        Ok(value) if size == 0 => reply.size(value.len() as u32),
        Ok(value) if value.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(value) => reply.data(&value),
        Err(e) => reply.error(errno("xattr", e)),
    }
}

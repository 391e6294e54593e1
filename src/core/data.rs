//! Regular-file data: open/create, read, write, flush, fsync, release, truncate, fallocate,
//! SEEK_DATA/SEEK_HOLE, and attribute changes that touch contents (size, times).

use super::admission::writable_bytes;
use super::atime::Atime;
use super::container::{Container, ReadBytes};
use super::fileattr::Change;
use super::inodes::{Content, Inode, Node};
use super::lower::{self, cstr};
use super::privileges::Changer;
use super::props::PropertyValues;
use super::usage::{Usage, UsageHold};
use super::{Attr, Caller, DenseFs, FsError, FsResult, Handle};
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

impl Content {
    /// The lower file it reads and writes through.
    pub(super) fn file(&self) -> &Arc<File> {
        match self {
            Content::Container(c) => c.lower_file(),
            Content::Plain(f) => f,
        }
    }

    /// The lower file has no name left (unlinked, reachable only through open handles). Only
    /// a removal of one of `inode`'s names through densefs can do that, so nothing else stats.
    fn nameless(&self, inode: &Inode) -> bool {
        use std::os::unix::fs::MetadataExt;
        inode.lost_a_name.load(Ordering::Relaxed) && self.file().metadata().is_ok_and(|m| m.nlink() == 0)
    }

    /// A handle opens the file for writing: make the lower file writable under every holder.
    pub fn make_writable(&self, path_fd: std::os::fd::RawFd) -> FsResult<()> {
        match self {
            Content::Container(c) => c.make_writable(path_fd),
            Content::Plain(file) => Ok(lower::upgrade_to_write(file, path_fd)?),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum SetTime {
    Now,
    At(SystemTime),
}

/// The attribute changes of one setattr call.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    /// Who asks: a size change drops setuid/setgid (see `write`).
    pub changer: Changer,
}

fn timespec(t: Option<SetTime>) -> libc::timespec {
    match t {
        None => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
        Some(SetTime::Now) => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
        Some(SetTime::At(t)) => {
            let (sec, nsec) = match t.duration_since(UNIX_EPOCH) {
                Ok(d) => (d.as_secs() as i64, d.subsec_nanos() as i64),
                Err(e) => {
                    let d = e.duration();
                    let mut sec = -(d.as_secs() as i64);
                    let mut nsec = d.subsec_nanos() as i64;
                    if nsec > 0 {
                        sec -= 1;
                        nsec = 1_000_000_000 - nsec;
                    }
                    (sec, nsec)
                }
            };
            libc::timespec { tv_sec: sec, tv_nsec: nsec }
        }
    }
}

/// How much of a lower file's start a reader's open reads ahead: the header and first records.
pub(super) const READER_START: u64 = 128 * 1024;

impl DenseFs {
    /// Builds the shared content of a regular file: a container, or the plain lower file.
    /// An empty lower file opened for writing becomes a container (it has nothing to preserve).
    /// Readers open the lower file read-only: reading never writes (a writer's open upgrades it).
    /// `created`: the inode's descriptor is the lower file `create` just opened read-write,
    /// and this is its stat.
    pub(super) fn load_content(&self, inode: &Node, writable: bool, created: Option<libc::stat>) -> FsResult<Content> {
        let content = self.load_content_of(inode, writable, created)?;
        if let Content::Container(c) = &content {
            c.share_free_space(self.memory.free_space_of(inode.lower_id().0));
        }
        Ok(content)
    }

    fn load_content_of(&self, inode: &Node, writable: bool, created: Option<libc::stat>) -> FsResult<Content> {
        let settings = || self.settings_in(self.inodes.parent_of(inode.nodeid).unwrap_or(super::ROOT));
        let file = match created {
            // A new file: nothing to probe (a network lower answers each call a round trip later),
            // and nothing it contributed to the mount's counters yet.
            Some(stat) if stat.st_size == 0 => {
                let mtime = libc::timespec { tv_sec: stat.st_mtime, tv_nsec: stat.st_mtime_nsec };
                let hold = self.usage.track(inode.lower_id(), inode.file(), Usage::default, || self.within_parent_of(inode.nodeid));
                let content = self.new_container(inode.file().clone(), Some(mtime), &settings())?;
                return Ok(Self::with_usage(content, hold));
            }
            Some(_) => inode.file().clone(),
            None => {
                self.read_listed_ahead(inode.nodeid);
                self.content_file(inode, writable)?
            }
        };
        // Measured before a writer's container changes anything (`usage/`).
        let hold =
            writable.then(|| self.usage.track(inode.lower_id(), &file, || Usage::measure(&file), || self.within_parent_of(inode.nodeid)));
        // The properties of the directory the file is in decide how it is written.
        let settings = settings();
        let content = match Container::probe_block(&file).map(|(header, block)| header.map(|h| (h, block))) {
            Ok(Some((header, first_block))) => {
                let c = Container::open(file, header, settings.record_policy(), self.engine.clone(), self.memory.clone(), None, writable)?;
                if !writable {
                    c.keep_first_block(first_block);
                }
                Content::Container(Arc::new(c))
            }
            Ok(None) if writable && file.metadata()?.len() == 0 => {
                let mut settings = settings;
                if let Some(wish) = codec_wish(&file) {
                    settings.compression = wish;
                }
                self.new_container(file, None, &settings)?
            }
            Ok(None) => Content::Plain(file),
            Err(e) => {
                let label = self.label(inode);
                tracing::error!(file = %label, "not a readable densefs container: {e}");
                return Err(FsError::corrupt(format!("{label}: {e}")));
            }
        };
        Ok(match hold {
            Some(hold) => Self::with_usage(content, hold),
            None => content,
        })
    }

    /// A container keeps the file's part in the counters; a plain file is measured around each
    /// change instead (`plain_change`).
    fn with_usage(content: Content, hold: UsageHold) -> Content {
        if let Content::Container(c) = &content {
            c.hold_usage(hold);
        }
        content
    }

    /// Makes a loaded content writable for `inode` (readers may have loaded it): a container
    /// starts counting its changes first.
    pub(super) fn make_content_writable(&self, content: &Content, inode: &Node) -> FsResult<()> {
        if let Content::Container(c) = content {
            if !c.holds_usage() {
                let file = c.lower_file().clone();
                c.hold_usage(self.usage.track(inode.lower_id(), &file, || Usage::measure(&file), || self.within_parent_of(inode.nodeid)));
            }
        }
        content.make_writable(inode.raw_fd())
    }

    /// A change of a plain lower file (not a container) in place: the counters move by what it
    /// changed.
    fn plain_change<T>(&self, inode: &Inode, file: &File, change: impl FnOnce() -> FsResult<T>) -> FsResult<T> {
        let _change = self.usage.begin();
        if !self.usage.known() {
            return change();
        }
        let before = Usage::measure(file);
        let result = change();
        let links = file.metadata().map_or(1, |m| std::os::unix::fs::MetadataExt::nlink(&m));
        self.usage.apply_file(&self.within_parent_of(inode.nodeid), &Usage::measure(file), &before, links);
        result
    }

    /// The lower file a content reads and writes through. The inode's own descriptor serves
    /// where it is open for reading (made writable in place for a writer): a reopen is one more
    /// call on the lower, a round trip on a network one. Else the inode is reopened.
    fn content_file(&self, inode: &Node, writable: bool) -> FsResult<Arc<File>> {
        let file = match (inode.readable_fd().is_some(), writable) {
            (true, true) => {
                lower::upgrade_to_write(inode.file(), inode.raw_fd())?;
                inode.file().clone()
            }
            (true, false) => {
                // Opened for the daemon's header reads (O_NONBLOCK, which a reader's reads must
                // not have); still O_NOATIME: a user's read moves the atime on its own (atime.rs).
                lower::set_noatime(inode.file(), true)?;
                inode.file().clone()
            }
            (false, true) => Arc::new(lower::reopen(inode.raw_fd(), libc::O_RDWR)?),
            (false, false) => Arc::new(lower::reopen_read(inode.raw_fd(), true)?),
        };
        if !writable {
            // A reader reads the header, then the first records: one read of the lower file's
            // start brings both (a small file whole), where two would wait in turn.
            let _ = lower::will_need(&file, 0, READER_START);
        }
        Ok(file)
    }

    /// An empty container on an empty lower file (`empty_since`: as for `Container::create`).
    fn new_container(&self, file: Arc<File>, empty_since: Option<libc::timespec>, settings: &PropertyValues) -> FsResult<Content> {
        let c = Container::create(
            file,
            empty_since,
            Self::create_settings(settings),
            settings.record_policy(),
            self.engine.clone(),
            self.memory.clone(),
            None,
        )?;
        Ok(Content::Container(Arc::new(c)))
    }

    /// `created`: as for `load_content`.
    pub(super) fn open_inode(&self, inode: &Node, writable: bool, created: Option<libc::stat>) -> FsResult<u64> {
        let mut open = inode.open.lock();
        let content = match &open.content {
            Some(c) => {
                if writable {
                    self.make_content_writable(c, inode)?;
                }
                c.clone()
            }
            None => {
                let c = self.load_content(inode, writable, created)?;
                open.content = Some(c.clone());
                c
            }
        };
        self.inodes.share(inode, content.file());
        open.handles += 1;
        open.opens += 1;
        Ok(self.new_handle(Handle {
            inode: inode.inode.clone(),
            content,
            writable,
            atime_moved: Default::default(),
            closing: Default::default(),
        }))
    }

    /// Whether a read through an open of `nodeid` now may move its access time: the open then
    /// drops the kernel's cached pages, so that the read reaches the daemon (atime.rs).
    pub fn read_may_move_atime(&self, nodeid: u64) -> bool {
        match self.atime.mode() {
            Atime::Never => false,
            Atime::Strict => true,
            Atime::Relative => self.inode(nodeid).ok().and_then(|inode| lower::stat_fd(inode.raw_fd()).ok()).is_none_or(|st| {
                let now = std::time::SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
                self.atime.read_may_move(&st, now)
            }),
        }
    }

    /// `changer`: for an O_TRUNC open, as for `write`. The kernel has checked that the caller
    /// may write the file: Linux truncates on `O_RDONLY|O_TRUNC` too.
    pub fn open(&self, nodeid: u64, flags: i32, changer: Changer) -> FsResult<u64> {
        let inode = self.inode(nodeid)?;
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        if writable || flags & libc::O_TRUNC != 0 {
            let appends = flags & libc::O_APPEND != 0 && flags & libc::O_TRUNC == 0;
            self.check_protection(&inode, if appends { Change::Append } else { Change::Contents })?;
        }
        let fh = self.open_inode(&inode, writable, None)?;
        if flags & libc::O_TRUNC != 0 {
            let truncated = (|| {
                self.kill_privileges(&inode, &changer)?;
                self.with_content(&inode, |content| self.truncate_content(&inode, content, 0))
            })();
            if let Err(e) = truncated {
                self.release(fh);
                return Err(e);
            }
        }
        Ok(fh)
    }

    pub fn create(&self, parent: u64, name: &OsStr, mode: u32, flags: i32, caller: Caller) -> FsResult<(Attr, u64)> {
        if super::props::is_reserved_name(name) {
            return Err(FsError::new(libc::EPERM, "name reserved by densefs"));
        }
        let dir = self.inode(parent)?;
        let c = cstr(name)?;
        // O_NOATIME: the daemon's own reads of the new file (records it rewrites, later header
        // reads through this descriptor) leave its access time alone; a reader's turn it off.
        let lower_flags = libc::O_CREAT | libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOATIME | (flags & libc::O_EXCL);
        let open = |flags: i32| {
            lower::with_umask(caller.umask, || match lower::openat(dir.raw_fd(), &c, flags, mode) {
                // An existing file the daemon does not own (O_CREAT without O_EXCL, daemon not root).
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => lower::openat(dir.raw_fd(), &c, flags & !libc::O_NOATIME, mode),
                other => other,
            })
        };
        // O_EXCL first: a file the lower makes now is new, and contributed nothing to the
        // mount's counters yet; one that was there is opened as O_CREAT alone opens it.
        let (created, new_file) = match open(lower_flags | libc::O_EXCL) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && flags & libc::O_EXCL == 0 => (open(lower_flags), false),
            other => (other, true),
        };
        let created = Arc::new(created?);
        self.give_to_caller(&dir, caller, |uid, gid| lower::fchown(&created, uid, gid))?;
        // The descriptor just opened is the inode's and serves its content: no lookup by name,
        // no second open (each a round trip on a network lower).
        let before = self.written_back_count();
        let stat = lower::stat_fd(created.as_raw_fd())?;
        let nodeid = self.inodes.remember_created(parent, name, &created, &stat).nodeid;
        let inode = match self.inode(nodeid) {
            Ok(inode) => inode,
            Err(e) => {
                self.forget(nodeid, 1);
                return Err(e);
            }
        };
        // A new file has no capabilities (none are inherited); the kernel asks before it writes.
        inode.no_capability.store(lower_flags & libc::O_EXCL != 0, Ordering::Relaxed);
        // Unless the table already knew the inode (O_CREAT of an existing file) and kept its own.
        let fresh = (new_file && Arc::ptr_eq(inode.file(), &created)).then_some(stat);
        drop(created);
        let fh = match self.open_inode(&inode, true, fresh) {
            Ok(fh) => fh,
            Err(e) => {
                self.forget(nodeid, 1);
                return Err(e);
            }
        };
        if flags & libc::O_TRUNC != 0 {
            if let Err(e) = self.truncate_content(&inode, &self.file_content(fh)?, 0) {
                self.release(fh);
                self.forget(nodeid, 1);
                return Err(e);
            }
        }
        let attr = match fresh {
            // Nothing has changed on the lower since that stat.
            Some(stat) if stat.st_size == 0 => self.attr_with(&inode, &stat, before)?,
            _ => self.attr_of(&inode)?,
        };
        Ok((attr, fh))
    }

    fn file_content(&self, fh: u64) -> FsResult<Content> {
        Ok(self.handle(fh)?.content.clone())
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<ReadBytes> {
        let handle = self.handle(fh)?;
        self.user_io();
        // strictatime: every read; relatime: the first of each open may (atime.rs).
        if self.atime.mode() == Atime::Strict || !handle.atime_moved.swap(true, Ordering::Relaxed) {
            self.atime.read(handle.content.file().as_raw_fd(), handle.inode.lower_id().0);
        }
        match handle.content.clone() {
            Content::Container(c) => c.read(offset, size as usize),
            Content::Plain(file) => {
                let mut buf = vec![0u8; size as usize];
                let n = lower::pread_full(&file, &mut buf, offset)?;
                buf.truncate(n);
                Ok(ReadBytes::owned(buf))
            }
        }
    }

    /// As on a local file system, the file loses setuid and setgid as `changer` may take them
    /// (`privileges.rs`). Under FUSE_HANDLE_KILLPRIV_V2 the kernel leaves this to the daemon
    /// and asks for security.capability once per inode instead of before every write (it still
    /// removes capabilities itself).
    pub fn write(&self, fh: u64, offset: u64, data: &[u8], changer: Changer) -> FsResult<usize> {
        let handle = self.handle(fh)?;
        self.user_io();
        let Handle { inode, content, .. } = &*handle;
        // Opened before `chattr +i`: refused, as ext4 checks at each write (and, as ext4, a
        // descriptor opened before `chattr +a` goes on writing where it likes).
        self.check_protection(inode, Change::Append)?;
        let killed = changer.fsetid == Some(false) && self.kill_privileges(&self.inode(inode.nodeid)?, &changer)?;
        let written = match content {
            Content::Container(c) => c.write(offset, data)?,
            Content::Plain(file) => self.plain_change(inode, file, || {
                file.write_all_at(data, offset)?;
                Ok(data.len())
            })?,
        };
        if killed {
            self.kernel_attrs_stale(inode); // the mode changed
        } else {
            // The kernel drops the file's size, times and blocks itself once a write is answered.
            inode.kernel_has_attrs.store(false, Ordering::SeqCst);
        }
        Ok(written)
    }

    /// close(2) of one handle: lands what is in memory (errors show here). A reader's close has
    /// nothing of its own to land, and must neither wait for writers' data nor take their
    /// write-back error (the FUSE adapter asks the kernel not to send it at all).
    pub fn flush(&self, fh: u64) -> FsResult<()> {
        let handle = self.handle(fh)?;
        handle.closing.store(true, std::sync::atomic::Ordering::Relaxed);
        match &*handle {
            // Unlinked: nobody can open it again, so its data is not landed (the handles still
            // open read it from memory, and the last close lets it go).
            Handle { inode, content, .. } if content.nameless(inode) => Ok(()),
            Handle { inode, content: Content::Container(c), writable: true, .. } => {
                c.flush()?;
                // The only handle: its close leaves the file as it is now, so its size hint goes
                // on while close(2) waits (the RELEASE after it is not waited for).
                if inode.open.lock().handles == 1 {
                    self.record_size_hint(c);
                }
                self.publish_lower_changes(inode, c);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    pub fn fsync(&self, fh: u64, datasync: bool) -> FsResult<()> {
        let handle = self.handle(fh)?;
        match &*handle {
            Handle { inode, content: Content::Container(c), .. } => {
                c.fsync(datasync)?;
                self.publish_lower_changes(inode, c);
                Ok(())
            }
            Handle { content: Content::Plain(file), .. } => Ok(if datasync { lower::fdatasync(file) } else { lower::fsync(file) }?),
        }
    }

    /// Last reference to a handle. When the file's last handle goes, its content is flushed and,
    /// if records were rewritten, synced so their old copies can be freed.
    pub fn release(&self, fh: u64) {
        self.releasing.fetch_add(1, Ordering::SeqCst);
        self.release_handle(fh);
        self.releasing.fetch_sub(1, Ordering::SeqCst);
        // The kernel may have forgotten the inode while this held its lock.
        self.inodes.retry_deferred_forgets();
    }

    fn release_handle(&self, fh: u64) {
        let Some(handle) = self.handles.lock().remove(&fh) else { return };
        let inode = &handle.inode;
        let mut open = inode.open.lock();
        open.handles = open.handles.saturating_sub(1);
        if open.handles > 0 {
            return;
        }
        if open.content.as_ref().is_some_and(|c| c.nameless(inode)) {
            // Unlinked while open: nobody can read it again, so nothing is written back and
            // its space comes back when its descriptor is closed, at the kernel's FORGET.
            open.content = None;
            return;
        }
        let Some(content) = open.content.take() else { return };
        let file = content.file().clone();
        // The background pass had it before this open: it keeps it, and lets go of it.
        let loaned = open.background.then(|| content.clone());
        if let Content::Container(c) = content {
            // Records fsyncs landed uncompressed or with lz4 get the file's codec now; their
            // interim copies are freed by the sync. A record that cannot be read again just
            // stays as it is.
            let settled = c.settle_interim(true).unwrap_or_else(|e| {
                tracing::warn!(inode = inode.nodeid, "re-encoding records an fsync landed: {e}");
                true
            });
            let result = if settled || c.has_stale() { c.sync(true) } else { c.flush() };
            if let Err(e) = result {
                // Keep the data in memory (readable, retried by background writeback).
                tracing::error!(inode = inode.nodeid, "writing back at close failed; the data stays in memory and is retried: {e}");
                open.content = Some(Content::Container(c));
                return;
            }
            self.record_size_hint(&c);
            if c.take_lower_changed() {
                self.lower_changed(inode, &mut open);
            } else {
                self.note_written_back(&mut open);
            }
            if c.wrote() {
                self.queue_background(inode, &c);
            }
        }
        if loaned.is_some() {
            open.content = loaned;
            return;
        }
        // The descriptor stays the inode's (`InodeTable::share`) and from now on serves the
        // daemon's own header reads, which leave the access time alone.
        let _ = lower::set_noatime(&file, true);
    }

    /// After an unlink or a rename over it (`last_name`: the lower file had one name before): a
    /// file no name reaches any more and no handle has open lets go of what it kept in memory
    /// (data a full disk refused at close), so its lower file is closed and its space comes back
    /// at once, and its node is retired: the lower may give its number to the next file it
    /// creates, which must never be reached through this node.
    pub(super) fn let_go_if_unlinked(&self, dev: u64, ino: u64, last_name: bool) {
        let Some(inode) = self.inodes.find(dev, ino) else { return };
        inode.lost_a_name.store(true, Ordering::Relaxed);
        let mut open = inode.open.lock();
        if last_name {
            // Its blocks come back when its descriptor closes: at once below where no handle has
            // it open, else after the RELEASE of its last handle and the kernel's FORGET (a
            // close(2) does not wait for them).
            self.inodes.deleted_but_held(&inode);
        }
        if open.handles > 0 || !(last_name || open.content.as_ref().is_some_and(|c| c.nameless(&inode))) {
            return;
        }
        if open.content.take().is_some() && !open.background {
            tracing::info!(inode = inode.nodeid, "unlinked: data kept in memory after a failed close is dropped");
        }
        drop(open);
        self.inodes.retire(&inode);
        self.inodes.forget(inode.nodeid, 0);
    }

    /// Runs `f` on the file's content, opening it just for the call if no handle has it open.
    fn with_content<T>(&self, inode: &Node, f: impl FnOnce(&Content) -> FsResult<T>) -> FsResult<T> {
        let mut open = inode.open.lock();
        if let Some(c) = open.content.clone() {
            self.make_content_writable(&c, inode)?;
            drop(open);
            return f(&c);
        }
        let content = self.load_content(inode, true, None)?;
        let result = f(&content);
        let flushed = match &content {
            Content::Container(c) => c.flush().inspect(|()| self.record_size_hint(c)),
            Content::Plain(_) => Ok(()),
        };
        match &content {
            Content::Container(c) if c.take_lower_changed() => self.lower_changed(&inode.inode, &mut open),
            _ => self.note_written_back(&mut open),
        }
        drop(open);
        flushed?;
        result
    }

    fn truncate_content(&self, inode: &Inode, content: &Content, size: u64) -> FsResult<()> {
        match content {
            Content::Container(c) => c.set_size(size),
            Content::Plain(file) => self.plain_change(inode, file, || Ok(lower::set_len(file, size)?)),
        }
    }

    pub fn setattr(&self, nodeid: u64, fh: Option<u64>, set: SetAttr) -> FsResult<Attr> {
        let inode = self.inode(nodeid)?;
        let sets_time = [set.atime, set.mtime].iter().flatten().any(|t| matches!(t, SetTime::At(_)));
        let change = if set.size.is_some() {
            Some(Change::Contents)
        } else if set.mode.is_some() || set.uid.is_some() || set.gid.is_some() || sets_time {
            Some(Change::Metadata)
        } else if set.atime.is_some() || set.mtime.is_some() {
            Some(Change::Touch)
        } else {
            None
        };
        if let Some(change) = change {
            self.check_protection(&inode, change)?;
        }
        // Through the node's descriptor when it is a real one (not O_PATH): fchmod and futimens
        // skip resolving /proc/self/fd/N, about 3 µs a call (tar and cp -p make both per file).
        let descriptor = inode.readable_fd().is_some();
        let path = lower::proc_path(inode.raw_fd());
        if let Some(mode) = set.mode {
            if descriptor {
                lower::fchmod(inode.file(), mode & 0o7777)?;
            } else {
                lower::chmod(&path, mode & 0o7777)?;
            }
        }
        if set.uid.is_some() || set.gid.is_some() {
            let uid = set.uid.unwrap_or(u32::MAX);
            let gid = set.gid.unwrap_or(u32::MAX);
            lower::fchownat(inode.raw_fd(), c"", uid, gid, libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW)?;
        }
        if let Some(size) = set.size {
            self.kill_privileges(&inode, &set.changer)?;
            match fh.and_then(|fh| self.file_content(fh).ok()) {
                Some(content) => self.truncate_content(&inode, &content, size)?,
                None => self.with_content(&inode, |content| self.truncate_content(&inode, content, size))?,
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let times = [timespec(set.atime), timespec(set.mtime)];
            let set_times = || -> FsResult<libc::stat> {
                if descriptor {
                    lower::futimens(inode.file(), &times)?;
                } else {
                    lower::utimensat(libc::AT_FDCWD, &path, &times, 0)?;
                }
                Ok(lower::stat_fd(inode.raw_fd())?)
            };
            let before = self.written_back_count();
            let st = match inode.open_content() {
                Some(Content::Container(c)) => {
                    if set.mtime.is_some() {
                        // tar and cp -p set the times of a file just written as they close it:
                        // its size hint goes on now, before the stat this reply is made of, and
                        // the close finds nothing left to change on the lower (nor the kernel
                        // anything to drop).
                        c.flush_data()?;
                        self.record_size_hint(&c);
                    }
                    c.set_times(set.mtime.is_some(), set_times)?
                }
                _ => set_times()?,
            };
            self.lower_changes_told_by_reply(&inode);
            return self.attr_with(&inode, &st, before);
        }
        self.lower_changes_told_by_reply(&inode);
        self.attr_of(&inode)
    }

    /// A SETATTR's reply replaces the attributes the kernel holds of the file, so the daemon's
    /// own writes so far (the landing a utimensat waits for, tar's or `cp -p`'s before their
    /// close) are told by it and need no notice at the close. Called before the reply's stat
    /// (`attr_with` takes an earlier one again).
    fn lower_changes_told_by_reply(&self, inode: &Node) {
        let mut open = inode.open.lock();
        if let Some(Content::Container(c)) = &open.content {
            if c.take_lower_changed() {
                self.note_written_back(&mut open);
            }
        }
    }

    /// Every mode served drops setuid/setgid as a write does, before it changes anything (as
    /// ext4 does).
    pub fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32, changer: Changer) -> FsResult<()> {
        let end = offset.checked_add(len).ok_or(FsError::errno(libc::EFBIG))?;
        let handle = self.handle(fh)?;
        self.check_protection(&handle.inode, if mode & !libc::FALLOC_FL_KEEP_SIZE == 0 { Change::Append } else { Change::Contents })?;
        let served = matches!(handle.content, Content::Plain(_)) || container_serves(mode);
        if served && self.kill_privileges(&self.inode(handle.inode.nodeid)?, &changer)? {
            self.kernel_attrs_stale(&handle.inode);
        }
        match handle.content.clone() {
            Content::Plain(file) => self.plain_change(&handle.inode, &file, || Ok(lower::fallocate(&file, mode, offset, len)?)),
            Content::Container(c) => {
                if !container_serves(mode) {
                    return Err(FsError::errno(libc::EOPNOTSUPP));
                }
                let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
                match mode & !libc::FALLOC_FL_KEEP_SIZE {
                    // Space cannot be promised for data whose compressed size is unknown: the
                    // size changes, the bytes read as zeros, nothing is reserved. As OpenZFS
                    // does (also unable to reserve), a request the lower plainly has no room
                    // for fails now, rather than the writes that follow.
                    0 => {
                        let growth = end.saturating_sub(offset.max(c.size()));
                        // What the lower has, less what writes already acknowledged need.
                        let sv = lower::fstatvfs(c.lower_file().as_raw_fd())?;
                        if let Some(free) = writable_bytes(&sv) {
                            let avail = free.saturating_sub(self.memory.admission().unlanded());
                            if growth > avail - avail / 8 {
                                return Err(FsError::errno(libc::ENOSPC));
                            }
                        }
                        c.changed_by_user()
                    }
                    // A hole punched (keeping the size) or a range zeroed.
                    _ => c.zero_range(offset, len)?,
                }
                if !keep_size && end > c.size() {
                    c.set_size(end)?;
                }
                Ok(())
            }
        }
    }

    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> FsResult<i64> {
        if offset < 0 {
            return Err(FsError::errno(libc::ENXIO));
        }
        match self.file_content(fh)? {
            Content::Container(c) => match whence {
                libc::SEEK_DATA => Ok(c.seek(offset as u64, true)? as i64),
                libc::SEEK_HOLE => Ok(c.seek(offset as u64, false)? as i64),
                _ => Err(FsError::errno(libc::EINVAL)),
            },
            Content::Plain(file) => Ok(lower::lseek(&file, offset, whence)?),
        }
    }
}

/// The fallocate modes a container serves: allocation (a size, nothing reserved), a range
/// zeroed, and a hole punched keeping the size (all else answers EOPNOTSUPP).
fn container_serves(mode: i32) -> bool {
    match mode & !libc::FALLOC_FL_KEEP_SIZE {
        0 | libc::FALLOC_FL_ZERO_RANGE => true,
        libc::FALLOC_FL_PUNCH_HOLE => mode & libc::FALLOC_FL_KEEP_SIZE != 0,
        _ => false,
    }
}

fn codec_wish_name() -> std::ffi::CString {
    std::ffi::CString::new(crate::format::CODEC_WISH_XATTR).expect("no NUL in the name")
}

/// The codec `chattr +c`/`+m` asked of the empty lower file `file` (`fileattr.rs`), if any.
pub(super) fn codec_wish(file: &File) -> Option<crate::codec::Setting> {
    let mut buf = [0u8; 32];
    let n = lower::getxattr_on(lower::XattrOn::Fd(std::os::fd::AsFd::as_fd(file)), &codec_wish_name(), &mut buf).ok()?;
    crate::codec::Setting::parse(std::str::from_utf8(&buf[..n]).ok()?).ok()
}

/// Keeps `setting` as the codec of the empty lower file `file`'s first write (`codec_wish`).
pub(super) fn set_codec_wish(file: &File, setting: crate::codec::Setting) -> FsResult<()> {
    Ok(lower::fsetxattr(file, &codec_wish_name(), setting.to_string().as_bytes(), 0)?)
}

//! Names: lookup, create and remove directory entries, links, renames, directory listings.

use super::inodes::Node;
use super::lower::{self, cstr};
use super::usage::{Usage, Within};
use super::{Attr, Caller, DenseFs, DirEntry, FsError, FsResult, Kind};
use crate::format::hints::SizeHint;
use crate::format::layout::HEADER_BLOCK;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::ffi::{CStr, OsStr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Names densefs keeps in the lower tree (its property file) do not exist through the mount.
fn hidden(name: &OsStr, errno: i32) -> FsResult<()> {
    if super::props::is_reserved_name(name) {
        Err(FsError::new(errno, "name reserved by densefs"))
    } else {
        Ok(())
    }
}

/// How many entries READDIRPLUS reads from the lower directory at a time, starting the header
/// reads of the regular files among them together (about a reply's worth: the kernel asks a
/// page at a time, some 25 entries with attributes).
const HEADERS_AHEAD: usize = 32;

/// A listing of a lower directory from a position on, for one request: densefs keeps no open
/// directory between a directory's READDIRs. Positions are the lower file system's own (d_off,
/// as NFS exports them), so concurrent and restarted listings each see every entry that stays
/// in the directory exactly once, and the kernel needs no OPENDIR to list (a writable mount
/// answers it ENOSYS, `fuse.rs`). A listing read further than its reply took is parked in
/// [`Cursors`], so the request that continues it goes on reading the same stream.
struct Listing {
    nodeid: u64,
    /// Entries read from the stream but not handed out, in order.
    pending: VecDeque<(u64, DirEntry)>,
    stream: lower::DirStream,
    /// The position after the last entry handed out.
    position: u64,
}

/// Files listings looked up without reading their headers (a trusted size hint answered),
/// in the order listed, across directories: a program that opens them next in that order
/// (`find | xargs cat`, `tar c`, a backup) gets their starts (header and first records, what a
/// reader's open reads ahead) read a batch ahead of its opens (`DenseFs::read_listed_ahead`),
/// where the listings used to read their headers one by one; a listing alone (`ls -l`, `du`)
/// reads none. The order spans directories because most hold a few files: ahead of
/// the last files of one directory lie the first of the next one listed.
#[derive(Default)]
pub struct Listed(Mutex<ListedOrder>);

#[derive(Default)]
struct ListedOrder {
    /// Node ids in listing order; `files[i]` has position `first + i`.
    files: VecDeque<u64>,
    first: u64,
    /// Each file's latest position.
    at: HashMap<u64, u64>,
    /// Positions below this had their headers asked for.
    ahead: u64,
}

/// Files remembered (8 bytes each, twice): a `find | xargs cat` opens files while `find`
/// lists further on.
const LISTED_FILES: usize = 1 << 16;
/// How many files' starts an open asks for ahead of it (once fewer than half are).
const LISTED_AHEAD: u64 = 64;

impl Listed {
    fn push(&self, file: u64) {
        let mut l = self.0.lock();
        let position = l.first + l.files.len() as u64;
        l.files.push_back(file);
        l.at.insert(file, position);
        if l.files.len() > LISTED_FILES {
            let oldest = l.files.pop_front().expect("not empty");
            let first = l.first;
            if l.at.get(&oldest) == Some(&first) {
                l.at.remove(&oldest);
            }
            l.first += 1;
        }
    }

    /// `file` is being opened: the files listed after it whose starts to ask for now.
    fn ahead_of(&self, file: u64) -> Vec<u64> {
        let mut l = self.0.lock();
        let Some(&at) = l.at.get(&file) else { return Vec::new() };
        if at + LISTED_AHEAD / 2 < l.ahead && at + LISTED_AHEAD * 2 > l.ahead {
            return Vec::new(); // enough asked for ahead of it already
        }
        let start = if l.ahead > at + 1 && l.ahead < at + LISTED_AHEAD { l.ahead } else { at + 1 };
        let end = (at + 1 + LISTED_AHEAD).min(l.first + l.files.len() as u64);
        l.ahead = end;
        (start..end).filter_map(|p| l.files.get((p - l.first) as usize).copied()).collect()
    }
}

/// Parked listings, at most [`CURSORS`] (each holds a descriptor of the lower directory).
#[derive(Default)]
pub struct Cursors(Mutex<VecDeque<Listing>>);

/// Listings parked between requests: one per directory being listed at once is plenty.
const CURSORS: usize = 16;

impl Cursors {
    /// The listing of `dir` that stopped at `position`, or a new one opened there.
    fn take(&self, dir: &Node, position: u64) -> FsResult<Listing> {
        let nodeid = dir.nodeid;
        let parked = {
            let mut parked = self.0.lock();
            parked.iter().position(|l| l.nodeid == nodeid && l.position == position).and_then(|i| parked.remove(i))
        };
        if let Some(listing) = parked {
            // Still this directory: one removed since has no links, and its inode number (so
            // a node id) may be a new directory's by now, whose positions can be the same.
            let st = lower::stat_fd(listing.stream.fd())?;
            if st.st_nlink > 0 && (st.st_dev, st.st_ino) == dir.lower_id() {
                return Ok(listing);
            }
        }
        let fd = lower::reopen_dir(dir.raw_fd())?;
        let mut stream = lower::DirStream::new(fd.into())?;
        if position != 0 {
            stream.seek(position);
        }
        Ok(Listing { nodeid, pending: VecDeque::new(), stream, position })
    }

    /// Keeps `listing` for the request that continues it; the oldest parked one goes if full.
    fn park(&self, listing: Listing) {
        let mut parked = self.0.lock();
        parked.retain(|l| l.nodeid != listing.nodeid || l.position != listing.position);
        if parked.len() >= CURSORS {
            parked.pop_front();
        }
        parked.push_back(listing);
    }
}

impl Listing {
    /// The next entry and the position after it; names densefs reserves are left out.
    fn next(&mut self) -> Option<(u64, DirEntry)> {
        if let Some(entry) = self.pending.pop_front() {
            return Some(entry);
        }
        loop {
            let ent = self.stream.next_entry()?;
            let name = OsStr::from_bytes(ent.name).to_os_string();
            if super::props::is_reserved_name(&name) {
                continue;
            }
            let kind = match ent.kind {
                libc::DT_DIR => Kind::Dir,
                libc::DT_LNK => Kind::Symlink,
                libc::DT_FIFO => Kind::Fifo,
                libc::DT_SOCK => Kind::Socket,
                libc::DT_CHR => Kind::CharDevice,
                libc::DT_BLK => Kind::BlockDevice,
                _ => Kind::File,
            };
            // "." and ".." carry the directory's own number, as they always did here.
            let ino = if name == "." || name == ".." { self.nodeid } else { ent.ino };
            return Some((ent.next, DirEntry { ino, kind, name, surely_regular: ent.kind == libc::DT_REG }));
        }
    }

    /// An entry was handed out: the listing now stands at `next`, after it.
    fn handed_out(&mut self, next: u64) {
        self.position = next;
    }

    /// Entries read but not handed out (in order) go back, to come first next time.
    fn put_back(&mut self, entries: impl DoubleEndedIterator<Item = (u64, DirEntry)>) {
        for entry in entries.rev() {
            self.pending.push_front(entry);
        }
    }
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
        opened: Option<(OwnedFd, libc::stat, Option<SizeHint>)>,
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
        let (readable, listed_hint) = match opened {
            Some((fd, st, hint)) => (Some((fd, st)), hint),
            None if surely_regular => (
                lower::open_readable(dir.raw_fd(), name).ok().map(|fd| lower::stat_fd(fd.as_raw_fd()).map(|st| (fd, st))).transpose()?,
                None,
            ),
            None => (None, None),
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
        if let Some(hint) = listed_hint {
            self.keep_listed_size(&inode, &st, &hint);
        }
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
        let _change = self.usage.begin();
        lower::with_umask(caller.umask, || lower::mkdirat(dir.raw_fd(), &c, mode))?;
        self.usage.apply(&self.within(parent), &Usage::directory(), &Usage::default());
        self.adopt(parent, name, caller)
    }

    pub fn mknod(&self, parent: u64, name: &OsStr, mode: u32, rdev: u32, caller: Caller) -> FsResult<Attr> {
        hidden(name, libc::EPERM)?;
        let dir = self.inode(parent)?;
        let c = cstr(name)?;
        let _change = self.usage.begin();
        lower::with_umask(caller.umask, || lower::mknodat(dir.raw_fd(), &c, mode, u64::from(rdev)))?;
        if mode & libc::S_IFMT == libc::S_IFREG {
            // A new empty plain file.
            let blocks = lower::stat_at(dir.raw_fd(), name).map_or(0, |st| st.st_blocks as u64);
            let stats = crate::inspect::FileStats { physical: blocks * 512, ..Default::default() };
            self.usage.apply(&self.within(parent), &Usage::of_file(&stats), &Usage::default());
        }
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
        let st = lower::entry_stat_at(dir.raw_fd(), &c);
        if let Some(st) = st.as_ref().filter(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG) {
            self.protected.check_entry(dir.raw_fd(), &c, st.st_ino)?;
        }
        let unlinked = st.as_ref().map(lower::id_and_links);
        let _change = self.usage.begin();
        let leaving = self.leaving_counters(dir.raw_fd(), &c, st, self.within(parent));
        lower::unlinkat(dir.raw_fd(), &c, 0)?;
        self.left_counters(leaving);
        if let Some((dev, ino, links)) = unlinked {
            self.let_go_if_unlinked(dev, ino, links <= 1);
        }
        Ok(())
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        let dir = self.inode(parent)?;
        let c = cstr(name)?;
        let _change = self.usage.begin();
        let removed = lower::id_at(dir.raw_fd(), &c);
        lower::unlinkat(dir.raw_fd(), &c, libc::AT_REMOVEDIR)?;
        self.usage.apply(&self.within(parent), &Usage::default(), &Usage::directory());
        if let Some(id) = removed {
            // Had it properties, it was a dataset: a directory made later may get its number.
            self.usage.forget_datasets(&Some(std::sync::Arc::from([id])));
        }
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
        let _change = self.usage.begin();
        let moving_st = lower::entry_stat_at(from.raw_fd(), &a);
        let moving = moving_st.as_ref().map(|st| (st.st_dev, st.st_ino));
        let displaced_st = lower::entry_stat_at(to.raw_fd(), &b);
        if let Some((_, ino)) = moving {
            self.protected.check_entry(from.raw_fd(), &a, ino)?;
        }
        if let Some(st) = displaced_st.as_ref().filter(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG) {
            self.protected.check_entry(to.raw_fd(), &b, st.st_ino)?;
        }
        let displaced = displaced_st.as_ref().map(lower::id_and_links);
        let replaced = displaced_st.filter(|st| flags & libc::RENAME_EXCHANGE == 0 && moving != Some((st.st_dev, st.st_ino)));
        let (from_within, to_within) = (self.within(parent), self.within(new_parent));
        let leaving = self.leaving_counters(to.raw_fd(), &b, replaced, to_within.clone());
        lower::renameat2(from.raw_fd(), &a, to.raw_fd(), &b, flags)?;
        // A walk counting meanwhile may have met what moved twice or not at all.
        self.usage.changed();
        self.left_counters(leaving);
        if from_within.as_deref() != to_within.as_deref() {
            match moving_st {
                // A file of one name: what it contributes moves between the datasets.
                Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_nlink <= 1 && flags & libc::RENAME_EXCHANGE == 0 => {
                    let measure = || {
                        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
                        lower::openat(to.raw_fd(), &b, flags, 0).map(Usage::measure_owned).unwrap_or_default()
                    };
                    self.usage.moved_file((st.st_dev, st.st_ino), &from_within, &to_within, measure);
                }
                // A directory's subtree, a hard-linked file, an exchange: not followed.
                Some(_) => self.usage.forget_datasets_between(&from_within, &to_within),
                None => {}
            }
        }
        // Keep the inode table's idea of where things live (it reopens evicted inodes by name).
        if let Some((dev, ino)) = moving {
            self.inodes.moved(dev, ino, new_parent, new_name);
        }
        if let Some((dev, ino, links)) = displaced {
            if flags & libc::RENAME_EXCHANGE != 0 {
                self.inodes.moved(dev, ino, parent, name);
            } else if moving != Some((dev, ino)) {
                self.let_go_if_unlinked(dev, ino, links <= 1);
            }
        }
        Ok(())
    }

    /// What the entry `name` in `dir` (`st`: its lower status) takes from the mount's
    /// counters when it goes: a directory, or a regular file's last name (held open by the
    /// returned descriptor, to be measured once it went).
    fn leaving_counters(&self, dir: RawFd, name: &CStr, st: Option<libc::stat>, within: Within) -> Option<Leaving> {
        let st = st?;
        let (dev, ino, links) = lower::id_and_links(&st);
        if !self.usage.known() {
            // A walk counting meanwhile must not be taken (`Accounting::adopt_walk`).
            self.usage.changed();
            return None;
        }
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => Some(Leaving::Directory(within)),
            libc::S_IFREG if links <= 1 => {
                // Opened even where a container tracks it: that one may go before the unlink ends.
                let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NOATIME | libc::O_NONBLOCK | libc::O_CLOEXEC;
                let file = lower::openat(dir, name, flags, 0).or_else(|_| lower::openat(dir, name, flags & !libc::O_NOATIME, 0)).ok();
                // Measured on another thread: a small file's blocks are few to wait for.
                Some(Leaving::File((dev, ino), file, st.st_size <= MEASURE_LATER_BELOW, within))
            }
            // One name of a hard-linked file: the datasets that held no other lose it.
            libc::S_IFREG => Some(Leaving::Name(within)),
            _ => None,
        }
    }

    fn left_counters(&self, leaving: Option<Leaving>) {
        match leaving {
            Some(Leaving::Directory(within)) => self.usage.apply(&within, &Usage::default(), &Usage::directory()),
            Some(Leaving::File(key, file, later, within)) => self.usage.remove_leaving(key, file, later, within),
            Some(Leaving::Name(within)) => self.usage.forget_datasets(&within),
            None => {}
        }
    }

    pub fn link(&self, nodeid: u64, new_parent: u64, new_name: &OsStr) -> FsResult<Attr> {
        hidden(new_name, libc::EPERM)?;
        let inode = self.inode(nodeid)?;
        self.check_protection(&inode, super::fileattr::Change::Name)?;
        let dir = self.inode(new_parent)?;
        let c = cstr(new_name)?;
        let src = lower::proc_path(inode.raw_fd());
        let _change = self.usage.begin();
        let links_before = lower::stat_fd(inode.raw_fd())?.st_nlink;
        lower::linkat(libc::AT_FDCWD, &src, dir.raw_fd(), &c, libc::AT_SYMLINK_FOLLOW)?;
        self.usage.changed();
        let (from, to) = (self.within_parent_of(nodeid), self.within(new_parent));
        if links_before == 0 {
            // An O_TMPFILE file's first name: it counts from its container's next measure on,
            // in the datasets of that name.
            self.usage.moved_file(inode.lower_id(), &from, &to, Usage::default);
        } else if links_before == 1 {
            // The datasets of the new name that did not hold the old one walk again.
            self.usage.forget_datasets_gained(&from, &to);
        } else {
            // Which datasets hold its other names is not known.
            self.usage.forget_datasets(&to);
        }
        self.lookup(new_parent, new_name)
    }

    /// Entries of directory `nodeid` from lower position `offset` (0: the start), each with
    /// the position after it, handed to `emit` until it answers that the reply is full.
    /// Each entry shows the inode number `stat` shows: the node id a lookup gives it.
    pub fn readdir(&self, nodeid: u64, offset: u64, mut emit: impl FnMut(u64, &DirEntry) -> bool) -> FsResult<()> {
        let dir = self.inode(nodeid)?;
        let dev = dir.lower_id().0;
        let mut listing = self.cursors.take(&dir, offset)?;
        while let Some((next, mut entry)) = listing.next() {
            let lower_ino = entry.ino;
            entry.ino = self.inodes.listed_id(dev, lower_ino);
            if emit(next, &entry) {
                entry.ino = lower_ino;
                listing.put_back(std::iter::once((next, entry)));
                self.cursors.park(listing);
                break;
            }
            listing.handed_out(next);
        }
        Ok(())
    }

    /// READDIRPLUS: as `readdir`, each entry with its attributes. The kernel takes a reference
    /// (a lookup it will forget) on every entry it receives except "." and "..", so each other
    /// entry is looked up here, and the one `emit` could not take is forgotten again. An entry
    /// gone since it was read is left out.
    pub fn readdirplus(&self, nodeid: u64, offset: u64, mut emit: impl FnMut(u64, &DirEntry, &Attr) -> bool) -> FsResult<()> {
        let dir = self.inode(nodeid)?;
        let mut listing = self.cursors.take(&dir, offset)?;
        let mut dir_attr = None;
        let mut emitted = false;
        loop {
            let mut batch: VecDeque<(u64, DirEntry)> = std::iter::from_fn(|| listing.next()).take(HEADERS_AHEAD).collect();
            if batch.is_empty() {
                return Ok(());
            }
            let mut opened = self.read_headers_ahead(&dir, batch.iter().map(|(_, e)| e));
            while let Some((next, entry)) = batch.pop_front() {
                let (opened_ahead, hint) = opened.pop_front().flatten().map_or((None, None), |(fd, hint)| (Some(fd), hint));
                let linked = entry.name != "." && entry.name != "..";
                let attr = if !linked {
                    // Not linked by the kernel: no lookup.
                    match dir_attr {
                        Some(attr) => attr,
                        None => *dir_attr.insert(self.attr_of(&dir)?),
                    }
                } else {
                    // Opened ahead: the name may lead elsewhere by now (renamed, replaced or removed).
                    let before = self.written_back_count();
                    let ahead = opened_ahead.and_then(|fd| {
                        let st = lower::stat_fd(fd.as_raw_fd()).ok()?;
                        let c = cstr(&entry.name).ok()?;
                        (lower::id_at(dir.raw_fd(), &c) == Some((st.st_dev, st.st_ino))).then_some((fd, st, hint))
                    });
                    match self.lookup_child(nodeid, &dir, &entry.name, Some((entry.ino, entry.surely_regular)), ahead, before) {
                        Ok(attr) => attr,
                        Err(e) if matches!(e.errno, libc::ENOENT | libc::ESTALE) => continue,
                        // The kernel asks again from the entry that failed.
                        Err(e) if emitted => {
                            tracing::debug!("readdirplus stops before {:?}: {e}", entry.name);
                            return Ok(());
                        }
                        Err(e) => return Err(e),
                    }
                };
                if emit(next, &entry, &attr) {
                    if linked {
                        self.inodes.forget(attr.ino, 1);
                    }
                    // This entry and the rest of the batch wait for the request that goes on.
                    listing.put_back(std::iter::once((next, entry)).chain(batch));
                    self.cursors.park(listing);
                    return Ok(());
                }
                listing.handed_out(next);
                if hint.is_some() {
                    self.listed.push(attr.ino);
                }
                emitted = true;
            }
        }
    }

    /// Opens the regular files of `batch` that no inode holds yet and starts reading the header
    /// blocks of those without a trusted size hint, without waiting: a cold `ls -l` waits for
    /// one header read per such file, and these are in flight together instead of one by one.
    /// One slot per entry of `batch`: the descriptor, and the hint that spared its header read.
    fn read_headers_ahead<'a>(
        &self,
        dir: &Node,
        batch: impl Iterator<Item = &'a DirEntry>,
    ) -> VecDeque<Option<(OwnedFd, Option<SizeHint>)>> {
        let dev = dir.lower_id().0;
        batch
            .map(|entry| {
                if !entry.surely_regular || self.inodes.find(dev, entry.ino).is_some() {
                    return None;
                }
                let fd = lower::open_readable(dir.raw_fd(), &entry.name).ok()?;
                let hint = self.listed_hint(lower::XattrOn::Fd(fd.as_fd()));
                if hint.is_none() {
                    let _ = lower::will_need(&fd, 0, HEADER_BLOCK);
                }
                Some((fd, hint))
            })
            .collect()
    }

    /// A closed file is being opened: if listings spared the headers of the files listed
    /// after it (size hints), the starts of a batch of them (header and first records, as a
    /// reader's own open asks for) are asked for now, without waiting.
    pub(super) fn read_listed_ahead(&self, file: u64) {
        for nodeid in self.listed.ahead_of(file) {
            let Some(inode) = self.inodes.get(nodeid) else { continue };
            if inode.open.lock().content.is_some() {
                continue;
            }
            if let Some(fd) = inode.cached_fd() {
                let _ = lower::will_need(&*fd, 0, super::data::READER_START);
            }
        }
    }

    pub fn fsyncdir(&self, nodeid: u64) -> FsResult<()> {
        let inode = self.inode(nodeid)?;
        let dir = lower::reopen_dir(inode.raw_fd())?;
        lower::fsync(&dir)?;
        Ok(())
    }

    /// Where a node lives on the lower file system (for tools and logs).
    pub fn lower_path(&self, nodeid: u64) -> FsResult<PathBuf> {
        let inode = self.inode(nodeid)?;
        Ok(std::fs::read_link(format!("/proc/self/fd/{}", inode.raw_fd()))?)
    }
}

/// An entry leaving the tree, for the mount's counters (`DenseFs::leaving_counters`).
enum Leaving {
    Directory(Within),
    /// A regular file's last name: its lower id, its lower file, and whether it is small
    /// enough to be measured after the unlink answered.
    File((u64, u64), Option<std::fs::File>, bool, Within),
    /// One of several names of a regular file.
    Name(Within),
}

/// Files up to this lower length are measured after their unlink answered.
const MEASURE_LATER_BELOW: i64 = 1 << 20;

#[cfg(test)]
mod tests {
    use super::{Listed, LISTED_AHEAD, LISTED_FILES};

    #[test]
    fn an_open_asks_for_the_files_listed_after_it_a_batch_at_a_time() {
        let listed = Listed::default();
        for file in 100..400 {
            listed.push(file);
        }
        let batch = |from: u64, n: u64| (from..from + n).collect::<Vec<u64>>();
        assert_eq!(listed.ahead_of(100), batch(101, LISTED_AHEAD), "the first open: a batch after it");
        assert_eq!(listed.ahead_of(101), Vec::<u64>::new(), "enough ahead already");
        // Half way through the batch, the next one, from where the last ended.
        assert_eq!(listed.ahead_of(140), batch(101 + LISTED_AHEAD, 140 + 1 + LISTED_AHEAD - (101 + LISTED_AHEAD)));
        assert_eq!(listed.ahead_of(1000), Vec::<u64>::new(), "a file no listing spared");
        // A jump past what was asked for starts after the file opened; the end of the listing stops it.
        assert_eq!(listed.ahead_of(380), batch(381, 19));
    }

    #[test]
    fn a_listing_keeps_the_latest_files_and_the_latest_place_of_each() {
        let listed = Listed::default();
        for file in 0..LISTED_FILES as u64 + 10 {
            listed.push(file);
        }
        assert_eq!(listed.ahead_of(5), Vec::<u64>::new(), "forgotten: listed too long ago");
        assert_eq!(listed.ahead_of(10), (11..11 + LISTED_AHEAD).collect::<Vec<u64>>());
        // Listed again (a second `ls`), a file counts from its new place.
        let listed = Listed::default();
        for file in [1, 2, 3, 1, 7, 8] {
            listed.push(file);
        }
        assert_eq!(listed.ahead_of(1), vec![7, 8]);
    }
}

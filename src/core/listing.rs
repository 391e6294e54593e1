//! Directory listings: READDIR and READDIRPLUS from a kept lower position, the headers of the
//! files listed read ahead for the opens that follow.

use super::inodes::Node;
use super::lower::{self, cstr};
use super::{Attr, DenseFs, DirEntry, FsResult, Kind};
use crate::format::hints::SizeHint;
use crate::format::layout::HEADER_BLOCK;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

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
}

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

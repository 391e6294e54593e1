//! One open container file: the write-back cache that maps logical reads and writes onto
//! compressed records. It ties together the record buffers (`buffers.rs`: dirty, in flight,
//! clean), the engine that compresses and decodes them, the landing queue (`landing.rs`) and the
//! store of the lower file (`store.rs`: header, tables, slots, healing, reclaim).
//!
//! Writes land in per-record buffers (`dirty`); a record is handed to the engine when a write
//! completes it, when too much is dirty, or on flush/fsync/close. The engine's completion
//! callback queues the record for landing; a landing thread writes it into one of its two slots
//! and only then its descriptor, so a crash at any instant leaves each record at its old or its
//! new contents (docs/FORMAT.md, "Writing a record"; the rules are `format::durability`).
//!
//! Lock order: `slot_io` before `state`. `slot_io` is held shared while lower slots are read and
//! exclusively while they are written or punched, so a reader never sees a slot change under it;
//! no lock is held while waiting on the engine. The landing queue has its own small lock, never
//! held while taking another.

pub mod densify;
#[cfg(test)]
mod model_tests;
mod resize;
mod sync;

use super::admission::FreeSpaceSample;
use super::buffers::Buffers;
use super::error::{FsError, FsResult};
use super::landing::{self, LandingQueue};
use super::lower;
use super::memory::Memory;
use super::store::{mtime_of, Store, StoreState};
use super::usage::UsageHold;
use crate::checksum::ChecksumKind;
use crate::codec::{Compression, Setting};
use crate::engine::{CompressRequest, DecompressRequest, Encoded, Engine, EngineError, Job, RecordPolicy};
use crate::format::durability::Epochs;
use crate::format::hints::SizeHint;
use crate::format::layout::round_up_block;
use crate::format::{newest_first, Descriptor, Header, Layout};
use densify::Densify;
use parking_lot::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use tracing::{error, warn};

/// Dirty bytes per file before all dirty records are handed to the engine.
const DIRTY_LIMIT: usize = 64 << 20;
/// Bytes per file in the engine before a writer waits: at least this, and up to half the memory
/// budget (`cache_size`). A GPU is busy only with hundreds of records at once (nvCOMP's Deflate
/// takes about 0.4 s a batch on an H200), so a mount with a larger budget keeps it busier.
const INFLIGHT_MIN: usize = 64 << 20;

/// What new container files are created with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreateSettings {
    pub compression: Setting,
    pub layout: Layout,
    pub checksum: ChecksumKind,
}

/// Why a record is loaded into its dirty buffer.
#[derive(Clone, Debug)]
enum Load {
    /// A change keeps some of its bytes.
    Edit,
    /// To be written again as it is, landed only if smaller (recompress, interim records, the
    /// background pass with its codec): only a stored record not being changed.
    Rewrite { densify: Option<Densify> },
}

/// What a record handed to the engine is compressed with.
#[derive(Clone, Copy, Debug)]
enum EncodeWith {
    /// The file's codec (its header's).
    FileCodec,
    /// What a user's fsync lands it with (`Setting::for_fsync`) instead: an interim copy,
    /// re-encoded with the file's codec once quiet.
    Fsync(Setting),
    /// The background pass's codec (`background_compression`): the header keeps the file's, so
    /// that new writes stay fast.
    Background(Compression),
}

/// A compressed record (or the engine's failure) waiting to land.
type Landing = (u64, u64, Result<Encoded, EngineError>);

pub struct Container {
    store: Store,
    engine: Arc<Engine>,
    memory: Arc<Memory>,
    /// The free-space sample write admission reads (`admission.rs`), shared with the other files on the same
    /// lower device once the file system gives it (`share_free_space`), else the file's own.
    free_space: OnceLock<Arc<FreeSpaceSample>>,
    slot_io: RwLock<()>,
    state: Mutex<State>,
    /// Signalled whenever a record lands (or is dropped from flight).
    landed: Condvar,
    landing: LandingQueue<Landing>,
    /// Bytes of copies landed since the lower file system was last asked to start writing
    /// them (`EARLY_WRITEBACK_BYTES`).
    landed_unwritten: AtomicU64,
    /// A writable container's part in the mount's counters (`usage/`): the file is measured
    /// again when the last container changing it goes, after its last landing.
    usage: OnceLock<UsageHold>,
}

struct State {
    policy: RecordPolicy,
    buffers: Buffers,
    store: StoreState,
    /// Dirty records recompress or the background pass loaded to re-encode, not changed by a
    /// user since: with the background codec they go to the engine with, whoever sends them
    /// (the writeback tick may, before the pass does).
    rewriting: HashMap<u64, Option<Densify>>,
    /// A failed landing, reported by the next write, flush or fsync (its data stays dirty).
    write_error: Option<FsError>,
    /// Where sequential reads stand, for read-ahead.
    stream: ReadStream,
    /// Records past the header's size found at open (a crash between landing them and writing
    /// the header): dropped on the lower when the file is first opened for writing, so a run
    /// that only reads changes nothing.
    pending_discard: Option<u64>,
    /// Records a user's fsync landed uncompressed or with lz4 instead of the file's codec:
    /// re-encoded once quiet (`Container::settle_interim`).
    interim: sync::Interim,
}

/// Once this many bytes of copies have landed in a file, the lower file system is asked to
/// start writing them to its disk. Otherwise a large file's copies wait in the lower's page cache
/// for its dirty thresholds (gigabytes on a large machine) or the writer's fsync, and the disk
/// idles while the copy is compressed, then the CPUs idle while the disk writes (measured: 1 GiB
/// FASTQ `cp` + sync 1.70-1.74 s without, 1.47-1.56 s with; 3 GB 4.9-5.0 s and 4.4-4.6 s).
const EARLY_WRITEBACK_BYTES: u64 = 16 << 20;

/// Records the lower file system is asked to fetch ahead of a sequential reader (8 MiB of data
/// at 128K records); asked again when half of them have been read.
const READ_AHEAD_RECORDS: u64 = 64;
/// How far out of order a stream's READs may come (twice the mount's kernel read-ahead).
const STREAM_SLACK_BYTES: u64 = 4 << 20;
/// How far behind a stream's READ its records' lower pages are dropped (past any READ still in
/// flight).
const DROP_BEHIND_BYTES: u64 = 8 << 20;

/// A reader's position: reads that continue where the last one ended form a stream.
#[derive(Default)]
struct ReadStream {
    /// The record after the last one read.
    next: u64,
    /// Records below this were already asked for.
    ahead_until: u64,
    /// The stream's descriptor tables were asked for (formats 4 to 6 keep them apart from the copies).
    tables_asked: bool,
    /// Records below this were left behind and had their lower pages dropped (or came before
    /// the stream began).
    dropped_until: u64,
}

impl ReadStream {
    /// Notes a read of records `first..=last` of a file of `records` records; returns the
    /// records to fetch ahead now, if the reads form a stream and the last request runs low.
    /// Reads up to `slack` records out of order still belong to the stream: the kernel's
    /// read-ahead has a few READs in flight at once, answered by several threads.
    fn advance(&mut self, first: u64, last: u64, records: u64, slack: u64) -> Option<std::ops::Range<u64>> {
        let sequential = first <= self.next + slack && last + 1 + slack >= self.next;
        self.next = if sequential { self.next.max(last + 1) } else { last + 1 };
        if !sequential {
            self.ahead_until = self.next;
            self.dropped_until = first;
            return None;
        }
        if self.ahead_until >= (self.next + READ_AHEAD_RECORDS / 2).min(records) {
            return None;
        }
        let from = self.ahead_until.max(self.next);
        self.ahead_until = (self.next + READ_AHEAD_RECORDS).min(records);
        (from < self.ahead_until).then_some(from..self.ahead_until)
    }

    /// The records a stream now reading from `first` has left more than `lag` records behind,
    /// not handed out before.
    fn behind(&mut self, first: u64, lag: u64) -> Option<std::ops::Range<u64>> {
        let until = first.saturating_sub(lag);
        (until > self.dropped_until).then(|| std::mem::replace(&mut self.dropped_until, until)..until)
    }
}

/// Copies' extents as ranges of the lower file, those packed one after another (formats 4 and
/// 5: they lie in the order they landed, about the records' order) joined into one.
fn joined(mut extents: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    extents.sort_unstable();
    let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(extents.len());
    for (off, len) in extents {
        match ranges.last_mut() {
            Some((start, end)) if off >= *start && off <= round_up_block(*end) => *end = (*end).max(off + len),
            _ => ranges.push((off, off + len)),
        }
    }
    ranges
}

/// A record moved into flight: its version and what to compress.
struct Sent {
    record: u64,
    seq: u64,
    request: CompressRequest,
    /// For a record of the background pass: where its encoded bytes are counted.
    densified: Option<Arc<AtomicU64>>,
}

/// Where a record's current bytes come from.
enum Source {
    Memory(Arc<Vec<u8>>),
    Absent,
    Lower { candidates: Vec<(usize, Descriptor)> },
}

/// Bytes a read returns, as the pieces they are made of: ranges of records' cached contents (no
/// copy), zeros for holes, or bytes of its own. The FUSE reply sends the pieces as they lie.
pub struct ReadBytes {
    parts: Vec<ReadPart>,
}

enum ReadPart {
    Owned(Vec<u8>),
    Record(Arc<Vec<u8>>, std::ops::Range<usize>),
    Zeros(usize),
}

/// What zero runs are sent from (a run is at most a record, 1 MiB).
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

impl ReadBytes {
    pub fn owned(bytes: Vec<u8>) -> ReadBytes {
        ReadBytes { parts: vec![ReadPart::Owned(bytes)] }
    }

    /// The bytes, in order, as slices.
    pub fn slices(&self) -> Vec<&[u8]> {
        let mut out = Vec::with_capacity(self.parts.len());
        for part in &self.parts {
            match part {
                ReadPart::Owned(bytes) => out.push(bytes.as_slice()),
                ReadPart::Record(record, range) => out.push(&record[range.clone()]),
                ReadPart::Zeros(mut n) => {
                    while n > 0 {
                        let run = n.min(ZEROS.len());
                        out.push(&ZEROS[..run]);
                        n -= run;
                    }
                }
            }
        }
        out
    }

    /// The bytes joined (callers other than the FUSE reply).
    pub fn to_vec(&self) -> Vec<u8> {
        self.slices().concat()
    }
}

impl Container {
    /// Reads the header block of a lower file: `None` if it is a plain file.
    pub fn probe(file: &File) -> Result<Option<Header>, crate::format::FormatError> {
        Store::probe(file)
    }

    /// [`Container::probe`] of a descriptor open for reading.
    pub fn probe_fd(fd: std::os::fd::BorrowedFd<'_>) -> Result<Option<Header>, crate::format::FormatError> {
        Store::probe_fd(fd)
    }

    /// [`Container::probe`], with the lower file's first block it read, for
    /// [`Container::keep_first_block`].
    pub fn probe_block(file: &File) -> Result<(Option<Header>, Box<[u8]>), crate::format::FormatError> {
        Store::probe_block(std::os::fd::AsFd::as_fd(file))
    }

    /// A reader's open keeps the first block its probe read: group 0's descriptors lie in it, so
    /// its first read reads them from memory (a small file's whole lower file, often).
    pub fn keep_first_block(&self, block: Box<[u8]>) {
        self.state.lock().store.keep_first_block(block);
    }

    /// Turns a lower file into an empty container (emptying it). Nothing is written until the
    /// file gets data or a size: an empty file stays an empty lower file. `empty_since`: the
    /// caller knows the lower file is empty and since when (its mtime), saving a stat.
    pub fn create(
        lower: impl Into<Arc<File>>,
        empty_since: Option<libc::timespec>,
        settings: CreateSettings,
        policy: RecordPolicy,
        engine: Arc<Engine>,
        memory: Arc<Memory>,
        label: Option<String>,
    ) -> FsResult<Container> {
        let lower = lower.into();
        let mtime = match empty_since {
            Some(mtime) => mtime,
            None => {
                let mut meta = lower.metadata()?;
                if meta.len() != 0 {
                    lower::set_len(&lower, 0)?;
                    meta = lower.metadata()?;
                }
                mtime_of(&meta)
            }
        };
        let header = Header {
            layout: settings.layout,
            checksum: settings.checksum,
            setting: settings.compression,
            size: 0,
            sequence: 0,
            durable_below: Epochs::NEW_FILE_DURABLE_BELOW,
            heal_from: 0,
        };
        let (store, state) = Store::create(lower, &header, label, mtime);
        Ok(Container::assemble(store, state, policy, engine, memory))
    }

    /// A container found on the lower file. `writable`: opened for writing, so what a crash
    /// left past the end of file is dropped now; a reader leaves that to the first writer.
    pub fn open(
        lower: impl Into<Arc<File>>,
        header: Header,
        policy: RecordPolicy,
        engine: Arc<Engine>,
        memory: Arc<Memory>,
        label: Option<String>,
        writable: bool,
    ) -> FsResult<Container> {
        let (store, state) = Store::open(lower.into(), &header, label)?;
        let container = Container::assemble(store, state, policy, engine, memory);
        container.state.lock().pending_discard = Some(header.layout.plain_size_to_records(header.size));
        if writable {
            container.discard_pending()?;
        }
        Ok(container)
    }

    fn assemble(store: Store, state: StoreState, policy: RecordPolicy, engine: Arc<Engine>, memory: Arc<Memory>) -> Container {
        Container {
            store,
            engine,
            memory: memory.clone(),
            free_space: OnceLock::new(),
            slot_io: RwLock::new(()),
            state: Mutex::new(State {
                policy,
                buffers: Buffers::new(memory),
                store: state,
                rewriting: HashMap::new(),
                write_error: None,
                pending_discard: None,
                stream: ReadStream::default(),
                interim: sync::Interim::default(),
            }),
            landed: Condvar::new(),
            landing: LandingQueue::default(),
            landed_unwritten: AtomicU64::new(0),
            usage: OnceLock::new(),
        }
    }

    /// Counts this container's changes of its file in the mount's counters (once).
    pub fn hold_usage(&self, hold: UsageHold) {
        let _ = self.usage.set(hold);
    }

    pub fn holds_usage(&self) -> bool {
        self.usage.get().is_some()
    }

    /// Drops records past the size that a crash left (they must not reappear if the file grows).
    fn discard_pending(&self) -> FsResult<()> {
        let _io = self.slot_io.write();
        let mut st = self.state.lock();
        if let Some(first) = st.pending_discard.take() {
            if let Err(e) = self.discard_from(&mut st, first) {
                st.pending_discard = Some(first);
                warn!(file = %self.store.label(), "cannot drop records past the end of file: {e}");
                return Err(e);
            }
        }
        Ok(())
    }

    /// A handle opens the file for writing: the lower file becomes writable (it was opened
    /// read-only while only readers had it), and what a crash left past the end goes.
    pub fn make_writable(&self, path_fd: std::os::fd::RawFd) -> FsResult<()> {
        lower::upgrade_to_write(self.store.lower(), path_fd)?;
        self.discard_pending()
    }

    /// Whether the daemon's own writes (landings, the put-back mtime) changed the lower file
    /// since the last call: its blocks or ctime as stat'ed before may be stale.
    pub fn take_lower_changed(&self) -> bool {
        self.state.lock().store.take_unpublished_changes()
    }

    /// The modification time users see, and the last status change not yet on the lower.
    pub fn times(&self) -> (libc::timespec, Option<libc::timespec>) {
        self.state.lock().store.times()
    }

    /// A user's utimensat: lands what is pending (else its landing would move the times set),
    /// then runs `set` (the utimensat on the lower file, returning the lower's status after it)
    /// and takes the mtime it left as the file's own. `set` runs under the state lock, so that
    /// neither a landing nor the writeback tick's putting back of the old mtime comes between.
    /// `sets_mtime`: the lower's mtime is not put back before (tar and cp -p set the times of
    /// a file they just wrote before closing it: that write would be overwritten at once).
    /// The stat `set` returns follows every change the daemon made to the lower file so far.
    pub fn set_times(self: &Arc<Self>, sets_mtime: bool, set: impl FnOnce() -> FsResult<libc::stat>) -> FsResult<libc::stat> {
        if sets_mtime {
            self.flush_data()?;
        } else {
            self.flush()?;
        }
        let mut st = self.state.lock();
        let stat = set()?;
        self.store.times_set_by_user(&mut st.store, libc::timespec { tv_sec: stat.st_mtime, tv_nsec: stat.st_mtime_nsec });
        // The landing above came before that stat: the reply made of it tells the kernel the
        // blocks and ctime it left, with no stat taken again.
        st.store.take_unpublished_changes();
        Ok(stat)
    }

    /// A user operation changed the file without changing its bytes (fallocate: ext4 moves
    /// mtime and ctime there too).
    pub fn changed_by_user(&self) {
        self.state.lock().store.user_changed();
    }

    /// Whether this content wrote the lower file (since it was opened).
    pub fn wrote(&self) -> bool {
        self.state.lock().store.wrote()
    }

    pub fn layout(&self) -> Layout {
        self.store.layout()
    }

    pub fn compression(&self) -> Setting {
        self.state.lock().store.compression
    }

    pub fn size(&self) -> u64 {
        self.state.lock().store.size
    }

    /// The lower file (shared with the inode table, whose descriptor for the inode it is).
    pub fn lower_file(&self) -> &Arc<File> {
        self.store.lower()
    }

    /// (size, record shift) once this run wrote the file and its header records the size it
    /// has, nothing left to land: what its size hint may say (`core::hints`). Only files of the
    /// current format get hints: a densefs reading versions 3 and 4 writes them, and would not
    /// remove a hint it does not know.
    pub fn settled_size(&self) -> Option<(u64, u8)> {
        let st = self.state.lock();
        let settled = self.layout().format_version() == crate::format::FORMAT_VERSION
            && st.store.wrote()
            && st.buffers.all_landed()
            && st.store.recorded_size() == Some(st.store.size);
        settled.then(|| (st.store.size, self.layout().record_shift()))
    }

    /// Has write admission read `sample`, the one the files on this file's lower device share.
    pub fn share_free_space(&self, sample: Arc<FreeSpaceSample>) {
        let _ = self.free_space.set(sample);
    }

    /// The lower file carries `hint` now (`StoreState::size_hint_written`).
    pub fn size_hint_written(&self, hint: SizeHint, written: bool) {
        self.state.lock().store.size_hint_written(hint, written);
    }

    /// The size hint known to be on the lower file, and whether it may carry one at all
    /// (`StoreState::size_hint_known`).
    pub fn size_hint_known(&self) -> (Option<SizeHint>, bool) {
        self.state.lock().store.size_hint_known()
    }

    /// What log lines call the file.
    pub fn label(&self) -> String {
        self.store.label()
    }

    /// Drops the error a failed landing left for this file's writer to hear: a file closed
    /// while its data could not be written has no writer left, and its retry must try afresh
    /// rather than report the last failure again.
    pub fn forget_write_error(&self) {
        self.state.lock().write_error = None;
    }

    /// Whether closing needs a sync to free old copies.
    pub fn has_stale(&self) -> bool {
        self.state.lock().store.has_stale()
    }

    /// Whether a failed landing left an error for this file's writer to hear.
    pub fn has_write_error(&self) -> bool {
        self.state.lock().write_error.is_some()
    }

    // ---- reading -----------------------------------------------------------------------

    fn source(&self, st: &mut State, record: u64) -> FsResult<Source> {
        if let Some(buf) = st.buffers.newest(record) {
            return Ok(Source::Memory(buf));
        }
        let found = self.store.copies(&mut st.store, record)?;
        Ok(if found.is_empty() { Source::Absent } else { Source::Lower { candidates: found } })
    }

    fn request(&self, record: u64, slot: usize, d: &Descriptor) -> FsResult<DecompressRequest> {
        Ok(DecompressRequest {
            codec: d.codec(),
            stored: self.store.read_copy(record, slot, d)?,
            logical_len: d.logical_len as usize,
            checksum_kind: self.store.checksum(),
            checksum: d.checksum,
        })
    }

    /// Reads one record from the lower file, newest copy first; an older copy is served only
    /// when the newest fails its checksum (a write torn by a crash), and that is logged.
    fn fetch_slow(&self, record: u64) -> FsResult<Arc<Vec<u8>>> {
        let _io = self.slot_io.read();
        let mut st = self.state.lock();
        let found = match self.source(&mut st, record)? {
            Source::Memory(buf) => return Ok(buf),
            Source::Absent => return Ok(Arc::new(Vec::new())),
            Source::Lower { candidates } => candidates,
        };
        let mut last = None;
        for (i, (slot, d)) in found.iter().enumerate() {
            let req = self.request(record, *slot, d)?;
            match self.engine.decode(&req) {
                Ok(buf) => {
                    if i > 0 {
                        warn!(file = %self.store.label(), record, "newest copy unreadable; serving the previous copy (an interrupted write)");
                    }
                    let buf = Arc::new(buf);
                    st.buffers.remember_clean(record, &buf);
                    return Ok(buf);
                }
                Err(e) => last = Some((*slot, e)),
            }
        }
        let (slot, e) = last.expect("BUG: candidates were not empty");
        let label = self.store.label();
        error!(file = %label, record, slot, "record unreadable: {e}");
        Err(FsError::corrupt(format!("{label}: record {record}: {e}")))
    }

    /// Current contents of several records, decoding the ones on the lower file in parallel.
    fn fetch(&self, records: &[u64]) -> FsResult<Vec<Arc<Vec<u8>>>> {
        let mut out: Vec<Option<Arc<Vec<u8>>>> = vec![None; records.len()];
        let mut pending: Vec<((usize, Descriptor), DecompressRequest)> = Vec::new();
        {
            let _io = self.slot_io.read();
            let mut st = self.state.lock();
            let mut plans = Vec::new();
            for (i, &record) in records.iter().enumerate() {
                match self.source(&mut st, record)? {
                    Source::Memory(buf) => out[i] = Some(buf),
                    Source::Absent => out[i] = Some(Arc::new(Vec::new())),
                    Source::Lower { candidates } => plans.push((i, candidates[0])),
                }
            }
            drop(st);
            for (i, (slot, d)) in plans {
                pending.push(((i, d), self.request(records[i], slot, &d)?));
            }
        }
        let (planned, requests): (Vec<(usize, Descriptor)>, Vec<DecompressRequest>) = pending.into_iter().unzip();
        let results = self.engine.decompress_all(requests);
        for ((i, planned), result) in planned.into_iter().zip(results) {
            let record = records[i];
            out[i] = Some(match result {
                Ok(buf) => {
                    let buf = Arc::new(buf);
                    // Cache it only if the record did not change while it was being decoded.
                    let mut st = self.state.lock();
                    let st = &mut *st;
                    let unchanged = !st.buffers.is_pending(record)
                        && self.store.pair(&mut st.store, record).ok().and_then(|p| newest_first(&p).first().map(|c| c.1)) == Some(planned);
                    if unchanged {
                        st.buffers.remember_clean(record, &buf);
                    }
                    buf
                }
                Err(_) => self.fetch_slow(record)?,
            });
        }
        Ok(out.into_iter().map(|b| b.expect("BUG: every record fetched")).collect())
    }

    /// A sequential reader's next records are asked of the lower file system before the
    /// kernel asks for them: the lower file's own read-ahead does not see the stream where
    /// copies are not adjacent (format 3's slots, or copies rewritten since), and each record
    /// would wait for the disk. And the lower pages of the records it has left behind are
    /// dropped: the kernel caches what they decoded to, and a large file's stream otherwise
    /// filled memory with a second, compressed copy (a cold 3 GB zstd-3 read took 3.1-3.4 s
    /// instead of 2.4-2.6 s on a VM where fresh pages cost).
    fn read_ahead(&self, first: u64, last: u64, records: u64) {
        let mut behind = Vec::new();
        let extents = {
            let mut st = self.state.lock();
            let record_size = self.layout().record_size();
            let Some(ahead) = st.stream.advance(first, last, records, STREAM_SLACK_BYTES.div_ceil(record_size)) else { return };
            // A lag, so that the READs still in flight keep their pages.
            let lag = DROP_BEHIND_BYTES.div_ceil(record_size);
            if let Some(left) = st.stream.behind(first, lag) {
                let st = &mut *st;
                behind = self.store.stored_extents(&mut st.store, left).unwrap_or_default();
            }
            if !std::mem::replace(&mut st.stream.tables_asked, true) {
                self.store.prefetch_tables(
                    self.layout().record_to_group(ahead.start)..self.layout().record_to_group(records.saturating_sub(1)) + 1,
                );
            }
            let st = &mut *st;
            match self.store.stored_extents(&mut st.store, ahead) {
                Ok(extents) => extents,
                Err(_) => return, // the read itself reports it
            }
        };
        // Hints both: an error is the next read's to report.
        for (start, end) in joined(extents) {
            let _ = lower::will_need(self.store.lower(), start, end - start);
        }
        for (start, end) in joined(behind) {
            let _ = lower::dont_need(self.store.lower(), start, end - start);
        }
    }

    pub fn read(&self, offset: u64, len: usize) -> FsResult<ReadBytes> {
        let size = self.size();
        if offset >= size || len == 0 {
            return Ok(ReadBytes::owned(Vec::new()));
        }
        let len = (len as u64).min(size - offset);
        let pieces: Vec<_> = self.layout().split(offset, len).collect();
        let records: Vec<u64> = pieces.iter().map(|p| p.record).collect();
        self.read_ahead(records[0], records[records.len() - 1], self.layout().plain_size_to_records(size));
        let contents = self.fetch(&records)?;
        let mut parts = Vec::with_capacity(pieces.len());
        for (piece, buf) in pieces.iter().zip(contents) {
            let have = buf.len().saturating_sub(piece.skip).min(piece.len);
            if have > 0 {
                parts.push(ReadPart::Record(buf, piece.skip..piece.skip + have));
            }
            // Past a record's end (a hole, or a record shorter than the file's size says): zeros.
            if piece.len > have {
                parts.push(ReadPart::Zeros(piece.len - have));
            }
        }
        Ok(ReadBytes { parts })
    }

    // ---- writing -----------------------------------------------------------------------

    /// Makes sure `record`'s current contents are in `dirty` (trimmed to the file size), so a
    /// partial write can modify them. `rewrite` (recompress): only a stored record, left alone
    /// if a change of it is pending, and marked as a rewrite (landed only if smaller); the mark
    /// is set under the same lock that sees no such change, and every user change clears it.
    /// Returns whether this call put the record's bytes in memory (for a rewrite: and marked it).
    fn load(&self, record: u64, load: Load) -> FsResult<bool> {
        let rewrite = matches!(load, Load::Rewrite { .. });
        let mark = |st: &mut State| {
            if let Load::Rewrite { densify } = &load {
                st.rewriting.insert(record, densify.clone());
            }
        };
        let done = |st: &State| if rewrite { st.buffers.is_pending(record) } else { st.buffers.is_dirty(record) };
        loop {
            let seen = {
                let _io = self.slot_io.read();
                let mut st = self.state.lock();
                if done(&st) {
                    return Ok(false);
                }
                match self.source(&mut st, record)? {
                    Source::Memory(buf) => {
                        self.put_trimmed(&mut st, record, &buf);
                        mark(&mut st);
                        return Ok(true);
                    }
                    Source::Absent if rewrite => return Ok(false),
                    Source::Absent => {
                        st.buffers.put_dirty(record, Vec::new());
                        return Ok(true);
                    }
                    Source::Lower { candidates } => candidates,
                }
            };
            let buf = self.fetch_slow(record)?;
            let _io = self.slot_io.read();
            let mut st = self.state.lock();
            let st = &mut *st;
            if done(st) {
                return Ok(false);
            }
            // Insert only if nothing changed the record while we read it; else look again.
            if !st.buffers.is_in_flight(record) && newest_first(&self.store.pair(&mut st.store, record)?) == seen {
                self.put_trimmed(st, record, &buf);
                mark(st);
                return Ok(true);
            }
        }
    }

    /// Makes the record's newest bytes its dirty ones, cut at the file size.
    fn put_trimmed(&self, st: &mut State, record: u64, buf: &[u8]) {
        let keep = self.layout().record_len_in_size(record, st.store.size);
        if buf.len() <= keep {
            st.buffers.load_dirty(record, buf.to_vec());
        } else {
            st.buffers.put_dirty(record, buf[..keep].to_vec());
        }
    }

    /// Locks the file for changing one record. When the change keeps some of the record's bytes
    /// (`partial`) and the record lies inside the file, its current contents are in `dirty` on
    /// return — even if another writer handed the record to the engine meanwhile.
    fn lock_for_edit(&self, record: u64, partial: bool) -> FsResult<(RwLockReadGuard<'_, ()>, MutexGuard<'_, State>)> {
        loop {
            let io = self.slot_io.read();
            let mut st = self.state.lock();
            let needs_old = partial && self.layout().record_to_plain_off(record) < st.store.size;
            if !needs_old || st.buffers.is_dirty(record) {
                return Ok((io, st));
            }
            match self.source(&mut st, record)? {
                Source::Memory(buf) => {
                    self.put_trimmed(&mut st, record, &buf);
                    return Ok((io, st));
                }
                Source::Absent => {
                    st.buffers.put_dirty(record, Vec::new());
                    return Ok((io, st));
                }
                Source::Lower { .. } => {
                    drop(st);
                    drop(io);
                    self.load(record, Load::Edit)?;
                }
            }
        }
    }

    /// Waits until the engine holds less than INFLIGHT_MIN, or half the memory budget if more,
    /// bytes of this file.
    fn wait_for_room(&self) {
        let limit = INFLIGHT_MIN.max(self.memory.limit() / 2);
        let mut st = self.state.lock();
        while st.buffers.inflight_bytes() > limit {
            self.landed.wait(&mut st);
        }
    }

    pub fn write(self: &Arc<Self>, offset: u64, data: &[u8]) -> FsResult<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        let end = offset.checked_add(data.len() as u64).ok_or(FsError::errno(libc::EFBIG))?;
        {
            let mut st = self.state.lock();
            if let Some(e) = st.write_error.take() {
                return Err(e);
            }
            self.store.check_lower_can_hold(&mut st.store, end)?;
        }
        self.wait_for_room();
        self.memory.wait_for_room();
        let free_space = self.free_space.get_or_init(Default::default);
        self.memory.admit_write(self.store.lower().as_raw_fd(), data.len() as u64, free_space)?;
        self.state.lock().store.user_changed();
        let layout = self.layout();
        let rs = layout.record_size() as usize;
        let size = self.size();
        if offset > size {
            self.zero_tail_past(size)?;
        }
        let mut ready = Vec::new();
        let mut at = 0;
        for p in layout.split(offset, data.len() as u64) {
            let (_io, mut st) = self.lock_for_edit(p.record, p.is_partial(rs))?;
            st.rewriting.remove(&p.record);
            let len = st.buffers.write_into(p.record, p.skip, &data[at..at + p.len]);
            at += p.len;
            if p.skip + p.len == rs && len == rs {
                ready.push(p.record);
            }
            st.store.size = st.store.size.max(layout.record_to_plain_off(p.record) + (p.skip + p.len) as u64);
        }
        let jobs = {
            let mut st = self.state.lock();
            if self.dirty_over_limit(&st) {
                ready = st.buffers.dirty_records();
            }
            self.prepare(&mut st, &ready)
        };
        self.engine.submit(jobs);
        Ok(data.len())
    }

    /// Whether this file holds so many dirty bytes that all of them go to the engine now.
    fn dirty_over_limit(&self, st: &State) -> bool {
        st.buffers.dirty_bytes() > DIRTY_LIMIT.min(self.memory.limit() / 2)
    }

    /// Moves the given dirty records into flight and builds their engine jobs. Records already in
    /// flight stay dirty: one version of a record is in the engine at a time.
    fn prepare(self: &Arc<Self>, st: &mut State, records: &[u64]) -> Vec<Job> {
        self.send(st, records, EncodeWith::FileCodec).into_iter().map(|sent| self.job(sent)).collect()
    }

    /// Moves the given dirty records into flight: what to compress for each, and with what.
    fn send(&self, st: &mut State, records: &[u64], with: EncodeWith) -> Vec<Sent> {
        let mut sent = Vec::new();
        for &record in records {
            let rewriting = &mut st.rewriting;
            let mut densify = None;
            let rewrite = || match rewriting.remove(&record) {
                Some(mark) => {
                    densify = mark;
                    true
                }
                None => false,
            };
            let Some((seq, data)) = st.buffers.send(record, rewrite) else { continue };
            let densified = densify.as_ref().map(|d| d.encoded.clone());
            let (compression, interim) = match (densify.map(|d| d.target), with) {
                (Some(c), _) | (None, EncodeWith::Background(c)) => (Setting::Fixed(c), false),
                (None, EncodeWith::FileCodec) => (st.store.compression, false),
                (None, EncodeWith::Fsync(setting)) => (setting, setting != st.store.compression),
            };
            st.interim.sent(record, interim);
            let request = CompressRequest {
                data,
                compression,
                min_savings: st.policy.min_savings,
                offload: st.policy.offload,
                checksum: self.store.checksum(),
            };
            sent.push(Sent { record, seq, request, densified });
        }
        sent
    }

    fn job(self: &Arc<Self>, sent: Sent) -> Job {
        let me = Arc::clone(self);
        let Sent { record, seq, request, densified } = sent;
        Job {
            request,
            done: Box::new(move |result| {
                if let (Some(counter), Ok(encoded)) = (&densified, &result) {
                    counter.fetch_add(encoded.bytes.len() as u64, Ordering::Relaxed);
                }
                me.queue_landing(record, seq, result)
            }),
        }
    }

    /// Compresses one sent record on the calling thread and lands it; false where the engine
    /// would rather have an accelerator do it.
    fn compress_and_land_here(&self, sent: &Sent) -> bool {
        let Some(encoded) = self.engine.compress_here(&sent.request) else { return false };
        if let Some(counter) = &sent.densified {
            counter.fetch_add(encoded.bytes.len() as u64, Ordering::Relaxed);
        }
        self.land(sent.record, sent.seq, Ok(encoded));
        true
    }

    /// Compresses and lands a single record on the calling thread (a small file at close: two
    /// thread handoffs would cost more than the work); more go to the engine's workers.
    fn write_out(self: &Arc<Self>, sent: Vec<Sent>) {
        if let [one] = sent.as_slice() {
            if self.compress_and_land_here(one) {
                return;
            }
        }
        self.engine.submit(sent.into_iter().map(|s| self.job(s)).collect());
    }

    /// Engine completion, on a compression worker: only queues the record for landing.
    fn queue_landing(self: &Arc<Self>, record: u64, seq: u64, result: Result<Encoded, EngineError>) {
        if self.landing.push((record, seq, result)) {
            let me = Arc::clone(self);
            landing::spawn(Box::new(move || {
                while let Some((record, seq, result)) = me.landing.pop() {
                    me.land(record, seq, result);
                }
            }));
        }
    }

    /// On a landing thread: writes the encoded record into a slot, then its descriptor.
    fn land(&self, record: u64, seq: u64, result: Result<Encoded, EngineError>) {
        let stored = self.write_landing(record, seq, result);
        if self.landed_unwritten.fetch_add(stored, Ordering::Relaxed) + stored >= EARLY_WRITEBACK_BYTES {
            self.landed_unwritten.store(0, Ordering::Relaxed);
            // A hint: an error here is the lower's to report at its next write or fsync.
            let _ = lower::start_writeback(self.store.lower());
        }
    }

    /// `land` under the locks: the bytes of the copy it wrote to the lower file.
    fn write_landing(&self, record: u64, seq: u64, result: Result<Encoded, EngineError>) -> u64 {
        let _io = self.slot_io.write();
        let mut st = self.state.lock();
        let st = &mut *st;
        let Some(flight) = st.buffers.in_flight(record).filter(|f| f.seq == seq) else {
            // Truncated away (or superseded) while in the engine.
            return 0;
        };
        let (only_if_smaller, changed) = (flight.only_if_smaller, flight.changed);
        // A new file's first landing writes its block 0 once (header, descriptor, an inline
        // record; the size too if this landing completes the file).
        let gathering = self.store.gather_block_0(&mut st.store);
        let mut stored = 0;
        let outcome = match result {
            Ok(encoded) => {
                stored = encoded.bytes.len() as u64;
                self.store.write_copy(&mut st.store, record, &encoded, only_if_smaller, changed)
            }
            Err(e) => Err(FsError::new(libc::EIO, format!("compressing record {record}: {e}"))),
        };
        let outcome = outcome.and_then(|()| {
            if gathering && st.buffers.only_in_flight(record) {
                self.store.write_header(&mut st.store) // writes the gathered block too
            } else {
                Ok(self.store.write_gathered(&mut st.store)?)
            }
        });
        if let Err(e) = outcome {
            if only_if_smaller {
                // A rewrite (recompress, an interim record, a background pass): the copy it
                // would have replaced is still there, so there is nothing to keep.
                st.buffers.take_inflight(record);
            } else {
                // Keep the data: a later flush retries once the cause (say, a full disk) is gone.
                st.buffers.requeue_inflight(record);
            }
            error!(file = %self.store.label(), record, "cannot write record: {e}");
            if matches!(e.errno, libc::ENOSPC | libc::EDQUOT) {
                self.memory.admission().landing_found_no_room();
            }
            stored = 0;
            st.store.forget_raw_copies(record);
            st.write_error = Some(e);
        } else {
            let flight = st.buffers.take_inflight(record).expect("BUG: in-flight record vanished under the lock");
            st.buffers.remember_clean(record, &flight.data);
        }
        self.landed.notify_all();
        stored
    }
}

#[cfg(test)]
mod read_stream_tests {
    use super::{ReadStream, READ_AHEAD_RECORDS};

    #[test]
    fn a_sequential_reader_is_read_ahead_in_batches_and_a_random_one_is_not() {
        let mut s = ReadStream::default();
        let total = 1000;
        // The first read from the start opens a window of READ_AHEAD_RECORDS past it.
        assert_eq!(s.advance(0, 7, total, 16), Some(8..8 + READ_AHEAD_RECORDS));
        // Nothing more until half of it is consumed.
        let mut asked = vec![];
        for first in (8..200).step_by(8) {
            if let Some(r) = s.advance(first, first + 7, total, 16) {
                asked.push(r);
            }
        }
        // Every record of the stream was asked for exactly once, in order, ahead of its read.
        let flat: Vec<u64> = asked.iter().flat_map(|r| r.clone()).collect();
        assert_eq!(flat, (8 + READ_AHEAD_RECORDS..flat[0] + flat.len() as u64).collect::<Vec<_>>());
        assert!(asked.iter().all(|r| r.end - r.start >= READ_AHEAD_RECORDS / 2), "{asked:?}");
        // A jump is no stream; reading on from there is one again.
        assert_eq!(s.advance(500, 507, total, 16), None);
        assert_eq!(s.advance(508, 515, total, 16), Some(516..516 + READ_AHEAD_RECORDS));
        // Never past the end of the file.
        assert_eq!(s.advance(990, 995, total, 16), None);
        assert_eq!(s.advance(996, 999, total, 16), None);
        let mut s = ReadStream::default();
        assert_eq!(s.advance(0, 3, 10, 16), Some(4..10));
        assert_eq!(s.advance(4, 9, 10, 16), None);
    }

    #[test]
    fn reads_a_little_out_of_order_stay_one_stream() {
        // Two READs in flight, answered by two threads: the later one may come first.
        let mut s = ReadStream::default();
        let (mut asked, mut left) = (vec![], vec![]);
        for pair in (0..400u64).step_by(16) {
            for first in [pair + 8, pair] {
                let Some(ahead) = s.advance(first, first + 7, 1000, 16) else { continue };
                asked.extend(ahead);
                if let Some(behind) = s.behind(first, 64) {
                    assert!(behind.end + 64 <= first, "{behind:?} left behind within the lag of {first}");
                    left.extend(behind);
                }
            }
        }
        // Asked ahead and left behind once each, in order: no read restarted the stream.
        assert_eq!(asked, (16..16 + asked.len() as u64).collect::<Vec<_>>());
        assert_eq!(left, (0..left.len() as u64).collect::<Vec<_>>());
        assert!(asked.len() >= 400 && left.len() >= 400 - 64 - 48, "{} asked, {} left", asked.len(), left.len());
    }

    #[test]
    fn a_stream_leaves_each_record_behind_once_and_only_what_it_read() {
        let mut s = ReadStream::default();
        let mut left = vec![];
        for first in (0..400).step_by(8) {
            s.advance(first, first + 7, 1000, 16);
            left.extend(s.behind(first, 64).into_iter().flatten());
        }
        // Records 0 .. 392 - 64, each once, in order; none within the lag.
        assert_eq!(left, (0..392 - 64).collect::<Vec<_>>());
        // A jump forward: what was skipped was never read, and is not left behind.
        s.advance(700, 707, 1000, 16);
        assert_eq!(s.behind(700, 64), None);
        s.advance(708, 715, 1000, 16);
        assert_eq!(s.behind(780, 64), Some(700..716));
        // A jump back starts over from there.
        s.advance(10, 17, 1000, 16);
        assert_eq!(s.behind(100, 64), Some(10..36));
    }
}

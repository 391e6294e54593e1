//! One open container file: logical reads and writes mapped onto compressed records.
//!
//! Writes land in per-record buffers (`dirty`); a record is handed to the engine when a write
//! completes it, when too much is dirty, or on flush/fsync/close. The engine's completion
//! callback writes the record into one of its two slots ("landing") and only then its descriptor,
//! so a crash at any instant leaves each record at its old or its new contents:
//! - a record is written to the slot that does not hold its current copy, except when that other
//!   slot holds the last *durable* copy (the current one was written since the last sync): then
//!   the current, not-yet-durable copy is overwritten in place and the durable one stays intact;
//! - after fdatasync, the older slot of every rewritten record is freed (descriptor cleared,
//!   blocks punched): until then the previous version survives any crash.
//!
//! Lock order: `slot_io` before `state`. `slot_io` is held shared while lower slots are read and
//! exclusively while they are written or punched, so a reader never sees a slot change under it;
//! no lock is held while waiting on the engine.

use super::error::{FsError, FsResult};
use super::lower;
use super::memory::Memory;
use crate::checksum::ChecksumKind;
use crate::codec::Compression;
use crate::engine::{CompressRequest, DecompressRequest, Encoded, Engine, EngineError, Job, Output, RecordPolicy, Work};
use crate::format::layout::{round_up_block, GROUP_RECORDS, HEADER_BLOCK, INLINE_CAPACITY, INLINE_OFF, TABLE_SIZE};
use crate::format::durability::Epochs;
use crate::format::{decode_table, newest_first, Descriptor, Header, Layout, Pair, SlotState, FLAG_INLINE};
use parking_lot::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fs::File;
use std::sync::Arc;
use tracing::{error, warn};

/// Dirty bytes per file before all dirty records are handed to the engine.
const DIRTY_LIMIT: usize = 64 << 20;
/// Bytes per file in the engine before a writer waits.
const INFLIGHT_LIMIT: usize = 64 << 20;
/// Decoded records kept for small reads that hit the same record again.
const CLEAN_CACHE_RECORDS: usize = 16;
/// Groups of descriptors cached per file (2 KiB each): tables are re-read when evicted, so a
/// huge file's metadata does not grow memory without bound.
const TABLE_CACHE_GROUPS: usize = 256;


/// What new container files are created with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreateSettings {
    pub compression: Compression,
    pub layout: Layout,
    pub checksum: ChecksumKind,
}

pub struct Container {
    lower: File,
    layout: Layout,
    checksum: ChecksumKind,
    engine: Arc<Engine>,
    memory: Arc<Memory>,
    /// Lower path, for log lines.
    label: String,
    slot_io: RwLock<()>,
    state: Mutex<State>,
    /// Signalled whenever a record lands.
    landed: Condvar,
}

struct InFlight {
    seq: u64,
    data: Arc<Vec<u8>>,
    /// Re-encoded by recompress (same bytes): land only if it takes less space than the copy
    /// stored now.
    only_if_smaller: bool,
}

struct State {
    /// How records written from now on are encoded (the file's own, or a recompress target).
    compression: Compression,
    policy: RecordPolicy,
    size: u64,
    header_seq: u64,
    persisted_size: u64,
    /// The header must be rewritten even if the size did not change (the codec did).
    header_stale: bool,
    tables: HashMap<u64, Box<[Pair]>>,
    /// Records changed in memory and not yet handed to the engine; each buffer is at most the
    /// record's length within `size` (bytes past it read as zeros).
    dirty: BTreeMap<u64, Vec<u8>>,
    dirty_bytes: usize,
    inflight: HashMap<u64, InFlight>,
    inflight_bytes: usize,
    next_seq: u64,
    clean: VecDeque<(u64, Arc<Vec<u8>>)>,
    /// Records whose other slot still holds an older copy, freed after the next sync.
    stale: BTreeSet<u64>,
    /// Dirty records recompress loaded to re-encode, not changed by a user since.
    rewriting: HashSet<u64>,
    /// Slots a truncate cleared, punched after the next sync: punching them at once could reach
    /// the disk before the cleared descriptor does, and a power cut would then leave a
    /// descriptor pointing at a hole with an older copy behind it served in its place.
    deferred_punch: BTreeSet<(u64, usize)>,
    /// A failed landing, reported by the next write, flush or fsync (its data stays dirty).
    write_error: Option<FsError>,
    /// The budget dirty, in-flight and clean bytes are charged to.
    memory: Arc<Memory>,
    /// Sync epochs (docs/FORMAT.md, "Epochs"). Copies written now carry `epoch`. Durable are
    /// the copies below `heal_from` (older runs, synced) and those of this run below
    /// `durable_below`; copies in `heal_from..run_base` were written by runs that did not end
    /// with a sync (a crash or power cut): possibly torn, and not durable. Each group's table
    /// is healed when first loaded (torn copies cleared, intact ones re-stamped with `epoch`),
    /// and the range is kept in the header until every group has been.
    epochs: Epochs,
    /// Groups healed in this run, and how many exist (for dropping the range once all are).
    healed: HashSet<u64>,
    groups_to_heal: u64,
    /// Whether this run's epochs are recorded durably in the header: done before the run's
    /// first descriptor write, so a later run never reuses them.
    announced: bool,
    /// Healed tables (in the cache) not written yet: a run that only reads writes nothing.
    unpersisted: HashSet<u64>,
    /// Every group with a table has been loaded (and healed) in this run.
    heal_complete: bool,
    /// Records past the header's size found at open (a crash between landing them and writing
    /// the header): dropped on the lower when the file is first opened for writing, so a run
    /// that only reads changes nothing.
    pending_discard: Option<u64>,
    /// This run has written to the lower file: a run that only reads has nothing to sync.
    wrote: bool,
    /// Sizes up to this are known to fit the lower file system (see `check_lower_can_hold`).
    checked_size: u64,
    /// A header is on the lower file. A new file gets one with its first data, so an empty file
    /// stays an empty lower file.
    header_on_disk: bool,
    /// The modification time users see. Writes the user did not make (landing after close,
    /// healing, punching old copies, recompress) move the lower's mtime; it is put back to this
    /// once the daemon's writes are done.
    mtime: libc::timespec,
    /// The last status change a user operation made, if the lower may not show it yet.
    ctime: Option<libc::timespec>,
    /// The lower's mtime may differ from `mtime`.
    mtime_to_restore: bool,
}

impl Drop for State {
    fn drop(&mut self) {
        let clean: usize = self.clean.iter().map(|(_, b)| b.len()).sum();
        self.memory.release(self.dirty_bytes + self.inflight_bytes + clean);
    }
}

/// Where a record's current bytes come from.
enum Source {
    Memory(Arc<Vec<u8>>),
    Absent,
    Lower { candidates: Vec<(usize, Descriptor)> },
}

impl State {
    fn new(compression: Compression, policy: RecordPolicy, header: &Header, groups: u64, mtime: libc::timespec, memory: Arc<Memory>) -> State {
        let (size, header_seq) = (header.size, header.sequence);
        State {
            compression,
            policy,
            header_stale: false,
            size,
            header_seq,
            persisted_size: size,
            tables: HashMap::new(),
            dirty: BTreeMap::new(),
            dirty_bytes: 0,
            inflight: HashMap::new(),
            inflight_bytes: 0,
            next_seq: 1,
            clean: VecDeque::new(),
            stale: BTreeSet::new(),
            rewriting: HashSet::new(),
            deferred_punch: BTreeSet::new(),
            write_error: None,
            memory,
            epochs: Epochs::for_run(header),
            healed: HashSet::new(),
            groups_to_heal: groups,
            announced: false,
            unpersisted: HashSet::new(),
            heal_complete: false,
            pending_discard: None,
            wrote: false,
            checked_size: 0,
            header_on_disk: true,
            mtime,
            ctime: None,
            mtime_to_restore: false,
        }
    }

    fn all_healed(&self) -> bool {
        self.heal_complete || self.healed.len() as u64 >= self.groups_to_heal
    }

    /// Every write the daemon makes to the lower file: the run has written, and the lower's
    /// mtime must be put back afterwards.
    fn touch(&mut self) {
        self.wrote = true;
        self.mtime_to_restore = true;
    }

    /// A user operation changed the file now: mtime and ctime move, as ext4 sets them.
    fn user_changed(&mut self) {
        let now = lower::now();
        self.mtime = now;
        self.ctime = Some(now);
        self.mtime_to_restore = true;
    }

    /// The range the header keeps: 0 once every group is healed.
    fn persisted_heal_from(&self) -> u64 {
        let done = self.all_healed() && self.unpersisted.is_empty();
        if done { 0 } else { self.epochs.heal_from }
    }

    fn forget_clean(&mut self, record: u64) {
        let memory = &self.memory;
        self.clean.retain(|(r, b)| {
            let keep = *r != record;
            if !keep {
                memory.release(b.len());
            }
            keep
        });
    }

    fn put_dirty(&mut self, record: u64, buf: Vec<u8>) {
        self.forget_clean(record);
        self.dirty_bytes += buf.len();
        self.memory.charge(buf.len());
        if let Some(old) = self.dirty.insert(record, buf) {
            self.dirty_bytes -= old.len();
            self.memory.release(old.len());
        }
    }

    fn take_dirty(&mut self, record: u64) -> Option<Vec<u8>> {
        let buf = self.dirty.remove(&record)?;
        self.dirty_bytes -= buf.len();
        self.memory.release(buf.len());
        Some(buf)
    }

    fn put_inflight(&mut self, record: u64, flight: InFlight) {
        self.inflight_bytes += flight.data.len();
        self.memory.charge(flight.data.len());
        if let Some(old) = self.inflight.insert(record, flight) {
            self.inflight_bytes -= old.data.len();
            self.memory.release(old.data.len());
        }
    }

    fn take_inflight(&mut self, record: u64) -> Option<InFlight> {
        let f = self.inflight.remove(&record)?;
        self.inflight_bytes -= f.data.len();
        self.memory.release(f.data.len());
        Some(f)
    }

    fn cache_table(&mut self, group: u64, table: Box<[Pair]>) {
        if self.tables.len() >= TABLE_CACHE_GROUPS {
            if let Some(&victim) = self.tables.keys().find(|&&g| g != group) {
                self.tables.remove(&victim);
                if self.unpersisted.remove(&victim) {
                    self.healed.remove(&victim); // its healed view is gone: heal again on reload
                }
            }
        }
        self.tables.insert(group, table);
    }
}

/// Groups whose regions the lower file reaches (what healing may have to visit).
fn groups_in(lower_len: u64, layout: Layout) -> u64 {
    if lower_len == 0 { 1 } else { layout.lower_off_to_group(lower_len - 1) + 1 }
}

impl Container {
    /// Reads the header block of a lower file: `None` if it is a plain file.
    pub fn probe(file: &File) -> Result<Option<Header>, crate::format::FormatError> {
        let mut block = vec![0u8; HEADER_BLOCK as usize];
        let n = lower::pread_full(file, &mut block, 0).map_err(|_| crate::format::FormatError::BadHeader)?;
        crate::format::Header::decode(&block[..n])
    }

    /// Turns an empty lower file into an empty container. Nothing is written until the file
    /// gets data or a size: an empty file stays an empty lower file.
    pub fn create(lower: File, settings: CreateSettings, policy: RecordPolicy, engine: Arc<Engine>, memory: Arc<Memory>, label: String) -> FsResult<Container> {
        let meta = lower.metadata()?;
        if meta.len() != 0 {
            lower.set_len(0)?;
        }
        let header = Header {
            layout: settings.layout,
            checksum: settings.checksum,
            codec: settings.compression.codec,
            level: settings.compression.level as i8,
            size: 0,
            sequence: 0,
            // A new file: this run's epochs (from 2 * EPOCH_GAP) are already past what the header
            // says, so it needs no announcement (and no sync) before its first write.
            durable_below: Epochs::NEW_FILE_DURABLE_BELOW,
            heal_from: 0,
        };
        let container = Container::assemble(lower, header, &meta, policy, engine, memory, label);
        {
            let mut st = container.state.lock();
            st.announced = true;
            st.header_on_disk = false;
        }
        Ok(container)
    }

    /// A container found on the lower file. `writable`: opened for writing, so what a crash
    /// left past the end of file is dropped now; a reader leaves that to the first writer.
    pub fn open(lower: File, header: Header, policy: RecordPolicy, engine: Arc<Engine>, memory: Arc<Memory>, label: String, writable: bool) -> FsResult<Container> {
        let meta = lower.metadata()?;
        let container = Container::assemble(lower, header, &meta, policy, engine, memory, label);
        container.state.lock().pending_discard = Some(container.layout.plain_size_to_records(header.size));
        if writable {
            container.discard_pending()?;
        }
        Ok(container)
    }

    fn assemble(lower: File, header: Header, meta: &std::fs::Metadata, policy: RecordPolicy, engine: Arc<Engine>, memory: Arc<Memory>, label: String) -> Container {
        use std::os::unix::fs::MetadataExt;
        let compression = Compression { codec: header.codec, level: header.level as i32 };
        let groups = groups_in(meta.len(), header.layout);
        let mtime = libc::timespec { tv_sec: meta.mtime(), tv_nsec: meta.mtime_nsec() };
        Container {
            lower,
            layout: header.layout,
            checksum: header.checksum,
            engine,
            memory: memory.clone(),
            label,
            slot_io: RwLock::new(()),
            state: Mutex::new(State::new(compression, policy, &header, groups, mtime, memory)),
            landed: Condvar::new(),
        }
    }

    /// Drops records past the size that a crash left (they must not reappear if the file grows).
    fn discard_pending(&self) -> FsResult<()> {
        let _io = self.slot_io.write();
        let mut st = self.state.lock();
        if let Some(first) = st.pending_discard.take() {
            if let Err(e) = self.discard_from(&mut st, first) {
                st.pending_discard = Some(first);
                warn!(file = %self.label, "cannot drop records past the end of file: {e}");
                return Err(e);
            }
        }
        Ok(())
    }

    /// A handle opens the file for writing: the lower file becomes writable (it was opened
    /// read-only while only readers had it), and what a crash left past the end goes.
    pub fn make_writable(&self, path_fd: std::os::fd::RawFd) -> FsResult<()> {
        lower::upgrade_to_write(&self.lower, path_fd)?;
        self.discard_pending()
    }

    /// The modification time users see, and the last status change not yet on the lower.
    pub fn times(&self) -> (libc::timespec, Option<libc::timespec>) {
        let st = self.state.lock();
        (st.mtime, st.ctime)
    }

    /// The user set the lower's times (utimensat): take them as the file's own.
    pub fn times_set_by_user(&self) -> FsResult<()> {
        use std::os::unix::fs::MetadataExt;
        let meta = self.lower.metadata()?;
        let mut st = self.state.lock();
        st.mtime = libc::timespec { tv_sec: meta.mtime(), tv_nsec: meta.mtime_nsec() };
        st.ctime = None;
        st.mtime_to_restore = false;
        Ok(())
    }

    /// A user operation changed the file without changing its bytes (fallocate: ext4 moves
    /// mtime and ctime there too).
    pub fn changed_by_user(&self) {
        self.state.lock().user_changed();
    }

    /// Puts the lower's mtime back to the user's after the daemon's own writes.
    fn restore_mtime(&self, st: &mut State) {
        if !st.mtime_to_restore {
            return;
        }
        let times = [libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT }, st.mtime];
        if unsafe { libc::futimens(std::os::fd::AsRawFd::as_raw_fd(&self.lower), times.as_ptr()) } != 0 {
            warn!(file = %self.label, "cannot keep the modification time: {}", std::io::Error::last_os_error());
        }
        st.mtime_to_restore = false;
        st.ctime = None;
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    pub fn compression(&self) -> Compression {
        self.state.lock().compression
    }

    pub fn size(&self) -> u64 {
        self.state.lock().size
    }

    pub fn lower_file(&self) -> &File {
        &self.lower
    }

    // ---- descriptors -------------------------------------------------------------------

    fn pair(&self, st: &mut State, record: u64) -> FsResult<Pair> {
        let group = self.layout.record_to_group(record);
        let index = self.layout.record_to_entry_index(record);
        if let Some(table) = st.tables.get(&group) {
            return Ok(table[index]);
        }
        let mut block = vec![0u8; TABLE_SIZE as usize];
        lower::pread_full(&self.lower, &mut block, self.layout.group_to_table_off(group))?;
        let mut table = decode_table(&block, group, self.layout);
        if st.healed.insert(group) {
            self.heal(st, group, &mut table)?;
            // A run that only reads keeps the healed view in memory and writes no header.
            if st.all_healed() && st.epochs.heal_from != 0 && st.announced {
                st.header_stale = true;
            }
        }
        for (i, pair) in table.iter().enumerate() {
            for (slot, s) in pair.iter().enumerate() {
                if *s == SlotState::Damaged {
                    warn!(file = %self.label, record = group * GROUP_RECORDS + i as u64, slot, "damaged slot descriptor ignored");
                }
            }
        }
        let pair = table[index];
        st.cache_table(group, table);
        Ok(pair)
    }

    /// Heals a group's table on first load: each copy a crashed run left (epoch in the suspect
    /// range) is checked; torn ones are cleared, intact ones re-stamped with this run's epoch so
    /// the next sync makes them durable. Never judged durable by mistake, so a write never
    /// overwrites the copy that must survive.
    fn heal(&self, st: &mut State, group: u64, table: &mut [Pair]) -> FsResult<()> {
        let mut changed = false;
        for (i, pair) in table.iter_mut().enumerate() {
            let record = group * GROUP_RECORDS + i as u64;
            let check = st.epochs.slots_to_check(pair);
            let mut intact = [true; 2];
            for slot in 0..2 {
                if let (true, SlotState::Valid(d)) = (check[slot], pair[slot]) {
                    let req = self.read_slot(record, slot, &d)?;
                    intact[slot] = self.checksum.compute(&req.stored) == d.checksum;
                }
            }
            if let Some(dropped) = st.epochs.heal(pair, intact) {
                for slot in (0..2).filter(|&s| dropped[s]) {
                    warn!(file = %self.label, record, slot, "dropping a copy torn by a crash or power cut (never synced); the previous copy stays");
                }
                changed = true;
            }
        }
        if changed {
            if st.announced {
                self.write_table(st, group, table)?;
            } else {
                st.unpersisted.insert(group); // written once this run writes at all
            }
        }
        Ok(())
    }

    fn write_table(&self, st: &mut State, group: u64, table: &[Pair]) -> FsResult<()> {
        st.touch();
        let mut block = Vec::with_capacity(TABLE_SIZE as usize);
        for pair in table {
            for s in pair {
                block.extend_from_slice(&s.encode());
            }
        }
        lower::pwrite_all(&self.lower, &block, self.layout.group_to_table_off(group))?;
        Ok(())
    }

    /// Heals every group not loaded yet (before a sync, so the range can go from the header).
    /// Only groups with something on the lower file are visited: a sparse file costs in
    /// proportion to its data, not its size.
    fn heal_all(&self, st: &mut State) -> FsResult<()> {
        if st.all_healed() {
            return Ok(());
        }
        // Healed tables are written as they are loaded (the cache does not have to hold them all).
        self.announce(st)?;
        let mut group = 0;
        while let Some(found) = self.next_stored_group(group)? {
            if !st.healed.contains(&found) {
                self.pair(st, found * GROUP_RECORDS)?;
            }
            group = found + 1;
        }
        st.heal_complete = true;
        if st.epochs.heal_from != 0 {
            st.header_stale = true;
        }
        Ok(())
    }

    /// The first group from `group` on whose region holds anything on the lower file. A group
    /// never written is a hole there (its table too), so SEEK_DATA skips it without reading.
    fn next_stored_group(&self, group: u64) -> FsResult<Option<u64>> {
        let from = if group == 0 { 0 } else { self.layout.group_to_table_off(group) };
        Ok(lower::seek_data(&self.lower, from)?.map(|off| self.layout.lower_off_to_group(off).max(group)))
    }

    /// Records this run's epochs in the header, durably, before its first descriptor write;
    /// then writes the tables healed so far.
    fn announce(&self, st: &mut State) -> FsResult<()> {
        if st.announced {
            return Ok(());
        }
        st.header_stale = true;
        self.write_header(st)?;
        lower::fdatasync(&self.lower)?;
        st.announced = true;
        for group in std::mem::take(&mut st.unpersisted) {
            if let Some(table) = st.tables.get(&group).cloned() {
                self.write_table(st, group, &table)?;
            }
        }
        if st.all_healed() && st.epochs.heal_from != 0 {
            st.header_stale = true;
        }
        Ok(())
    }

    fn set_descriptor(&self, st: &mut State, record: u64, slot: usize, state: SlotState) -> FsResult<()> {
        if matches!(state, SlotState::Valid(_)) {
            self.announce(st)?;
            if !st.header_on_disk {
                // A new file's first record: its header goes first (the descriptors alone would
                // make it a container whose header is gone).
                st.header_stale = true;
                self.write_header(st)?;
            }
        }
        st.touch();
        let bytes = state.encode();
        lower::pwrite_all(&self.lower, &bytes, self.layout.record_to_descriptor_off(record, slot))?;
        let group = self.layout.record_to_group(record);
        if let Some(table) = st.tables.get_mut(&group) {
            table[self.layout.record_to_entry_index(record)][slot] = state;
        }
        Ok(())
    }

    // ---- reading -----------------------------------------------------------------------

    fn source(&self, st: &mut State, record: u64) -> FsResult<Source> {
        if let Some(buf) = st.dirty.get(&record) {
            return Ok(Source::Memory(Arc::new(buf.clone())));
        }
        if let Some(f) = st.inflight.get(&record) {
            return Ok(Source::Memory(f.data.clone()));
        }
        if let Some((_, buf)) = st.clean.iter().find(|(r, _)| *r == record) {
            return Ok(Source::Memory(buf.clone()));
        }
        let pair = self.pair(st, record)?;
        let found = newest_first(&pair);
        if found.is_empty() && pair.contains(&SlotState::Damaged) {
            // A record was there, and its descriptor is damaged: not a hole to read as zeros.
            error!(file = %self.label, record, "record unreadable: its slot descriptors are damaged");
            return Err(FsError::corrupt(format!("{}: record {record}: damaged slot descriptor", self.label)));
        }
        Ok(if found.is_empty() { Source::Absent } else { Source::Lower { candidates: found } })
    }

    fn read_slot(&self, record: u64, slot: usize, d: &Descriptor) -> FsResult<DecompressRequest> {
        let mut stored = vec![0u8; d.stored_len as usize];
        let at = if d.is_inline() { INLINE_OFF } else { self.layout.record_to_slot_off(record, slot) };
        // A slot cut short (a truncated lower file) keeps its length: the missing bytes read as
        // zeros and fail the checksum, so it is never taken for a hole.
        lower::pread_full(&self.lower, &mut stored, at)?;
        Ok(DecompressRequest {
            codec: d.codec(),
            stored,
            logical_len: d.logical_len as usize,
            checksum_kind: self.checksum,
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
            let req = self.read_slot(record, *slot, d)?;
            match self.engine.decode(&req) {
                Ok(buf) => {
                    if i > 0 {
                        warn!(file = %self.label, record, "newest copy unreadable; serving the previous copy (an interrupted write)");
                    }
                    let buf = Arc::new(buf);
                    self.remember_clean(&mut st, record, &buf);
                    return Ok(buf);
                }
                Err(e) => last = Some((*slot, e)),
            }
        }
        let (slot, e) = last.expect("BUG: candidates were not empty");
        error!(file = %self.label, record, slot, "record unreadable: {e}");
        Err(FsError::corrupt(format!("{}: record {record}: {e}", self.label)))
    }

    fn remember_clean(&self, st: &mut State, record: u64, buf: &Arc<Vec<u8>>) {
        st.forget_clean(record);
        if st.clean.len() >= CLEAN_CACHE_RECORDS || (st.memory.over() && !st.clean.is_empty()) {
            if let Some((_, old)) = st.clean.pop_front() {
                st.memory.release(old.len());
            }
        }
        if st.memory.over() {
            return; // a cache, not worth memory the budget does not have
        }
        st.memory.charge(buf.len());
        st.clean.push_back((record, buf.clone()));
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
                pending.push(((i, d), self.read_slot(records[i], slot, &d)?));
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
                    let unchanged = !st.dirty.contains_key(&record)
                        && !st.inflight.contains_key(&record)
                        && self.pair(&mut st, record).ok().and_then(|p| newest_first(&p).first().map(|c| c.1)) == Some(planned);
                    if unchanged {
                        self.remember_clean(&mut st, record, &buf);
                    }
                    buf
                }
                Err(_) => self.fetch_slow(record)?,
            });
        }
        Ok(out.into_iter().map(|b| b.expect("BUG: every record fetched")).collect())
    }

    pub fn read(&self, offset: u64, len: usize) -> FsResult<Vec<u8>> {
        let size = self.size();
        if offset >= size {
            return Ok(Vec::new());
        }
        let len = (len as u64).min(size - offset);
        let pieces: Vec<_> = self.layout.split(offset, len).collect();
        let records: Vec<u64> = pieces.iter().map(|p| p.record).collect();
        let contents = self.fetch(&records)?;
        let mut out = vec![0u8; len as usize];
        let mut at = 0;
        for (piece, buf) in pieces.iter().zip(contents) {
            let have = buf.len().saturating_sub(piece.skip).min(piece.len);
            if have > 0 {
                out[at..at + have].copy_from_slice(&buf[piece.skip..piece.skip + have]);
            }
            at += piece.len;
        }
        Ok(out)
    }

    // ---- writing -----------------------------------------------------------------------

    /// Makes sure `record`'s current contents are in `dirty` (trimmed to the file size), so a
    /// partial write can modify them.
    fn load_dirty(&self, record: u64) -> FsResult<()> {
        loop {
            let seen = {
                let _io = self.slot_io.read();
                let mut st = self.state.lock();
                if st.dirty.contains_key(&record) {
                    return Ok(());
                }
                match self.source(&mut st, record)? {
                    Source::Memory(buf) => {
                        self.put_trimmed(&mut st, record, &buf);
                        return Ok(());
                    }
                    Source::Absent => {
                        st.put_dirty(record, Vec::new());
                        return Ok(());
                    }
                    Source::Lower { candidates } => candidates,
                }
            };
            let buf = self.fetch_slow(record)?;
            let _io = self.slot_io.read();
            let mut st = self.state.lock();
            if st.dirty.contains_key(&record) {
                return Ok(());
            }
            // Insert only if nothing changed the record while we read it; else look again.
            if !st.inflight.contains_key(&record) && newest_first(&self.pair(&mut st, record)?) == seen {
                self.put_trimmed(&mut st, record, &buf);
                return Ok(());
            }
        }
    }

    /// Puts a stored record's bytes in `dirty` to be re-encoded, marked as a rewrite (landed only
    /// if smaller). A record with a user's change pending is left to the ordinary path: the mark
    /// is set under the same lock that sees no such change, and every user change clears it.
    fn load_for_rewrite(&self, record: u64) -> FsResult<()> {
        loop {
            let seen = {
                let _io = self.slot_io.read();
                let mut st = self.state.lock();
                if st.dirty.contains_key(&record) || st.inflight.contains_key(&record) {
                    return Ok(());
                }
                match self.source(&mut st, record)? {
                    Source::Memory(buf) => {
                        self.put_trimmed(&mut st, record, &buf);
                        st.rewriting.insert(record);
                        return Ok(());
                    }
                    Source::Absent => return Ok(()),
                    Source::Lower { candidates } => candidates,
                }
            };
            let buf = self.fetch_slow(record)?;
            let _io = self.slot_io.read();
            let mut st = self.state.lock();
            if st.dirty.contains_key(&record) || st.inflight.contains_key(&record) {
                return Ok(());
            }
            if newest_first(&self.pair(&mut st, record)?) == seen {
                self.put_trimmed(&mut st, record, &buf);
                st.rewriting.insert(record);
                return Ok(());
            }
        }
    }

    fn put_trimmed(&self, st: &mut State, record: u64, buf: &[u8]) {
        let keep = self.layout.record_len_in_size(record, st.size);
        st.put_dirty(record, buf[..buf.len().min(keep)].to_vec());
    }

    /// Locks the file for changing one record. When the change keeps some of the record's bytes
    /// (`partial`) and the record lies inside the file, its current contents are in `dirty` on
    /// return — even if another writer handed the record to the engine meanwhile.
    fn lock_for_edit(&self, record: u64, partial: bool) -> FsResult<(RwLockReadGuard<'_, ()>, MutexGuard<'_, State>)> {
        loop {
            let io = self.slot_io.read();
            let mut st = self.state.lock();
            let needs_old = partial && self.layout.record_to_plain_off(record) < st.size;
            if !needs_old || st.dirty.contains_key(&record) {
                return Ok((io, st));
            }
            match self.source(&mut st, record)? {
                Source::Memory(buf) => {
                    self.put_trimmed(&mut st, record, &buf);
                    return Ok((io, st));
                }
                Source::Absent => {
                    st.put_dirty(record, Vec::new());
                    return Ok((io, st));
                }
                Source::Lower { .. } => {
                    drop(st);
                    drop(io);
                    self.load_dirty(record)?;
                }
            }
        }
    }

    fn take_write_error(&self, st: &mut State) -> FsResult<()> {
        match st.write_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Waits until the engine holds less than INFLIGHT_LIMIT bytes of this file.
    fn wait_for_room(&self) {
        let mut st = self.state.lock();
        while st.inflight_bytes > INFLIGHT_LIMIT {
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
            self.take_write_error(&mut st)?;
            self.check_lower_can_hold(&mut st, end)?;
            st.user_changed();
        }
        self.wait_for_room();
        self.memory.wait_for_room();
        let rs = self.layout.record_size() as usize;
        let size = self.size();
        if offset > size {
            self.zero_tail_past(size)?;
        }
        let mut ready = Vec::new();
        let mut at = 0;
        for p in self.layout.split(offset, data.len() as u64) {
            let (_io, mut st) = self.lock_for_edit(p.record, p.is_partial(rs))?;
            st.rewriting.remove(&p.record);
            let mut buf = st.take_dirty(p.record).unwrap_or_default();
            if buf.len() < p.skip + p.len {
                buf.resize(p.skip + p.len, 0);
            }
            buf[p.skip..p.skip + p.len].copy_from_slice(&data[at..at + p.len]);
            at += p.len;
            if p.skip + p.len == rs && buf.len() == rs {
                ready.push(p.record);
            }
            st.put_dirty(p.record, buf);
            st.size = st.size.max(self.layout.record_to_plain_off(p.record) + (p.skip + p.len) as u64);
        }
        let jobs = {
            let mut st = self.state.lock();
            if st.dirty_bytes > DIRTY_LIMIT.min(st.memory.limit() / 2) {
                ready = st.dirty.keys().copied().collect();
            }
            self.prepare(&mut st, &ready)
        };
        self.engine.submit(jobs);
        Ok(data.len())
    }

    /// Moves the given dirty records into flight and builds their engine jobs. Records already in
    /// flight stay dirty: one version of a record is in the engine at a time.
    fn prepare(self: &Arc<Self>, st: &mut State, records: &[u64]) -> Vec<Job> {
        let mut jobs = Vec::new();
        for &record in records {
            if st.inflight.contains_key(&record) {
                continue;
            }
            let Some(buf) = st.take_dirty(record) else { continue };
            if buf.is_empty() {
                // Nothing past the end of file: a record truncated to nothing.
                continue;
            }
            let seq = st.next_seq;
            st.next_seq += 1;
            let data = Arc::new(buf);
            let only_if_smaller = st.rewriting.remove(&record);
            st.put_inflight(record, InFlight { seq, data: data.clone(), only_if_smaller });
            let me = Arc::clone(self);
            jobs.push(Job {
                work: Work::Compress(CompressRequest {
                    data,
                    compression: st.compression,
                    min_savings: st.policy.min_savings,
                    offload: st.policy.offload,
                    checksum: self.checksum,
                }),
                done: Box::new(move |result| me.land(record, seq, result)),
            });
        }
        jobs
    }

    /// Engine completion: writes the encoded record into a slot, then its descriptor.
    fn land(&self, record: u64, seq: u64, result: Result<Output, EngineError>) {
        let _io = self.slot_io.write();
        let mut st = self.state.lock();
        if st.inflight.get(&record).map(|f| f.seq) != Some(seq) {
            // Truncated away (or superseded) while in the engine.
            return;
        }
        let only_if_smaller = st.inflight.get(&record).is_some_and(|f| f.only_if_smaller);
        let outcome = match result {
            Ok(Output::Compressed(encoded)) => self.write_record(&mut st, record, &encoded, only_if_smaller),
            Ok(Output::Decompressed(_)) => panic!("BUG: compress job returned a decompressed record"),
            Err(e) => Err(FsError::new(libc::EIO, format!("compressing record {record}: {e}"))),
        };
        let flight = st.take_inflight(record).expect("BUG: in-flight record vanished under the lock");
        if let Err(e) = outcome {
            error!(file = %self.label, record, "cannot write record: {e}");
            // Keep the data: a later flush retries once the cause (say, a full disk) is gone.
            if !st.dirty.contains_key(&record) {
                st.put_dirty(record, flight.data.to_vec());
            }
            st.write_error = Some(e);
        } else {
            self.remember_clean(&mut st, record, &flight.data);
        }
        self.landed.notify_all();
    }

    fn write_record(&self, st: &mut State, record: u64, encoded: &Encoded, only_if_smaller: bool) -> FsResult<()> {
        let pair = self.pair(st, record)?;
        let found = newest_first(&pair);
        // Keep the last durable copy: if the current copy is not durable yet (written in this
        // sync epoch — including before a crash or power cut, when it may even be torn) and the
        // other slot holds an older one, overwrite the current copy in place.
        let target = st.epochs.target_slot(&pair);
        let generation = found.first().map_or(0, |(_, d)| d.generation) + 1;
        let stored = encoded.bytes.len() as u64;
        let inline = record == 0 && target == 0 && stored > 0 && stored <= INLINE_CAPACITY;
        let slot_off = self.layout.record_to_slot_off(record, target);
        // Bytes the slot's own area held and holds now (an inline copy holds none of it).
        let old_len = match pair[target] {
            SlotState::Valid(d) if d.is_inline() => 0,
            SlotState::Valid(d) => round_up_block(d.stored_len as u64),
            SlotState::Damaged => self.layout.record_size(),
            SlotState::Empty => 0,
        };
        let new_len = if inline { 0 } else { round_up_block(stored) };
        if only_if_smaller {
            // Recompress keeps what was smaller: a stronger codec must never make a file take
            // more blocks (say, a one-block inline record moving out to a slot of its own).
            if let Some(&(_, current)) = found.first() {
                let now = if current.is_inline() { 0 } else { round_up_block(current.stored_len as u64) };
                if new_len >= now {
                    return Ok(());
                }
            }
        }
        st.touch();
        if stored > 0 {
            lower::pwrite_all(&self.lower, &encoded.bytes, if inline { INLINE_OFF } else { slot_off })?;
        }
        if old_len > new_len {
            lower::punch_hole(&self.lower, slot_off + new_len, old_len - new_len)?;
        }
        let descriptor = Descriptor {
            generation,
            stored_len: encoded.bytes.len() as u32,
            logical_len: encoded.logical_len,
            codec_id: encoded.codec as u8,
            level: encoded.level,
            flags: if inline { FLAG_INLINE } else { 0 },
            checksum: encoded.checksum,
            epoch: st.epochs.epoch,
        };
        self.set_descriptor(st, record, target, SlotState::Valid(descriptor))?;
        if pair[1 - target] != SlotState::Empty {
            st.stale.insert(record);
        }
        Ok(())
    }

    /// Hands every dirty record to the engine and waits until all of them have landed, then
    /// writes the header. Records dirtied by other writers after the call starts are not waited
    /// for (so a busy writer cannot hold an fsync forever).
    pub fn flush(self: &Arc<Self>) -> FsResult<()> {
        let mut st = self.state.lock();
        let mut pending: BTreeSet<u64> = st.dirty.keys().chain(st.inflight.keys()).copied().collect();
        loop {
            if let Some(e) = st.write_error.take() {
                return Err(e);
            }
            pending.retain(|r| st.dirty.get(r).is_some_and(|b| !b.is_empty()) || st.inflight.contains_key(r));
            if pending.is_empty() {
                break;
            }
            let ready: Vec<u64> = pending.iter().copied().filter(|r| st.dirty.contains_key(r)).collect();
            let jobs = self.prepare(&mut st, &ready);
            if jobs.is_empty() {
                self.landed.wait(&mut st);
            } else {
                drop(st);
                self.engine.submit(jobs);
                st = self.state.lock();
            }
        }
        self.write_header(&mut st)?;
        // Only a run that wrote: a reader never writes (its descriptor is read-only).
        let emptied = st.size == 0 && st.header_on_disk && st.wrote;
        drop(st);
        if emptied {
            self.cut_to_empty()?;
        }
        self.restore_mtime(&mut self.state.lock());
        Ok(())
    }

    /// A file truncated to nothing becomes an empty lower file again (no header block), so it
    /// takes no more space than an empty plain file. Crash-safe: an empty lower file is an empty
    /// file, whatever else of the truncate a power cut keeps or undoes.
    fn cut_to_empty(&self) -> FsResult<()> {
        let _io = self.slot_io.write();
        let mut st = self.state.lock();
        if st.size != 0 || !st.header_on_disk || !st.dirty.is_empty() || !st.inflight.is_empty() {
            return Ok(());
        }
        st.touch();
        self.lower.set_len(0)?;
        st.header_on_disk = false;
        st.header_stale = false;
        st.persisted_size = 0;
        st.tables.clear();
        st.unpersisted.clear();
        st.stale.clear();
        st.rewriting.clear();
        st.deferred_punch.clear();
        st.heal_complete = true;
        let memory = st.memory.clone();
        for (_, b) in st.clean.drain(..) {
            memory.release(b.len());
        }
        Ok(())
    }

    /// Background writeback (every few seconds): starts compressing every dirty record without
    /// waiting, and records the size once nothing is in flight, so a crash loses little.
    pub fn writeback(self: &Arc<Self>) -> FsResult<()> {
        let jobs = {
            let mut st = self.state.lock();
            if st.dirty.is_empty() && st.inflight.is_empty() {
                self.write_header(&mut st)?;
                self.restore_mtime(&mut st);
            }
            let records: Vec<u64> = st.dirty.keys().copied().collect();
            self.prepare(&mut st, &records)
        };
        self.engine.submit(jobs);
        Ok(())
    }

    fn write_header(&self, st: &mut State) -> FsResult<()> {
        if st.size == st.persisted_size && !st.header_stale {
            return Ok(());
        }
        if st.size == 0 && !st.header_on_disk {
            return Ok(()); // an empty new file stays an empty lower file
        }
        st.touch();
        let sequence = st.header_seq + 1;
        let header = Header {
            layout: self.layout,
            checksum: self.checksum,
            codec: st.compression.codec,
            level: st.compression.level as i8,
            size: st.size,
            sequence,
            durable_below: st.epochs.durable_below,
            heal_from: st.persisted_heal_from(),
        };
        let encoded = header.encode();
        if st.header_on_disk {
            lower::pwrite_all(&self.lower, &encoded, Header::copy_offset(sequence))?;
        } else {
            // A new file's first header fills both copies: each write after it replaces one.
            lower::pwrite_all(&self.lower, &[encoded.as_slice(), encoded.as_slice()].concat(), 0)?;
        }
        st.header_seq = sequence;
        st.persisted_size = st.size;
        st.header_stale = false;
        st.header_on_disk = true;
        Ok(())
    }

    /// fsync: everything written so far is on stable storage when this returns. Then the older
    /// copies of rewritten records are no longer needed and their space is freed.
    pub fn sync(self: &Arc<Self>, datasync: bool) -> FsResult<()> {
        self.flush()?;
        if !self.state.lock().wrote {
            // This run wrote nothing (a reader's fsync): no epoch to close, no header to write.
            let synced = if datasync { lower::fdatasync(&self.lower) } else { lower::fsync(&self.lower) };
            return Ok(synced?);
        }
        {
            let _io = self.slot_io.read();
            let mut st = self.state.lock();
            self.heal_all(&mut st)?;
        }
        let (was_stale, closing) = {
            let mut st = self.state.lock();
            // Copies written from here on belong to the next epoch: this sync does not cover them.
            let closing = st.epochs.begin_sync();
            (std::mem::take(&mut st.stale), closing)
        };
        let synced = if datasync { lower::fdatasync(&self.lower) } else { lower::fsync(&self.lower) };
        if let Err(e) = synced {
            let mut st = self.state.lock();
            st.stale.extend(was_stale);
            return Err(e.into());
        }
        {
            // Everything of the closing epoch is durable: record that in the header, and make
            // the header durable too before returning. A run after a crash must know exactly
            // which copies are durable: taking a durable copy for a possibly torn one (or the
            // reverse) would make the next write overwrite the copy that must survive.
            let mut st = self.state.lock();
            st.epochs.synced(closing);
            st.header_stale = true;
            self.write_header(&mut st)?;
        }
        lower::fdatasync(&self.lower)?;
        let reclaimed = self.reclaim(was_stale);
        self.restore_mtime(&mut self.state.lock());
        reclaimed
    }

    /// Frees the non-current slot of each record (their current copy is durable), and the
    /// slots truncates cleared (their cleared descriptors are durable now).
    fn reclaim(&self, records: BTreeSet<u64>) -> FsResult<()> {
        let _io = self.slot_io.write();
        let mut st = self.state.lock();
        let rs = self.layout.record_size();
        for (record, slot) in std::mem::take(&mut st.deferred_punch) {
            // Skip a slot written again since (its descriptor is set again).
            if self.pair(&mut st, record)?[slot] == SlotState::Empty {
                st.touch();
                lower::punch_hole(&self.lower, self.layout.record_to_slot_off(record, slot), rs)?;
            }
        }
        if records.is_empty() {
            return Ok(());
        }
        let limit = self.layout.plain_size_to_records(st.size);
        for record in records {
            if record >= limit {
                continue;
            }
            let pair = self.pair(&mut st, record)?;
            let Ok(free) = st.epochs.reclaimable(&pair) else {
                st.stale.insert(record); // rewritten again since: its old copy is still needed
                continue;
            };
            if let Some(other) = free {
                self.set_descriptor(&mut st, record, other, SlotState::Empty)?;
                lower::punch_hole(&self.lower, self.layout.record_to_slot_off(record, other), rs)?;
            }
        }
        Ok(())
    }

    /// Whether closing needs a sync to free old copies.
    pub fn has_stale(&self) -> bool {
        let st = self.state.lock();
        !st.stale.is_empty() || !st.deferred_punch.is_empty()
    }

    /// Re-encodes every stored record with `compression` (ZFS's `zfs rewrite`). Each record takes
    /// the ordinary write path, so the file stays readable and writable meanwhile and a crash
    /// leaves every record at its old or its new encoding of the same bytes.
    pub fn recompress(self: &Arc<Self>, compression: Compression, policy: RecordPolicy) -> FsResult<()> {
        {
            let mut st = self.state.lock();
            st.compression = compression;
            st.policy = policy;
            st.header_stale = true;
        }
        let records = self.layout.plain_size_to_records(self.size());
        let mut start = 0;
        while start < records {
            let end = (start + GROUP_RECORDS).min(records);
            let mut batch = Vec::new();
            for record in start..end {
                let (_io, mut st) = self.lock_for_edit(record, false)?;
                let stored = newest_first(&self.pair(&mut st, record)?).first().is_some_and(|(_, d)| !d.is_hole());
                if stored || st.dirty.contains_key(&record) || st.inflight.contains_key(&record) {
                    batch.push(record);
                }
            }
            for &record in &batch {
                self.load_for_rewrite(record)?;
            }
            let jobs = self.prepare(&mut self.state.lock(), &batch);
            self.engine.submit(jobs);
            self.wait_for_room();
            start = end;
        }
        self.sync(true)?;
        self.compact_tail()
    }

    /// After a rewrite the last record's copy may sit in its second slot, past where the lower
    /// file ended: it is written again into its first slot (free once the sync reclaimed it) and
    /// the lower file cut after it, so recompress never makes the lower file longer.
    fn compact_tail(self: &Arc<Self>) -> FsResult<()> {
        let records = self.layout.plain_size_to_records(self.size());
        let Some(last) = records.checked_sub(1) else { return Ok(()) };
        let in_second_slot = {
            let _io = self.slot_io.read();
            let mut st = self.state.lock();
            let pair = self.pair(&mut st, last)?;
            pair[0] == SlotState::Empty && matches!(pair[1], SlotState::Valid(d) if !d.is_hole())
        };
        if !in_second_slot {
            return Ok(());
        }
        self.load_dirty(last)?;
        self.sync(true)?;
        let _io = self.slot_io.write();
        let mut st = self.state.lock();
        let pair = self.pair(&mut st, last)?;
        let end = match pair {
            [SlotState::Valid(d), SlotState::Empty] if d.is_inline() => HEADER_BLOCK,
            [SlotState::Valid(d), SlotState::Empty] => self.layout.record_to_slot_off(last, 0) + round_up_block(d.stored_len as u64),
            _ => return Ok(()),
        };
        if self.lower.metadata()?.len() > end {
            st.touch();
            self.lower.set_len(end)?;
            self.restore_mtime(&mut st);
        }
        Ok(())
    }

    // ---- size changes --------------------------------------------------------------------

    /// Zeroes the bytes of the record holding `size` that lie past `size`, so that growing the
    /// file never shows what an earlier, longer version held there.
    fn zero_tail_past(&self, size: u64) -> FsResult<()> {
        let record = self.layout.plain_off_to_record(size);
        if size % self.layout.record_size() == 0 {
            return Ok(());
        }
        self.load_dirty(record) // trims to the size
    }

    pub fn set_size(self: &Arc<Self>, new_size: u64) -> FsResult<()> {
        let old = self.size();
        {
            // ext4 moves mtime and ctime on every truncate, even to the same size.
            let mut st = self.state.lock();
            self.check_lower_can_hold(&mut st, new_size)?;
            st.user_changed();
        }
        if new_size > old {
            self.zero_tail_past(old)?;
            self.state.lock().size = new_size;
        } else if new_size < old {
            let boundary = self.layout.plain_off_to_record(new_size);
            if new_size % self.layout.record_size() != 0 {
                drop(self.lock_for_edit(boundary, true)?);
            }
            let _io = self.slot_io.write();
            let mut st = self.state.lock();
            st.size = new_size;
            let keep = self.layout.record_len_in_size(boundary, new_size);
            st.rewriting.remove(&boundary);
            if let Some(mut buf) = st.take_dirty(boundary) {
                buf.truncate(keep);
                // The trimmed copy replaces any longer one still in the engine.
                st.take_inflight(boundary);
                st.put_dirty(boundary, buf);
            }
            self.discard_from(&mut st, self.layout.plain_size_to_records(new_size))?;
        }
        Ok(())
    }

    /// Drops every record from `first` on, in memory and on the lower file.
    /// Caller holds `slot_io` exclusively.
    fn discard_from(&self, st: &mut State, first: u64) -> FsResult<()> {
        let doomed: Vec<u64> = st.dirty.range(first..).map(|(r, _)| *r).collect();
        for r in doomed {
            st.take_dirty(r);
        }
        let doomed: Vec<u64> = st.inflight.keys().copied().filter(|&r| r >= first).collect();
        for r in doomed {
            st.take_inflight(r);
        }
        let memory = st.memory.clone();
        st.clean.retain(|(r, b)| {
            if *r >= first {
                memory.release(b.len());
            }
            *r < first
        });
        st.stale = st.stale.range(..first).copied().collect();
        st.rewriting.retain(|&r| r < first);
        // Records sharing a table that stays (the boundary group's, and always group 0's, which
        // lives in block 0) are cleared one by one; later groups are cut off with their tables.
        let clear_end = if first > 0 && first % GROUP_RECORDS == 0 { first } else { (first / GROUP_RECORDS + 1) * GROUP_RECORDS };
        for record in first..clear_end {
            let pair = self.pair(st, record)?;
            for (slot, s) in pair.iter().enumerate() {
                if *s != SlotState::Empty {
                    self.set_descriptor(st, record, slot, SlotState::Empty)?;
                    st.deferred_punch.insert((record, slot));
                }
            }
        }
        // Whole later groups go at once (their tables with them); the boundary group's slots stay
        // until their cleared descriptors are durable (deferred punches), group 0's included.
        let keep_len = self.layout.records_to_lower_len(first.max(1));
        if self.lower.metadata()?.len() > keep_len {
            st.touch();
            self.lower.set_len(keep_len)?;
        }
        let kept_groups = clear_end / GROUP_RECORDS;
        st.tables.retain(|&g, _| g < kept_groups);
        self.landed.notify_all();
        Ok(())
    }

    /// Sets `[offset, offset + len)` to zeros (records wholly inside become holes).
    pub fn zero_range(self: &Arc<Self>, offset: u64, len: u64) -> FsResult<()> {
        let size = self.size();
        let end = offset.saturating_add(len).min(size);
        if offset >= end {
            return Ok(());
        }
        self.state.lock().user_changed();
        let rs = self.layout.record_size() as usize;
        for p in self.layout.split(offset, end - offset) {
            let keep = self.layout.record_len_in_size(p.record, size);
            let whole = p.skip == 0 && p.len >= keep;
            let (_io, mut st) = self.lock_for_edit(p.record, p.is_partial(rs) && !whole)?;
            st.rewriting.remove(&p.record);
            let mut buf = st.take_dirty(p.record).unwrap_or_default();
            if whole {
                buf = vec![0u8; keep];
            } else if buf.len() > p.skip {
                let stop = (p.skip + p.len).min(buf.len());
                buf[p.skip..stop].fill(0);
            }
            st.put_dirty(p.record, buf);
        }
        Ok(())
    }

    /// Refuses a size whose records the lower file system cannot hold (EFBIG, as the lower would
    /// say), when the write or truncate is made rather than when its record lands.
    fn check_lower_can_hold(&self, st: &mut State, end: u64) -> FsResult<()> {
        if end <= st.size.max(st.checked_size) || end == 0 {
            return Ok(());
        }
        let last = self.layout.plain_off_to_record(end - 1);
        let lower_end = self.layout.record_to_slot_off(last, 1).checked_add(self.layout.record_size());
        if !lower_end.is_some_and(|e| lower::offset_allowed(&self.lower, e)) {
            return Err(FsError::new(libc::EFBIG, format!("{}: the lower file system cannot hold a file of {end} bytes stored this way", self.label)));
        }
        st.checked_size = end;
        Ok(())
    }

    /// Whether a record has data stored on the lower file (not a hole).
    fn stored_data(&self, st: &mut State, record: u64) -> FsResult<bool> {
        Ok(newest_first(&self.pair(st, record)?).first().is_some_and(|(_, d)| !d.is_hole()))
    }

    /// The first record in `from..end` holding data: in memory, or stored (groups with nothing on
    /// the lower are skipped without reading them).
    fn next_data_record(&self, st: &mut State, from: u64, end: u64) -> FsResult<Option<u64>> {
        let in_memory = st.dirty.range(from..).next().map(|(r, _)| *r).into_iter().chain(st.inflight.keys().copied().filter(|&r| r >= from)).min();
        let limit = in_memory.unwrap_or(end).min(end);
        let mut record = from;
        while record < limit {
            let group = self.layout.record_to_group(record);
            let Some(found) = self.next_stored_group(group)? else { break };
            if found > group {
                record = found * GROUP_RECORDS;
                continue;
            }
            let group_end = ((group + 1) * GROUP_RECORDS).min(limit);
            for r in record..group_end {
                if self.stored_data(st, r)? {
                    return Ok(Some(r));
                }
            }
            record = group_end;
        }
        Ok(in_memory.filter(|&r| r < end))
    }

    /// The first record in `from..end` that is a hole (or `end`); data records are visited once each.
    fn next_hole_record(&self, st: &mut State, from: u64, end: u64) -> FsResult<u64> {
        let mut record = from;
        while record < end {
            if !st.dirty.contains_key(&record) && !st.inflight.contains_key(&record) {
                let group = self.layout.record_to_group(record);
                let group_stored = st.tables.contains_key(&group) || self.next_stored_group(group)? == Some(group);
                if !group_stored || !self.stored_data(st, record)? {
                    return Ok(record);
                }
            }
            record += 1;
        }
        Ok(end)
    }

    /// SEEK_DATA / SEEK_HOLE at record granularity: a record is a hole when nothing or only an
    /// all-zero record is stored for it (dirty records count as data). Costs in proportion to
    /// the data, never to the offset.
    pub fn seek(&self, offset: u64, want_data: bool) -> FsResult<u64> {
        let _io = self.slot_io.read();
        let mut st = self.state.lock();
        let size = st.size;
        if offset >= size {
            return Err(FsError::errno(libc::ENXIO));
        }
        let records = self.layout.plain_size_to_records(size);
        let from = self.layout.plain_off_to_record(offset);
        if want_data {
            match self.next_data_record(&mut st, from, records)? {
                Some(record) => Ok(offset.max(self.layout.record_to_plain_off(record))),
                None => Err(FsError::errno(libc::ENXIO)),
            }
        } else {
            let record = self.next_hole_record(&mut st, from, records)?;
            Ok(offset.max(self.layout.record_to_plain_off(record)).min(size))
        }
    }
}

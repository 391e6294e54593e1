//! The lower file of one container as a store of record copies: its header, its descriptor
//! tables (cached, healed on first load), its slots, and the durability bookkeeping around them
//! (epochs, the announcement of a run, the old copies and cleared slots a sync reclaims). It
//! knows nothing of buffers or the engine: the container (`container.rs`) is the write-back
//! cache above it, and `inspect` reads through the same table and slot readers.
//!
//! A store's mutable state is a [`StoreState`], owned by whoever serialises access to the store
//! (the container keeps it under its state lock and passes it to every call that needs it).
//! Writers of slots hold the container's `slot_io` exclusively; the store does not lock.

use super::changed::Changed;
use super::error::{FsError, FsResult};
use super::lower;
use crate::checksum::ChecksumKind;
use crate::codec::Setting;
use crate::format::durability::Epochs;
use crate::format::hints::SizeHint;
use crate::format::layout::{round_up_block, BLOCK, GROUP_RECORDS, HEADER_BLOCK, TABLE_SIZE};
use crate::format::{
    decode_table, newest_first, Descriptor, FormatError, Header, Layout, Pair, SlotState, BIRTH_HEADER_SIZE, BIRTH_HEADER_XATTR,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::Arc;
use tracing::{error, warn};

mod slots;
mod space;

use space::{Extent, Space};

/// Groups of descriptors cached per file (2 KiB each): tables are re-read when evicted, so a
/// huge file's metadata does not grow memory without bound.
const TABLE_CACHE_GROUPS: usize = 256;

pub struct Store {
    /// Shared with the inode table, whose descriptor for the inode it also is (one descriptor
    /// per open file, not two).
    lower: Arc<File>,
    layout: Layout,
    checksum: ChecksumKind,
    /// What log lines call the file; `None`: its lower path, looked up when a line needs it
    /// (a readlink per opened file costs more than the rest of a small file's open).
    label: Option<String>,
}

/// What a store remembers between calls.
pub struct StoreState {
    /// The logical size (what the next header records).
    pub size: u64,
    /// How records written from now on are encoded (recorded in the header).
    pub compression: Setting,
    header_seq: u64,
    persisted_size: u64,
    /// The header must be rewritten even if the size did not change (the codec did).
    pub header_stale: bool,
    tables: HashMap<u64, Box<[Pair]>>,
    /// Sync epochs (docs/FORMAT.md, "Epochs"; the rules are `format::durability`). Each
    /// group's table is healed when first loaded, and the suspect range is kept in the header
    /// until every group has been.
    epochs: Epochs,
    /// Groups healed in this run, and how many exist (for dropping the range once all are).
    healed: HashSet<u64>,
    groups_to_heal: u64,
    /// Whether a header recording this run's epochs is durable: done before the run writes
    /// anything else (its first copy), so a later run never reuses them; and for a new or emptied
    /// file, so a power cut never leaves its data in a lower file whose block 0 is lost.
    announced: bool,
    /// Healed tables (in the cache) not written yet: a run that only reads writes nothing.
    unpersisted: HashSet<u64>,
    /// Every group with a table has been loaded (and healed) in this run.
    heal_complete: bool,
    /// Every healed table is on stable storage (a flush completed after the last was written),
    /// so the header may drop the suspect range: before that, a power cut could undo a healed
    /// table and leave a torn copy under an epoch a header without the range calls durable.
    heal_durable: bool,
    /// Records whose other slot still holds an older copy, freed after the next sync.
    stale: BTreeSet<u64>,
    /// Records whose older copy a user's fsync found durable-superseded and left in place: the
    /// record's next copy overwrites those allocated blocks, where a punched slot would have to
    /// be allocated again (a journal commit on the lower at every fsync of a rewriting
    /// workload). Freed by the next writeback tick, or at close.
    kept_for_reuse: BTreeSet<u64>,
    /// Slots a truncate cleared, punched after the next sync: punching them at once could reach
    /// the disk before the cleared descriptor does, and a power cut would then leave a
    /// descriptor pointing at a hole with an older copy behind it served in its place.
    /// With the epoch of the clear: a sync closing that epoch made it durable.
    deferred_punch: BTreeMap<(u64, usize), u64>,
    /// Formats 4 to 6: the places of copies a truncate cleared, with the epoch of the clear: given up
    /// (punched, free for new copies) once a sync closing that epoch made the clear durable.
    deferred_places: Vec<(u64, Extent)>,
    /// Formats 4 to 6: the lower file's free space, built from every table before the run places its
    /// first copy (`Store::space`).
    space: Option<Space>,
    /// Uncompressed copies this run wrote, per record and slot, with the blocks in which the
    /// record's newest version differs from them: the next copy into such a slot writes only
    /// those blocks (`write_copy`). A slot is listed only while its descriptor is the one written
    /// with it.
    raw_copies: HashMap<u64, [Option<RawCopy>; 2]>,
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
    /// The daemon changed the lower file (a write, a punch or a put-back mtime moves its blocks
    /// or ctime) since `take_unpublished_changes` last reported it.
    unpublished_changes: bool,
    /// A new file's block 0 while its first landing assembles it ([`Store::gather_block_0`]).
    gathered: Option<GatheredBlock>,
    /// The lower file may carry a size hint (`core::hints`), to be removed before a header
    /// records another size: an existing file may, a new one has none.
    size_hint_may_exist: bool,
    /// The size hint the lower file carries as this run last wrote or found it, while no write
    /// of the daemon's came after (`touch` forgets it): a close that would give the file the
    /// same hint has nothing to stat, read or write.
    size_hint_on_lower: Option<SizeHint>,
    /// The lower file's first block as the open that probed its header read it (the file's
    /// length, where shorter), while no write of the daemon's came after (`touch` drops it):
    /// group 0's table lies in it, and a small file's first read need not read it again.
    first_block: Option<Box<[u8]>>,
}

/// An uncompressed copy in a slot: the descriptor it was written with (a slot whose descriptor
/// says otherwise holds something else), and where the record's newest version differs from it.
#[derive(Clone, Copy)]
struct RawCopy {
    written: Descriptor,
    behind: Changed,
}

/// Block 0 of a lower file that has none yet, assembled in memory: header copies, an inline
/// record, group 0's descriptors, and how far they reach.
struct GatheredBlock {
    bytes: Box<[u8]>,
    end: usize,
}

impl StoreState {
    fn all_healed(&self) -> bool {
        self.heal_complete || self.healed.len() as u64 >= self.groups_to_heal
    }

    /// Every write the daemon makes to the lower file: the run has written, and the lower's
    /// mtime must be put back afterwards.
    fn touch(&mut self) {
        self.wrote = true;
        self.mtime_to_restore = true;
        self.unpublished_changes = true;
        self.size_hint_on_lower = None;
        self.first_block = None;
    }

    /// Whether the daemon changed the lower file since the last call: attributes read before
    /// (blocks, ctime) may be stale.
    pub fn take_unpublished_changes(&mut self) -> bool {
        std::mem::take(&mut self.unpublished_changes)
    }

    /// A user operation changed the file now: mtime and ctime move, as ext4 sets them.
    pub fn user_changed(&mut self) {
        let now = lower::now();
        self.mtime = now;
        self.ctime = Some(now);
        self.mtime_to_restore = true;
    }

    pub fn times(&self) -> (libc::timespec, Option<libc::timespec>) {
        (self.mtime, self.ctime)
    }

    /// The lower file carries `hint` now (the daemon may write it while the store lives on: a
    /// FLUSH): a header recording another size removes it first. `written`: this call wrote it,
    /// which moved the lower's ctime (a change to publish, as a landing's).
    pub fn size_hint_written(&mut self, hint: SizeHint, written: bool) {
        self.size_hint_may_exist = true;
        self.size_hint_on_lower = Some(hint);
        self.unpublished_changes |= written;
    }

    /// Keeps the first block the open's probe read (`first_block`), for group 0's table.
    pub fn keep_first_block(&mut self, block: Box<[u8]>) {
        self.first_block = Some(block);
    }

    /// What this run knows of the lower file's size hint: the one it carries, if known
    /// (`size_hint_on_lower`), and whether it may carry one at all.
    pub fn size_hint_known(&self) -> (Option<SizeHint>, bool) {
        (self.size_hint_on_lower, self.size_hint_may_exist)
    }

    /// The size the header on the lower file records, if it has one.
    pub fn recorded_size(&self) -> Option<u64> {
        self.header_on_disk.then_some(self.persisted_size)
    }

    pub fn wrote(&self) -> bool {
        self.wrote
    }

    /// A version of `record` failed to land: what this run knows of its uncompressed copies no
    /// longer holds (the next version was changed against the one that failed).
    pub fn forget_raw_copies(&mut self, record: u64) {
        self.raw_copies.remove(&record);
    }

    /// Whether closing needs a sync to free old copies.
    pub fn has_stale(&self) -> bool {
        !self.stale.is_empty() || !self.deferred_punch.is_empty() || !self.deferred_places.is_empty() || !self.kept_for_reuse.is_empty()
    }

    /// Old copies an fsync kept for reuse wait to be freed.
    pub fn keeps_old_copies(&self) -> bool {
        !self.kept_for_reuse.is_empty()
    }

    /// An empty file whose header is on the lower (truncated to nothing by this run).
    pub fn emptied(&self) -> bool {
        self.size == 0 && self.header_on_disk && self.wrote
    }

    /// The range the header keeps: 0 once every group is healed, durably.
    fn persisted_heal_from(&self) -> u64 {
        if self.heal_durable {
            0
        } else {
            self.epochs.heal_from
        }
    }

    /// An empty lower file's group 0 holds nothing (and needs no healing): a new file's first
    /// record lands without reading a table, and its header keeps no suspect range.
    fn know_group_0_empty(&mut self) {
        self.heal_durable = true;
        self.healed.insert(0);
        self.cache_table(0, vec![[SlotState::Empty; 2]; GROUP_RECORDS as usize].into_boxed_slice());
    }

    fn cache_table(&mut self, group: u64, table: Box<[Pair]>) {
        if self.tables.len() >= TABLE_CACHE_GROUPS {
            // Group 0's table is only in memory while block 0 is being gathered.
            let gathering = self.gathered.is_some();
            if let Some(&victim) = self.tables.keys().find(|&&g| g != group && !(g == 0 && gathering)) {
                self.tables.remove(&victim);
                if self.unpersisted.remove(&victim) {
                    self.healed.remove(&victim); // its healed view is gone: heal again on reload
                }
            }
        }
        self.tables.insert(group, table);
    }

    /// A sync begins (its flush is next): copies written from here on belong to the next epoch.
    pub fn begin_sync(&mut self) -> ClosingSync {
        ClosingSync {
            epoch: self.epochs.begin_sync(),
            stale: std::mem::take(&mut self.stale),
            heal_written: self.all_healed() && self.unpersisted.is_empty(),
        }
    }

    /// The sync's flush failed: the old copies are still to be freed later.
    pub fn sync_failed(&mut self, closing: ClosingSync) {
        self.stale.extend(closing.stale);
    }

    /// The sync's flush completed: everything of the closing epoch is durable (and the healed
    /// tables, if all were written before it); the next header records that.
    pub fn synced(&mut self, closing: &ClosingSync) {
        self.epochs.synced(closing.epoch);
        self.heal_durable |= closing.heal_written;
        self.header_stale = true;
    }
}

/// A sync between its start and its flush's outcome ([`StoreState::begin_sync`]).
pub struct ClosingSync {
    epoch: u64,
    /// Records whose older copy can be freed once the sync completed.
    stale: BTreeSet<u64>,
    /// Every group was healed and its table written before the flush began.
    heal_written: bool,
}

/// The place a format-4 or -5 copy takes on the lower file (none for a hole or an inline copy, nor in
/// earlier formats).
fn placed_extent(d: &Descriptor) -> Option<Extent> {
    (d.place != 0).then(|| (u64::from(d.place) * BLOCK, round_up_block(u64::from(d.stored_len))))
}

/// The lower file's modification time, as futimens takes it.
pub fn mtime_of(meta: &std::fs::Metadata) -> libc::timespec {
    use std::os::unix::fs::MetadataExt;
    libc::timespec { tv_sec: meta.mtime(), tv_nsec: meta.mtime_nsec() }
}

/// Groups whose regions the lower file reaches (what healing may have to visit).
fn groups_in(lower_len: u64, layout: Layout) -> u64 {
    if lower_len == 0 {
        1
    } else {
        layout.lower_off_to_group(lower_len - 1) + 1
    }
}

impl Store {
    /// Reads the header block of a lower file: `None` if it is a plain file.
    ///
    /// A lower file whose block 0 is all zeros but that carries a birth header is a new (or
    /// emptied) container whose first header a power cut undid: nothing in it was synced since
    /// it was born, so it is that empty container (its birth header, size 0).
    pub fn probe(file: &File) -> Result<Option<Header>, FormatError> {
        Self::probe_fd(file.as_fd())
    }

    /// [`Store::probe`] of a descriptor open for reading.
    pub fn probe_fd(fd: BorrowedFd<'_>) -> Result<Option<Header>, FormatError> {
        Self::probe_block(fd).map(|(header, _)| header)
    }

    /// [`Store::probe_fd`], with the block it read (as long as the file, where shorter): for
    /// `StoreState::keep_first_block`.
    pub fn probe_block(fd: BorrowedFd<'_>) -> Result<(Option<Header>, Box<[u8]>), FormatError> {
        let mut block = vec![0u8; HEADER_BLOCK as usize];
        let n = lower::pread_full_fd(fd, &mut block, 0).map_err(|_| FormatError::BadHeader)?;
        block.truncate(n);
        let header = match Header::decode(&block)? {
            None if n > 0 && block.iter().all(|&b| b == 0) => Self::birth_header(fd),
            found => found,
        };
        Ok((header, block.into_boxed_slice()))
    }

    fn birth_header(fd: BorrowedFd<'_>) -> Option<Header> {
        let name = std::ffi::CString::new(BIRTH_HEADER_XATTR).expect("no NUL in the name");
        let mut value = [0u8; BIRTH_HEADER_SIZE + 1];
        let n = lower::getxattr_on(lower::XattrOn::Fd(fd), &name, &mut value).ok()?;
        Header::decode_birth(&value[..n])
    }

    /// Drops the lower file's birth header, if it has one.
    pub(super) fn forget_birth(&self) -> std::io::Result<()> {
        let name = std::ffi::CString::new(BIRTH_HEADER_XATTR).expect("no NUL in the name");
        match lower::removexattr_on(lower::XattrOn::Fd(self.lower.as_fd()), &name) {
            Err(e) if e.raw_os_error() != Some(libc::ENODATA) && e.raw_os_error() != Some(libc::ENOTSUP) => Err(e),
            _ => Ok(()),
        }
    }

    /// Records `header` (a new file's first) as the lower file's birth header. False where the
    /// lower file system keeps no user xattrs (or refuses this one): the header must then be
    /// synced before anything else is written.
    fn record_birth(&self, header: &Header) -> bool {
        let name = std::ffi::CString::new(BIRTH_HEADER_XATTR).expect("no NUL in the name");
        match lower::fsetxattr(&self.lower, &name, &header.encode_birth(), 0) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(file = %self.label(), "no birth header ({e}): the first header is synced instead");
                false
            }
        }
    }

    /// A store for reading only (no state): what `inspect` uses.
    pub fn reader(lower: File, layout: Layout, checksum: ChecksumKind, label: Option<String>) -> Store {
        Store { lower: Arc::new(lower), layout, checksum, label }
    }

    /// The store of a container whose header is `header`, and its state for this run.
    pub fn open(lower: Arc<File>, header: &Header, label: Option<String>) -> std::io::Result<(Store, StoreState)> {
        let meta = lower.metadata()?;
        Ok(Store::with_lower(lower, header, label, meta.len(), mtime_of(&meta)))
    }

    /// As `open`, for a lower file of `lower_len` bytes modified at `mtime`.
    fn with_lower(lower: Arc<File>, header: &Header, label: Option<String>, lower_len: u64, mtime: libc::timespec) -> (Store, StoreState) {
        let state = StoreState {
            size: header.size,
            compression: header.setting,
            header_seq: header.sequence,
            persisted_size: header.size,
            header_stale: false,
            tables: HashMap::new(),
            epochs: Epochs::for_run(header),
            healed: HashSet::new(),
            groups_to_heal: groups_in(lower_len, header.layout),
            announced: false,
            unpersisted: HashSet::new(),
            heal_complete: false,
            heal_durable: false,
            stale: BTreeSet::new(),
            kept_for_reuse: BTreeSet::new(),
            raw_copies: HashMap::new(),
            deferred_punch: BTreeMap::new(),
            deferred_places: Vec::new(),
            space: None,
            wrote: false,
            checked_size: 0,
            header_on_disk: true,
            mtime,
            ctime: None,
            mtime_to_restore: false,
            unpublished_changes: false,
            gathered: None,
            size_hint_may_exist: true,
            size_hint_on_lower: None,
            first_block: None,
        };
        (Store { lower, layout: header.layout, checksum: header.checksum, label }, state)
    }

    /// The store of a new, empty container on an empty lower file. Nothing is written until the
    /// file gets data or a size: an empty file stays an empty lower file.
    /// `mtime`: the empty lower file's modification time.
    pub fn create(lower: Arc<File>, header: &Header, label: Option<String>, mtime: libc::timespec) -> (Store, StoreState) {
        let (store, mut state) = Store::with_lower(lower, header, label, 0, mtime);
        // Announced (header written) with its first data or size.
        state.header_on_disk = false;
        state.size_hint_may_exist = false;
        state.know_group_0_empty();
        state.space = header.layout.placed().then(|| Space::new(header.layout, Vec::new()));
        (store, state)
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    pub fn checksum(&self) -> ChecksumKind {
        self.checksum
    }

    pub fn label(&self) -> String {
        match &self.label {
            Some(label) => label.clone(),
            None => lower::fd_path(self.lower.as_raw_fd()),
        }
    }

    /// The lower file (shared: it is also the inode table's descriptor for the inode).
    pub fn lower(&self) -> &Arc<File> {
        &self.lower
    }

    // ---- times -------------------------------------------------------------------------

    /// The user set the lower's times (utimensat): take them as the file's own.
    pub fn times_set_by_user(&self, st: &mut StoreState, mtime: libc::timespec) {
        st.mtime = mtime;
        st.ctime = None;
        st.mtime_to_restore = false;
    }

    /// Puts the lower's mtime back to the user's after the daemon's own writes.
    pub fn restore_mtime(&self, st: &mut StoreState) {
        if !st.mtime_to_restore {
            return;
        }
        let times = [libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT }, st.mtime];
        match lower::futimens(&self.lower, &times) {
            Ok(()) => st.unpublished_changes = true, // the ctime moved
            Err(e) => warn!(file = %self.label(), "cannot keep the modification time: {e}"),
        }
        st.mtime_to_restore = false;
        st.ctime = None;
    }

    // ---- tables ------------------------------------------------------------------------

    /// A group's table as the lower file holds it (not healed, not cached).
    pub fn read_table(&self, group: u64) -> std::io::Result<Box<[Pair]>> {
        let mut block = vec![0u8; TABLE_SIZE as usize];
        lower::pread_full(&self.lower, &mut block, self.layout.group_to_table_off(group))?;
        Ok(decode_table(&block, group, self.layout))
    }

    /// Group 0's table as `read_table` would read it, from the lower file's first block (None
    /// where the table reaches past a block that did not end the file).
    fn table_in_first_block(&self, block: &[u8]) -> Option<Box<[Pair]>> {
        let at = self.layout.group_to_table_off(0) as usize;
        let end = at + TABLE_SIZE as usize;
        if end > block.len() && block.len() == HEADER_BLOCK as usize {
            return None;
        }
        // Past the file's end the table reads as zeros, as `pread_full` leaves them.
        let mut table = vec![0u8; TABLE_SIZE as usize];
        if at < block.len() {
            let have = &block[at..end.min(block.len())];
            table[..have.len()].copy_from_slice(have);
        }
        Some(decode_table(&table, 0, self.layout))
    }

    /// Formats 4 to 6: asks the lower file system for the table blocks of `groups` (at most 4096 of
    /// them) without waiting: they lie apart from the packed copies, and a sequential reader
    /// would otherwise stop for each one.
    pub fn prefetch_tables(&self, groups: std::ops::Range<u64>) {
        if !self.layout.placed() {
            return;
        }
        for group in groups.start.max(1)..groups.end.min(groups.start + 4096) {
            let _ = lower::will_need(&*self.lower, self.layout.group_to_table_off(group), TABLE_SIZE);
        }
    }

    /// A record's two descriptors, from the cache or the lower file (healed on first load).
    pub fn pair(&self, st: &mut StoreState, record: u64) -> FsResult<Pair> {
        let group = self.layout.record_to_group(record);
        let index = self.layout.record_to_entry_index(record);
        if let Some(table) = st.tables.get(&group) {
            return Ok(table[index]);
        }
        let first_block = if group == 0 { st.first_block.take() } else { None };
        let mut table = match first_block.and_then(|block| self.table_in_first_block(&block)) {
            Some(table) => table,
            None => self.read_table(group)?,
        };
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
                    warn!(file = %self.label(), record = group * GROUP_RECORDS + i as u64, slot, "damaged slot descriptor ignored");
                }
            }
        }
        let pair = table[index];
        st.cache_table(group, table);
        Ok(pair)
    }

    /// A record's valid copies, newest first; a record whose only descriptors are damaged held
    /// data and is unreadable (not a hole to read as zeros).
    pub fn copies(&self, st: &mut StoreState, record: u64) -> FsResult<Vec<(usize, Descriptor)>> {
        let pair = self.pair(st, record)?;
        let found = newest_first(&pair);
        if found.is_empty() && pair.contains(&SlotState::Damaged) {
            error!(file = %self.label(), record, "record unreadable: its slot descriptors are damaged");
            return Err(FsError::corrupt(format!("{}: record {record}: damaged slot descriptor", self.label())));
        }
        Ok(found)
    }

    /// Whether a record has data stored on the lower file (not a hole).
    pub fn stored_data(&self, st: &mut StoreState, record: u64) -> FsResult<bool> {
        Ok(newest_first(&self.pair(st, record)?).first().is_some_and(|(_, d)| !d.is_hole()))
    }

    /// Whether `group`'s table is cached (it may hold data without anything on the lower yet).
    pub fn table_cached(&self, st: &StoreState, group: u64) -> bool {
        st.tables.contains_key(&group)
    }

    /// Heals a group's table on first load: each copy a crashed run left (epoch in the suspect
    /// range) is checked; torn ones are cleared, intact ones re-stamped with this run's epoch so
    /// the next sync makes them durable. Never judged durable by mistake, so a write never
    /// overwrites the copy that must survive.
    fn heal(&self, st: &mut StoreState, group: u64, table: &mut [Pair]) -> FsResult<()> {
        let mut changed = false;
        for (i, pair) in table.iter_mut().enumerate() {
            let record = group * GROUP_RECORDS + i as u64;
            let check = st.epochs.slots_to_check(pair);
            let mut intact = [true; 2];
            for slot in 0..2 {
                if let (true, SlotState::Valid(d)) = (check[slot], pair[slot]) {
                    intact[slot] = self.checksum.compute(&self.read_copy(record, slot, &d)?) == d.checksum;
                }
            }
            if let Some(dropped) = st.epochs.heal(pair, intact) {
                for slot in (0..2).filter(|&s| dropped[s]) {
                    warn!(file = %self.label(), record, slot, "dropping a copy torn by a crash or power cut (never synced); the previous copy stays");
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

    fn write_table(&self, st: &mut StoreState, group: u64, table: &[Pair]) -> FsResult<()> {
        st.touch();
        let mut block = Vec::with_capacity(TABLE_SIZE as usize);
        for pair in table {
            for s in pair {
                block.extend_from_slice(&s.encode(self.layout.placed()));
            }
        }
        self.write_meta(st, &block, self.layout.group_to_table_off(group))?;
        Ok(())
    }

    /// Heals every group not loaded yet (before a sync, so the range can go from the header).
    /// Only groups with something on the lower file are visited: a sparse file costs in
    /// proportion to its data, not its size.
    pub fn heal_all(&self, st: &mut StoreState) -> FsResult<()> {
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
    ///
    /// Formats 4 to 6: copies lie anywhere, so a group counts when its own table block holds anything.
    pub fn next_stored_group(&self, group: u64) -> std::io::Result<Option<u64>> {
        if !self.layout.placed() {
            let from = if group == 0 { 0 } else { self.layout.group_to_table_off(group) };
            return Ok(lower::seek_data(&self.lower, from)?.map(|off| self.layout.lower_off_to_group(off).max(group)));
        }
        let mut group = group;
        loop {
            let (table, table_end) = match group {
                0 => (0, HEADER_BLOCK),
                g => (self.layout.group_to_table_off(g), self.layout.group_to_table_off(g) + BLOCK),
            };
            let Some(off) = lower::seek_data(&self.lower, table)? else { return Ok(None) };
            if off < table_end {
                return Ok(Some(group));
            }
            group = self.layout.first_table_at_or_after(off).max(group + 1);
        }
    }

    /// Formats 4 to 6: the lower file's free space, built from every table (healed first) the first
    /// time the run needs it.
    fn space<'a>(&self, st: &'a mut StoreState) -> FsResult<&'a mut Space> {
        if st.space.is_none() {
            self.heal_all(st)?;
            let mut used: Vec<Extent> = st.deferred_places.iter().map(|&(_, place)| place).collect();
            self.visit_pairs(st, 0, |_, _, pair| {
                used.extend(pair.iter().filter_map(|s| match s {
                    SlotState::Valid(d) => placed_extent(d),
                    _ => None,
                }));
                Ok(())
            })?;
            st.space = Some(Space::new(self.layout, used));
        }
        Ok(st.space.as_mut().expect("BUG: built above"))
    }

    /// Calls `visit` with each record from `first` on and its descriptors, in the groups whose
    /// regions hold anything on the lower file (`next_stored_group`).
    fn visit_pairs(
        &self,
        st: &mut StoreState,
        first: u64,
        mut visit: impl FnMut(&mut StoreState, u64, Pair) -> FsResult<()>,
    ) -> FsResult<()> {
        let mut group = self.layout.record_to_group(first);
        while let Some(found) = self.next_stored_group(group)? {
            for record in (found * GROUP_RECORDS).max(first)..(found + 1) * GROUP_RECORDS {
                let pair = self.pair(st, record)?;
                visit(st, record, pair)?;
            }
            group = found + 1;
        }
        Ok(())
    }

    /// Records this run's epochs in the header, durably, before the run writes anything else
    /// (its first copy or size); then writes the tables healed so far.
    ///
    /// A new or emptied file (an empty lower file) gets its first header here, before any data:
    /// a power cut can undo any write not covered by a sync while the lower file keeps the
    /// length later writes gave it, and a lower file whose block 0 went back to zeros with data
    /// behind it would be taken for a plain file, its slots served as its bytes. So the header
    /// is also recorded as the lower file's birth header (an xattr: metadata, which the lower
    /// file system journals ahead of the data blocks written after it), which stands in for a
    /// zeroed block 0; only where the lower keeps no xattrs is the header synced instead.
    fn announce(&self, st: &mut StoreState) -> FsResult<()> {
        if st.announced {
            return Ok(());
        }
        st.header_stale = true;
        let birth = !st.header_on_disk;
        // The size stays what the last header said: records of this run may still be dirty
        // (say, a tail zeroed before the file grew), and a larger size must not reach the disk
        // before they have landed, or a crash would show what they held before.
        let header = self.write_header_sized(st, st.persisted_size, true)?;
        if !(birth && self.record_birth(&header)) {
            self.write_gathered(st)?;
            lower::fdatasync(&self.lower)?;
            st.epochs.announced();
        }
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

    fn set_descriptor(&self, st: &mut StoreState, record: u64, slot: usize, state: SlotState) -> FsResult<()> {
        if matches!(state, SlotState::Valid(_)) {
            // Also a new file's first header: descriptors alone would make it a container whose
            // header is gone.
            self.announce(st)?;
        }
        st.touch();
        let bytes = state.encode(self.layout.placed());
        if let Some(copies) = st.raw_copies.get_mut(&record) {
            copies[slot] = None;
        }
        self.write_meta(st, &bytes, self.layout.record_to_descriptor_off(record, slot))?;
        let group = self.layout.record_to_group(record);
        if let Some(table) = st.tables.get_mut(&group) {
            table[self.layout.record_to_entry_index(record)][slot] = state;
        }
        Ok(())
    }

    /// Empties every descriptor of `group` with one write of a zeroed table: what
    /// `set_descriptor` to `Empty` does to each of them, in one write. The group's raw copies
    /// are the caller's to forget (`discard_placed_from` drops every one past the cut).
    fn clear_table(&self, st: &mut StoreState, group: u64) -> FsResult<()> {
        st.touch();
        self.write_meta(st, &[0u8; TABLE_SIZE as usize], self.layout.group_to_table_off(group))?;
        if let Some(table) = st.tables.get_mut(&group) {
            table.fill([SlotState::Empty; 2]);
        }
        Ok(())
    }

    // ---- header and syncs --------------------------------------------------------------

    /// Writes the header (if anything in it changed), recording the current size; block 0 is
    /// on the lower file afterwards, if it was being gathered.
    pub fn write_header(&self, st: &mut StoreState) -> FsResult<()> {
        if !st.header_on_disk {
            if st.size == 0 {
                return Ok(()); // an empty new file stays an empty lower file
            }
            self.announce(st)?; // its first header, durable
        }
        self.write_header_sized(st, st.size, false)?;
        Ok(self.write_gathered(st)?)
    }

    /// `first`: the lower file may be empty (announcing a new file): its first header is written.
    /// Returns the header written (as it was already, if nothing changed).
    fn write_header_sized(&self, st: &mut StoreState, size: u64, first: bool) -> FsResult<Header> {
        if size == st.persisted_size && !st.header_stale {
            return Ok(self.header(st, size, st.header_seq));
        }
        debug_assert!(st.header_on_disk || first, "BUG: a new file's first header goes through announce");
        if size != st.persisted_size && st.size_hint_may_exist {
            // The hint names the size the header is about to stop recording.
            super::hints::drop_size_hint(&self.lower)?;
            st.size_hint_may_exist = false;
            st.size_hint_on_lower = None;
        }
        st.touch();
        let sequence = st.header_seq + 1;
        let header = self.header(st, size, sequence);
        let encoded = header.encode();
        if st.header_on_disk {
            self.write_meta(st, &encoded, Header::copy_offset(sequence))?;
        } else {
            // A new file's first header fills both copies: each write after it replaces one.
            self.write_meta(st, &[encoded.as_slice(), encoded.as_slice()].concat(), 0)?;
        }
        st.header_seq = sequence;
        st.persisted_size = size;
        st.header_stale = false;
        st.header_on_disk = true;
        Ok(header)
    }

    fn header(&self, st: &StoreState, size: u64, sequence: u64) -> Header {
        Header {
            layout: self.layout,
            checksum: self.checksum,
            setting: st.compression,
            size,
            sequence,
            durable_below: st.epochs.durable_below,
            heal_from: st.persisted_heal_from(),
        }
    }

    // ---- block 0 of a new file -----------------------------------------------------------

    /// Starts gathering block 0 if the lower file has none yet (a new or emptied file whose
    /// first header is still to come); returns whether block 0 is being gathered. A landing
    /// gathers: its first header (both copies), an inline record, its descriptor and, when
    /// the landing completes the file, the header recording the size all go into one write
    /// ([`Store::write_gathered`]) instead of four — each a round trip on a network lower.
    ///
    /// Crash-safe as the separate writes were: the birth header (an xattr) is still recorded
    /// before any data, so a crash before block 0 is written leaves the empty container it
    /// stands for; a power cut sees the same block either way (the separate writes fell in one
    /// page of the lower's page cache, which reaches the disk as a whole, or not). Nothing
    /// reads the lower file's block 0 meanwhile: the landing holds `slot_io` exclusively.
    pub fn gather_block_0(&self, st: &mut StoreState) -> bool {
        if !st.header_on_disk && st.gathered.is_none() {
            st.gathered = Some(GatheredBlock { bytes: vec![0; HEADER_BLOCK as usize].into_boxed_slice(), end: 0 });
        }
        st.gathered.is_some()
    }

    /// Writes the gathered block 0 in one piece, if one is being gathered. On failure it stays
    /// gathered (what it holds is the file's truth; the next landing, flush or sync writes it).
    pub fn write_gathered(&self, st: &mut StoreState) -> std::io::Result<()> {
        let Some(g) = &st.gathered else { return Ok(()) };
        if g.end > 0 {
            lower::pwrite_all(&self.lower, &g.bytes[..g.end], 0)?;
            st.touch();
        }
        st.gathered = None;
        Ok(())
    }

    /// Writes metadata (a header, descriptors, an inline record) at `off`: into block 0 while
    /// it is being gathered, else to the lower file.
    fn write_meta(&self, st: &mut StoreState, bytes: &[u8], off: u64) -> std::io::Result<()> {
        let end = off + bytes.len() as u64;
        if let Some(g) = st.gathered.as_mut().filter(|_| off < HEADER_BLOCK) {
            if end <= HEADER_BLOCK {
                g.bytes[off as usize..end as usize].copy_from_slice(bytes);
                g.end = g.end.max(end as usize);
                return Ok(());
            }
            self.write_gathered(st)?; // a write reaching past block 0 (none does): block 0 first
        }
        lower::pwrite_all(&self.lower, bytes, off)
    }

    /// fdatasync (`datasync`) or fsync of the lower file. (A block 0 being gathered is not in
    /// it: [`Store::write_gathered`] first.)
    pub fn sync_lower(&self, datasync: bool) -> std::io::Result<()> {
        if datasync {
            lower::fdatasync(&self.lower)
        } else {
            lower::fsync(&self.lower)
        }
    }
}

//! The lower file of one container as a store of record copies: its header, its descriptor
//! tables (cached, healed on first load), its slots, and the durability bookkeeping around them
//! (epochs, the announcement of a run, the old copies and cleared slots a sync reclaims). It
//! knows nothing of buffers or the engine: the container (`container.rs`) is the write-back
//! cache above it, and `inspect` reads through the same table and slot readers.
//!
//! This file holds the store, its state and its opening; `store/tables.rs` the descriptor tables
//! and their healing, `store/header.rs` the header and a new file's block 0, `store/slots.rs`
//! the copies and their reclaim, `store/space.rs` where formats 4 to 6 place a copy.
//!
//! A store's mutable state is a [`StoreState`], owned by whoever serialises access to the store
//! (the container keeps it under its state lock and passes it to every call that needs it).
//! Writers of slots hold the container's `slot_io` exclusively; the store does not lock.

use super::changed::Changed;
use super::lower;
use crate::checksum::ChecksumKind;
use crate::codec::Setting;
use crate::format::durability::Epochs;
use crate::format::hints::SizeHint;
use crate::format::layout::{round_up_block, BLOCK, GROUP_RECORDS, HEADER_BLOCK};
use crate::format::{Descriptor, FormatError, Header, Layout, Pair, SlotState};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::Arc;
use tracing::warn;

mod header;
mod slots;
mod space;
mod tables;

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
}

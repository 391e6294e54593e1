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
//! This file holds the container's state, its constructors and accessors; the read path is
//! `container/read.rs`, the write path (loading, writing, sending to the engine, landing)
//! `container/write.rs`, flush/fsync/recompress `container/sync.rs`, size changes
//! `container/resize.rs` and one record of the background pass `container/densify.rs`.
//!
//! Lock order: `slot_io` before `state`. `slot_io` is held shared while lower slots are read and
//! exclusively while they are written or punched, so a reader never sees a slot change under it;
//! no lock is held while waiting on the engine. The landing queue has its own small lock, never
//! held while taking another.

pub mod densify;
#[cfg(test)]
mod model_tests;
mod read;
mod resize;
mod sync;
mod write;

use super::admission::FreeSpaceSample;
use super::buffers::Buffers;
use super::error::{FsError, FsResult};
use super::landing::LandingQueue;
use super::lower;
use super::memory::Memory;
use super::store::{mtime_of, Store, StoreState};
use super::usage::UsageHold;
use crate::checksum::ChecksumKind;
use crate::codec::{Compression, Setting};
use crate::engine::{Encoded, Engine, EngineError, RecordPolicy};
use crate::format::durability::Epochs;
use crate::format::hints::SizeHint;
use crate::format::{Header, Layout};
use densify::Densify;
use parking_lot::{Condvar, Mutex, RwLock};
pub use read::ReadBytes;
use read::ReadStream;
use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
pub use sync::Writeback;
use tracing::warn;

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
}

//! The write path: loading a record to change it, writes, handing dirty records to the engine
//! and landing what it returns (a slot, then its descriptor).

use super::read::Source;
use super::{Container, EncodeWith, Load, State};
use crate::codec::Setting;
use crate::core::error::{FsError, FsResult};
use crate::core::landing;
use crate::core::lower;
use crate::engine::{CompressRequest, Encoded, EngineError, Job};
use crate::format::newest_first;
use parking_lot::{MutexGuard, RwLockReadGuard};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tracing::error;

/// Dirty bytes per file before all dirty records are handed to the engine.
const DIRTY_LIMIT: usize = 64 << 20;
/// Bytes per file in the engine before a writer waits: at least this, and up to half the memory
/// budget (`cache_size`). A GPU is busy only with hundreds of records at once (nvCOMP's Deflate
/// takes about 0.4 s a batch on an H200), so a mount with a larger budget keeps it busier.
const INFLIGHT_MIN: usize = 64 << 20;

/// Once this many bytes of copies have landed in a file, the lower file system is asked to
/// start writing them to its disk. Otherwise a large file's copies wait in the lower's page cache
/// for its dirty thresholds (gigabytes on a large machine) or the writer's fsync, and the disk
/// idles while the copy is compressed, then the CPUs idle while the disk writes (measured: 1 GiB
/// FASTQ `cp` + sync 1.70-1.74 s without, 1.47-1.56 s with; 3 GB 4.9-5.0 s and 4.4-4.6 s).
const EARLY_WRITEBACK_BYTES: u64 = 16 << 20;

/// A record moved into flight: its version and what to compress.
pub(super) struct Sent {
    record: u64,
    seq: u64,
    request: CompressRequest,
    /// For a record of the background pass: where its encoded bytes are counted.
    densified: Option<Arc<AtomicU64>>,
}

impl Container {
    // ---- writing -----------------------------------------------------------------------

    /// Makes sure `record`'s current contents are in `dirty` (trimmed to the file size), so a
    /// partial write can modify them. `rewrite` (recompress): only a stored record, left alone
    /// if a change of it is pending, and marked as a rewrite (landed only if smaller); the mark
    /// is set under the same lock that sees no such change, and every user change clears it.
    /// Returns whether this call put the record's bytes in memory (for a rewrite: and marked it).
    pub(super) fn load(&self, record: u64, load: Load) -> FsResult<bool> {
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
    pub(super) fn lock_for_edit(&self, record: u64, partial: bool) -> FsResult<(RwLockReadGuard<'_, ()>, MutexGuard<'_, State>)> {
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
    pub(super) fn wait_for_room(&self) {
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
    pub(super) fn dirty_over_limit(&self, st: &State) -> bool {
        st.buffers.dirty_bytes() > DIRTY_LIMIT.min(self.memory.limit() / 2)
    }

    /// Moves the given dirty records into flight and builds their engine jobs. Records already in
    /// flight stay dirty: one version of a record is in the engine at a time.
    pub(super) fn prepare(self: &Arc<Self>, st: &mut State, records: &[u64]) -> Vec<Job> {
        self.send(st, records, EncodeWith::FileCodec).into_iter().map(|sent| self.job(sent)).collect()
    }

    /// Moves the given dirty records into flight: what to compress for each, and with what.
    pub(super) fn send(&self, st: &mut State, records: &[u64], with: EncodeWith) -> Vec<Sent> {
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

    pub(super) fn job(self: &Arc<Self>, sent: Sent) -> Job {
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
    pub(super) fn compress_and_land_here(&self, sent: &Sent) -> bool {
        let Some(encoded) = self.engine.compress_here(&sent.request) else { return false };
        if let Some(counter) = &sent.densified {
            counter.fetch_add(encoded.bytes.len() as u64, Ordering::Relaxed);
        }
        self.land(sent.record, sent.seq, Ok(encoded));
        true
    }

    /// Compresses and lands a single record on the calling thread (a small file at close: two
    /// thread handoffs would cost more than the work); more go to the engine's workers.
    pub(super) fn write_out(self: &Arc<Self>, sent: Vec<Sent>) {
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

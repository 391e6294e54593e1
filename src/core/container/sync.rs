//! Flush, writeback, fsync and recompress: the container's ways of making what is in memory
//! land, and of making what landed durable.

use super::{Container, EncodeWith, Load, State};
use crate::codec::Setting;
use crate::core::changed::Changed;
use crate::core::error::FsResult;
use crate::engine::{Encoded, RecordPolicy};
use crate::format::layout::GROUP_RECORDS;
use crate::format::newest_first;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Which dirty records a background writeback sends.
#[derive(Clone, Copy)]
pub enum Writeback {
    /// All of them (the memory budget is spent).
    Everything,
    /// Those dirty for a whole tick interval (the writeback tick).
    Aged,
}

impl Container {
    /// Hands every dirty record to the engine and waits until all of them have landed, then
    /// writes the header and puts the lower's mtime back to the user's. Records dirtied by other
    /// writers after the call starts are not waited for (so a busy writer cannot hold an fsync
    /// forever).
    pub fn flush(self: &Arc<Self>) -> FsResult<()> {
        self.flush_data()?;
        self.store.restore_mtime(&mut self.state.lock().store);
        Ok(())
    }

    /// `flush`, leaving the lower's mtime where the landings put it: for a caller about to set
    /// it (a user's utimensat), which makes putting it back first a wasted write.
    pub fn flush_data(self: &Arc<Self>) -> FsResult<()> {
        self.land_all(false)
    }

    /// Lands every dirty record; `for_fsync`: with the setting a user's fsync waits for.
    fn land_all(self: &Arc<Self>, for_fsync: bool) -> FsResult<()> {
        let mut st = self.state.lock();
        let with = match for_fsync {
            true => EncodeWith::Fsync(st.store.compression.for_fsync(st.buffers.dirty_bytes())),
            false => EncodeWith::FileCodec,
        };
        let mut pending: BTreeSet<u64> = st.buffers.dirty_records().into_iter().chain(st.buffers.in_flight_records()).collect();
        loop {
            if let Some(e) = st.write_error.take() {
                return Err(e);
            }
            pending.retain(|&r| st.buffers.has_dirty_bytes(r) || st.buffers.is_in_flight(r));
            if pending.is_empty() {
                break;
            }
            let ready: Vec<u64> = pending.iter().copied().filter(|&r| st.buffers.is_dirty(r)).collect();
            let sent = self.send(&mut st, &ready, with);
            if sent.is_empty() {
                // Waits for queued landings too: a record leaves flight only once it landed.
                self.landed.wait(&mut st);
            } else {
                drop(st);
                self.write_out(sent);
                st = self.state.lock();
            }
        }
        self.store.write_header(&mut st.store)?;
        // Only a run that wrote: a reader never writes (its descriptor is read-only).
        let emptied = st.store.emptied();
        drop(st);
        if emptied {
            self.cut_to_empty()?;
        }
        Ok(())
    }

    /// A file truncated to nothing becomes an empty lower file again (no header block).
    fn cut_to_empty(&self) -> FsResult<()> {
        let _io = self.slot_io.write();
        let mut st = self.state.lock();
        let st = &mut *st;
        if !st.store.emptied() || !st.buffers.all_landed() {
            return Ok(());
        }
        self.store.cut_to_empty(&mut st.store)?;
        st.rewriting.clear();
        st.buffers.clear_clean();
        Ok(())
    }

    /// Lets go of the decoded records kept for reads (they are on the lower file).
    pub fn drop_cached_records(&self) {
        self.state.lock().buffers.clear_clean();
    }

    /// Background writeback: starts compressing dirty records without waiting (every one, or
    /// at a tick those dirty for a whole tick interval), and records the size once nothing is
    /// in flight, so a crash loses little.
    pub fn writeback(self: &Arc<Self>, which: Writeback) -> FsResult<()> {
        if self.state.lock().store.keeps_old_copies() {
            let _io = self.slot_io.write();
            self.store.free_kept(&mut self.state.lock().store)?;
        }
        let jobs = {
            let mut st = self.state.lock();
            if st.buffers.all_landed() {
                self.store.write_header(&mut st.store)?;
                self.store.restore_mtime(&mut st.store);
            }
            let records = match which {
                Writeback::Everything => st.buffers.dirty_records(),
                Writeback::Aged => st.buffers.aged_dirty_records(),
            };
            self.prepare(&mut st, &records)
        };
        self.engine.submit(jobs);
        Ok(())
    }

    /// Everything written so far is on stable storage when this returns. Then the older copies
    /// of rewritten records are no longer needed and their space is freed.
    pub fn sync(self: &Arc<Self>, datasync: bool) -> FsResult<()> {
        self.sync_and_reclaim(datasync, false)
    }

    /// A user's fsync on an open file: as `sync`, but the older copies stay allocated for the
    /// records' next copies (a rewriting workload fsyncs again and again; each punched slot
    /// would be allocated again, a journal commit on the lower each time). The writeback tick
    /// or the close frees them.
    pub fn fsync(self: &Arc<Self>, datasync: bool) -> FsResult<()> {
        self.sync_and_reclaim(datasync, true)
    }

    /// `user_fsync`: a user waits, so records land with the fast codec (`Setting::for_fsync`),
    /// the sync takes one flush, and the older copies stay allocated for reuse.
    ///
    /// One flush makes the records durable; the header records it with its next write (this
    /// file's next fsync, the writeback tick, the close). A run after a power cut finds those
    /// copies in its suspect range, checks them and keeps the intact ones as durable
    /// (`Epochs::heal`), so the acknowledged ones survive. Other syncs (close, recompress) also
    /// write the header and flush it: the next run then has nothing to check.
    fn sync_and_reclaim(self: &Arc<Self>, datasync: bool, user_fsync: bool) -> FsResult<()> {
        match self.land_all(user_fsync) {
            // Uncompressed (or lz4) records may not fit where the file's codec would: the records
            // that failed are dirty again and retried with it.
            Err(e) if user_fsync && e.errno == libc::ENOSPC => self.land_all(false)?,
            landed => landed?,
        }
        self.store.restore_mtime(&mut self.state.lock().store);
        if !self.state.lock().store.wrote() {
            // This run wrote nothing (a reader's fsync): no epoch to close, no header to write.
            return Ok(self.store.sync_lower(datasync)?);
        }
        {
            let _io = self.slot_io.read();
            self.store.heal_all(&mut self.state.lock().store)?;
        }
        // Copies written from here on belong to the next epoch: this sync does not cover them.
        let closing = self.state.lock().store.begin_sync();
        if let Err(e) = self.store.sync_lower(datasync) {
            self.state.lock().store.sync_failed(closing);
            return Err(e.into());
        }
        self.state.lock().store.synced(&closing);
        if !user_fsync {
            self.store.write_header(&mut self.state.lock().store)?;
            self.store.sync_lower(true)?;
        }
        let reclaimed = {
            let _io = self.slot_io.write();
            self.store.reclaim(&mut self.state.lock().store, closing, user_fsync)
        };
        self.store.restore_mtime(&mut self.state.lock().store);
        reclaimed
    }

    /// The codec records written from now on get (`chattr +c`/`+m`), kept in the header from
    /// the next sync on; stored records keep theirs until rewritten.
    pub fn set_compression(&self, compression: Setting) {
        let mut st = self.state.lock();
        if st.store.compression != compression {
            st.store.compression = compression;
            st.store.header_stale = true;
        }
    }

    /// Re-encodes every stored record with `compression` (ZFS's `zfs rewrite`). Each record takes
    /// the ordinary write path, so the file stays readable and writable meanwhile and a crash
    /// leaves every record at its old or its new encoding of the same bytes.
    pub fn recompress(self: &Arc<Self>, compression: Setting, policy: RecordPolicy) -> FsResult<()> {
        {
            let mut st = self.state.lock();
            st.store.compression = compression;
            st.policy = policy;
            st.store.header_stale = true;
        }
        let records = self.layout().plain_size_to_records(self.size());
        self.rewrite(0..records)?;
        self.sync(true)?;
        self.compact_tail(EncodeWith::FileCodec)
    }

    /// Re-encodes the given stored records with the file's codec, a group at a time (memory
    /// stays bounded). Each takes the ordinary write path as a rewrite: it lands only if
    /// smaller, and a user's change of the record meanwhile wins.
    fn rewrite(self: &Arc<Self>, records: impl IntoIterator<Item = u64>) -> FsResult<()> {
        let mut records = records.into_iter().peekable();
        while records.peek().is_some() {
            let mut batch = Vec::new();
            for record in records.by_ref().take(GROUP_RECORDS as usize) {
                let (_io, mut st) = self.lock_for_edit(record, false)?;
                let st: &mut State = &mut st;
                if self.store.stored_data(&mut st.store, record)? || st.buffers.is_pending(record) {
                    batch.push(record);
                }
            }
            for &record in &batch {
                self.load(record, Load::Rewrite { densify: None })?;
            }
            let jobs = self.prepare(&mut self.state.lock(), &batch);
            self.engine.submit(jobs);
            self.wait_for_room();
        }
        Ok(())
    }

    /// Re-encodes with the file's own codec the records a user's fsync landed with lz4
    /// (`Setting::for_fsync`): those not fsynced again since the previous call (the writeback
    /// tick's, every few seconds, as ZFS's transaction groups follow its intent log), or with
    /// `all` every one (the last close). Hands them to the engine without waiting; returns
    /// whether it did, so that the caller syncs to free their lz4 copies.
    pub fn settle_interim(self: &Arc<Self>, all: bool) -> FsResult<bool> {
        let (records, size_records) = {
            let mut st = self.state.lock();
            let quiet = std::mem::take(&mut st.interim.quiet);
            let recent = std::mem::take(&mut st.interim.recent);
            let records: BTreeSet<u64> = if all {
                quiet.into_iter().chain(recent).collect()
            } else {
                st.interim.quiet = recent;
                quiet
            };
            (records, self.layout().plain_size_to_records(st.store.size))
        };
        // Past the end: truncated away since.
        let records: Vec<u64> = records.into_iter().filter(|&r| r < size_records).collect();
        if records.is_empty() {
            return Ok(false);
        }
        self.rewrite(records)?;
        Ok(true)
    }

    /// After a rewrite the last record's copy may sit in its second slot, past where the lower
    /// file ended: it is written again into its first slot (free once the sync reclaimed it) and
    /// the lower file cut after it, so recompress never makes the lower file longer.
    ///
    /// Formats 4 to 6: the new copies lie past the old ones, freed by the sync; the last ones are
    /// copied, their stored bytes as they are, into the free space below (`move_copy`, at most a
    /// group's worth), and one sync frees their old copies and cuts the lower file after them.
    ///
    /// `with`: formats 1 to 3, what the moved record is encoded with (the background pass keeps
    /// its codec).
    pub(super) fn compact_tail(self: &Arc<Self>, with: EncodeWith) -> FsResult<()> {
        if self.layout().placed() {
            let tail = {
                let _io = self.slot_io.read();
                self.store.tail_copies(&mut self.state.lock().store, GROUP_RECORDS as usize)?
            };
            let mut moved = false;
            for (place, record) in tail {
                let movable = {
                    let _io = self.slot_io.read();
                    self.store.room_below(&mut self.state.lock().store, place)?
                };
                // One sync after them all frees every old copy (an fsync each cost the
                // background pass a second).
                if !movable || !self.move_copy(record)? {
                    break;
                }
                moved = true;
            }
            if moved {
                self.sync(true)?;
            }
            return Ok(());
        }
        let records = self.layout().plain_size_to_records(self.size());
        let Some(last) = records.checked_sub(1) else { return Ok(()) };
        let in_second_slot = {
            let _io = self.slot_io.read();
            self.store.tail_in_second_slot(&mut self.state.lock().store, last)?
        };
        if !in_second_slot {
            return Ok(());
        }
        self.load(last, Load::Edit)?;
        self.send_moved(last, with);
        self.sync(true)?;
        let _io = self.slot_io.write();
        self.store.cut_after_first_slot(&mut self.state.lock().store, last)
    }
}

impl Container {
    /// Formats 4 to 6: writes `record`'s newest copy again, its stored bytes as they are, at the
    /// lowest free place that holds it (`compact_tail`: moving a copy encodes nothing again).
    /// The old copy stays the record's other copy until the next sync. False, and nothing
    /// moved, where the record is being changed or its copy fails its checksum (a read reports
    /// that; moving it would only copy the damage).
    pub(super) fn move_copy(&self, record: u64) -> FsResult<bool> {
        let _io = self.slot_io.write();
        let mut st = self.state.lock();
        let st = &mut *st;
        if st.buffers.is_pending(record) {
            return Ok(false);
        }
        let newest = newest_first(&self.store.pair(&mut st.store, record)?).first().copied();
        let Some((slot, d)) = newest.filter(|(_, d)| !d.is_hole() && !d.is_inline()) else { return Ok(false) };
        let request = self.request(record, slot, &d)?;
        if self.engine.decode(&request).is_err() {
            return Ok(false);
        }
        let copy = Encoded { codec: d.codec(), level: d.level, bytes: request.stored, logical_len: d.logical_len, checksum: d.checksum };
        self.store.write_copy(&mut st.store, record, &copy, false, Changed::All)?;
        self.store.write_gathered(&mut st.store)?;
        Ok(true)
    }

    /// A record loaded to be written again elsewhere goes to the engine with `with` (the sync
    /// after it would send it with the file's codec).
    fn send_moved(self: &Arc<Self>, record: u64, with: EncodeWith) {
        if matches!(with, EncodeWith::FileCodec) {
            return;
        }
        let sent = self.send(&mut self.state.lock(), &[record], with);
        self.write_out(sent);
    }
}

/// Records landed with lz4 by a user's fsync (`Setting::for_fsync`), for `settle_interim`.
#[derive(Default)]
pub(super) struct Interim {
    /// Landed so since the last settle.
    recent: BTreeSet<u64>,
    /// Landed so before it, and not since: re-encoded by the next settle.
    quiet: BTreeSet<u64>,
}

impl Interim {
    /// `record` is handed to the engine, `interim`: with the fsync codec instead of the file's.
    pub(super) fn sent(&mut self, record: u64, interim: bool) {
        self.quiet.remove(&record);
        if interim {
            self.recent.insert(record);
        } else {
            self.recent.remove(&record);
        }
    }
}

//! The store's slots: reading and writing record copies, reclaiming old copies after a sync,
//! and cutting the lower file (truncates, an emptied file, recompress's tail).

use super::{ClosingSync, RawCopy, Store, StoreState};
use crate::codec::Codec;
use crate::core::changed::Changed;
use crate::core::error::{FsError, FsResult};
use crate::core::lower;
use crate::engine::Encoded;
use crate::format::durability::Reclaim;
use crate::format::layout::{round_up_block, GROUP_RECORDS, HEADER_BLOCK, INLINE_CAPACITY, INLINE_OFF};
use crate::format::{newest_first, Descriptor, FormatError, SlotState, FLAG_INLINE};
use std::collections::BTreeSet;

impl Store {
    // ---- slots -------------------------------------------------------------------------

    /// The stored bytes of one copy. A slot cut short (a truncated lower file) keeps its
    /// length: the missing bytes read as zeros and fail the checksum, so it is never taken for
    /// a hole.
    pub fn read_copy(&self, record: u64, slot: usize, d: &Descriptor) -> std::io::Result<Vec<u8>> {
        let mut stored = vec![0u8; d.stored_len as usize];
        let at = if d.is_inline() { INLINE_OFF } else { self.layout.record_to_slot_off(record, slot) };
        lower::pread_full(&self.lower, &mut stored, at)?;
        Ok(stored)
    }

    /// Where the newest copies of `records` lie on the lower file (offset, length), for
    /// read-ahead: holes, inline records and damaged ones have nothing to fetch.
    pub fn stored_extents(&self, st: &mut StoreState, records: std::ops::Range<u64>) -> FsResult<Vec<(u64, u64)>> {
        let mut extents = Vec::new();
        for record in records {
            let pair = self.pair(st, record)?;
            if let Some(&(slot, d)) = newest_first(&pair).first() {
                if !d.is_hole() && !d.is_inline() {
                    extents.push((self.layout.record_to_slot_off(record, slot), u64::from(d.stored_len)));
                }
            }
        }
        Ok(extents)
    }

    /// Verifies and decodes one copy (`format::record`).
    pub fn decode_copy(&self, record: u64, slot: usize, d: &Descriptor) -> std::io::Result<Result<Vec<u8>, FormatError>> {
        let stored = self.read_copy(record, slot, d)?;
        Ok(crate::format::record::verify_and_decode(d.codec(), &stored, d.logical_len as usize, self.checksum, d.checksum))
    }

    /// Writes a new copy of a record (docs/FORMAT.md, "Writing a record"): the stored bytes
    /// into the target slot (punching what the slot held past them), then its descriptor.
    /// `only_if_smaller` (recompress): nothing is written unless the copy takes fewer blocks.
    /// `changed`: the blocks this version changed against the record's previous one. An
    /// uncompressed copy going where this run wrote an uncompressed copy of the same length
    /// writes only the blocks that differ from it (a 4 KiB write and fsync writes 4 KiB, not
    /// the record): the slot then holds what a whole write would leave, and a torn write of it
    /// is a torn copy like any other.
    /// Caller holds `slot_io` exclusively.
    pub fn write_copy(&self, st: &mut StoreState, record: u64, encoded: &Encoded, only_if_smaller: bool, changed: Changed) -> FsResult<()> {
        let pair = self.pair(st, record)?;
        let found = newest_first(&pair);
        // Keep the last durable copy (format::durability).
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
        // Taken out before anything can fail: a failed write leaves the slots unknown.
        let mut copies = st.raw_copies.remove(&record).unwrap_or_default();
        let raw = encoded.codec == Codec::Off && stored > 0 && !inline;
        let in_target =
            copies[target].take().filter(|c| raw && pair[target] == SlotState::Valid(c.written) && c.written.stored_len as u64 == stored);
        // Before the slot is written: a new file's data never reaches its lower file ahead of a
        // durable header.
        self.announce(st)?;
        if st.deferred_punch.contains_key(&(record, target)) {
            self.make_clears_durable(st)?;
        }
        st.touch();
        if stored > 0 {
            if inline {
                self.write_meta(st, &encoded.bytes, INLINE_OFF)?;
            } else if let Some(copy) = in_target {
                for (start, end) in copy.behind.union(changed).ranges(encoded.bytes.len()) {
                    lower::pwrite_all(&self.lower, &encoded.bytes[start..end], slot_off + start as u64)?;
                }
            } else {
                lower::pwrite_all(&self.lower, &encoded.bytes, slot_off)?;
            }
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
        // The other slot's copy now differs in these blocks too; this one in none.
        copies[1 - target] = copies[1 - target].map(|c| RawCopy { behind: c.behind.union(changed), ..c });
        copies[target] = raw.then_some(RawCopy { written: descriptor, behind: Changed::NONE });
        if copies.iter().any(Option::is_some) {
            st.raw_copies.insert(record, copies);
        }
        Ok(())
    }

    /// Punches slots a truncate cleared, once their cleared descriptors are durable; a slot
    /// written again since keeps its new copy.
    fn punch_cleared(&self, st: &mut StoreState, cleared: impl IntoIterator<Item = (u64, usize)>) -> FsResult<()> {
        for (record, slot) in cleared {
            if self.pair(st, record)?[slot] == SlotState::Empty {
                st.touch();
                lower::punch_hole(&self.lower, self.layout.record_to_slot_off(record, slot), self.layout.record_size())?;
            }
        }
        Ok(())
    }

    /// A slot a truncate cleared since the last sync may still hold the copy the disk calls
    /// current (the cleared descriptor is not durable yet), and a power cut tearing it would
    /// serve the copy before it. Before a new copy goes there, a flush makes the clears durable
    /// (and their punches are done). Caller holds `slot_io` exclusively.
    fn make_clears_durable(&self, st: &mut StoreState) -> FsResult<()> {
        self.write_gathered(st)?;
        lower::fdatasync(&self.lower)?;
        let cleared = std::mem::take(&mut st.deferred_punch);
        self.punch_cleared(st, cleared.into_keys())
    }

    /// After a sync: punches the slots truncates cleared before it began (their cleared
    /// descriptors are durable now), and frees the non-current slot of each record whose current
    /// copy is durable.
    /// `keep_for_reuse` (a user's fsync on a file that stays open): those old copies stay in
    /// place for the records' next copies to overwrite, and are freed by `free_kept` later.
    /// Caller holds `slot_io` exclusively.
    pub fn reclaim(&self, st: &mut StoreState, closing: ClosingSync, keep_for_reuse: bool) -> FsResult<()> {
        // Not the slots cleared during the flush (in the next epoch): those wait for the next sync.
        let (cleared, later) = std::mem::take(&mut st.deferred_punch).into_iter().partition(|&(_, epoch)| epoch <= closing.epoch);
        st.deferred_punch = later;
        self.punch_cleared(st, cleared.into_keys())?;
        let records = closing.stale;
        if keep_for_reuse {
            st.kept_for_reuse.extend(records);
            return Ok(());
        }
        let kept = std::mem::take(&mut st.kept_for_reuse);
        self.free_old_copies(st, records.into_iter().chain(kept).collect())
    }

    /// Frees the old copies an fsync kept for reuse (the writeback tick); a record rewritten
    /// since keeps its old copy until the next sync. Caller holds `slot_io` exclusively.
    pub fn free_kept(&self, st: &mut StoreState) -> FsResult<()> {
        let kept = std::mem::take(&mut st.kept_for_reuse);
        self.free_old_copies(st, kept)
    }

    /// Frees the non-current slot of each record whose current copy is durable; the others wait
    /// for the next sync.
    fn free_old_copies(&self, st: &mut StoreState, records: BTreeSet<u64>) -> FsResult<()> {
        let rs = self.layout.record_size();
        let limit = self.layout.plain_size_to_records(st.size);
        for record in records {
            if record >= limit {
                continue;
            }
            let pair = self.pair(st, record)?;
            match st.epochs.reclaimable(&pair) {
                Reclaim::Nothing => {}
                // Rewritten again since: its old copy is still needed.
                Reclaim::NotYetDurable => {
                    st.stale.insert(record);
                }
                Reclaim::Free(other) => {
                    self.set_descriptor(st, record, other, SlotState::Empty)?;
                    lower::punch_hole(&self.lower, self.layout.record_to_slot_off(record, other), rs)?;
                }
            }
        }
        Ok(())
    }

    /// Drops every record from `first` on, on the lower file: descriptors of records sharing a
    /// table that stays (the boundary group's, and always group 0's, which lives in block 0) are
    /// cleared one by one and their slots punched after the next sync; later groups are cut off
    /// with their tables. A size below the header's is recorded in the header at once.
    /// Caller holds `slot_io` exclusively.
    pub fn discard_from(&self, st: &mut StoreState, first: u64) -> FsResult<()> {
        st.stale = st.stale.range(..first).copied().collect();
        st.kept_for_reuse = st.kept_for_reuse.range(..first).copied().collect();
        let clear_end = if first > 0 && first % GROUP_RECORDS == 0 { first } else { (first / GROUP_RECORDS + 1) * GROUP_RECORDS };
        for record in first..clear_end {
            let pair = self.pair(st, record)?;
            for (slot, s) in pair.iter().enumerate() {
                if *s != SlotState::Empty {
                    self.set_descriptor(st, record, slot, SlotState::Empty)?;
                    st.deferred_punch.insert((record, slot), st.epochs.epoch);
                }
            }
        }
        let keep_len = self.layout.records_to_lower_len(first.max(1));
        if self.lower.metadata()?.len() > keep_len {
            st.touch();
            self.lower.set_len(keep_len)?;
        }
        let kept_groups = clear_end / GROUP_RECORDS;
        st.tables.retain(|&g, _| g < kept_groups);
        st.raw_copies.retain(|&r, _| r < first);
        // The record holding a new end inside it keeps its old copy, with the bytes cut off,
        // until its trimmed copy lands: the header must stop covering them now, or a crash before
        // that landing brings them back. (A smaller size is safe to record at any time: nothing
        // past it is read, and a writer growing the file again trims that record first.)
        if st.header_on_disk && st.size < st.persisted_size {
            self.write_header_sized(st, st.size, false)?;
        }
        Ok(())
    }

    /// A file truncated to nothing becomes an empty lower file again (no header block), so it
    /// takes no more space than an empty plain file. Crash-safe: an empty lower file is an empty
    /// file, whatever else of the truncate a power cut keeps or undoes.
    pub fn cut_to_empty(&self, st: &mut StoreState) -> FsResult<()> {
        st.touch();
        // An empty lower file is an empty plain file: it must not keep a birth header, or the
        // plain data a writer may give it later (one that opened it as plain) could be taken
        // for a container a power cut undid. The next birth records it again.
        self.forget_birth()?;
        self.lower.set_len(0)?;
        st.gathered = None;
        st.header_on_disk = false;
        st.announced = false; // the next data brings a new first header, synced first
        st.header_stale = false;
        st.persisted_size = 0;
        st.tables.clear();
        st.raw_copies.clear();
        st.unpersisted.clear();
        st.stale.clear();
        st.kept_for_reuse.clear();
        st.deferred_punch.clear();
        st.heal_complete = true;
        st.know_group_0_empty();
        Ok(())
    }

    /// Whether the last record's only copy sits in its second slot (after a rewrite).
    pub fn tail_in_second_slot(&self, st: &mut StoreState, last: u64) -> FsResult<bool> {
        let pair = self.pair(st, last)?;
        Ok(pair[0] == SlotState::Empty && matches!(pair[1], SlotState::Valid(d) if !d.is_hole()))
    }

    /// Cuts the lower file right after the last record's copy in its first slot (if that is
    /// where it is). Caller holds `slot_io` exclusively.
    pub fn cut_after_first_slot(&self, st: &mut StoreState, last: u64) -> FsResult<()> {
        let end = match self.pair(st, last)? {
            [SlotState::Valid(d), SlotState::Empty] if d.is_inline() => HEADER_BLOCK,
            [SlotState::Valid(d), SlotState::Empty] => self.layout.record_to_slot_off(last, 0) + round_up_block(d.stored_len as u64),
            _ => return Ok(()),
        };
        if self.lower.metadata()?.len() > end {
            st.touch();
            self.lower.set_len(end)?;
            self.restore_mtime(st);
        }
        Ok(())
    }

    /// Refuses a size whose records the lower file system cannot hold (EFBIG, as the lower would
    /// say), when the write or truncate is made rather than when its record lands.
    pub fn check_lower_can_hold(&self, st: &mut StoreState, end: u64) -> FsResult<()> {
        if end <= st.size.max(st.checked_size) || end == 0 {
            return Ok(());
        }
        let last = self.layout.plain_off_to_record(end - 1);
        let fits = |record: u64| {
            // Each record has two slots: past half of off_t's range none can be reached (and the
            // offset arithmetic below would overflow).
            if record >= (i64::MAX as u64 / 2) / self.layout.record_size() {
                return false;
            }
            let lower_end = self.layout.record_to_slot_off(record, 1).checked_add(self.layout.record_size());
            // Every writable Linux file system holds files of 2 GiB (FAT's limit is 4 GiB): no
            // need to ask for less.
            lower_end.is_some_and(|e| e <= 1 << 31 || lower::offset_allowed(&self.lower, e))
        };
        // Up to the end of `last`'s group if that fits too, so a file growing by small writes
        // asks the lower once per group, not once per write.
        let group_end = (self.layout.record_to_group(last) + 1) * GROUP_RECORDS;
        if fits(group_end - 1) {
            st.checked_size = self.layout.record_to_plain_off(group_end).max(end);
        } else if fits(last) {
            st.checked_size = end;
        } else {
            return Err(FsError::new(
                libc::EFBIG,
                format!("{}: the lower file system cannot hold a file of {end} bytes stored this way", self.label()),
            ));
        }
        Ok(())
    }
}

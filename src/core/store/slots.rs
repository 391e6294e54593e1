//! The store's slots: reading and writing record copies, reclaiming old copies after a sync,
//! and cutting the lower file (truncates, an emptied file, recompress's tail).

use super::{placed_extent, ClosingSync, Extent, RawCopy, Space, Store, StoreState};
use crate::codec::Codec;
use crate::core::changed::Changed;
use crate::core::error::{FsError, FsResult};
use crate::core::lower;
use crate::engine::Encoded;
use crate::format::durability::Reclaim;
use crate::format::layout::{round_up_block, BLOCK, GROUP_RECORDS, HEADER_BLOCK, INLINE_CAPACITY, INLINE_OFF};
use crate::format::{newest_first, Descriptor, FormatError, SlotState, FLAG_INLINE};
use std::collections::BTreeSet;

impl Store {
    // ---- slots -------------------------------------------------------------------------

    /// The stored bytes of one copy. A slot cut short (a truncated lower file) keeps its
    /// length: the missing bytes read as zeros and fail the checksum, so it is never taken for
    /// a hole.
    pub fn read_copy(&self, record: u64, slot: usize, d: &Descriptor) -> std::io::Result<Vec<u8>> {
        let mut stored = vec![0u8; d.stored_len as usize];
        lower::pread_full(&self.lower, &mut stored, self.copy_at(record, slot, d))?;
        Ok(stored)
    }

    /// Where a copy's stored bytes begin on the lower file: block 0's inline area, the place its
    /// descriptor names (formats 4 to 6), or its record's slot (formats 1 to 3).
    fn copy_at(&self, record: u64, slot: usize, d: &Descriptor) -> u64 {
        if d.is_inline() {
            INLINE_OFF
        } else if self.layout.placed() {
            u64::from(d.place) * BLOCK
        } else {
            self.layout.record_to_slot_off(record, slot)
        }
    }

    /// Where the newest copies of `records` lie on the lower file (offset, length), for
    /// read-ahead: holes, inline records and damaged ones have nothing to fetch.
    pub fn stored_extents(&self, st: &mut StoreState, records: std::ops::Range<u64>) -> FsResult<Vec<(u64, u64)>> {
        let mut extents = Vec::new();
        for record in records {
            let pair = self.pair(st, record)?;
            if let Some(&(slot, d)) = newest_first(&pair).first() {
                if !d.is_hole() && !d.is_inline() {
                    extents.push((self.copy_at(record, slot, &d), u64::from(d.stored_len)));
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
        // Where the target's copy lies now (formats 4 to 6: its place; earlier: its slot, whose area
        // holds what its descriptor says, or anything if that is damaged).
        let placed = self.layout.placed();
        let (old_at, old_len) = match pair[target] {
            SlotState::Valid(d) if d.is_inline() => (0, 0),
            SlotState::Valid(d) if placed => placed_extent(&d).unwrap_or((0, 0)),
            SlotState::Valid(d) => (self.layout.record_to_slot_off(record, target), round_up_block(d.stored_len as u64)),
            SlotState::Damaged if !placed => (self.layout.record_to_slot_off(record, target), self.layout.record_size()),
            SlotState::Damaged | SlotState::Empty => (0, 0),
        };
        // Taken out before anything can fail: a failed write leaves the slots unknown.
        let mut copies = st.raw_copies.remove(&record).unwrap_or_default();
        let raw = encoded.codec == Codec::Off && stored > 0 && !inline;
        let in_target =
            copies[target].take().filter(|c| raw && pair[target] == SlotState::Valid(c.written) && c.written.stored_len as u64 == stored);
        // Before the slot is written: a new file's data never reaches its lower file ahead of a
        // durable header.
        self.announce(st)?;
        if !placed && st.deferred_punch.contains_key(&(record, target)) {
            self.make_clears_durable(st)?;
        }
        // Formats 4 to 6: the copy goes over the target's old one if it fits there (as a slot would
        // be overwritten), else to a free place. Either may go: the target holds the older copy
        // (the current one is durable) or a current one not yet durable (docs/FORMAT.md).
        let in_place = !placed || (new_len > 0 && new_len <= old_len);
        let copy_off = if new_len == 0 {
            0
        } else if in_place {
            if placed {
                old_at
            } else {
                self.layout.record_to_slot_off(record, target)
            }
        } else {
            let at = self.space(st)?.place(new_len);
            if at / BLOCK > u64::from(u32::MAX) {
                return Err(FsError::new(libc::EFBIG, format!("{}: the lower file would outgrow 16 TiB", self.label())));
            }
            at
        };
        st.touch();
        if stored > 0 {
            if inline {
                self.write_meta(st, &encoded.bytes, INLINE_OFF)?;
            } else if let Some(copy) = in_target {
                for (start, end) in copy.behind.union(changed).ranges(encoded.bytes.len()) {
                    lower::pwrite_all(&self.lower, &encoded.bytes[start..end], copy_off + start as u64)?;
                }
            } else if let Err(e) = lower::pwrite_all(&self.lower, &encoded.bytes, copy_off) {
                if !in_place {
                    // A new place no descriptor names: what the failed write took (a full disk
                    // keeps a short write's blocks) goes back, for the retry to use.
                    let _ = lower::punch_hole(&self.lower, copy_off, new_len);
                    self.space(st)?.give_up((copy_off, new_len));
                }
                return Err(e.into());
            }
        }
        // What the target's old copy held past the new one (all of it, if the copy moved).
        let given_up: Option<Extent> = match (in_place, new_len) {
            _ if old_len == 0 => None,
            (true, 0) if !placed => Some((self.layout.record_to_slot_off(record, target), old_len)),
            (true, n) if n > 0 && old_len > n => Some((copy_off + n, old_len - n)),
            (true, _) => None,
            (false, _) => Some((old_at, old_len)),
        };
        if in_place {
            if let Some((at, len)) = given_up {
                lower::punch_hole(&self.lower, at, len)?;
                if let Some(space) = st.space.as_mut() {
                    space.give_up((at, len));
                }
            }
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
            place: if placed && new_len > 0 { (copy_off / BLOCK) as u32 } else { 0 },
        };
        if placed && !in_place && old_len > 0 {
            self.space(st)?; // built while the old descriptor still names the place it gives up
        }
        self.set_descriptor(st, record, target, SlotState::Valid(descriptor))?;
        // A copy that moved gives its old place up once its descriptor no longer names it.
        if let (false, Some((at, len))) = (in_place, given_up) {
            lower::punch_hole(&self.lower, at, len)?;
            self.space(st)?.give_up((at, len));
        }
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
        let mut slots = Vec::new();
        for (record, slot) in cleared {
            if self.pair(st, record)?[slot] == SlotState::Empty {
                slots.push((self.layout.record_to_slot_off(record, slot), self.layout.record_size()));
            }
        }
        if !slots.is_empty() {
            st.touch();
        }
        self.punch_freed(st, slots)
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
        if !st.deferred_places.is_empty() {
            self.space(st)?; // built while the places to give up still count as used
        }
        let (cleared, later) = std::mem::take(&mut st.deferred_places).into_iter().partition(|&(epoch, _)| epoch <= closing.epoch);
        st.deferred_places = later;
        self.give_up_places(st, cleared)?;
        let records = closing.stale;
        if keep_for_reuse {
            st.kept_for_reuse.extend(records);
            return Ok(());
        }
        let kept = std::mem::take(&mut st.kept_for_reuse);
        self.free_old_copies(st, records.into_iter().chain(kept).collect())?;
        self.trim_lower(st)
    }

    /// Formats 4 to 6: punches the places of copies whose cleared descriptors are durable now and
    /// makes them free for new copies; the lower file is cut after the last place and table it
    /// still needs.
    fn give_up_places(&self, st: &mut StoreState, places: Vec<(u64, Extent)>) -> FsResult<()> {
        if places.is_empty() {
            return Ok(());
        }
        st.touch();
        self.space(st)?;
        self.punch_freed(st, places.into_iter().map(|(_, place)| place).collect())?;
        self.trim_lower(st)
    }

    /// Formats 4 to 6: cuts the lower file after the last place and table it still needs.
    fn trim_lower(&self, st: &mut StoreState) -> FsResult<()> {
        let Some(frontier) = st.space.as_ref().map(Space::frontier) else { return Ok(()) };
        let records = self.layout.plain_size_to_records(st.size);
        let last_table_end = match records.checked_sub(1).map(|r| self.layout.record_to_group(r)) {
            None | Some(0) => HEADER_BLOCK,
            Some(group) => self.layout.group_to_table_off(group) + BLOCK,
        };
        let keep = frontier.max(last_table_end);
        if self.lower.metadata()?.len() > keep {
            st.touch();
            lower::set_len(&self.lower, keep)?;
        }
        Ok(())
    }

    /// Formats 4 to 6: the (at most) `n` records whose current copies lie last on the lower file, the
    /// last first, with their places (after a rewrite the new copies lie past the old ones,
    /// freed since).
    pub fn tail_copies(&self, st: &mut StoreState, n: usize) -> FsResult<Vec<(Extent, u64)>> {
        if !self.layout.placed() {
            return Ok(Vec::new());
        }
        let mut last: Vec<(Extent, u64)> = Vec::new();
        self.visit_pairs(st, 0, |_, record, pair| {
            if let Some(place) = newest_first(&pair).first().and_then(|(_, d)| placed_extent(d)) {
                last.push((place, record));
                if last.len() > 2 * n {
                    last.sort_unstable_by(|a, b| b.cmp(a));
                    last.truncate(n);
                }
            }
            Ok(())
        })?;
        last.sort_unstable_by(|a, b| b.cmp(a));
        last.truncate(n);
        Ok(last)
    }

    /// Formats 4 to 6: whether free space below `place` would hold its copy.
    pub fn room_below(&self, st: &mut StoreState, (at, len): Extent) -> FsResult<bool> {
        Ok(self.space(st)?.has_room_below(len, at))
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
        let mut freed = Vec::new();
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
                    let old = match pair[other] {
                        SlotState::Valid(d) if self.layout.placed() => placed_extent(&d),
                        _ if self.layout.placed() => None,
                        _ => Some((self.layout.record_to_slot_off(record, other), rs)),
                    };
                    self.set_descriptor(st, record, other, SlotState::Empty)?;
                    freed.extend(old);
                }
            }
        }
        self.punch_freed(st, freed)
    }

    /// Punches places no descriptor names any more and, formats 4 to 6, makes them free for new
    /// copies: adjacent ones in one call (a lower mounted with `discard` discards each call's
    /// range before it returns: a call per copy cost a background pass seconds).
    fn punch_freed(&self, st: &mut StoreState, mut places: Vec<Extent>) -> FsResult<()> {
        places.sort_unstable();
        let mut runs: Vec<Extent> = Vec::new();
        for (at, len) in places {
            match runs.last_mut() {
                Some((start, run)) if *start + *run == at => *run += len,
                _ => runs.push((at, len)),
            }
        }
        for (at, len) in runs {
            lower::punch_hole(&self.lower, at, len)?;
            if let Some(space) = st.space.as_mut() {
                space.give_up((at, len));
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
        if self.layout.placed() {
            return self.discard_placed_from(st, first);
        }
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
            lower::set_len(&self.lower, keep_len)?;
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

    /// `discard_from` of formats 4 to 6: copies lie anywhere, so no cut of the lower file drops a
    /// record with its table. Every descriptor from `first` on is cleared: those of `first`'s
    /// own group one by one, every later group that holds any with one zeroed table (a cut of
    /// a large file writes a table per 32 records, not a descriptor per record; a table that
    /// holds none stays a hole). Their places are punched and reused after the next sync made
    /// the clears durable, and the lower file is cut then (`give_up_places`).
    fn discard_placed_from(&self, st: &mut StoreState, first: u64) -> FsResult<()> {
        let first_whole_group = first.div_ceil(GROUP_RECORDS);
        let mut whole_groups = BTreeSet::new();
        self.visit_pairs(st, first, |st, record, pair| {
            let group = self.layout.record_to_group(record);
            for (slot, s) in pair.iter().enumerate() {
                if *s != SlotState::Empty {
                    if let SlotState::Valid(d) = s {
                        if let Some(place) = placed_extent(d) {
                            st.deferred_places.push((st.epochs.epoch, place));
                        }
                    }
                    if group >= first_whole_group {
                        whole_groups.insert(group);
                    } else {
                        self.set_descriptor(st, record, slot, SlotState::Empty)?;
                    }
                }
            }
            Ok(())
        })?;
        for group in whole_groups {
            self.clear_table(st, group)?;
        }
        st.raw_copies.retain(|&r, _| r < first);
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
        lower::set_len(&self.lower, 0)?;
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
        st.deferred_places.clear();
        st.space = self.layout.placed().then(|| Space::new(self.layout, Vec::new()));
        st.heal_complete = true;
        st.know_group_0_empty();
        Ok(())
    }

    /// Whether the last record's only copy sits in its second slot (after a rewrite).
    /// (Formats 4 to 6 have no second slot to sit in: a copy takes the first free place.)
    pub fn tail_in_second_slot(&self, st: &mut StoreState, last: u64) -> FsResult<bool> {
        if self.layout.placed() {
            return Ok(false);
        }
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
            lower::set_len(&self.lower, end)?;
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
            let lower_end = self.layout.lower_end_bound(record);
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

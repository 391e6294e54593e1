//! The descriptor tables: read from the lower file (or from the first block its open read),
//! healed on first load, cached and written; the walks over the groups that hold anything, and
//! the free space built from them.

use super::{placed_extent, Extent, Space, Store, StoreState};
use crate::core::error::{FsError, FsResult};
use crate::core::lower;
use crate::format::layout::{BLOCK, GROUP_RECORDS, HEADER_BLOCK, TABLE_SIZE};
use crate::format::{decode_table, newest_first, Descriptor, Pair, SlotState};
use tracing::{error, warn};

impl Store {
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

    pub(super) fn write_table(&self, st: &mut StoreState, group: u64, table: &[Pair]) -> FsResult<()> {
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
    pub(super) fn space<'a>(&self, st: &'a mut StoreState) -> FsResult<&'a mut Space> {
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
    pub(super) fn visit_pairs(
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
    pub(super) fn set_descriptor(&self, st: &mut StoreState, record: u64, slot: usize, state: SlotState) -> FsResult<()> {
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
    pub(super) fn clear_table(&self, st: &mut StoreState, group: u64) -> FsResult<()> {
        st.touch();
        self.write_meta(st, &[0u8; TABLE_SIZE as usize], self.layout.group_to_table_off(group))?;
        if let Some(table) = st.tables.get_mut(&group) {
            table.fill([SlotState::Empty; 2]);
        }
        Ok(())
    }
}

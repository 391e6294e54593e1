//! Pure offset arithmetic of the container: where a record's descriptor and slots live in the
//! lower file, and how a byte range splits into per-record pieces. No I/O here.
//!
//! ```text
//! block 0 (4 KiB)    header copy A @0, header copy B @64, inline area @128 (1920 B),
//!                    table of group 0 @2048 (2 KiB)
//! group 0 slots      for record i of the group: slot 0, then slot 1, each record_size bytes
//! group g >= 1:      table block (4 KiB, first 2 KiB used), then the group's slots
//! ```
//! A group is GROUP_RECORDS records; its table holds one ENTRY_SIZE entry (two slot
//! descriptors) per record. Formats 4 to 6 place each copy where its descriptor says, so the
//! slots are only room between tables: format 4 keeps format 3's (64 slots after each table),
//! formats 5 and 6 leave room for 8 records after each table, so that a compressed file's lower
//! length follows its stored bytes instead of twice its logical size. Every slot starts on a
//! 4 KiB boundary, so a slot's unused tail can be punched out and the lower file's allocated
//! blocks follow the compressed size. Group 0's table
//! shares the header's block, and so may record 0's slot 0 when it compresses to at most
//! INLINE_CAPACITY bytes: a small file then takes a single block.

use super::{FORMAT_VERSION, PLACED_WIDE_FORMAT_VERSION, SLOTS_FORMAT_VERSION};

pub const HEADER_BLOCK: u64 = 4096;
pub const GROUP_RECORDS: u64 = 32;
pub const DESCRIPTOR_SIZE: u64 = 32;
pub const ENTRY_SIZE: u64 = 2 * DESCRIPTOR_SIZE;
pub const TABLE_SIZE: u64 = GROUP_RECORDS * ENTRY_SIZE;
/// Where group 0's table sits inside the header block.
pub const GROUP0_TABLE_OFF: u64 = HEADER_BLOCK - TABLE_SIZE;
/// Block 0's room for record 0's slot 0, after the two 64-byte header copies.
pub const INLINE_OFF: u64 = 128;
pub const INLINE_CAPACITY: u64 = GROUP0_TABLE_OFF - INLINE_OFF;
pub const SLOTS_PER_RECORD: u64 = 2;
/// Allocation granularity the layout is aligned to (and rounds slot tails to).
pub const BLOCK: u64 = 4096;

pub const MIN_RECORD_SHIFT: u8 = 12;
pub const MAX_RECORD_SHIFT: u8 = 20;

/// Record geometry of one container file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    record_shift: u8,
    arrangement: Arrangement,
}

/// Where a file's copies and tables lie: what its format version says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arrangement {
    /// Formats 1 to 3: each copy in one of its record's two slots (`record_to_slot_off`).
    InSlots,
    /// Format 4: each copy where its descriptor says (`Descriptor::place`), packed in the order
    /// written; the tables stay at format 3's offsets, a table every 64 slots.
    PlacedWide,
    /// Formats 5 and 6: copies placed as in format 4; a table every 8 records' worth of bytes.
    Placed,
}

/// Records' worth of room after each table block in formats 5 and 6: the tables of a file whose
/// copies average at least 1/4 of their records lie among its copies, so its lower length is
/// about its stored bytes (format 4's tables reach twice the logical size).
const PLACED_ROOM_RECORDS: u64 = 8;

/// The part of one record that a byte range touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub record: u64,
    /// Offset of the range's first byte inside the record.
    pub skip: usize,
    pub len: usize,
}

impl Piece {
    /// A piece that does not cover its whole record needs the record's old bytes (read-modify-write).
    pub fn is_partial(&self, record_size: usize) -> bool {
        self.skip != 0 || self.len != record_size
    }
}

impl Layout {
    /// The geometry new files get (formats 5 and 6: copies placed explicitly, tables dense).
    /// `record_size` must be a power of two from 4 KiB to 1 MiB.
    pub fn new(record_size: u64) -> Option<Layout> {
        if !record_size.is_power_of_two() {
            return None;
        }
        let shift = record_size.trailing_zeros() as u8;
        (MIN_RECORD_SHIFT..=MAX_RECORD_SHIFT).contains(&shift).then_some(Layout { record_shift: shift, arrangement: Arrangement::Placed })
    }

    /// The same records laid out as format `version` lays them out (1 to 6).
    pub fn of_version(self, version: u16) -> Layout {
        let arrangement = match version {
            ..=SLOTS_FORMAT_VERSION => Arrangement::InSlots,
            PLACED_WIDE_FORMAT_VERSION => Arrangement::PlacedWide,
            _ => Arrangement::Placed,
        };
        Layout { arrangement, ..self }
    }

    /// The format version a header of a file with this layout records: a file keeps the
    /// layout it was born with (files of versions 1 and 2 become version 3: same layout).
    pub fn format_version(&self) -> u16 {
        match self.arrangement {
            Arrangement::InSlots => SLOTS_FORMAT_VERSION,
            Arrangement::PlacedWide => PLACED_WIDE_FORMAT_VERSION,
            Arrangement::Placed => FORMAT_VERSION,
        }
    }

    /// The same records with each copy in its record's slot (formats 1 to 3).
    pub fn in_slots(self) -> Layout {
        self.of_version(SLOTS_FORMAT_VERSION)
    }

    /// Whether descriptors say where their copies lie (formats 4 to 6).
    pub fn placed(&self) -> bool {
        self.arrangement != Arrangement::InSlots
    }

    pub fn from_shift(record_shift: u8) -> Option<Layout> {
        Layout::new(1u64.checked_shl(record_shift as u32)?)
    }

    pub fn record_shift(&self) -> u8 {
        self.record_shift
    }

    pub fn record_size(&self) -> u64 {
        1 << self.record_shift
    }

    pub fn plain_off_to_record(&self, offset: u64) -> u64 {
        offset >> self.record_shift
    }

    pub fn record_to_plain_off(&self, record: u64) -> u64 {
        record << self.record_shift
    }

    /// Number of records needed to hold `size` logical bytes.
    pub fn plain_size_to_records(&self, size: u64) -> u64 {
        size.div_ceil(self.record_size())
    }

    /// Logical bytes of `record` that lie below `size` (the record's length in a file of that size).
    pub fn record_len_in_size(&self, record: u64, size: u64) -> usize {
        let start = self.record_to_plain_off(record);
        size.saturating_sub(start).min(self.record_size()) as usize
    }

    /// Bytes between one table block and the next: a group's slots (formats 1 to 4), or room
    /// for PLACED_ROOM_RECORDS copies (formats 5 and 6).
    fn slots_span(&self) -> u64 {
        match self.arrangement {
            Arrangement::InSlots | Arrangement::PlacedWide => GROUP_RECORDS * SLOTS_PER_RECORD * self.record_size(),
            Arrangement::Placed => PLACED_ROOM_RECORDS * self.record_size(),
        }
    }

    pub fn record_to_group(&self, record: u64) -> u64 {
        record / GROUP_RECORDS
    }

    /// Offset of the group's first slot (formats 5 and 6: of the room after its table).
    pub fn group_to_slots_off(&self, group: u64) -> u64 {
        HEADER_BLOCK + group * (self.slots_span() + BLOCK)
    }

    /// The group whose region holds lower offset `off`: group 0's is block 0 and its slots,
    /// a later group's is its table block and its slots.
    pub fn lower_off_to_group(&self, off: u64) -> u64 {
        let group0_end = HEADER_BLOCK + self.slots_span();
        if off < group0_end {
            0
        } else {
            1 + (off - group0_end) / (self.slots_span() + BLOCK)
        }
    }

    /// The first group whose table lies at or after lower offset `off`.
    pub fn first_table_at_or_after(&self, off: u64) -> u64 {
        let group = self.lower_off_to_group(off);
        if off <= self.group_to_table_off(group) {
            group
        } else {
            group + 1
        }
    }

    /// The table block (4 KiB) a copy must not overlap that is the first to end after `off`:
    /// block 0 (header, inline area, group 0's table) or a later group's table block.
    pub fn reserved_block_after(&self, off: u64) -> u64 {
        if off < HEADER_BLOCK {
            return 0;
        }
        let group = self.lower_off_to_group(off);
        let table = self.group_to_table_off(group);
        if group > 0 && off < table + BLOCK {
            table
        } else {
            self.group_to_table_off(group + 1)
        }
    }

    /// Offset of the group's table (TABLE_SIZE bytes).
    pub fn group_to_table_off(&self, group: u64) -> u64 {
        if group == 0 {
            GROUP0_TABLE_OFF
        } else {
            self.group_to_slots_off(group) - BLOCK
        }
    }

    /// Index of `record` inside its group's table.
    pub fn record_to_entry_index(&self, record: u64) -> usize {
        (record % GROUP_RECORDS) as usize
    }

    pub fn record_to_descriptor_off(&self, record: u64, slot: usize) -> u64 {
        self.group_to_table_off(self.record_to_group(record)) + (record % GROUP_RECORDS) * ENTRY_SIZE + slot as u64 * DESCRIPTOR_SIZE
    }

    /// Formats 1 to 3 only: later formats place copies by their descriptors.
    pub fn record_to_slot_off(&self, record: u64, slot: usize) -> u64 {
        debug_assert!(slot < SLOTS_PER_RECORD as usize);
        debug_assert!(!self.placed());
        self.group_to_slots_off(self.record_to_group(record))
            + ((record % GROUP_RECORDS) * SLOTS_PER_RECORD + slot as u64) * self.record_size()
    }

    /// How far into the lower file the copies of records `0..=record` can reach: their slots'
    /// end (formats 1 to 3), or two copies of each (a record rewritten before a sync keeps its
    /// older one) with the table blocks between them (formats 4 to 6). None past u64.
    pub fn lower_end_bound(&self, record: u64) -> Option<u64> {
        if !self.placed() {
            // record_to_slot_off(record, 1) + record size, checked.
            let within = ((record % GROUP_RECORDS) * SLOTS_PER_RECORD + 2) * self.record_size();
            let group = self.record_to_group(record).checked_mul(self.slots_span() + BLOCK)?;
            return group.checked_add(HEADER_BLOCK + within);
        }
        let copies = record.checked_add(1)?.checked_mul(SLOTS_PER_RECORD * self.record_size())?;
        let tables = copies.div_ceil(self.slots_span()) + 1;
        HEADER_BLOCK.checked_add(copies)?.checked_add(tables.checked_mul(BLOCK)?)
    }

    /// Lower-file length that holds every record below `records` (the end of its last group;
    /// formats 1 to 3).
    pub fn records_to_lower_len(&self, records: u64) -> u64 {
        if records == 0 {
            return HEADER_BLOCK;
        }
        self.group_to_slots_off(self.record_to_group(records - 1)) + self.slots_span()
    }

    /// Splits the logical range `[offset, offset + len)` into per-record pieces.
    pub fn split(&self, offset: u64, len: u64) -> impl Iterator<Item = Piece> + '_ {
        let end = offset.saturating_add(len);
        let mut pos = offset;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let record = self.plain_off_to_record(pos);
            let skip = (pos - self.record_to_plain_off(record)) as usize;
            let take = (self.record_size() - skip as u64).min(end - pos);
            pos += take;
            Some(Piece { record, skip, len: take as usize })
        })
    }
}

/// Rounds up to the allocation block.
pub fn round_up_block(n: u64) -> u64 {
    n.div_ceil(BLOCK) * BLOCK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_powers_of_two_from_4k_to_1m_are_record_sizes() {
        for shift in 0..32u32 {
            let ok = (12..=20).contains(&shift);
            assert_eq!(Layout::new(1 << shift).is_some(), ok, "shift {shift}");
        }
        assert!(Layout::new(12288).is_none());
        assert!(Layout::new(0).is_none());
    }

    #[test]
    fn regions_never_overlap_and_are_block_aligned() {
        for shift in [12u8, 13, 17, 20] {
            let layout = Layout::from_shift(shift).unwrap().in_slots();
            let rs = layout.record_size();
            // Header copies (64 bytes at 0 and 64), the inline area, then every table and slot.
            let mut regions: Vec<(u64, u64)> = vec![(0, 64), (64, 128), (INLINE_OFF, INLINE_OFF + INLINE_CAPACITY)];
            for record in 0..(3 * GROUP_RECORDS) {
                let t = layout.group_to_table_off(layout.record_to_group(record));
                if record % GROUP_RECORDS == 0 {
                    regions.push((t, t + TABLE_SIZE));
                    assert_eq!(t / BLOCK, (t + TABLE_SIZE - 1) / BLOCK, "a table lies inside one block");
                }
                for slot in 0..2 {
                    let s = layout.record_to_slot_off(record, slot);
                    assert_eq!(s % BLOCK, 0);
                    regions.push((s, s + rs));
                    let d = layout.record_to_descriptor_off(record, slot);
                    assert!(d >= t && d + DESCRIPTOR_SIZE <= t + TABLE_SIZE);
                    // A descriptor never straddles a 512-byte sector, so its write is atomic on disk.
                    assert_eq!(d / 512, (d + DESCRIPTOR_SIZE - 1) / 512);
                }
            }
            regions.sort();
            for pair in regions.windows(2) {
                assert!(pair[0].1 <= pair[1].0, "overlap {pair:?}");
                // The only unused space: the second half of later groups' table blocks.
                let gap = pair[1].0 - pair[0].1;
                assert!(gap == 0 || gap == BLOCK - TABLE_SIZE, "gap {pair:?}");
            }
            assert_eq!(layout.records_to_lower_len(3 * GROUP_RECORDS), regions.last().unwrap().1);
            assert_eq!(layout.records_to_lower_len(1), HEADER_BLOCK + GROUP_RECORDS * 2 * rs);
        }
    }

    #[test]
    fn every_lower_offset_belongs_to_the_group_whose_table_or_slot_holds_it() {
        for shift in [12u8, 17, 20] {
            let layout = Layout::from_shift(shift).unwrap().in_slots();
            assert_eq!(layout.lower_off_to_group(0), 0);
            for group in 1..5u64 {
                let table = layout.group_to_table_off(group);
                assert_eq!(layout.lower_off_to_group(table), group);
                assert_eq!(layout.lower_off_to_group(table - 1), group - 1);
                let first = group * GROUP_RECORDS;
                for record in [first, first + GROUP_RECORDS - 1] {
                    for slot in 0..2 {
                        let s = layout.record_to_slot_off(record, slot);
                        assert_eq!(layout.lower_off_to_group(s), group);
                        assert_eq!(layout.lower_off_to_group(s + layout.record_size() - 1), group);
                    }
                }
            }
            // Far away, without overflow: record 2^33's group.
            let record = 1u64 << 33;
            assert_eq!(layout.lower_off_to_group(layout.record_to_slot_off(record, 1)), layout.record_to_group(record));
        }
    }

    #[test]
    fn each_version_keeps_its_tables_where_it_put_them() {
        let layout = Layout::new(128 * 1024).unwrap();
        assert_eq!(layout.format_version(), super::FORMAT_VERSION);
        for version in 1..=6u16 {
            let l = layout.of_version(version);
            // Versions 1 and 2 become 3, version 5 becomes 6 (the same layouts).
            let becomes = match version {
                ..=3 => 3,
                4 => 4,
                _ => super::FORMAT_VERSION,
            };
            assert_eq!(l.format_version(), becomes);
            assert_eq!(l.placed(), version >= 4);
            assert_eq!(l.group_to_table_off(0), GROUP0_TABLE_OFF);
        }
        // Formats 3 and 4: a table every 64 slots (8 MiB + 4 KiB at 128 KiB records).
        for l in [layout.of_version(3), layout.of_version(4)] {
            assert_eq!(l.group_to_table_off(1), HEADER_BLOCK + (64 << 17));
            assert_eq!(l.group_to_table_off(2), 2 * (HEADER_BLOCK + (64 << 17)));
        }
        // Formats 5 and 6: a table every 8 records' worth (1 MiB + 4 KiB).
        assert_eq!(layout.group_to_table_off(1), HEADER_BLOCK + (8 << 17));
        assert_eq!(layout.group_to_table_off(7), 7 * (HEADER_BLOCK + (8 << 17)));
    }

    #[test]
    fn placed_tables_and_the_blocks_reserved_for_them_agree() {
        for layout in [Layout::new(4096).unwrap(), Layout::new(128 * 1024).unwrap(), Layout::new(128 * 1024).unwrap().of_version(4)] {
            assert_eq!(layout.reserved_block_after(0), 0);
            assert_eq!(layout.reserved_block_after(HEADER_BLOCK), layout.group_to_table_off(1));
            assert_eq!(layout.first_table_at_or_after(1), 0);
            assert_eq!(layout.first_table_at_or_after(GROUP0_TABLE_OFF + 1), 1);
            for group in 1..50u64 {
                let table = layout.group_to_table_off(group);
                assert_eq!(table % BLOCK, 0);
                assert_eq!(layout.lower_off_to_group(table), group);
                assert_eq!(layout.lower_off_to_group(table - 1), group - 1);
                assert_eq!(layout.reserved_block_after(table - 1), table);
                assert_eq!(layout.reserved_block_after(table), table);
                assert_eq!(layout.reserved_block_after(table + BLOCK - 1), table);
                assert_eq!(layout.reserved_block_after(table + BLOCK), layout.group_to_table_off(group + 1));
                assert_eq!(layout.first_table_at_or_after(table), group);
                assert_eq!(layout.first_table_at_or_after(table + 1), group + 1);
            }
        }
    }

    #[test]
    fn the_lower_end_bound_covers_two_copies_of_every_record_and_the_tables_among_them() {
        for layout in [Layout::new(4096).unwrap(), Layout::new(128 * 1024).unwrap()] {
            let rs = layout.record_size();
            for format in [3u16, 4, 5] {
                let l = layout.of_version(format);
                for record in [0u64, 1, 31, 32, 1000] {
                    let bound = l.lower_end_bound(record).unwrap();
                    if format == 3 {
                        assert_eq!(bound, l.record_to_slot_off(record, 1) + rs);
                    }
                    assert!(bound >= HEADER_BLOCK + 2 * (record + 1) * rs, "format {format}, record {record}");
                    // The record's own table lies below it.
                    assert!(l.group_to_table_off(l.record_to_group(record)) + BLOCK <= bound);
                }
                // No overflow far out.
                assert!(l.lower_end_bound(u64::MAX / 2).is_none());
            }
            // Placed copies may take what format 3's slots took, give or take a table block.
            let (slots, placed) =
                (layout.of_version(3).lower_end_bound(1000).unwrap(), layout.of_version(4).lower_end_bound(1000).unwrap());
            assert!(placed >= slots && placed <= slots + 2 * BLOCK, "{placed} against {slots}");
        }
    }

    #[test]
    fn split_covers_the_range_exactly_for_every_small_case() {
        let layout = Layout::new(4096).unwrap();
        let rs = layout.record_size();
        for offset in (0..3 * rs).step_by(511) {
            for len in (0..3 * rs).step_by(777) {
                let pieces: Vec<Piece> = layout.split(offset, len).collect();
                let mut pos = offset;
                for p in &pieces {
                    assert_eq!(layout.record_to_plain_off(p.record) + p.skip as u64, pos);
                    assert!(p.len > 0 && p.skip + p.len <= rs as usize);
                    pos += p.len as u64;
                }
                assert_eq!(pos, offset + len);
            }
        }
    }

    #[test]
    fn record_lengths_follow_the_file_size() {
        let layout = Layout::new(4096).unwrap();
        assert_eq!(layout.plain_size_to_records(0), 0);
        assert_eq!(layout.plain_size_to_records(1), 1);
        assert_eq!(layout.plain_size_to_records(4096), 1);
        assert_eq!(layout.plain_size_to_records(4097), 2);
        assert_eq!(layout.record_len_in_size(1, 4097), 1);
        assert_eq!(layout.record_len_in_size(0, 4097), 4096);
        assert_eq!(layout.record_len_in_size(2, 4097), 0);
        assert!(layout.split(0, 4096).next().is_some_and(|p| !p.is_partial(4096)));
        assert!(layout.split(1, 4095).next().is_some_and(|p| p.is_partial(4096)));
    }
}

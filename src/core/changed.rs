//! Which blocks of a record a change touched: what lets a user's fsync bring an uncompressed copy
//! up to date by writing only the blocks that differ from it (`Store::write_copy`), instead of
//! the whole record. Anything not tracked block by block is `All`, so a path that forgets to say
//! what it changed costs a whole-record write, never a stale block.

use crate::format::layout::BLOCK;

/// Records are at most 1 MiB: 256 blocks of 4 KiB.
const WORDS: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    /// Unknown, or everything: the whole record must be written.
    All,
    /// These blocks (bit i: bytes `i * BLOCK .. (i + 1) * BLOCK` of the record).
    Blocks([u64; WORDS]),
}

impl Changed {
    pub const NONE: Changed = Changed::Blocks([0; WORDS]);

    /// Also the blocks holding bytes `start..end` of the record.
    pub fn add(&mut self, start: usize, end: usize) {
        let Changed::Blocks(bits) = self else { return };
        if start >= end {
            return;
        }
        let (first, last) = (start / BLOCK as usize, (end - 1) / BLOCK as usize);
        if last >= WORDS * 64 {
            *self = Changed::All;
            return;
        }
        for block in first..=last {
            bits[block / 64] |= 1 << (block % 64);
        }
    }

    pub fn union(self, other: Changed) -> Changed {
        match (self, other) {
            (Changed::Blocks(a), Changed::Blocks(b)) => Changed::Blocks(std::array::from_fn(|i| a[i] | b[i])),
            _ => Changed::All,
        }
    }

    /// The byte ranges (start, end) to write so that a copy of `len` bytes this set is relative
    /// to becomes the new one; adjacent blocks are merged into one range.
    pub fn ranges(&self, len: usize) -> Vec<(usize, usize)> {
        let Changed::Blocks(bits) = self else { return vec![(0, len)] };
        let block = BLOCK as usize;
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for i in (0..WORDS * 64).filter(|&i| bits[i / 64] & (1 << (i % 64)) != 0) {
            let (start, end) = (i * block, ((i + 1) * block).min(len));
            if start >= len {
                break;
            }
            match ranges.last_mut() {
                Some(last) if last.1 == start => last.1 = end,
                _ => ranges.push((start, end)),
            }
        }
        ranges
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_every_changed_byte_block_aligned_and_merged() {
        let mut c = Changed::NONE;
        assert!(c.ranges(131072).is_empty());
        c.add(100, 200);
        c.add(4095, 4097); // straddles blocks 0 and 1
        c.add(40_000, 40_001);
        assert_eq!(c.ranges(131072), vec![(0, 8192), (36864, 40960)]);
        // The last block is cut at the record's length.
        let mut tail = Changed::NONE;
        tail.add(10_000, 10_001);
        assert_eq!(tail.ranges(10_500), vec![(8192, 10_500)]);
        assert_eq!(Changed::All.ranges(5000), vec![(0, 5000)]);
        assert_eq!(c.union(tail).ranges(131072), vec![(0, 12288), (36864, 40960)]);
        assert_eq!(c.union(Changed::All), Changed::All);
        // Past 1 MiB nothing is tracked.
        let mut big = Changed::NONE;
        big.add(0, (1 << 20) + 1);
        assert_eq!(big, Changed::All);
        let mut empty = Changed::NONE;
        empty.add(7, 7);
        assert_eq!(empty, Changed::NONE);
    }
}

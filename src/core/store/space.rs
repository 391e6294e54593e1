//! Where a format-4 or -5 container's next copy goes: the lower file's free space, as ranges between
//! the copies its descriptors point at (docs/FORMAT.md, "Placing a copy"). Pure bookkeeping of
//! offsets; the store builds it from every table before its first placement and tells it of
//! each copy placed and each place given up.
//!
//! A new copy takes the first free range that holds it, else the space at the *frontier* (past
//! every copy), stepping over the table blocks that sit at fixed offsets: a file written in
//! order gets its copies packed one after another, as the lower file system then reads them
//! back fastest.

use crate::format::layout::{Layout, BLOCK, HEADER_BLOCK};
use std::collections::BTreeMap;

/// A place (offset, length), both multiples of 4 KiB.
pub type Extent = (u64, u64);

pub struct Space {
    layout: Layout,
    /// Free ranges below the frontier: start -> end, never touching each other.
    free: BTreeMap<u64, u64>,
    /// Everything from here on is free but for table blocks.
    frontier: u64,
}

impl Space {
    /// The space of a lower file whose copies lie at `used` (any order; overlaps are a damaged
    /// file's and are kept used).
    pub fn new(layout: Layout, mut used: Vec<Extent>) -> Space {
        used.retain(|&(_, len)| len > 0);
        used.sort_unstable();
        let mut space = Space { layout, free: BTreeMap::new(), frontier: HEADER_BLOCK };
        for (start, len) in used {
            if start > space.frontier {
                space.add_free_steering_clear(space.frontier, start);
            }
            space.frontier = space.frontier.max(start + len);
        }
        space
    }

    /// Where everything past is free (the end the lower file needs for its copies).
    pub fn frontier(&self) -> u64 {
        self.frontier
    }

    /// Whether a copy of `len` bytes would get a place below `limit`.
    pub fn has_room_below(&self, len: u64, limit: u64) -> bool {
        self.free.iter().take_while(|&(&s, _)| s < limit).any(|(&s, &e)| e - s >= len && s + len <= limit)
    }

    /// A place for `len` bytes (a multiple of 4 KiB, at most a record).
    pub fn place(&mut self, len: u64) -> u64 {
        debug_assert!(len > 0 && len % BLOCK == 0);
        if let Some((&start, &end)) = self.free.iter().find(|&(&s, &e)| e - s >= len) {
            self.free.remove(&start);
            if end > start + len {
                self.free.insert(start + len, end);
            }
            return start;
        }
        let mut at = self.frontier;
        loop {
            let reserved = self.layout.reserved_block_after(at);
            if at + len <= reserved {
                break;
            }
            // Overlapping a table block: what lies before it stays free.
            if reserved > at {
                self.insert_free(at, reserved);
            }
            at = reserved + BLOCK;
        }
        self.frontier = at + len;
        at
    }

    /// `extent` holds no copy any more.
    pub fn give_up(&mut self, (start, len): Extent) {
        if len == 0 {
            return;
        }
        debug_assert!(start >= HEADER_BLOCK && start + len <= self.frontier, "BUG: giving up {start}+{len} past {}", self.frontier);
        self.insert_free(start, start + len);
        // Free space reaching the frontier moves it back, over table blocks too (the store
        // keeps the tables it still needs when it cuts the lower file).
        loop {
            if let Some((&start, &end)) = self.free.range(..self.frontier).next_back() {
                if end == self.frontier {
                    self.free.remove(&start);
                    self.frontier = start;
                    continue;
                }
            }
            let below = self.layout.reserved_block_after(self.frontier - BLOCK);
            if below >= HEADER_BLOCK && below + BLOCK == self.frontier {
                self.frontier = below;
                continue;
            }
            break;
        }
    }

    /// Adds `[start, end)` to the free ranges, merged with the ranges it touches.
    fn insert_free(&mut self, mut start: u64, mut end: u64) {
        if let Some((&s, &e)) = self.free.range(..=start).next_back() {
            debug_assert!(e <= start, "BUG: {start}..{end} already free ({s}..{e})");
            if e == start {
                self.free.remove(&s);
                start = s;
            }
        }
        if let Some(&e) = self.free.get(&end) {
            self.free.remove(&end);
            end = e;
        }
        self.free.insert(start, end);
    }

    /// Adds the free space in `[start, end)`, less the table blocks in it.
    fn add_free_steering_clear(&mut self, mut start: u64, end: u64) {
        while start < end {
            let reserved = self.layout.reserved_block_after(start);
            let stop = reserved.min(end);
            if stop > start {
                self.insert_free(start, stop);
            }
            start = stop.max(reserved + BLOCK);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::new(4096).unwrap()
    }

    /// The table blocks a copy must never overlap, up to `end`.
    fn tables_below(layout: Layout, end: u64) -> Vec<Extent> {
        let mut blocks = vec![(0, HEADER_BLOCK)];
        let mut group = 1;
        while layout.group_to_table_off(group) < end {
            blocks.push((layout.group_to_table_off(group), BLOCK));
            group += 1;
        }
        blocks
    }

    fn overlaps(a: Extent, b: Extent) -> bool {
        a.0 < b.0 + b.1 && b.0 < a.0 + a.1
    }

    #[test]
    fn copies_written_in_order_lie_packed_around_the_tables() {
        let layout = layout();
        let mut space = Space::new(layout, Vec::new());
        let mut placed: Vec<Extent> = Vec::new();
        for i in 0..200u64 {
            let len = BLOCK * (1 + i % 2);
            let at = space.place(len);
            placed.push((at, len));
        }
        let tables = tables_below(layout, space.frontier());
        assert!(tables.len() > 3, "the copies cross several table blocks");
        for (i, &p) in placed.iter().enumerate() {
            assert!(tables.iter().all(|&t| !overlaps(p, t)), "copy {i} at {p:?} overlaps a table");
            assert!(placed[..i].iter().all(|&q| !overlaps(p, q)), "copy {i} overlaps another");
        }
        // Packed: nothing between the copies but table blocks and the one-block gaps a
        // two-block copy leaves before a table.
        let data: u64 = placed.iter().map(|p| p.1).sum();
        let span = space.frontier() - HEADER_BLOCK;
        assert!(span <= data + tables.len() as u64 * 2 * BLOCK, "span {span} for {data} bytes");
    }

    #[test]
    fn given_up_places_are_taken_again_first_and_the_frontier_moves_back() {
        let mut space = Space::new(layout(), Vec::new());
        let a = space.place(2 * BLOCK);
        let b = space.place(BLOCK);
        let c = space.place(BLOCK);
        space.give_up((a, 2 * BLOCK));
        assert_eq!(space.place(BLOCK), a, "first fit");
        assert_eq!(space.place(BLOCK), a + BLOCK);
        assert_eq!(space.place(BLOCK), c + BLOCK, "nothing free below: the frontier");
        let end = space.frontier();
        space.give_up((c + BLOCK, BLOCK));
        space.give_up((c, BLOCK));
        assert_eq!(space.frontier(), c, "free space at the end is the frontier");
        space.give_up((b, BLOCK));
        assert_eq!(space.frontier(), b, "merged with the free range before it");
        assert!(end > space.frontier());
    }

    #[test]
    fn the_frontier_moves_back_over_table_blocks_to_the_last_copy() {
        let layout = layout();
        let mut space = Space::new(layout, Vec::new());
        let placed: Vec<u64> = (0..100).map(|_| space.place(BLOCK)).collect();
        assert!(space.frontier() > layout.group_to_table_off(1) + BLOCK, "past group 1's table");
        for &at in placed[10..].iter().rev() {
            space.give_up((at, BLOCK));
        }
        assert_eq!(space.frontier(), placed[9] + BLOCK);
        // Given up in any order, the same.
        let mut space = Space::new(layout, Vec::new());
        let placed: Vec<u64> = (0..100).map(|_| space.place(BLOCK)).collect();
        for &at in &placed[10..] {
            space.give_up((at, BLOCK));
        }
        assert_eq!(space.frontier(), placed[9] + BLOCK);
        assert_eq!(space.place(BLOCK), placed[10], "the next copy goes right after the last");
    }

    #[test]
    fn a_space_rebuilt_from_its_copies_keeps_them_and_the_tables_clear() {
        let layout = layout();
        let used = vec![(HEADER_BLOCK + 3 * BLOCK, BLOCK), (layout.group_to_table_off(2) + BLOCK, 2 * BLOCK), (HEADER_BLOCK, BLOCK)];
        let mut space = Space::new(layout, used.clone());
        assert_eq!(space.frontier(), layout.group_to_table_off(2) + 3 * BLOCK);
        let tables = tables_below(layout, space.frontier());
        let mut fresh = Vec::new();
        while space.frontier() == layout.group_to_table_off(2) + 3 * BLOCK {
            let at = space.place(BLOCK);
            fresh.push((at, BLOCK));
        }
        // Every free block below the frontier was found (all of them but the 4 used and the
        // table blocks of groups 1 and 2), and none of them is taken or reserved.
        let free_below = (layout.group_to_table_off(2) + 3 * BLOCK - HEADER_BLOCK) / BLOCK - 4 - 2;
        assert_eq!(fresh.len() as u64 - 1, free_below);
        for &f in &fresh {
            assert!(used.iter().chain(&tables).all(|&u| !overlaps(f, u)), "{f:?}");
        }
    }
}

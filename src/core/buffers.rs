//! The in-memory records of one open container: *dirty* (changed, not yet handed to the
//! engine), *in flight* (being compressed or waiting to land) and *clean* (a small cache of
//! decoded records). Every byte held is charged to the mount's one budget (`memory.rs`) and
//! released when dropped, so the accounting stays exact whatever path a buffer takes.

use super::changed::Changed;
use super::memory::Memory;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

/// Decoded records kept for small reads that hit the same record again.
const CLEAN_CACHE_RECORDS: usize = 16;

/// One version of a record handed to the engine.
pub struct InFlight {
    /// Tells this version from a later one of the same record (landing checks it).
    pub seq: u64,
    pub data: Arc<Vec<u8>>,
    /// The blocks this version changed against the one before it.
    pub changed: Changed,
    /// Re-encoded by recompress (same bytes): land only if it takes less space than the copy
    /// stored now.
    pub only_if_smaller: bool,
}

pub struct Buffers {
    /// Records changed in memory and not yet handed to the engine; each buffer is at most the
    /// record's length within the file size (bytes past it read as zeros).
    dirty: BTreeMap<u64, Vec<u8>>,
    /// For each dirty record, the blocks changed against the record's newest version before it
    /// (in flight, or landed).
    changed: HashMap<u64, Changed>,
    /// For each dirty record, the writeback tick (a count of them) during which it became dirty:
    /// the tick sends a record once a whole tick interval has passed since (`aged_dirty_records`).
    dirtied_at: HashMap<u64, u64>,
    /// Writeback ticks so far.
    ticks: u64,
    dirty_bytes: usize,
    inflight: HashMap<u64, InFlight>,
    inflight_bytes: usize,
    next_seq: u64,
    clean: VecDeque<(u64, Arc<Vec<u8>>)>,
    memory: Arc<Memory>,
}

impl Drop for Buffers {
    fn drop(&mut self) {
        let clean: usize = self.clean.iter().map(|(_, b)| b.len()).sum();
        self.memory.release_unlanded(self.dirty_bytes + self.inflight_bytes);
        self.memory.release(clean);
    }
}

impl Buffers {
    pub fn new(memory: Arc<Memory>) -> Buffers {
        Buffers {
            dirty: BTreeMap::new(),
            changed: HashMap::new(),
            dirtied_at: HashMap::new(),
            ticks: 0,
            dirty_bytes: 0,
            inflight: HashMap::new(),
            inflight_bytes: 0,
            next_seq: 1,
            clean: VecDeque::new(),
            memory,
        }
    }

    pub fn memory(&self) -> &Arc<Memory> {
        &self.memory
    }

    // ---- dirty -------------------------------------------------------------------------

    pub fn is_dirty(&self, record: u64) -> bool {
        self.dirty.contains_key(&record)
    }

    /// Dirty with something in it (a record truncated to nothing has an empty buffer).
    pub fn has_dirty_bytes(&self, record: u64) -> bool {
        self.dirty.get(&record).is_some_and(|b| !b.is_empty())
    }

    pub fn dirty_records(&self) -> Vec<u64> {
        self.dirty.keys().copied().collect()
    }

    /// Counts a writeback tick and returns the records dirty since before the tick before it:
    /// dirty for at least one whole interval (as the kernel's dirty_expire). A record a writer
    /// is filling right now waits for its write to end instead of being compressed half full
    /// and again when full (a writer's 3 MiB write comes as pieces of 1 MiB less 16 bytes).
    pub fn aged_dirty_records(&mut self) -> Vec<u64> {
        self.ticks += 1;
        let before = self.ticks - 1;
        self.dirty.keys().copied().filter(|r| self.dirtied_at.get(r).is_some_and(|&at| at < before)).collect()
    }

    pub fn dirty_bytes(&self) -> usize {
        self.dirty_bytes
    }

    /// Sets a record's dirty bytes, changed anywhere.
    pub fn put_dirty(&mut self, record: u64, buf: Vec<u8>) {
        self.put(record, buf, Changed::All);
    }

    /// Makes the record's newest version (in flight or landed), unchanged, its dirty bytes, for
    /// a partial write to change.
    pub fn load_dirty(&mut self, record: u64, buf: Vec<u8>) {
        self.put(record, buf, Changed::NONE);
    }

    /// Writes `bytes` at `at` into the record's dirty bytes (empty if it had none: then its
    /// earlier bytes are unknown), zero-filling a gap; returns the buffer's new length.
    pub fn write_into(&mut self, record: u64, at: usize, bytes: &[u8]) -> usize {
        let changed = self.changed.get(&record).copied();
        // A record stays as old as its first change (a busy record still goes out in time).
        let dirtied_at = self.dirtied_at.get(&record).copied();
        let (mut buf, mut changed) = match self.take_dirty(record) {
            Some(buf) => (buf, changed.unwrap_or(Changed::All)),
            None => (Vec::new(), Changed::All),
        };
        let end = at + bytes.len();
        if buf.len() < end {
            changed.add(buf.len(), end);
        }
        // Bytes past the buffer's end are appended, not zeroed first and then overwritten (a
        // sequential writer fills every record this way); only a gap before `at` is zeros.
        if buf.len() < at {
            buf.resize(at, 0);
        }
        let overwritten = bytes.len().min(buf.len() - at);
        buf[at..at + overwritten].copy_from_slice(&bytes[..overwritten]);
        buf.extend_from_slice(&bytes[overwritten..]);
        changed.add(at, end);
        let len = buf.len();
        self.put(record, buf, changed);
        if let Some(at) = dirtied_at {
            self.dirtied_at.insert(record, at);
        }
        len
    }

    fn put(&mut self, record: u64, buf: Vec<u8>, changed: Changed) {
        self.changed.insert(record, changed);
        self.dirtied_at.entry(record).or_insert(self.ticks);
        self.forget_clean(record);
        self.dirty_bytes += buf.len();
        self.memory.charge_unlanded(buf.len());
        if let Some(old) = self.dirty.insert(record, buf) {
            self.dirty_bytes -= old.len();
            self.memory.release_unlanded(old.len());
        }
    }

    pub fn take_dirty(&mut self, record: u64) -> Option<Vec<u8>> {
        let buf = self.dirty.remove(&record)?;
        self.changed.remove(&record);
        self.dirtied_at.remove(&record);
        self.dirty_bytes -= buf.len();
        self.memory.release_unlanded(buf.len());
        Some(buf)
    }

    // ---- in flight ---------------------------------------------------------------------

    pub fn is_in_flight(&self, record: u64) -> bool {
        self.inflight.contains_key(&record)
    }

    pub fn in_flight(&self, record: u64) -> Option<&InFlight> {
        self.inflight.get(&record)
    }

    pub fn inflight_bytes(&self) -> usize {
        self.inflight_bytes
    }

    pub fn in_flight_records(&self) -> Vec<u64> {
        self.inflight.keys().copied().collect()
    }

    /// Moves a dirty record into flight, unless a version of it is in flight already (one at a
    /// time) or it has no bytes (a record truncated to nothing). Returns the version's number
    /// and bytes. `only_if_smaller` is asked only for a version that goes.
    pub fn send(&mut self, record: u64, only_if_smaller: impl FnOnce() -> bool) -> Option<(u64, Arc<Vec<u8>>)> {
        if self.inflight.contains_key(&record) {
            return None;
        }
        let changed = self.changed.get(&record).copied().unwrap_or(Changed::All);
        let len = self.dirty.get(&record)?.len();
        // Charged in flight before the dirty charge goes (see `requeue_inflight`).
        self.memory.charge_unlanded(len);
        let buf = self.take_dirty(record).expect("dirty under the same borrow");
        if buf.is_empty() {
            return None;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let data = Arc::new(buf);
        let only_if_smaller = only_if_smaller();
        self.inflight_bytes += data.len();
        self.inflight.insert(record, InFlight { seq, data: data.clone(), changed, only_if_smaller });
        Some((seq, data))
    }

    pub fn take_inflight(&mut self, record: u64) -> Option<InFlight> {
        let f = self.inflight.remove(&record)?;
        self.inflight_bytes -= f.data.len();
        self.memory.release_unlanded(f.data.len());
        Some(f)
    }

    /// A version that could not land goes back to dirty (unless a newer one is dirty already),
    /// charged as dirty before its in-flight charge goes: `df` and the admission of writes read
    /// the unlanded count without this file's lock, and must never see the bytes leave.
    pub fn requeue_inflight(&mut self, record: u64) -> Option<InFlight> {
        let f = self.inflight.remove(&record)?;
        self.inflight_bytes -= f.data.len();
        if !self.dirty.contains_key(&record) {
            self.put(record, f.data.to_vec(), Changed::All);
        }
        self.memory.release_unlanded(f.data.len());
        Some(f)
    }

    /// Nothing dirty, and nothing in flight but `record`.
    pub fn only_in_flight(&self, record: u64) -> bool {
        self.dirty.is_empty() && self.inflight.len() == 1 && self.inflight.contains_key(&record)
    }

    // ---- clean and all -----------------------------------------------------------------

    /// The record's newest bytes held in memory: dirty, in flight, or clean.
    pub fn newest(&self, record: u64) -> Option<Arc<Vec<u8>>> {
        if let Some(buf) = self.dirty.get(&record) {
            return Some(Arc::new(buf.clone()));
        }
        if let Some(f) = self.inflight.get(&record) {
            return Some(f.data.clone());
        }
        self.clean.iter().find(|(r, _)| *r == record).map(|(_, b)| b.clone())
    }

    /// Whether the record has a change not yet on the lower file.
    pub fn is_pending(&self, record: u64) -> bool {
        self.is_dirty(record) || self.is_in_flight(record)
    }

    /// Nothing dirty and nothing in flight.
    pub fn all_landed(&self) -> bool {
        self.dirty.is_empty() && self.inflight.is_empty()
    }

    /// Whether the record's change not yet on the lower file holds data: a version all zeros
    /// (punched, or written as zeros) lands as a hole, so SEEK_DATA finds none in it now
    /// either. None when nothing is pending.
    pub fn pending_data(&self, record: u64) -> Option<bool> {
        let newest = match self.dirty.get(&record) {
            Some(buf) => buf.as_slice(),
            None => self.inflight.get(&record)?.data.as_slice(),
        };
        Some(newest.iter().any(|&b| b != 0))
    }

    /// The first record from `from` on with a pending change that holds data (`pending_data`).
    pub fn first_pending_data_from(&self, from: u64) -> Option<u64> {
        let holds_data = |r: &u64| self.pending_data(*r) == Some(true);
        // Dirty records in order, up to the first with data (a punch calls this per record).
        let dirty = self.dirty.range(from..).map(|(r, _)| *r).find(holds_data);
        let inflight = self.inflight.keys().copied().filter(|&r| r >= from && !self.dirty.contains_key(&r) && holds_data(&r)).min();
        dirty.into_iter().chain(inflight).min()
    }

    pub fn forget_clean(&mut self, record: u64) {
        let memory = &self.memory;
        self.clean.retain(|(r, b)| {
            let keep = *r != record;
            if !keep {
                memory.release(b.len());
            }
            keep
        });
    }

    /// Keeps a decoded record for the next read of it, within the budget.
    pub fn remember_clean(&mut self, record: u64, buf: &Arc<Vec<u8>>) {
        self.forget_clean(record);
        if self.clean.len() >= CLEAN_CACHE_RECORDS || (self.memory.over() && !self.clean.is_empty()) {
            if let Some((_, old)) = self.clean.pop_front() {
                self.memory.release(old.len());
            }
        }
        if self.memory.over() {
            return; // a cache, not worth memory the budget does not have
        }
        self.memory.charge(buf.len());
        self.clean.push_back((record, buf.clone()));
    }

    pub fn clear_clean(&mut self) {
        for (_, b) in self.clean.drain(..) {
            self.memory.release(b.len());
        }
    }

    /// Drops every record from `first` on (a truncate).
    pub fn drop_from(&mut self, first: u64) {
        for r in self.dirty.range(first..).map(|(r, _)| *r).collect::<Vec<_>>() {
            self.take_dirty(r);
        }
        for r in self.inflight.keys().copied().filter(|&r| r >= first).collect::<Vec<_>>() {
            self.take_inflight(r);
        }
        let memory = &self.memory;
        self.clean.retain(|(r, b)| {
            if *r >= first {
                memory.release(b.len());
            }
            *r < first
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record goes to the tick's writeback once it has been dirty for a whole interval,
    /// counted from its first change (later writes to it do not make it younger), and a record
    /// dirtied again after it went starts over.
    #[test]
    fn the_tick_sends_records_dirty_for_a_whole_interval() {
        let mut b = Buffers::new(Arc::new(Memory::new(1 << 20)));
        b.write_into(0, 0, &[1; 100]);
        assert!(b.aged_dirty_records().is_empty(), "dirtied during the interval this tick ends");
        b.write_into(0, 100, &[2; 100]);
        b.write_into(1, 0, &[3; 10]);
        assert_eq!(b.aged_dirty_records(), vec![0], "record 0 dirty since before the tick before");
        assert_eq!(b.aged_dirty_records(), vec![0, 1]);
        b.send(0, || false).unwrap();
        b.take_inflight(0).unwrap();
        b.write_into(0, 0, &[4; 10]);
        assert_eq!(b.aged_dirty_records(), vec![1], "record 0 dirtied again: young again");
        assert_eq!(b.aged_dirty_records(), vec![0, 1]);
        b.take_dirty(1).unwrap();
        b.put_dirty(1, vec![5; 10]);
        assert_eq!(b.aged_dirty_records(), vec![0]);
    }

    #[test]
    fn every_path_releases_what_it_charged() {
        let memory = Arc::new(Memory::new(1 << 20));
        {
            let mut b = Buffers::new(memory.clone());
            b.put_dirty(0, vec![1; 100]);
            b.put_dirty(0, vec![2; 50]); // replaced
            b.put_dirty(1, vec![3; 10]);
            assert_eq!(memory.used(), 60);
            let (seq, data) = b.send(0, || false).unwrap();
            assert_eq!((seq, data.len(), b.inflight_bytes(), b.dirty_bytes()), (1, 50, 50, 10));
            assert!(b.send(0, || false).is_none(), "nothing dirty left to send");
            b.put_dirty(0, vec![4; 20]);
            assert!(b.send(0, || false).is_none(), "one version in flight at a time");
            assert_eq!(memory.used(), 80);
            let f = b.take_inflight(0).unwrap();
            b.remember_clean(0, &f.data); // dirty 0 forgets nothing: clean is separate
            b.remember_clean(5, &Arc::new(vec![0; 7]));
            assert_eq!(b.newest(0).unwrap().as_slice(), &[4; 20][..], "dirty wins over clean");
            b.put_dirty(5, vec![9; 3]); // a change forgets the clean copy
            assert_eq!(memory.used(), 20 + 10 + 50 + 3);
            b.drop_from(1);
            assert_eq!(memory.used(), 20 + 50);
            assert!(b.send(0, || false).is_some());
            assert_eq!(b.first_pending_data_from(0), Some(0));
        }
        assert_eq!(memory.used(), 0, "dropping the buffers releases the rest");
    }

    #[test]
    fn a_pending_version_of_zeros_holds_no_data_whether_dirty_or_in_flight() {
        let mut b = Buffers::new(Arc::new(Memory::new(1 << 20)));
        b.put_dirty(1, vec![0; 64]);
        b.put_dirty(2, vec![0, 0, 5]);
        b.send(2, || false).unwrap();
        b.put_dirty(3, vec![0; 8]);
        b.send(3, || false).unwrap();
        b.put_dirty(4, vec![7]);
        assert_eq!(
            (b.pending_data(0), b.pending_data(1), b.pending_data(2), b.pending_data(3)),
            (None, Some(false), Some(true), Some(false))
        );
        assert_eq!(b.first_pending_data_from(0), Some(2));
        assert_eq!(b.first_pending_data_from(3), Some(4));
        b.put_dirty(2, Vec::new()); // the dirty version, truncated to nothing, wins over the one in flight
        assert_eq!(b.first_pending_data_from(0), Some(4));
    }

    #[test]
    fn a_version_carries_the_blocks_written_since_the_one_before_and_all_of_them_when_unknown() {
        let memory = Arc::new(Memory::new(1 << 20));
        let mut b = Buffers::new(memory);
        let changed = |b: &mut Buffers, record| {
            b.send(record, || false).unwrap();
            b.take_inflight(record).unwrap().changed
        };
        // Loaded unchanged, then written in two places: those blocks.
        b.load_dirty(0, vec![7; 65536]);
        b.write_into(0, 5000, &[1; 10]);
        b.write_into(0, 20_000, &[2; 5000]);
        let mut expected = Changed::NONE;
        expected.add(5000, 5010);
        expected.add(20_000, 25_000);
        assert_eq!(changed(&mut b, 0), expected);
        // Grown past its end: the gap counts as changed too.
        b.load_dirty(1, vec![7; 4096]);
        assert_eq!(b.write_into(1, 16_384, &[3; 100]), 16_484);
        let mut grown = Changed::NONE;
        grown.add(4096, 16_484);
        assert_eq!(changed(&mut b, 1), grown);
        // No earlier bytes in memory, or bytes put by another path: unknown.
        b.write_into(2, 0, &[4; 100]);
        assert_eq!(changed(&mut b, 2), Changed::All);
        b.put_dirty(3, vec![5; 4096]);
        b.write_into(3, 0, &[6; 10]);
        assert_eq!(changed(&mut b, 3), Changed::All);
    }

    #[test]
    fn writes_overwrite_extend_and_leave_zeros_in_gaps() {
        let mut b = Buffers::new(Arc::new(Memory::new(1 << 20)));
        assert_eq!(b.write_into(0, 0, &[1; 10]), 10);
        assert_eq!(b.write_into(0, 6, &[2; 10]), 16, "overlaps the end: overwrites, then appends");
        assert_eq!(b.write_into(0, 20, &[3; 4]), 24, "past the end: a gap of zeros first");
        assert_eq!(b.write_into(0, 2, &[4; 3]), 24, "inside: the length stays");
        let mut expected = vec![1u8; 6];
        expected[2..5].fill(4);
        expected.extend([2; 10]);
        expected.extend([0; 4]);
        expected.extend([3; 4]);
        assert_eq!(b.newest(0).unwrap().as_slice(), &expected[..]);
        assert_eq!(b.dirty_bytes(), 24);
    }

    #[test]
    fn an_empty_buffer_is_never_sent() {
        let memory = Arc::new(Memory::new(1 << 20));
        let mut b = Buffers::new(memory);
        b.put_dirty(3, Vec::new());
        assert!(b.send(3, || false).is_none());
        assert!(!b.is_dirty(3), "taken, and dropped");
    }
}

//! The read path: a record's current bytes from memory or the lower file (decoded in parallel,
//! an older copy where the newest is torn), read-ahead of a sequential reader, and the bytes a
//! read returns.

use super::{Container, State};
use crate::core::error::{FsError, FsResult};
use crate::core::lower;
use crate::engine::DecompressRequest;
use crate::format::layout::round_up_block;
use crate::format::{newest_first, Descriptor};
use std::sync::Arc;
use tracing::{error, warn};

/// Records the lower file system is asked to fetch ahead of a sequential reader (8 MiB of data
/// at 128K records); asked again when half of them have been read.
const READ_AHEAD_RECORDS: u64 = 64;
/// How far out of order a stream's READs may come (twice the mount's kernel read-ahead).
const STREAM_SLACK_BYTES: u64 = 4 << 20;
/// How far behind a stream's READ its records' lower pages are dropped (past any READ still in
/// flight).
const DROP_BEHIND_BYTES: u64 = 8 << 20;

/// A reader's position: reads that continue where the last one ended form a stream.
#[derive(Default)]
pub(super) struct ReadStream {
    /// The record after the last one read.
    next: u64,
    /// Records below this were already asked for.
    ahead_until: u64,
    /// The stream's descriptor tables were asked for (formats 4 to 6 keep them apart from the copies).
    tables_asked: bool,
    /// Records below this were left behind and had their lower pages dropped (or came before
    /// the stream began).
    dropped_until: u64,
}

impl ReadStream {
    /// Notes a read of records `first..=last` of a file of `records` records; returns the
    /// records to fetch ahead now, if the reads form a stream and the last request runs low.
    /// Reads up to `slack` records out of order still belong to the stream: the kernel's
    /// read-ahead has a few READs in flight at once, answered by several threads.
    fn advance(&mut self, first: u64, last: u64, records: u64, slack: u64) -> Option<std::ops::Range<u64>> {
        let sequential = first <= self.next + slack && last + 1 + slack >= self.next;
        self.next = if sequential { self.next.max(last + 1) } else { last + 1 };
        if !sequential {
            self.ahead_until = self.next;
            self.dropped_until = first;
            return None;
        }
        if self.ahead_until >= (self.next + READ_AHEAD_RECORDS / 2).min(records) {
            return None;
        }
        let from = self.ahead_until.max(self.next);
        self.ahead_until = (self.next + READ_AHEAD_RECORDS).min(records);
        (from < self.ahead_until).then_some(from..self.ahead_until)
    }

    /// The records a stream now reading from `first` has left more than `lag` records behind,
    /// not handed out before.
    fn behind(&mut self, first: u64, lag: u64) -> Option<std::ops::Range<u64>> {
        let until = first.saturating_sub(lag);
        (until > self.dropped_until).then(|| std::mem::replace(&mut self.dropped_until, until)..until)
    }
}

/// Copies' extents as ranges of the lower file, those packed one after another (formats 4 and
/// 5: they lie in the order they landed, about the records' order) joined into one.
fn joined(mut extents: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    extents.sort_unstable();
    let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(extents.len());
    for (off, len) in extents {
        match ranges.last_mut() {
            Some((start, end)) if off >= *start && off <= round_up_block(*end) => *end = (*end).max(off + len),
            _ => ranges.push((off, off + len)),
        }
    }
    ranges
}

/// Where a record's current bytes come from.
pub(super) enum Source {
    Memory(Arc<Vec<u8>>),
    Absent,
    Lower { candidates: Vec<(usize, Descriptor)> },
}

/// Bytes a read returns, as the pieces they are made of: ranges of records' cached contents (no
/// copy), zeros for holes, or bytes of its own. The FUSE reply sends the pieces as they lie.
pub struct ReadBytes {
    parts: Vec<ReadPart>,
}

enum ReadPart {
    Owned(Vec<u8>),
    Record(Arc<Vec<u8>>, std::ops::Range<usize>),
    Zeros(usize),
}

/// What zero runs are sent from (a run is at most a record, 1 MiB).
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

impl ReadBytes {
    pub fn owned(bytes: Vec<u8>) -> ReadBytes {
        ReadBytes { parts: vec![ReadPart::Owned(bytes)] }
    }

    /// The bytes, in order, as slices.
    pub fn slices(&self) -> Vec<&[u8]> {
        let mut out = Vec::with_capacity(self.parts.len());
        for part in &self.parts {
            match part {
                ReadPart::Owned(bytes) => out.push(bytes.as_slice()),
                ReadPart::Record(record, range) => out.push(&record[range.clone()]),
                ReadPart::Zeros(mut n) => {
                    while n > 0 {
                        let run = n.min(ZEROS.len());
                        out.push(&ZEROS[..run]);
                        n -= run;
                    }
                }
            }
        }
        out
    }

    /// The bytes joined (callers other than the FUSE reply).
    pub fn to_vec(&self) -> Vec<u8> {
        self.slices().concat()
    }
}

impl Container {
    // ---- reading -----------------------------------------------------------------------

    pub(super) fn source(&self, st: &mut State, record: u64) -> FsResult<Source> {
        if let Some(buf) = st.buffers.newest(record) {
            return Ok(Source::Memory(buf));
        }
        let found = self.store.copies(&mut st.store, record)?;
        Ok(if found.is_empty() { Source::Absent } else { Source::Lower { candidates: found } })
    }

    pub(super) fn request(&self, record: u64, slot: usize, d: &Descriptor) -> FsResult<DecompressRequest> {
        Ok(DecompressRequest {
            codec: d.codec(),
            stored: self.store.read_copy(record, slot, d)?,
            logical_len: d.logical_len as usize,
            checksum_kind: self.store.checksum(),
            checksum: d.checksum,
        })
    }

    /// Reads one record from the lower file, newest copy first; an older copy is served only
    /// when the newest fails its checksum (a write torn by a crash), and that is logged.
    pub(super) fn fetch_slow(&self, record: u64) -> FsResult<Arc<Vec<u8>>> {
        let _io = self.slot_io.read();
        let mut st = self.state.lock();
        let found = match self.source(&mut st, record)? {
            Source::Memory(buf) => return Ok(buf),
            Source::Absent => return Ok(Arc::new(Vec::new())),
            Source::Lower { candidates } => candidates,
        };
        let mut last = None;
        for (i, (slot, d)) in found.iter().enumerate() {
            let req = self.request(record, *slot, d)?;
            match self.engine.decode(&req) {
                Ok(buf) => {
                    if i > 0 {
                        warn!(file = %self.store.label(), record, "newest copy unreadable; serving the previous copy (an interrupted write)");
                    }
                    let buf = Arc::new(buf);
                    st.buffers.remember_clean(record, &buf);
                    return Ok(buf);
                }
                Err(e) => last = Some((*slot, e)),
            }
        }
        let (slot, e) = last.expect("BUG: candidates were not empty");
        let label = self.store.label();
        error!(file = %label, record, slot, "record unreadable: {e}");
        Err(FsError::corrupt(format!("{label}: record {record}: {e}")))
    }

    /// Current contents of several records, decoding the ones on the lower file in parallel.
    fn fetch(&self, records: &[u64]) -> FsResult<Vec<Arc<Vec<u8>>>> {
        let mut out: Vec<Option<Arc<Vec<u8>>>> = vec![None; records.len()];
        let mut pending: Vec<((usize, Descriptor), DecompressRequest)> = Vec::new();
        {
            let _io = self.slot_io.read();
            let mut st = self.state.lock();
            let mut plans = Vec::new();
            for (i, &record) in records.iter().enumerate() {
                match self.source(&mut st, record)? {
                    Source::Memory(buf) => out[i] = Some(buf),
                    Source::Absent => out[i] = Some(Arc::new(Vec::new())),
                    Source::Lower { candidates } => plans.push((i, candidates[0])),
                }
            }
            drop(st);
            for (i, (slot, d)) in plans {
                pending.push(((i, d), self.request(records[i], slot, &d)?));
            }
        }
        let (planned, requests): (Vec<(usize, Descriptor)>, Vec<DecompressRequest>) = pending.into_iter().unzip();
        let results = self.engine.decompress_all(requests);
        for ((i, planned), result) in planned.into_iter().zip(results) {
            let record = records[i];
            out[i] = Some(match result {
                Ok(buf) => {
                    let buf = Arc::new(buf);
                    // Cache it only if the record did not change while it was being decoded.
                    let mut st = self.state.lock();
                    let st = &mut *st;
                    let unchanged = !st.buffers.is_pending(record)
                        && self.store.pair(&mut st.store, record).ok().and_then(|p| newest_first(&p).first().map(|c| c.1)) == Some(planned);
                    if unchanged {
                        st.buffers.remember_clean(record, &buf);
                    }
                    buf
                }
                Err(_) => self.fetch_slow(record)?,
            });
        }
        Ok(out.into_iter().map(|b| b.expect("BUG: every record fetched")).collect())
    }

    /// A sequential reader's next records are asked of the lower file system before the
    /// kernel asks for them: the lower file's own read-ahead does not see the stream where
    /// copies are not adjacent (format 3's slots, or copies rewritten since), and each record
    /// would wait for the disk. And the lower pages of the records it has left behind are
    /// dropped: the kernel caches what they decoded to, and a large file's stream otherwise
    /// filled memory with a second, compressed copy (a cold 3 GB zstd-3 read took 3.1-3.4 s
    /// instead of 2.4-2.6 s on a VM where fresh pages cost).
    fn read_ahead(&self, first: u64, last: u64, records: u64) {
        let mut behind = Vec::new();
        let extents = {
            let mut st = self.state.lock();
            let record_size = self.layout().record_size();
            let Some(ahead) = st.stream.advance(first, last, records, STREAM_SLACK_BYTES.div_ceil(record_size)) else { return };
            // A lag, so that the READs still in flight keep their pages.
            let lag = DROP_BEHIND_BYTES.div_ceil(record_size);
            if let Some(left) = st.stream.behind(first, lag) {
                let st = &mut *st;
                behind = self.store.stored_extents(&mut st.store, left).unwrap_or_default();
            }
            if !std::mem::replace(&mut st.stream.tables_asked, true) {
                self.store.prefetch_tables(
                    self.layout().record_to_group(ahead.start)..self.layout().record_to_group(records.saturating_sub(1)) + 1,
                );
            }
            let st = &mut *st;
            match self.store.stored_extents(&mut st.store, ahead) {
                Ok(extents) => extents,
                Err(_) => return, // the read itself reports it
            }
        };
        // Hints both: an error is the next read's to report.
        for (start, end) in joined(extents) {
            let _ = lower::will_need(self.store.lower(), start, end - start);
        }
        for (start, end) in joined(behind) {
            let _ = lower::dont_need(self.store.lower(), start, end - start);
        }
    }

    pub fn read(&self, offset: u64, len: usize) -> FsResult<ReadBytes> {
        let size = self.size();
        if offset >= size || len == 0 {
            return Ok(ReadBytes::owned(Vec::new()));
        }
        let len = (len as u64).min(size - offset);
        let pieces: Vec<_> = self.layout().split(offset, len).collect();
        let records: Vec<u64> = pieces.iter().map(|p| p.record).collect();
        self.read_ahead(records[0], records[records.len() - 1], self.layout().plain_size_to_records(size));
        let contents = self.fetch(&records)?;
        let mut parts = Vec::with_capacity(pieces.len());
        for (piece, buf) in pieces.iter().zip(contents) {
            let have = buf.len().saturating_sub(piece.skip).min(piece.len);
            if have > 0 {
                parts.push(ReadPart::Record(buf, piece.skip..piece.skip + have));
            }
            // Past a record's end (a hole, or a record shorter than the file's size says): zeros.
            if piece.len > have {
                parts.push(ReadPart::Zeros(piece.len - have));
            }
        }
        Ok(ReadBytes { parts })
    }
}

#[cfg(test)]
mod read_stream_tests {
    use super::{ReadStream, READ_AHEAD_RECORDS};

    #[test]
    fn a_sequential_reader_is_read_ahead_in_batches_and_a_random_one_is_not() {
        let mut s = ReadStream::default();
        let total = 1000;
        // The first read from the start opens a window of READ_AHEAD_RECORDS past it.
        assert_eq!(s.advance(0, 7, total, 16), Some(8..8 + READ_AHEAD_RECORDS));
        // Nothing more until half of it is consumed.
        let mut asked = vec![];
        for first in (8..200).step_by(8) {
            if let Some(r) = s.advance(first, first + 7, total, 16) {
                asked.push(r);
            }
        }
        // Every record of the stream was asked for exactly once, in order, ahead of its read.
        let flat: Vec<u64> = asked.iter().flat_map(|r| r.clone()).collect();
        assert_eq!(flat, (8 + READ_AHEAD_RECORDS..flat[0] + flat.len() as u64).collect::<Vec<_>>());
        assert!(asked.iter().all(|r| r.end - r.start >= READ_AHEAD_RECORDS / 2), "{asked:?}");
        // A jump is no stream; reading on from there is one again.
        assert_eq!(s.advance(500, 507, total, 16), None);
        assert_eq!(s.advance(508, 515, total, 16), Some(516..516 + READ_AHEAD_RECORDS));
        // Never past the end of the file.
        assert_eq!(s.advance(990, 995, total, 16), None);
        assert_eq!(s.advance(996, 999, total, 16), None);
        let mut s = ReadStream::default();
        assert_eq!(s.advance(0, 3, 10, 16), Some(4..10));
        assert_eq!(s.advance(4, 9, 10, 16), None);
    }

    #[test]
    fn reads_a_little_out_of_order_stay_one_stream() {
        // Two READs in flight, answered by two threads: the later one may come first.
        let mut s = ReadStream::default();
        let (mut asked, mut left) = (vec![], vec![]);
        for pair in (0..400u64).step_by(16) {
            for first in [pair + 8, pair] {
                let Some(ahead) = s.advance(first, first + 7, 1000, 16) else { continue };
                asked.extend(ahead);
                if let Some(behind) = s.behind(first, 64) {
                    assert!(behind.end + 64 <= first, "{behind:?} left behind within the lag of {first}");
                    left.extend(behind);
                }
            }
        }
        // Asked ahead and left behind once each, in order: no read restarted the stream.
        assert_eq!(asked, (16..16 + asked.len() as u64).collect::<Vec<_>>());
        assert_eq!(left, (0..left.len() as u64).collect::<Vec<_>>());
        assert!(asked.len() >= 400 && left.len() >= 400 - 64 - 48, "{} asked, {} left", asked.len(), left.len());
    }

    #[test]
    fn a_stream_leaves_each_record_behind_once_and_only_what_it_read() {
        let mut s = ReadStream::default();
        let mut left = vec![];
        for first in (0..400).step_by(8) {
            s.advance(first, first + 7, 1000, 16);
            left.extend(s.behind(first, 64).into_iter().flatten());
        }
        // Records 0 .. 392 - 64, each once, in order; none within the lag.
        assert_eq!(left, (0..392 - 64).collect::<Vec<_>>());
        // A jump forward: what was skipped was never read, and is not left behind.
        s.advance(700, 707, 1000, 16);
        assert_eq!(s.behind(700, 64), None);
        s.advance(708, 715, 1000, 16);
        assert_eq!(s.behind(780, 64), Some(700..716));
        // A jump back starts over from there.
        s.advance(10, 17, 1000, 16);
        assert_eq!(s.behind(100, 64), Some(10..36));
    }
}

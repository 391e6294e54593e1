//! Looking at containers from the outside: per-file statistics (what `densefs stat/get/list`
//! report) and a scrub that verifies every record's checksum and decoding. Works on any lower
//! file, mounted or not; it only reads.

use crate::codec::{Codec, Compression, Setting};
use crate::core::store::Store;
use crate::format::layout::GROUP_RECORDS;
use crate::format::{newest_first, FormatError, Header, SlotState};
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};

/// What one regular file holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileStats {
    pub container: bool,
    /// The size programs see.
    pub logical_size: u64,
    /// Bytes of data actually stored, holes excluded (ZFS's `logicalused`).
    pub logical_data: u64,
    /// Bytes the lower file occupies (its allocated blocks).
    pub physical: u64,
    /// The stored data's bytes after compression: the records' stored lengths (a plain file's
    /// length), without the container's header and tables or the lower's allocation unit.
    pub stored_data: u64,
    pub record_size: Option<u64>,
    /// The container's format version (docs/FORMAT.md): 5, or an earlier one it keeps.
    pub format_version: Option<u16>,
    /// The lower file's length (a directory's: its files' together): format 4's reaches about
    /// twice the logical size.
    pub lower_length: u64,
    pub compression: Option<String>,
    /// Current records by how they are stored: a setting name (`gzip-6`), `raw` or `hole`.
    pub records: BTreeMap<String, u64>,
    /// Records kept raw because compressing them saved less than `min_savings`.
    pub raw_low_savings: u64,
    pub problems: Vec<Problem>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// `None`: the header or the file as a whole.
    pub record: Option<u64>,
    pub what: String,
}

impl FileStats {
    pub fn add(&mut self, other: &FileStats) {
        self.logical_size += other.logical_size;
        self.logical_data += other.logical_data;
        self.physical += other.physical;
        self.stored_data += other.stored_data;
        self.lower_length += other.lower_length;
        for (k, v) in &other.records {
            *self.records.entry(k.clone()).or_default() += v;
        }
        self.raw_low_savings += other.raw_low_savings;
    }

    /// Takes away what `add` added (never below zero; record kinds that reach zero go).
    pub fn sub(&mut self, other: &FileStats) {
        self.logical_size = self.logical_size.saturating_sub(other.logical_size);
        self.logical_data = self.logical_data.saturating_sub(other.logical_data);
        self.physical = self.physical.saturating_sub(other.physical);
        self.stored_data = self.stored_data.saturating_sub(other.stored_data);
        self.lower_length = self.lower_length.saturating_sub(other.lower_length);
        for (k, v) in &other.records {
            if let Some(have) = self.records.get_mut(k) {
                *have = have.saturating_sub(*v);
                if *have == 0 {
                    self.records.remove(k);
                }
            }
        }
        self.raw_low_savings = self.raw_low_savings.saturating_sub(other.raw_low_savings);
    }
}

/// Statistics of one lower file; with `verify`, every current record is read, checksummed and
/// decoded, and each failure is listed.
pub fn inspect(file: &File, verify: bool) -> io::Result<FileStats> {
    inspect_owned(file.try_clone()?, verify)
}

/// As `inspect`, on a descriptor of its own (no duplicate made: a walk opens each file anyway).
pub fn inspect_owned(file: File, verify: bool) -> io::Result<FileStats> {
    let meta = file.metadata()?;
    let mut stats = FileStats { physical: meta.blocks() * 512, lower_length: meta.len(), ..FileStats::default() };
    let mut block = vec![0u8; 4096];
    let n = file.read_at(&mut block, 0)?;
    let header = match Header::decode(&block[..n]) {
        Ok(Some(h)) => h,
        Ok(None) => {
            stats.logical_size = meta.len();
            stats.logical_data = meta.len();
            stats.stored_data = meta.len();
            return Ok(stats);
        }
        Err(e) => {
            stats.container = true;
            stats.problems.push(Problem { record: None, what: header_problem(&e) });
            return Ok(stats);
        }
    };
    stats.container = true;
    stats.logical_size = header.size;
    stats.record_size = Some(header.layout.record_size());
    stats.format_version = Some(header.layout.format_version());
    stats.compression = Some(header.setting.to_string());
    let layout = header.layout;
    // Tables and slots are read as the container reads them (not healed: what is on the disk).
    let store = Store::reader(file, layout, header.checksum, None);
    let records = layout.plain_size_to_records(header.size);
    let mut table = Box::default();
    let mut table_group = u64::MAX;
    let mut next = 0;
    while next < records {
        let record = next;
        next += 1;
        let group = layout.record_to_group(record);
        if group != table_group {
            // Groups with nothing on the lower file (never written: a sparse file, or a damaged
            // header claiming a huge size) are holes, counted without walking them.
            let stored = store.next_stored_group(group)?;
            let skip_to = match stored {
                Some(g) if g == group => record,
                Some(g) => (g * GROUP_RECORDS).min(records),
                None => records,
            };
            if skip_to > record {
                *stats.records.entry("hole".into()).or_default() += skip_to - record;
                next = skip_to;
                continue;
            }
            table = store.read_table(group)?;
            table_group = group;
        }
        let pair = table[layout.record_to_entry_index(record)];
        for (slot, s) in pair.iter().enumerate() {
            if *s == SlotState::Damaged {
                stats.problems.push(Problem { record: Some(record), what: format!("slot {slot}: damaged descriptor") });
            }
        }
        let copies = newest_first(&pair);
        let Some(&(slot, d)) = copies.first() else {
            *stats.records.entry("hole".into()).or_default() += 1;
            continue;
        };
        let key = if d.is_hole() {
            "hole".to_string()
        } else if d.codec() == Codec::Off {
            if header.setting != Setting::Fixed(Compression::OFF) {
                stats.raw_low_savings += 1;
            }
            "raw".to_string()
        } else {
            Compression { codec: d.codec(), level: d.level as i32 }.to_string()
        };
        if !d.is_hole() {
            stats.logical_data += d.logical_len as u64;
            stats.stored_data += d.stored_len as u64;
        }
        *stats.records.entry(key).or_default() += 1;
        if verify && !d.is_hole() {
            if let Err(e) = store.decode_copy(record, slot, &d)? {
                let older_ok = copies.get(1).is_some_and(|(s2, d2)| store.decode_copy(record, *s2, d2).is_ok_and(|r| r.is_ok()));
                let what =
                    if older_ok { format!("slot {slot}: {e}; the previous copy is served instead") } else { format!("slot {slot}: {e}") };
                stats.problems.push(Problem { record: Some(record), what });
            }
        }
    }
    Ok(stats)
}

fn header_problem(e: &FormatError) -> String {
    format!("header: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_file_is_reported_as_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plain");
        std::fs::write(&path, b"hello").unwrap();
        let stats = inspect(&File::open(&path).unwrap(), true).unwrap();
        assert!(!stats.container);
        assert_eq!((stats.logical_size, stats.logical_data), (5, 5));
        assert!(stats.problems.is_empty());
    }

    #[test]
    fn a_damaged_header_is_a_problem_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad");
        let mut bytes = vec![0u8; 4096];
        bytes[..8].copy_from_slice(b"DENSEFS\0");
        std::fs::write(&path, &bytes).unwrap();
        let stats = inspect(&File::open(&path).unwrap(), true).unwrap();
        assert!(stats.container);
        assert_eq!(stats.problems.len(), 1);
        assert!(stats.problems[0].what.contains("header"));
    }

    #[test]
    fn a_header_claiming_an_absurd_size_is_walked_only_as_far_as_the_file_goes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge");
        let header = Header {
            layout: crate::format::Layout::from_shift(12).unwrap(),
            checksum: crate::checksum::ChecksumKind::Crc32c,
            setting: crate::codec::Setting::LZ4,
            size: 1 << 60,
            sequence: 1,
            durable_below: 0,
            heal_from: 0,
        };
        let mut bytes = vec![0u8; 4096];
        bytes[64..128].copy_from_slice(&header.encode());
        std::fs::write(&path, &bytes).unwrap();
        let start = std::time::Instant::now();
        let stats = inspect(&File::open(&path).unwrap(), true).unwrap();
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(stats.records["hole"], (1u64 << 60) / 4096);
    }
}

//! The container below FUSE against a model: random operations (write, read, truncate,
//! zero_range, flush, sync, reopen) and simulated crashes on a tempfile lower with the CPU
//! engine, checked against a plain `Vec<u8>`.
//!
//! A crash copies the lower file while nothing writes it (both container locks held: a SIGKILL
//! at that instant), forgets the container, and reopens the copy. Every record of the reopened
//! file must then read as it was at the last flush or after some operation since (never
//! anything else), and its size must be one of those versions' sizes. The model continues from
//! what the reopened file holds.
//!
//! A dropped container (no flush, its queued landings finish) is checked the same way.
//!
//! Power cuts (any write since the last sync undone, block by block) are played exhaustively on
//! small cases at the end, from what `lower::power_cut` recorded.
//!
//! A failing seed is printed with its operations; add it to `REGRESSIONS` so it always runs.
//! `DENSEFS_MODEL_SEEDS=n` runs n random seeds instead of the default few.

use super::{Container, CreateSettings, Writeback};
use crate::checksum::ChecksumKind;
use crate::codec::Setting;
use crate::core::memory::Memory;
use crate::engine::{Engine, MinSavings, Offload, RecordPolicy};
use crate::format::Layout;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Seeds that once failed (or cover a case worth keeping), by name, with whether they ran with
/// user fsyncs (`run_seed`): they always run.
const REGRESSIONS: &[(&str, u64, bool)] = &[
    // A header announcing the run recorded the grown size while the zeroed tail record (a
    // truncate, then a write far past the end) was still dirty: stale bytes after a crash.
    // Depends on landing order: failed about one run in five before the fix.
    ("the announcement keeps the last size", 117665080017039, false),
    ("small records, lz4, crashes after truncates", 1, false),
    ("16 KiB records, zstd, inline first record", 2, false),
    ("raw records, far writes across groups", 3, false),
    ("many reopens", 7, false),
];

const OPS_PER_SEED: usize = 150;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Harness {
    dir: tempfile::TempDir,
    engine: Arc<Engine>,
    memory: Arc<Memory>,
    policy: RecordPolicy,
    path: PathBuf,
    crashes: usize,
    container: Arc<Container>,
}

/// A copy of a lower file as a crash leaves it: its bytes and its birth header (an xattr,
/// which `std::fs::copy` leaves behind).
fn copy_lower(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap();
    let name = std::ffi::CString::new(crate::format::BIRTH_HEADER_XATTR).unwrap();
    let mut value = [0u8; 256];
    let from = File::open(from).unwrap();
    if let Ok(n) = crate::core::lower::getxattr_on(crate::core::lower::XattrOn::Fd(std::os::fd::AsFd::as_fd(&from)), &name, &mut value) {
        crate::core::lower::fsetxattr(&open_rw(to), &name, &value[..n], 0).unwrap();
    }
}

fn open_rw(path: &Path) -> File {
    OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap()
}

impl Harness {
    fn new(settings: CreateSettings) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(Engine::new(2));
        let memory = Arc::new(Memory::new(64 << 20));
        let policy = RecordPolicy { min_savings: MinSavings::ZFS, offload: Offload::Cpu };
        let path = dir.path().join("f0");
        let container =
            Arc::new(Container::create(open_rw(&path), None, settings, policy, engine.clone(), memory.clone(), Some("f0".into())).unwrap());
        Harness { dir, engine, memory, policy, path, crashes: 0, container }
    }

    fn reopen(&mut self, path: PathBuf) {
        self.container = Arc::new(self.open_at(&path));
        self.path = path;
    }

    /// A container on the lower file at `path`, as a new run opens it for writing.
    fn open_at(&self, path: &Path) -> Container {
        let file = open_rw(path);
        match Container::probe(&file).unwrap() {
            Some(header) => {
                Container::open(file, header, self.policy, self.engine.clone(), self.memory.clone(), Some("f".into()), true).unwrap()
            }
            None => {
                // An empty lower file is an empty file: it becomes a container on its first write.
                assert_eq!(file.metadata().unwrap().len(), 0, "a container lost its header");
                let settings = CreateSettings {
                    compression: self.container.compression(),
                    layout: self.container.layout(),
                    checksum: ChecksumKind::Crc32c,
                };
                Container::create(file, None, settings, self.policy, self.engine.clone(), self.memory.clone(), Some("f".into())).unwrap()
            }
        }
    }

    /// Copies the lower file while neither a landing nor a header write can run: a process
    /// killed at this instant. Landings still queued go on writing the old file, unseen.
    fn crash(&mut self) {
        self.crashes += 1;
        let copy = self.dir.path().join(format!("f{}", self.crashes));
        {
            let _io = self.container.slot_io.write();
            let _st = self.container.state.lock();
            copy_lower(&self.path, &copy);
        }
        self.reopen(copy);
    }

    /// Drops the container without flushing (a process that exits without closing): what is in
    /// flight still lands, what is dirty is lost. Reopens the same lower file once the old
    /// container is gone.
    fn drop_unflushed(&mut self) {
        let old = Arc::downgrade(&self.container);
        // Stand in with an empty container on a scratch file (creating one writes nothing).
        let (path, scratch) = (self.path.clone(), self.dir.path().join("scratch"));
        self.reopen(scratch);
        self.path = path;
        let start = std::time::Instant::now();
        while old.upgrade().is_some() {
            assert!(start.elapsed() < std::time::Duration::from_secs(30), "queued landings never finished");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.reopen(self.path.clone());
    }

    fn read_all(&self) -> Vec<u8> {
        self.container.read(0, self.container.size() as usize).unwrap().to_vec()
    }
}

fn pattern(rng: &mut Rng, len: usize) -> Vec<u8> {
    match rng.below(4) {
        0 => vec![0; len],
        1 => {
            let b = rng.next() as u8;
            vec![b; len]
        }
        2 => b"ACGT densefs text ".iter().cycle().skip(rng.below(17) as usize).take(len).copied().collect(),
        _ => (0..len).map(|_| rng.next() as u8).collect(),
    }
}

/// The bytes a version holds in `range` (zeros past its end).
fn bytes_of(version: &[u8], start: usize, end: usize) -> Vec<u8> {
    (start..end).map(|i| version.get(i).copied().unwrap_or(0)).collect()
}

/// `user_fsyncs`: half the syncs are a user's fsync instead (records land uncompressed or with
/// lz4, not with the file's codec) followed by a writeback tick's settle, which re-encodes them
/// later.
fn run_seed(name: &str, seed: u64, user_fsyncs: bool) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let record_size = [4096u64, 16384][rng.below(2) as usize];
    let compression = ["lz4", "zstd-3", "off", "gzip-1"][rng.below(4) as usize];
    let settings = CreateSettings {
        compression: Setting::parse(compression).unwrap(),
        layout: Layout::new(record_size).unwrap(),
        checksum: ChecksumKind::Crc32c,
    };
    let rs = record_size as usize;
    // Past group 0 (32 records) and now and then far beyond.
    let span = 40 * rs;
    let mut h = Harness::new(settings);
    let mut model: Vec<u8> = Vec::new();
    // The versions since the last flush: what a crash may leave, record by record.
    let mut versions: Vec<Vec<u8>> = vec![Vec::new()];
    let mut log: Vec<String> = vec![format!("{record_size} B records, {compression}, user fsyncs: {user_fsyncs}")];
    let fail = |log: &[String], what: String| -> ! {
        panic!("model seed {seed} ({name}) failed: {what}\noperations:\n  {}", log.join("\n  "));
    };
    for _ in 0..OPS_PER_SEED {
        let op = rng.below(100);
        match op {
            0..=39 => {
                let far = rng.below(20) == 0;
                let off = if far { 100 * rs + rng.below(rs as u64) as usize } else { rng.below(span as u64) as usize };
                let len = 1 + rng.below(3 * record_size) as usize;
                let data = pattern(&mut rng, len);
                log.push(format!("write {off} +{len}"));
                if let Err(e) = h.container.write(off as u64, &data) {
                    fail(&log, format!("write: {e}"));
                }
                if model.len() < off + len {
                    model.resize(off + len, 0);
                }
                model[off..off + len].copy_from_slice(&data);
                versions.push(model.clone());
            }
            40..=59 => {
                let off = rng.below(model.len() as u64 + 10) as usize;
                let len = rng.below(3 * record_size) as usize;
                log.push(format!("read {off} +{len}"));
                let got = h.container.read(off as u64, len).unwrap_or_else(|e| fail(&log, format!("read: {e}"))).to_vec();
                let want = if off >= model.len() { Vec::new() } else { model[off..(off + len).min(model.len())].to_vec() };
                if got != want {
                    fail(&log, format!("read {off} +{len} differs from the model"));
                }
            }
            60..=67 => {
                let size = rng.below(span as u64 + rs as u64) as usize;
                log.push(format!("truncate {size}"));
                h.container.set_size(size as u64).unwrap_or_else(|e| fail(&log, format!("truncate: {e}")));
                model.resize(size, 0);
                versions.push(model.clone());
            }
            68..=75 => {
                let off = rng.below(model.len() as u64 + 10) as usize;
                let len = rng.below(3 * record_size) as usize;
                log.push(format!("zero_range {off} +{len}"));
                h.container.zero_range(off as u64, len as u64).unwrap_or_else(|e| fail(&log, format!("zero_range: {e}")));
                let end = (off + len).min(model.len());
                if off < end {
                    model[off..end].fill(0);
                }
                versions.push(model.clone());
            }
            76..=82 => {
                log.push("flush".into());
                h.container.flush().unwrap_or_else(|e| fail(&log, format!("flush: {e}")));
                versions = vec![model.clone()];
            }
            83..=88 => {
                let datasync = rng.below(2) == 0;
                if user_fsyncs && rng.below(2) == 0 {
                    log.push("fsync, tick".into());
                    h.container.fsync(datasync).unwrap_or_else(|e| fail(&log, format!("fsync: {e}")));
                    h.container.settle_interim(false).unwrap_or_else(|e| fail(&log, format!("settle: {e}")));
                } else {
                    log.push("sync".into());
                    h.container.sync(datasync).unwrap_or_else(|e| fail(&log, format!("sync: {e}")));
                }
                versions = vec![model.clone()];
            }
            89..=93 => {
                log.push("reopen".into());
                h.container.flush().unwrap_or_else(|e| fail(&log, format!("flush before reopen: {e}")));
                let path = h.path.clone();
                h.reopen(path);
                versions = vec![model.clone()];
            }
            _ => {
                if rng.below(2) == 0 {
                    log.push("crash".into());
                    h.crash();
                } else {
                    log.push("drop without flush".into());
                    h.drop_unflushed();
                }
                let got = h.read_all();
                // A header written mid-operation (a landing announcing the run) may record a size
                // between two versions': never more than the largest.
                if !versions.iter().any(|v| v.len() >= got.len()) {
                    fail(&log, format!("after the crash the size is {}, larger than any written since the last flush", got.len()));
                }
                for start in (0..got.len()).step_by(rs) {
                    let end = (start + rs).min(got.len());
                    if !versions.iter().any(|v| bytes_of(v, start, end) == got[start..end]) {
                        fail(&log, format!("after the crash record {} holds bytes no version had", start / rs));
                    }
                }
                model = got;
                versions = vec![model.clone()];
            }
        }
    }
    log.push("final settle, flush, reopen, compare".into());
    h.container.settle_interim(true).unwrap_or_else(|e| fail(&log, format!("final settle: {e}")));
    h.container.flush().unwrap_or_else(|e| fail(&log, format!("final flush: {e}")));
    let path = h.path.clone();
    h.reopen(path);
    if h.read_all() != model {
        fail(&log, "after the final reopen the file differs from the model".into());
    }
    let report = crate::inspect::inspect(&File::open(&h.path).unwrap(), true).unwrap();
    if !report.problems.is_empty() {
        fail(&log, format!("scrub found problems: {:?}", report.problems));
    }
}

#[test]
fn model_regressions() {
    for &(name, seed, user_fsyncs) in REGRESSIONS {
        run_seed(name, seed, user_fsyncs);
    }
}

#[test]
fn model_random_seeds() {
    let count: u64 = std::env::var("DENSEFS_MODEL_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(6);
    let base = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() << 16;
    for i in 0..count {
        // Shown with the test's output if it fails, also where a panic skips run_seed's report.
        println!("model seed {} (user fsyncs: {})", base + i, i % 2 == 1);
        run_seed("random", base + i, i % 2 == 1);
    }
}

// ---- power cuts ----------------------------------------------------------------------------

/// Every power cut the lower file can take now (as tests/crash.rs plays them on real mounts):
/// each subset of the blocks written since its last sync goes back to what it held at that sync,
/// the length staying. Each result is reopened as a new run would, and every record must read as
/// zeros or as `written` (the one version of each record since the sync) or fail with EIO —
/// never as other bytes, and the file must never lose its header and pass for a plain file.
///
/// `durable`: every record was durable before the writes since the sync (it was only moved or
/// re-encoded): it must read as `written`, exactly.
fn every_power_cut(h: &Harness, written: &dyn Fn(u64) -> Vec<u8>, durable: bool) {
    let unsynced: Vec<(u64, Vec<u8>)> = crate::core::lower::power_cut::unsynced(h.container.lower_file()).into_iter().collect();
    assert!(!unsynced.is_empty() && unsynced.len() <= 10, "{} blocks written since the sync", unsynced.len());
    let rs = h.container.layout().record_size();
    for reverted in 0..1u32 << unsynced.len() {
        let what = format!(
            "power cut reverting blocks {:?}",
            unsynced.iter().enumerate().filter(|(i, _)| reverted & 1 << i != 0).map(|(_, b)| b.0 / 4096).collect::<Vec<_>>()
        );
        let copy = h.dir.path().join(format!("cut{reverted}"));
        copy_lower(&h.path, &copy);
        {
            let file = open_rw(&copy);
            let len = file.metadata().unwrap().len();
            for (i, (off, old)) in unsynced.iter().enumerate() {
                if reverted & 1 << i != 0 && *off < len {
                    crate::core::lower::pwrite_all(&file, &old[..old.len().min((len - off) as usize)], *off).unwrap();
                }
            }
        }
        let container = Arc::new(
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.open_at(&copy)))
                .unwrap_or_else(|_| panic!("{what}: the file does not reopen as a container")),
        );
        for record in 0..h.container.layout().plain_size_to_records(container.size()) {
            match container.read(record * rs, rs as usize).map(|got| got.to_vec()) {
                Ok(got) if durable => assert!(got == written(record), "{what}: record {record} does not read as it was"),
                Err(e) if durable => panic!("{what}: record {record}: {e}"),
                Ok(got) => {
                    let want = written(record);
                    assert!(
                        got.iter().all(|&b| b == 0) || got == want[..got.len().min(want.len())],
                        "{what}: record {record} reads as bytes never written"
                    );
                }
                Err(e) => assert_eq!(e.errno, libc::EIO, "{what}: record {record}: {e}"),
            }
        }
        // And it takes new data (a file whose first header was undid starts over).
        let fresh = noise(0, 99);
        container.write(0, &fresh).unwrap();
        container.flush().unwrap();
        drop(container);
        let again = h.open_at(&copy);
        assert_eq!(again.read(0, fresh.len()).unwrap().to_vec(), fresh, "{what}: new data after the cut");
        drop(again);
        std::fs::remove_file(&copy).unwrap();
    }
}

fn power_cut_harness() -> Harness {
    power_cut_harness_of(4096)
}

fn power_cut_harness_of(record_size: u64) -> Harness {
    let settings = CreateSettings { compression: Setting::LZ4, layout: Layout::new(record_size).unwrap(), checksum: ChecksumKind::Crc32c };
    let h = Harness::new(settings);
    crate::core::lower::power_cut::watch(h.container.lower_file());
    h
}

/// 16 KiB of random bases and newlines: lz4 stores it in 3 blocks, gzip-6 in fewer.
fn bases(seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    (0..16 * 1024).map(|_| b"ACGT\n"[rng.below(5) as usize]).collect()
}

/// Incompressible contents of one 4 KiB record (stored raw: one block of its own).
fn noise(record: u64, version: u64) -> Vec<u8> {
    let mut rng = Rng((record << 32 | version).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    (0..4096).map(|_| rng.next() as u8).collect()
}

/// A new file's first records landed, no sync yet: a power cut could keep them and undo block 0
/// (header and table), leaving a lower file that starts with a zeroed block: a plain file whose
/// "contents" are the container's slots. Failed the power-cut test of tests/crash.rs about one run
/// in eight (60 rounds) before a new container's first header was made durable before anything
/// else is written.
#[test]
fn a_power_cut_never_turns_a_new_container_into_a_plain_file() {
    let h = power_cut_harness();
    for record in [0, 1, 40] {
        h.container.write(record * 4096, &noise(record, 1)).unwrap();
    }
    h.container.flush().unwrap();
    // No sync was spent on the new file: block 0 is as it was at the last sync, empty (the birth
    // header stands in for it until then).
    let unsynced = crate::core::lower::power_cut::unsynced(h.container.lower_file());
    assert!(unsynced[&0].iter().all(|&b| b == 0), "the new file's first header was synced on its own");
    every_power_cut(&h, &|record| noise(record, 1), false);
}

/// A new file of one record writes its block 0 once (header, descriptor, size; the record too
/// when it fits inline), not in four small writes, each a round trip on a network lower; and
/// that one write is as safe against a power cut.
#[test]
fn a_new_file_of_one_record_writes_its_block_0_once() {
    let small: Vec<u8> = b"a small file, compressible. ".repeat(40);
    for (contents, writes) in [(small, 1), (noise(0, 1), 2)] {
        let h = power_cut_harness();
        h.container.write(0, &contents).unwrap();
        h.container.flush().unwrap();
        let lower = h.container.lower_file();
        assert_eq!(crate::core::lower::power_cut::writes(lower), writes, "writes to the lower file for {} bytes", contents.len());
        assert_eq!(h.open_at(&h.path).read(0, 4096).unwrap().to_vec(), contents);
        // A read of nothing inside the file (a random model seed found it panicking).
        assert!(h.container.read(7, 0).unwrap().to_vec().is_empty());
        every_power_cut(&h, &|_| contents.clone(), false);
    }
}

/// The same for a file truncated to nothing (an empty lower file again) and written anew.
#[test]
fn a_power_cut_never_turns_an_emptied_container_into_a_plain_file() {
    let h = power_cut_harness();
    for record in 0..3 {
        h.container.write(record * 4096, &noise(record, 1)).unwrap();
    }
    h.container.sync(true).unwrap();
    h.container.set_size(0).unwrap();
    h.container.sync(true).unwrap();
    assert_eq!(h.container.lower_file().metadata().unwrap().len(), 0, "an emptied file is an empty lower file");
    for record in [1, 2] {
        h.container.write(record * 4096, &noise(record, 2)).unwrap();
    }
    h.container.flush().unwrap();
    every_power_cut(&h, &|record| noise(record, 2), false);
}

/// A new file given a size and no data: only its header is written.
#[test]
fn a_power_cut_never_turns_a_sized_new_container_into_a_plain_file() {
    let h = power_cut_harness();
    h.container.set_size(1 << 20).unwrap();
    h.container.flush().unwrap();
    every_power_cut(&h, &|_| vec![0; 4096], false);
}

/// A truncate inside a record keeps the record's head in memory (trimmed, dirty) while its old
/// copy, holding the bytes cut off, stays current on the lower file until the trimmed one lands.
/// A crash in between must not show those bytes: the crash test found them back ("record came
/// back after a truncate removed it") on files with records larger than its writes.
#[test]
fn a_crash_after_a_truncate_inside_a_record_never_brings_back_what_it_cut() {
    let rs = 16384;
    let settings = CreateSettings { compression: Setting::LZ4, layout: Layout::new(rs as u64).unwrap(), checksum: ChecksumKind::Crc32c };
    let mut h = Harness::new(settings);
    let data: Vec<u8> = (0..3 * rs).map(|i| (i % 251 + 1) as u8).collect();
    h.container.write(0, &data).unwrap();
    h.container.flush().unwrap();
    let cut = rs + rs / 2;
    h.container.set_size(cut as u64).unwrap();
    h.crash();
    let got = h.read_all();
    let kept = cut.min(got.len());
    assert_eq!(got[..kept], data[..kept], "what the truncate kept");
    assert!(got[kept..].iter().all(|&b| b == 0), "the crash brought back bytes the truncate cut (the file reads as {} bytes)", got.len());
    // Nor does growing the file again, in this run or the next.
    h.container.set_size(3 * rs as u64).unwrap();
    let grown = h.read_all();
    assert!(grown[cut..].iter().all(|&b| b == 0), "growing the file brought back bytes the truncate cut");
    h.container.flush().unwrap();
    let path = h.path.clone();
    h.reopen(path);
    assert_eq!(h.read_all(), grown);
}

/// A user's utimensat on an open file while the writeback tick runs: the tick must not put the
/// file's old mtime back between the lower's utimensat and the stat that reads it back, or the
/// time the user set is lost. (Over the Gluster client, rsync found 3 of 11,637 untarred files
/// with their write time instead of the archive's.)
#[test]
fn the_writeback_tick_never_undoes_a_users_utimensat() {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    let settings = CreateSettings { compression: Setting::LZ4, layout: Layout::new(4096).unwrap(), checksum: ChecksumKind::Crc32c };
    let h = Harness::new(settings);
    let stop = Arc::new(AtomicBool::new(false));
    let ticker = {
        let (container, stop) = (h.container.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                container.writeback(Writeback::Aged).unwrap();
            }
        })
    };
    let lower = h.container.lower_file().clone();
    for round in 0..40 {
        h.container.write(0, &noise(0, round)).unwrap();
        let want = libc::timespec { tv_sec: 1_000_000_000 + round as i64, tv_nsec: 0 };
        let st = h
            .container
            .set_times(true, || {
                crate::core::lower::futimens(&lower, &[libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT }, want])?;
                std::thread::sleep(std::time::Duration::from_millis(2)); // a network lower's round trip
                Ok(crate::core::lower::stat_fd(lower.as_raw_fd())?)
            })
            .unwrap();
        assert_eq!((st.st_mtime, st.st_mtime_nsec), (want.tv_sec, want.tv_nsec), "round {round}: the mtime read back");
        assert_eq!(h.container.times().0.tv_sec, want.tv_sec, "round {round}: the file's mtime");
    }
    stop.store(true, Ordering::Relaxed);
    ticker.join().unwrap();
    let now = crate::core::lower::stat_fd(lower.as_raw_fd()).unwrap();
    assert_eq!(now.st_mtime, 1_000_000_039, "the lower's mtime after the tick");
}

/// The background pass's end moves the last copies down into the space the old ones left, as
/// they are stored (`move_copy`); their old places are freed only by the sync after. A power
/// cut before that sync, undoing any of the blocks the moves wrote, leaves every record reading
/// exactly as it did: each was durable before, at its old place or its new.
#[test]
fn a_power_cut_while_a_pass_moves_copies_down_keeps_every_record() {
    use super::densify::{Densified, Densify};
    let h = power_cut_harness_of(16 * 1024);
    let text = |record: u64| bases(record * 7919 + 1);
    for record in 0..3 {
        h.container.write(record * 16 * 1024, &text(record)).unwrap();
    }
    h.container.sync(true).unwrap();
    let densify = Densify { target: crate::codec::Compression::parse("gzip-6").unwrap(), encoded: Default::default() };
    for record in 0..3 {
        assert!(matches!(h.container.densify_record(record, &densify).unwrap(), Densified::Sent { .. }));
    }
    // The lz4 copies are freed; the gzip-6 ones lie past where they were.
    h.container.sync(true).unwrap();
    let lower_len = |h: &Harness| h.container.lower_file().metadata().unwrap().len();
    let before = lower_len(&h);
    crate::core::lower::power_cut::watch(h.container.lower_file());
    for record in (0..3).rev() {
        assert!(h.container.move_copy(record).unwrap(), "record {record} moved");
    }
    every_power_cut(&h, &text, true);
    h.container.sync(true).unwrap();
    assert!(lower_len(&h) < before, "the moves shortened the lower file: {} then {before}", lower_len(&h));
    for record in 0..3 {
        assert_eq!(h.container.read(record * 16 * 1024, 16 * 1024).unwrap().to_vec(), text(record));
    }
}

/// A sync frees the old copies of the records rewritten since; copies lying side by side are
/// punched in one call (on a lower mounted with `discard` each call waits for the device).
#[test]
fn old_copies_side_by_side_are_punched_together() {
    let h = power_cut_harness_of(16 * 1024);
    let text = |record: u64, version: u64| bases((record * 7919 + version) | 1);
    for version in 0..2 {
        for record in 0..64 {
            h.container.write(record * 16 * 1024, &text(record, version)).unwrap();
        }
        h.container.sync(true).unwrap();
    }
    // 64 old copies of 3 blocks each, side by side but for the table blocks between them (a
    // copy never overlaps one): 7 runs here, a punch each (a punch per copy before).
    let punches = crate::core::lower::power_cut::punches(h.container.lower_file());
    assert!((1..64 / 4).contains(&punches), "{punches} punches freed 64 old copies");
    for record in 0..64 {
        assert_eq!(h.container.read(record * 16 * 1024, 16 * 1024).unwrap().to_vec(), text(record, 1));
    }
}

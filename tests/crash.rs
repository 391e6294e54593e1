//! SIGKILL crash test: kill the daemon during a mixed workload (writes, overwrites, truncates,
//! renames, fsyncs), remount, and check that every fsync'd record is intact, no record reads as
//! anything but one of its written versions (or zeros where allowed), and nothing a completed
//! truncate removed comes back.

mod common;

use common::{Dirs, Mount};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const RECORD: usize = 16 * 1024;
const FILES: u32 = 3;
const RECORDS: u32 = 24;
const MAGIC: u32 = 0xD15E_A5E5;
/// The largest record size the tests mount with (zstd-1's default).
const LARGEST_RECORD: u64 = 128 * 1024;

/// A full record whose first 16 bytes say which (file, record, version) it is.
fn version_bytes(file: u32, record: u32, version: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD);
    for v in [MAGIC, file, record, version] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let mut x = ((file as u64) << 40) ^ ((record as u64) << 20) ^ version as u64 ^ 0x9E37_79B9_7F4A_7C15;
    while out.len() < RECORD {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Compressible: few distinct bytes, long runs.
        let byte = b"ACGT\n"[(x % 5) as usize];
        out.extend(std::iter::repeat_n(byte, 1 + (x >> 60) as usize));
    }
    out.truncate(RECORD);
    out
}

#[derive(Default)]
struct Journal {
    /// Highest version written per (file, record) when that file was last fsync'd.
    synced: HashMap<(u32, u32), u32>,
    /// Every version handed to write() per (file, record).
    written: HashMap<(u32, u32), u32>,
    /// The last version whose write() returned success: a write the crash interrupted may or
    /// may not have happened, so a later fsync vouches only for these.
    acked: HashMap<(u32, u32), u32>,
    /// Versions below this were removed by a completed truncate and must never come back.
    floor: HashMap<(u32, u32), u32>,
    /// The same, for truncates a later fsync made durable (what survives a power cut).
    durable_floor: HashMap<(u32, u32), u32>,
    /// Power cuts: a truncate not made durable may have been undone by the cut.
    power_cut: bool,
    /// A truncate (file, first record cut) whose answer the crash may have swallowed.
    truncating: Option<(u32, u32)>,
    /// Each file's current name, and a rename (file, other name) the crash may have swallowed.
    names: HashMap<u32, String>,
    renaming: Option<(u32, String)>,
    /// The last operations per file (round, what), for failure messages.
    history: HashMap<u32, std::collections::VecDeque<String>>,
    /// The round the writer is in (for `history`).
    round: usize,
}

impl Journal {
    fn name(&self, file: u32) -> String {
        self.names.get(&file).cloned().unwrap_or(format!("f{file}"))
    }

    /// Notes an operation on `file` for failure messages (the last few per file).
    fn note(&mut self, file: u32, what: String) {
        let round = self.round;
        let h = self.history.entry(file).or_default();
        if h.len() >= 60 {
            h.pop_front();
        }
        h.push_back(format!("r{round} {what}"));
    }

    /// The recent operations on `file`, one a line.
    fn history_of(&self, file: u32) -> String {
        self.history.get(&file).map(|h| h.iter().map(|l| format!("  {l}\n")).collect()).unwrap_or_default()
    }

    /// A completed truncate of `file` to record `cut`: what it removed never comes back, and no
    /// fsync vouches for it any more.
    fn cut(&mut self, file: u32, cut: u32) {
        for r in cut..RECORDS {
            let next = self.written.get(&(file, r)).copied().unwrap_or(0) + 1;
            self.floor.insert((file, r), next);
            self.synced.remove(&(file, r));
        }
    }

    /// A rename or truncate whose answer the crash swallowed may or may not have happened, and the
    /// check allowed both. Settle it before the next round, through the new mount: otherwise the
    /// next writer creates a new, empty file under the name a rename freed, or the journal goes
    /// on vouching for records a truncate removed, once a later truncate clears `truncating`.
    fn settle(&mut self, m: &Mount) {
        let mnt = m.mnt.as_path();
        if let Some((file, to)) = self.renaming.take() {
            if !mnt.join(self.name(file)).exists() && mnt.join(&to).exists() {
                self.note(file, format!("settle rename: it happened ({to})"));
                self.names.insert(file, to);
            }
        }
        if let Some((file, mut cut)) = self.truncating.take() {
            let Ok(f) = OpenOptions::new().write(true).open(mnt.join(self.name(file))) else { return };
            let len = f.metadata().unwrap().len();
            let end = (cut as usize * RECORD) as u64;
            if len > end {
                if let Err(e) = f.set_len(end) {
                    // A truncate inside a densefs record reads that record, and after a power cut
                    // it may be unreadable: a copy torn before any fsync vouched for it (the check
                    // allowed that). Cut where that record starts instead, which reads nothing;
                    // what goes beyond the cut was never vouched for either.
                    let start = end / LARGEST_RECORD * LARGEST_RECORD;
                    let diagnosis =
                        || format!("{}\n history:\n{}{}", lower_dump(&m.lower.join(self.name(file))), self.history_of(file), m.log_text());
                    assert_eq!(e.raw_os_error(), Some(libc::EIO), "settling f{file}'s truncate to record {cut}: {e}\n{}", diagnosis());
                    if let Err(e) = f.set_len(start) {
                        panic!("settling f{file}'s truncate to {start} bytes: {e}\n{}", diagnosis());
                    }
                    self.note(file, format!("settle truncate to record {cut}: unreadable there, cut at {start} bytes"));
                    cut = (start / RECORD as u64) as u32;
                }
            }
            self.note(file, format!("settle truncate to record {cut}: size was {len}"));
            self.cut(file, cut);
        }
    }
}

fn other_name(file: u32, name: &str) -> String {
    if name.ends_with(".moved") {
        format!("f{file}")
    } else {
        format!("f{file}.moved")
    }
}

/// The mount's root directory, opened while it is mounted: the writer reaches its files through
/// it (`/proc/self/fd/N/name`), never by the mount point's path. Once the kill has detached the
/// mount, that path is the empty directory below it, where a writer starting late (or renaming)
/// would create and fsync plain files the next mount hides, and the journal would vouch for them.
fn mount_root(mnt: &std::path::Path) -> File {
    File::open(mnt).unwrap()
}

fn writer(root: File, seed: u64, journal: Arc<Mutex<Journal>>, stop: Arc<AtomicBool>) {
    use std::os::fd::AsRawFd;
    let mnt = std::path::PathBuf::from(format!("/proc/self/fd/{}", root.as_raw_fd()));
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut files: Vec<File> = Vec::new();
    for i in 0..FILES {
        let name = journal.lock().unwrap().name(i);
        match OpenOptions::new().read(true).write(true).create(true).truncate(false).open(mnt.join(name)) {
            Ok(f) => files.push(f),
            Err(_) => return, // killed before the writer started
        }
    }
    // Versions keep counting up across rounds, so an old copy is never mistaken for a new one.
    let mut next_version: HashMap<(u32, u32), u32> = journal.lock().unwrap().written.clone();
    // Writes acknowledged before the crash but never synced may be gone: an fsync in this run
    // vouches only for what this run wrote.
    {
        let mut j = journal.lock().unwrap();
        j.acked.clear();
        if j.power_cut {
            j.floor = j.durable_floor.clone();
        }
    }
    while !stop.load(Ordering::Relaxed) {
        let file = rng.gen_range(0..FILES);
        let record = rng.gen_range(0..RECORDS);
        let v = next_version.entry((file, record)).or_insert(0);
        *v += 1;
        let version = *v;
        {
            let mut j = journal.lock().unwrap();
            j.written.insert((file, record), version);
            j.note(file, format!("write record {record} v{version}"));
        }
        if files[file as usize].write_all_at(&version_bytes(file, record, version), (record as usize * RECORD) as u64).is_err() {
            journal.lock().unwrap().note(file, format!("write record {record} v{version} failed"));
            return; // the daemon is gone
        }
        journal.lock().unwrap().acked.insert((file, record), version);
        if rng.gen_ratio(1, 25) {
            // Truncate to a record boundary: records from `cut` on are gone.
            let cut = rng.gen_range(0..RECORDS);
            {
                let mut j = journal.lock().unwrap();
                j.truncating = Some((file, cut));
                j.note(file, format!("truncate to record {cut}"));
            }
            if files[file as usize].set_len((cut as usize * RECORD) as u64).is_err() {
                journal.lock().unwrap().note(file, format!("truncate to record {cut} failed"));
                return;
            }
            let mut j = journal.lock().unwrap();
            j.truncating = None;
            j.note(file, format!("truncate to record {cut} done"));
            j.cut(file, cut);
        }
        if rng.gen_ratio(1, 30) {
            let (from, to) = {
                let mut j = journal.lock().unwrap();
                let from = j.name(file);
                let to = other_name(file, &from);
                j.renaming = Some((file, to.clone()));
                (from, to)
            };
            journal.lock().unwrap().note(file, format!("rename {from} -> {to}"));
            if std::fs::rename(mnt.join(&from), mnt.join(&to)).is_err() {
                journal.lock().unwrap().note(file, format!("rename {from} -> {to} failed"));
                return;
            }
            let mut j = journal.lock().unwrap();
            j.note(file, format!("rename {from} -> {to} done"));
            j.renaming = None;
            j.names.insert(file, to);
        }
        if rng.gen_ratio(1, 12) {
            let before: Vec<((u32, u32), u32)> = {
                let j = journal.lock().unwrap();
                // Records truncated away since their last write are zeros now, not that version.
                j.acked.iter().filter(|(k, v)| k.0 == file && **v >= j.floor.get(k).copied().unwrap_or(0)).map(|(k, v)| (*k, *v)).collect()
            };
            journal.lock().unwrap().note(file, "fsync".into());
            let ok = if rng.gen_bool(0.5) { files[file as usize].sync_all() } else { files[file as usize].sync_data() };
            if ok.is_err() {
                journal.lock().unwrap().note(file, "fsync failed".into());
                return;
            }
            let mut j = journal.lock().unwrap();
            j.note(file, "fsync done".into());
            for (k, v) in before {
                j.synced.insert(k, v);
            }
            let floors: Vec<((u32, u32), u32)> = j.floor.iter().filter(|(k, _)| k.0 == file).map(|(k, v)| (*k, *v)).collect();
            j.durable_floor.extend(floors);
        }
    }
}

/// What a power cut did to one lower file: (name, block offsets reverted, kept).
type CutReport = (String, Vec<u64>, Vec<u64>);

/// The last power cut, for the failure message.
static LAST_CUT: Mutex<Vec<CutReport>> = Mutex::new(Vec::new());

/// Records written since their last fsync that a power cut left unreadable (EIO, not garbage).
static TORN_UNSYNCED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A lower container file as the failure messages show it: its length, both header copies, and
/// every non-empty descriptor of group 0 (which holds the test's records at any record size).
fn lower_dump(lower: &std::path::Path) -> String {
    let raw = std::fs::read(lower).unwrap_or_default();
    let u32_at = |o: usize| u32::from_le_bytes(raw[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(raw[o..o + 8].try_into().unwrap());
    let mut out = format!(" lower {}: {} bytes\n", lower.display(), raw.len());
    if raw.len() < 4096 {
        return out;
    }
    for at in [0, 64] {
        if &raw[at..at + 8] == b"DENSEFS\0" {
            out += &format!(
                "  header @{at}: record shift {} size {} seq {} durable_below {} heal_from {}\n",
                raw[at + 10],
                u64_at(at + 16),
                u64_at(at + 24),
                u64_at(at + 32),
                u64_at(at + 40)
            );
        }
    }
    for entry in 0..32 {
        for slot in 0..2 {
            let o = 2048 + entry * 64 + slot * 32;
            if raw[o..o + 32].iter().all(|&b| b == 0) {
                continue;
            }
            let epoch = u64::from(u32_at(o + 24)) | (u64::from(raw[o + 15]) << 32);
            out += &format!(
                "  record {entry} slot {slot}: gen {} stored {} logical {} codec {} flags {} epoch {epoch} sum {:x}\n",
                u32_at(o),
                u32_at(o + 4),
                u32_at(o + 8),
                raw[o + 12],
                raw[o + 14],
                u64_at(o + 16)
            );
        }
    }
    out
}

/// `power_cut`: unsynced writes may have been undone, so only truncates made durable by an
/// fsync are sure to have removed what they cut.
fn check_after_crash(m: &Mount, journal: &Journal, round: usize, power_cut: bool) -> usize {
    let mut verified = 0;
    for file in 0..FILES {
        let name = journal.name(file);
        let mut opened = File::open(m.path(&name));
        if opened.is_err() && journal.renaming.as_ref().is_some_and(|(f, _)| *f == file) {
            opened = File::open(m.path(&other_name(file, &name)));
        }
        let Ok(f) = opened else {
            assert!(!journal.synced.keys().any(|(fi, _)| *fi == file), "round {round}: fsync'd file f{file} missing");
            continue;
        };
        let size = f.metadata().unwrap().len() as usize;
        for record in 0..RECORDS {
            let start = record as usize * RECORD;
            // A truncate the crash interrupted may or may not have happened: zeros are allowed.
            let maybe_cut = journal.truncating.is_some_and(|(f, cut)| f == file && record >= cut);
            let synced = journal.synced.get(&(file, record)).copied().filter(|_| !maybe_cut);
            let floors = if power_cut { &journal.durable_floor } else { &journal.floor };
            let floor = floors.get(&(file, record)).copied().unwrap_or(0);
            if start >= size {
                assert!(synced.is_none(), "round {round}: f{file} record {record} was fsync'd at v{synced:?} but the file is {size} bytes");
                continue;
            }
            let mut buf = vec![0u8; RECORD.min(size - start)];
            if let Err(e) = f.read_exact_at(&mut buf, start as u64) {
                // After a power cut, a record written since the last fsync whose descriptor reached
                // the disk but whose data did not fails its checksum: EIO, never garbage. Only
                // fsync'd records must read.
                if power_cut && synced.is_none() && e.raw_os_error() == Some(libc::EIO) {
                    TORN_UNSYNCED.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                panic!("round {round}: f{file} record {record} unreadable after crash: {e}\n{}", m.log_text());
            }
            if buf.iter().all(|&b| b == 0) {
                assert!(synced.is_none(), "round {round}: f{file} record {record} fsync'd at v{synced:?} reads as zeros");
                continue;
            }
            let word = |i: usize| u32::from_le_bytes(buf[i * 4..i * 4 + 4].try_into().unwrap());
            assert_eq!((word(0), word(1), word(2)), (MAGIC, file, record), "round {round}: f{file} record {record} is garbage");
            let version = word(3);
            assert_eq!(
                buf[..],
                version_bytes(file, record, version)[..buf.len()],
                "round {round}: f{file} record {record} v{version} torn"
            );
            let written = journal.written.get(&(file, record)).copied().unwrap_or(0);
            assert!(version <= written, "round {round}: f{file} record {record} v{version} was never written");
            if let Some(s) = synced {
                assert!(
                    version >= s,
                    "round {round}: f{file} record {record} went back to v{version} after fsync of v{s}\n{}\n last cut: {:?}\n history:\n{}{}",
                    lower_dump(&m.lower.join(&name)),
                    LAST_CUT.lock().unwrap(),
                    journal.history_of(file),
                    m.log_text()
                );
            }
            assert!(
                version >= floor,
                "round {round}: f{file} record {record} v{version} came back after a truncate removed it (size {size})\n{}\n history:\n{}{}",
                lower_dump(&m.lower.join(&name)),
                journal.history_of(file),
                m.log_text()
            );
            verified += 1;
        }
    }
    verified
}

/// How a round of the workload ends.
#[derive(Clone, Copy)]
enum Interrupt {
    /// SIGKILL of the daemon.
    Kill,
    /// FS_IOC_SHUTDOWN without a flush (`xfs_io -x -c shutdown`), then a clean unmount.
    Shutdown,
}

/// `rounds` rounds of the writer, each ended by `how` and checked after the next mount.
fn interrupted_rounds(rounds: usize, how: Interrupt) {
    let seed = seed_or(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64);
    eprintln!("crash test seed {seed} (replay with DENSEFS_SEED={seed})");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let d = Dirs::new();
    let journal = Arc::new(Mutex::new(Journal::default()));
    let mut total = 0;
    for round in 0..rounds {
        let options = ["recordsize=16K,compression=lz4", "recordsize=16K,compression=gzip-1", "compression=zstd-1"][round % 3];
        let m = Mount::new(&d.lower, &d.mnt, options);
        journal.lock().unwrap().round = round;
        if round > 0 {
            total += check_after_crash(&m, &journal.lock().unwrap(), round, false);
            journal.lock().unwrap().settle(&m);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let (root, journal, stop, seed) = (mount_root(&d.mnt), journal.clone(), stop.clone(), rng.gen());
            std::thread::spawn(move || writer(root, seed, journal, stop))
        };
        std::thread::sleep(Duration::from_millis(rng.gen_range(30..400)));
        let what = match how {
            Interrupt::Kill => {
                m.kill();
                "killed"
            }
            Interrupt::Shutdown => {
                common::shut_down(&d.mnt, 2).expect("FS_IOC_SHUTDOWN");
                "shut down"
            }
        };
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
        {
            let mut j = journal.lock().unwrap();
            for file in 0..FILES {
                j.note(file, format!("{what} (mounted with {options})"));
            }
        }
    }
    let m = Mount::new(&d.lower, &d.mnt, "");
    total += check_after_crash(&m, &journal.lock().unwrap(), rounds, false);
    m.unmount();
    eprintln!("verified {total} records across {rounds} rounds");
    assert!(total > 0);
}

fn crash_rounds() -> usize {
    std::env::var("DENSEFS_CRASH_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(30)
}

#[test]
fn sigkill_during_writes_never_loses_fsynced_data_or_returns_garbage() {
    interrupted_rounds(crash_rounds(), Interrupt::Kill);
}

/// A shutdown in the middle of the workload stops the file system as the kill does: the
/// writer's next request fails (EIO), nothing more lands, and after a clean unmount (the mount
/// dropped at the end of each round) and a new mount the same rules hold.
#[test]
fn a_shutdown_during_writes_never_loses_fsynced_data_or_returns_garbage() {
    interrupted_rounds(crash_rounds() / 3, Interrupt::Shutdown);
}

#[test]
fn data_left_in_an_open_file_reaches_the_lower_within_seconds() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "recordsize=128K");
    let f = OpenOptions::new().write(true).create(true).truncate(true).open(m.path("log")).unwrap();
    // A partial record and a size change: neither a full record nor a close pushes them out.
    let line = b"first line of a log that stays open\n";
    f.write_all_at(line, 0).unwrap();
    // Wait for the lower header to record the size (two writeback ticks: data, then header).
    let header_size = |raw: &[u8], at: usize| {
        let seq = u64::from_le_bytes(raw[at + 24..at + 32].try_into().unwrap());
        let size = u64::from_le_bytes(raw[at + 16..at + 24].try_into().unwrap());
        (seq, size)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let raw = std::fs::read(d.lower.join("log")).unwrap();
        // A new file's lower stays empty until its first data lands.
        let newest = if raw.len() >= 128 { header_size(&raw, 0).max(header_size(&raw, 64)) } else { (0, 0) };
        if newest.1 == line.len() as u64 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the size never reached the lower file");
        std::thread::sleep(Duration::from_millis(200));
    }
    m.kill();
    drop(f);
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(std::fs::read(m.path("log")).unwrap(), b"first line of a log that stays open\n");
    m.unmount();
}

// ---- power cuts ----------------------------------------------------------------------------

/// A new file's first header is not synced on its own: the lower file's birth header (an xattr)
/// stands in for block 0. A power cut that keeps the new file's slots and undoes block 0 (played
/// here by zeroing it) leaves an empty file, never the slots served as bytes, and never a
/// hidden attribute a user can see; the file takes new data again.
#[test]
fn a_new_file_whose_first_header_a_power_cut_undid_reads_as_empty() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "recordsize=16K,compression=lz4");
    std::fs::write(m.path("new"), common::compressible(200_000, 7)).unwrap();
    assert_eq!(xattr_names(&m.path("new")), "", "the birth header is densefs's own, never listed");
    m.unmount();
    let lower = d.lower.join("new");
    let len = std::fs::metadata(&lower).unwrap().len();
    assert!(len > 4096, "the new file's slots are on the lower file");
    let raw = std::fs::read(&lower).unwrap();
    assert!(raw[4096..].iter().any(|&b| b != 0));
    OpenOptions::new().write(true).open(&lower).unwrap().write_all_at(&[0u8; 4096], 0).unwrap();
    cut_short(&d.lower);

    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(std::fs::metadata(m.path("new")).unwrap().len(), 0, "the new file's unsynced data is gone, as a whole");
    assert_eq!(std::fs::read(m.path("new")).unwrap(), b"");
    let fresh = common::compressible(50_000, 8);
    OpenOptions::new().write(true).open(m.path("new")).unwrap().write_all_at(&fresh, 0).unwrap();
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(std::fs::read(m.path("new")).unwrap(), fresh);
    m.unmount();
}

/// A file truncated to nothing is an empty lower file, which a reader opens as a plain file; a
/// writer joining that reader writes plain bytes. Its birth header from its life as a container
/// must be gone by then, or plain data starting with a zero block would be taken for a container
/// a power cut undid, and read as empty (found by the differential test).
#[test]
fn an_emptied_file_written_as_plain_keeps_its_data() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=zstd-3");
    std::fs::write(m.path("f"), common::compressible(300_000, 9)).unwrap();
    OpenOptions::new().write(true).open(m.path("f")).unwrap().set_len(0).unwrap();
    let reader = File::open(m.path("f")).unwrap();
    let writer = OpenOptions::new().write(true).open(m.path("f")).unwrap();
    let data = common::compressible(5000, 10);
    writer.write_all_at(&data, 8192).unwrap();
    drop((reader, writer));
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let mut want = vec![0u8; 8192];
    want.extend_from_slice(&data);
    let got = std::fs::read(m.path("f")).unwrap();
    assert_eq!(got.len(), want.len(), "the file's size");
    assert!(got == want, "the file's bytes");
    m.unmount();
}

/// What a power cut leaves in the lower root's run record: the run that was cut never recorded
/// its end (a clean unmount records it only after syncing everything, which the tests that
/// play a cut on a cleanly unmounted lower undo by hand).
fn cut_short(lower: &std::path::Path) {
    use densefs::format::hints::{RunRecord, RUN_RECORD_XATTR};
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(lower.as_os_str().as_bytes()).unwrap();
    let name = std::ffi::CString::new(RUN_RECORD_XATTR).unwrap();
    let mut value = [0u8; 64];
    // SAFETY: both strings are NUL-terminated; getxattr writes at most value.len() bytes.
    let n = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
    assert!(n > 0, "the lower root has a run record");
    let record = RunRecord { running: true, ..RunRecord::decode(&value[..n as usize]).expect("a run record") };
    let value = record.encode();
    // SAFETY: both strings are NUL-terminated; setxattr reads value.len() bytes of `value`.
    assert_eq!(unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) }, 0);
}

fn xattr_names(path: &std::path::Path) -> String {
    let out = std::process::Command::new("getfattr").args(["-d", "-m", "-", "--absolute-names"]).arg(path).output().unwrap();
    assert!(out.status.success(), "getfattr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.starts_with('#') && !l.is_empty()).collect::<Vec<_>>().join("\n")
}

/// Builds tests/fault/libpowercut.c (logs pre-images of every lower write, and sync marks).
fn powercut_shim(dir: &std::path::Path) -> std::path::PathBuf {
    let out = dir.join("libpowercut.so");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fault/libpowercut.c");
    let ok = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&out)
        .arg(&src)
        .args(["-ldl", "-lpthread"])
        .status()
        .expect("cc");
    assert!(ok.success(), "cannot build the power-cut shim");
    out
}

/// Plays a power cut on the lower files from the shim's logs (`DENSEFS_POWERCUT_KEEP=1` keeps a
/// copy of each cut's log under /tmp/powercut-last for diagnosis): every 4 KiB block written since
/// its file's last successful sync independently keeps its new contents or goes back to what it
/// held at that sync. Returns (blocks reverted, blocks kept).
fn power_cut(lower: &std::path::Path, logs: &std::path::Path, rng: &mut rand::rngs::StdRng) -> (usize, usize) {
    use std::os::unix::fs::MetadataExt;
    // (dev, ino) -> block offset -> contents at the last sync (the first pre-image after it).
    let mut unsynced: HashMap<(u64, u64), HashMap<u64, Vec<u8>>> = HashMap::new();
    for entry in std::fs::read_dir(logs).unwrap().flatten() {
        let raw = std::fs::read(entry.path()).unwrap();
        let mut at = 0;
        let u64_at = |i: usize| u64::from_ne_bytes(raw[i..i + 8].try_into().unwrap());
        while at + 17 <= raw.len() {
            let (kind, key) = (raw[at], (u64_at(at + 1), u64_at(at + 9)));
            at += 17;
            if kind == 2 {
                unsynced.remove(&key);
                continue;
            }
            if at + 8 + 4096 > raw.len() {
                break; // the daemon died mid-entry
            }
            let off = u64_at(at);
            unsynced.entry(key).or_default().entry(off).or_insert_with(|| raw[at + 8..at + 8 + 4096].to_vec());
            at += 8 + 4096;
        }
        if std::env::var_os("DENSEFS_POWERCUT_KEEP").is_some() {
            static ROUND: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = ROUND.fetch_add(1, Ordering::Relaxed);
            let _ = std::fs::create_dir_all("/tmp/powercut-last");
            let _ = std::fs::copy(entry.path(), format!("/tmp/powercut-last/undo.{n:03}"));
        }
        std::fs::remove_file(entry.path()).unwrap();
    }
    let mut paths = HashMap::new();
    for entry in std::fs::read_dir(lower).unwrap().flatten() {
        let meta = entry.metadata().unwrap();
        if meta.is_file() {
            paths.insert((meta.dev(), meta.ino()), entry.path());
        }
    }
    let (mut reverted, mut kept) = (0, 0);
    let mut cut = LAST_CUT.lock().unwrap();
    cut.clear();
    for (key, blocks) in unsynced {
        let Some(path) = paths.get(&key) else { continue };
        let file = OpenOptions::new().write(true).open(path).unwrap();
        let len = file.metadata().unwrap().len();
        let (mut r, mut k) = (Vec::new(), Vec::new());
        let mut blocks: Vec<(u64, Vec<u8>)> = blocks.into_iter().collect();
        blocks.sort();
        for (off, old) in blocks {
            if off >= len || rng.gen_bool(0.5) {
                kept += 1;
                k.push(off);
                continue;
            }
            let n = old.len().min((len - off) as usize);
            file.write_all_at(&old[..n], off).unwrap();
            reverted += 1;
            r.push(off);
        }
        cut.push((format!("{} ino {}", path.file_name().unwrap().to_string_lossy(), key.1), r, k));
    }
    (reverted, kept)
}

/// What a power-cut test needs: its directories, the shim (tests/fault/libpowercut.c) logging
/// into `logs`, and the rng deciding which unsynced blocks each cut undoes.
struct PowerCuts {
    d: Dirs,
    logs: std::path::PathBuf,
    shim: std::path::PathBuf,
    rng: rand::rngs::StdRng,
}

impl PowerCuts {
    fn new(seed: u64) -> PowerCuts {
        let d = Dirs::new();
        let logs = d.root.path().join("powercut");
        std::fs::create_dir(&logs).unwrap();
        let shim = powercut_shim(d.root.path());
        PowerCuts { d, logs, shim, rng: rand::rngs::StdRng::seed_from_u64(seed) }
    }

    /// A mount whose daemon's lower writes the shim logs.
    fn mount(&self, options: &str) -> Mount {
        let env = [("LD_PRELOAD", self.shim.to_str().unwrap()), ("POWERCUT_LOG", self.logs.to_str().unwrap())];
        Mount::with_env(&self.d.lower, &self.d.mnt, options, &env)
    }

    /// A power cut, once the daemon was killed: (blocks undone, blocks kept).
    fn cut(&mut self) -> (usize, usize) {
        power_cut(&self.d.lower, &self.logs, &mut self.rng)
    }
}

/// `DENSEFS_SEED` if set (to replay), else `default`.
fn seed_or(default: u64) -> u64 {
    std::env::var("DENSEFS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Writes `version` of records `0..records` of the crash tests' file 0.
fn write_versions(file: &File, records: u32, version: u32) {
    for record in 0..records {
        file.write_all_at(&version_bytes(0, record, version), u64::from(record) * RECORD as u64).unwrap();
    }
}

#[test]
fn a_power_cut_never_loses_fsynced_data_or_returns_garbage() {
    let rounds: usize = std::env::var("DENSEFS_POWERCUT_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    let seed: u64 = std::env::var("DENSEFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64);
    eprintln!("power-cut test seed {seed} (replay with DENSEFS_SEED={seed})");
    let mut cuts = PowerCuts::new(seed);
    let journal = Arc::new(Mutex::new(Journal { power_cut: true, ..Journal::default() }));
    let (mut total, mut reverted, mut kept) = (0, 0, 0);
    for round in 0..=rounds {
        let options = ["recordsize=16K,compression=lz4", "recordsize=16K,compression=gzip-1", "compression=zstd-1"][round % 3];
        let m = cuts.mount(options);
        journal.lock().unwrap().round = round;
        if round > 0 {
            total += check_after_crash(&m, &journal.lock().unwrap(), round, true);
            journal.lock().unwrap().settle(&m);
        }
        if round == rounds {
            m.unmount();
            break;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let (root, journal, stop, seed) = (mount_root(&cuts.d.mnt), journal.clone(), stop.clone(), cuts.rng.gen());
            std::thread::spawn(move || writer(root, seed, journal, stop))
        };
        std::thread::sleep(Duration::from_millis(cuts.rng.gen_range(50..400)));
        m.kill();
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
        {
            let mut j = journal.lock().unwrap();
            for file in 0..FILES {
                j.note(file, format!("killed (mounted with {options})"));
            }
        }
        let (r, k) = cuts.cut();
        reverted += r;
        kept += k;
    }
    eprintln!(
        "verified {total} records across {rounds} power cuts ({reverted} unsynced blocks reverted, {kept} kept; {} unsynced records left unreadable, none garbage)",
        TORN_UNSYNCED.load(Ordering::Relaxed)
    );
    assert!(total > 0 && reverted > 0);
}

/// Records a user's fsync landed uncompressed in a gzip-6 file are re-encoded by the writeback tick
/// without a sync of their own: a power cut after that (each unsynced block kept or undone) must
/// leave every record as it was fsynced, from one copy or the other, never unreadable.
#[test]
fn a_power_cut_after_the_tick_re_encodes_fsynced_records_keeps_them() {
    let mut cuts = PowerCuts::new(seed_or(7));
    let mut expected: Vec<(String, Vec<u8>)> = Vec::new();
    let mut reverted = 0;
    for round in 0..2 {
        let m = cuts.mount("recordsize=16K,compression=gzip-6");
        for (name, data) in &expected {
            assert!(std::fs::read(m.path(name)).unwrap() == *data, "round {round}: {name} differs after the power cut");
        }
        let name = format!("db{round}");
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.path(&name)).unwrap();
        let mut data = common::compressible(16 * RECORD, round);
        file.write_all_at(&data, 0).unwrap();
        file.sync_all().unwrap();
        for record in 0..16 {
            let at = record * RECORD + cuts.rng.gen_range(0..RECORD - 64);
            data[at..at + 64].fill(b'0' + record as u8);
            file.write_all_at(&data[at..at + 64], at as u64).unwrap();
            file.sync_data().unwrap();
        }
        // How many of the file's records are stored with `codec`.
        let stored_with = |m: &Mount, codec: &str| {
            let out = std::process::Command::new(common::BIN).args(["stat", "--json"]).arg(m.path(&name)).output().unwrap();
            let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            report[0]["stats"]["records"][codec].as_u64().unwrap_or(0)
        };
        // The fsyncs landed a record each, uncompressed; on a slow machine the tick may already
        // have re-encoded the records fsync'd first (it takes those a tick has passed over
        // without another fsync).
        let (raw, gzip) = (stored_with(&m, "raw"), stored_with(&m, "gzip-6"));
        assert!(raw > 0 && raw + gzip == 16, "the fsyncs landed uncompressed: {raw} raw and {gzip} gzip-6 records of 16");
        common::wait_until("the tick to re-encode the fsynced records", || stored_with(&m, "gzip-6") == 16);
        m.kill();
        drop(file);
        reverted += cuts.cut().0;
        expected.push((name, data));
    }
    let m = Mount::new(&cuts.d.lower, &cuts.d.mnt, "");
    for (name, data) in &expected {
        assert!(std::fs::read(m.path(name)).unwrap() == *data, "{name} differs after the power cut");
    }
    m.unmount();
    eprintln!("{reverted} unsynced blocks undone by 2 power cuts after re-encoding");
    assert!(reverted > 0, "no power cut undid anything: the test tested nothing");
}

/// A user's fsync flushes once and the header records it later, so after a power cut the copies
/// the last fsync acknowledged lie in the next run's suspect range. That run must keep them as
/// durable: its next write of each record goes to the other slot. Were they taken for unsynced
/// copies and overwritten in place, a second power cut in that write would bring back the
/// version before them (the older copy beside them).
#[test]
fn a_second_power_cut_never_takes_back_what_the_last_fsync_acknowledged() {
    const N: u32 = 16;
    let mut cuts = PowerCuts::new(seed_or(11));
    let options = "recordsize=16K,compression=lz4";
    // Which version each record reads as (u32::MAX: none of them).
    let versions = |m: &Mount| -> Vec<u32> {
        let data = std::fs::read(m.path("db")).unwrap();
        (0..N)
            .map(|r| {
                let got = &data[r as usize * RECORD..(r as usize + 1) * RECORD];
                (0..3).find(|&v| got == version_bytes(0, r, v)).unwrap_or(u32::MAX)
            })
            .collect()
    };

    // Run 1: versions 0 and 1 each fsync'd; the power goes right after the second fsync.
    let m = cuts.mount(options);
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.path("db")).unwrap();
    write_versions(&file, N, 0);
    file.sync_data().unwrap();
    write_versions(&file, N, 1);
    file.sync_data().unwrap();
    m.kill();
    drop(file);
    cuts.cut();

    // Run 2: version 1 everywhere; version 2 lands (the writeback tick, no sync), then the power
    // goes again, tearing some of its writes.
    let m = cuts.mount(options);
    assert_eq!(versions(&m), vec![1; N as usize], "after the first power cut");
    let file = OpenOptions::new().read(true).write(true).open(m.path("db")).unwrap();
    write_versions(&file, N, 2);
    let lower = cuts.d.lower.join("db");
    common::wait_until("version 2 to land", || lower_dump(&lower).matches(" gen 3 ").count() == N as usize);
    m.kill();
    drop(file);
    let (reverted, kept) = cuts.cut();

    let m = Mount::new(&cuts.d.lower, &cuts.d.mnt, "");
    let after = versions(&m);
    m.unmount();
    eprintln!("after the second power cut ({reverted} blocks undone, {kept} kept): versions {after:?}");
    assert!(reverted > 0 && kept > 0, "the second power cut must tear the unsynced writes");
    assert!(after.iter().all(|&v| v == 1 || v == 2), "a record lost what the fsync acknowledged: {after:?}\n{}", lower_dump(&lower));
}

/// A truncate clears the descriptors of the records it cuts, and a power cut may undo that until
/// the next sync. Records written again before that sync must not overwrite the slot of a copy
/// the disk may still call current: a cut would then leave it torn, and the copy before it (which
/// an fsync had superseded) would be served in its place.
#[test]
fn records_cut_and_written_again_before_a_sync_never_bring_back_a_superseded_copy() {
    const N: u32 = 12;
    let mut cuts = PowerCuts::new(seed_or(5));
    let mut reverted = 0;
    for round in 0..8 {
        let name = format!("db{round}");
        let m = cuts.mount("recordsize=16K,compression=lz4");
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.path(&name)).unwrap();
        // Three fsync'd versions: each record's current copy (version 2) is back in its first
        // slot, with version 1 beside it.
        for version in 0..3 {
            write_versions(&file, N, version);
            file.sync_data().unwrap();
        }
        file.set_len(RECORD as u64).unwrap(); // not synced
        write_versions(&file, N, 3);
        let lower = cuts.d.lower.join(&name);
        common::wait_until("version 3 to land", || (1..N).all(|r| lower_dump(&lower).contains(&format!("record {r} slot 0: gen 1 "))));
        m.kill();
        drop(file);
        reverted += cuts.cut().0;
        let m = Mount::new(&cuts.d.lower, &cuts.d.mnt, "");
        let f = File::open(m.path(&name)).unwrap();
        for record in 1..N {
            let mut buf = vec![0u8; RECORD];
            match f.read_exact_at(&mut buf, u64::from(record) * RECORD as u64) {
                // Torn and never fsync'd, with no copy before it: EIO is allowed; so is a file
                // the undone truncate left shorter.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EIO)) || e.kind() == std::io::ErrorKind::UnexpectedEof => continue,
                Err(e) => panic!("round {round}: record {record}: {e}"),
                Ok(()) => {}
            }
            let version = (0..4).find(|&v| buf == version_bytes(0, record, v));
            assert!(
                matches!(version, Some(2 | 3)) || buf.iter().all(|&b| b == 0),
                "round {round}: record {record} reads as version {version:?}, superseded by the fsync of version 2\n{}",
                lower_dump(&lower)
            );
        }
        drop(f);
        m.unmount();
    }
    assert!(reverted > 0, "no power cut undid anything: the test tested nothing");
}

/// A user's fsync of a record or two lands it uncompressed, and where the record's other slot
/// holds an uncompressed copy this run wrote, only the blocks that differ from that copy are
/// written. Small writes at random places (within a block, across blocks and records), each
/// fsync'd, then a few not, then a power cut: every record must read as its last fsync'd state
/// or a later one, whole — never EIO, never a mix of states.
#[test]
fn small_fsynced_writes_that_rewrite_only_changed_blocks_survive_power_cuts() {
    const RECORDS: usize = 8;
    const RS: usize = 64 * 1024;
    let mut cuts = PowerCuts::new(seed_or(17));
    let mut model = common::random_bytes(RECORDS * RS, 3);
    let mut reverted = 0;
    // Six rounds, and more until a cut undid something: on a loaded machine the unsynced
    // writes of a round may all have reached the disk (ext4 commits every 5 s) before its cut.
    let mut round = 0;
    while round < 6 || (reverted == 0 && round < MAX_ROUNDS_UNTIL_UNDONE) {
        let m = cuts.mount("recordsize=64K,compression=lz4");
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(m.path("db")).unwrap();
        if round == 0 {
            file.write_all_at(&model, 0).unwrap();
        }
        file.sync_data().unwrap();
        // Each record's states from its last fsync'd one on.
        let mut states: Vec<Vec<Vec<u8>>> = model.chunks(RS).map(|r| vec![r.to_vec()]).collect();
        for op in 0..160 {
            let at = cuts.rng.gen_range(0..RECORDS * RS - 1);
            let len = cuts.rng.gen_range(1..=9000).min(RECORDS * RS - at);
            let bytes = common::random_bytes(len, cuts.rng.gen());
            file.write_all_at(&bytes, at as u64).unwrap();
            model[at..at + len].copy_from_slice(&bytes);
            let synced = op < 140 && file.sync_data().is_ok();
            for r in at / RS..=(at + len - 1) / RS {
                let state = model[r * RS..(r + 1) * RS].to_vec();
                if synced {
                    states[r] = vec![state];
                } else {
                    states[r].push(state);
                }
            }
        }
        m.kill();
        drop(file);
        reverted += cuts.cut().0;
        let m = Mount::new(&cuts.d.lower, &cuts.d.mnt, "");
        let file = File::open(m.path("db")).unwrap();
        for (r, allowed) in states.iter().enumerate() {
            let mut got = vec![0u8; RS];
            let read = file.read_exact_at(&mut got, (r * RS) as u64);
            assert!(read.is_ok(), "round {round}: record {r} unreadable after the power cut: {read:?}");
            let which = allowed.iter().position(|s| *s == got);
            assert!(which.is_some(), "round {round}: record {r} reads as none of its {} states since its last fsync", allowed.len());
            model[r * RS..(r + 1) * RS].copy_from_slice(&got);
        }
        drop(file);
        m.unmount();
        round += 1;
    }
    eprintln!("{reverted} unsynced blocks undone by {round} power cuts");
    assert!(reverted > 0, "no power cut undid anything: the test tested nothing");
}

/// Rounds a power-cut test runs at most waiting for a cut that undoes something.
const MAX_ROUNDS_UNTIL_UNDONE: usize = 30;

/// The background pass rewrites records that are durable already, inside their files, and moves
/// the last copies down at its end: a kill and a power cut at any point of it (each block
/// written since its file's last sync kept or undone at random) leave every file reading back
/// exactly as it was written, whatever mix of old and new copies the cut left.
#[test]
fn a_power_cut_during_background_passes_loses_nothing() {
    let mut cuts = PowerCuts::new(seed_or(46));
    let mut expected: Vec<(String, Vec<u8>)> = Vec::new();
    let (mut reverted, mut densified) = (0, 0);
    for round in 0..6u64 {
        let m = cuts.mount("recordsize=16K,compression=lz4,background_compression=gzip-6,background_delay=200ms");
        for (name, data) in &expected {
            assert!(std::fs::read(m.path(name)).unwrap() == *data, "round {round}: {name} differs after the power cut");
        }
        let mut records = 0;
        for i in 0..3u64 {
            let name = format!("r{round}-{i}");
            let data = common::compressible(cuts.rng.gen_range(100_000..1_500_000), 100 * round + i);
            let file = File::create(m.path(&name)).unwrap();
            file.write_all_at(&data, 0).unwrap();
            file.sync_all().unwrap();
            records += data.len().div_ceil(RECORD) as u64;
            expected.push((name, data));
        }
        // Killed at a random point of the passes: after some records, or after all of them; on a
        // loaded machine, where the pass's SCHED_IDLE threads crawl, after its first record and
        // at most 5 s more.
        let until = cuts.rng.gen_range(1..=records + records / 4);
        let background = || common::engine_snapshot(&m.mnt)["background"].clone();
        let reached = |at_least: u64| {
            let b = background();
            b["records"].as_u64().unwrap() >= at_least || b["waiting_files"] == 0
        };
        common::wait_up_to("the pass's first record", 600, || reached(1));
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !reached(until) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        densified += background()["records"].as_u64().unwrap();
        m.kill();
        reverted += cuts.cut().0;
    }
    let m = Mount::new(&cuts.d.lower, &cuts.d.mnt, "");
    for (name, data) in &expected {
        assert!(std::fs::read(m.path(name)).unwrap() == *data, "{name} differs after the power cuts");
    }
    m.unmount();
    eprintln!("{densified} records re-encoded, {reverted} unsynced blocks undone by 6 power cuts");
    assert!(densified > 0 && reverted > 0, "no record re-encoded or no block undone: the test tested nothing");
}

//! Load: 16 threads writing, rewriting, truncating, renaming, syncing and reading back a shared
//! tree at once for a while (DENSEFS_LOAD_SECONDS, default 15), each file checked against a model
//! on every read. Meanwhile the daemon's memory (peak RSS) must stay within `cache_size` plus a
//! stated constant, and its open descriptors bounded.

mod common;

use common::{compressible, random_bytes, Dirs, Mount};
use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const THREADS: usize = 16;
const FILES: usize = 48;
const CACHE: u64 = 64 << 20;
/// What the daemon needs besides file data: code, 16 FUSE threads with 1 MiB request buffers,
/// engine workers, descriptor tables, allocator slack. Stated in README's reliability section.
const CONSTANT: u64 = 128 << 20;

struct File {
    /// Current path relative to the mount (renames move it between directories).
    path: String,
    model: Vec<u8>,
}

fn status_kb(pid: u32, key: &str) -> u64 {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[test]
fn sixteen_writers_and_readers_keep_data_exact_and_memory_bounded() {
    let seconds: u64 = std::env::var("DENSEFS_LOAD_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, &format!("compression=zstd-1,recordsize=128K,cache_size={}", CACHE));
    let pid = m.child.as_ref().unwrap().id();
    for dir in 0..4 {
        fs::create_dir(m.path(&format!("d{dir}"))).unwrap();
    }
    let files: Arc<Vec<Mutex<File>>> =
        Arc::new((0..FILES).map(|i| Mutex::new(File { path: format!("d{}/f{i}", i % 4), model: Vec::new() })).collect());
    let mnt: PathBuf = m.mnt.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    // The monitor: peak RSS (VmHWM covers moments between samples) and descriptors.
    let max_fds = Arc::new(AtomicU64::new(0));
    let monitor = {
        let (stop, max_fds) = (stop.clone(), max_fds.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let fds = fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count() as u64).unwrap_or(0);
                max_fds.fetch_max(fds, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (files, mnt, ops) = (files.clone(), mnt.clone(), ops.clone());
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1);
                let mut rnd = move |n: u64| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % n.max(1)
                };
                while Instant::now() < deadline {
                    let i = rnd(FILES as u64) as usize;
                    let mut f = files[i].lock().unwrap();
                    let path = mnt.join(&f.path);
                    match rnd(10) {
                        0..=4 => {
                            // A write somewhere in the first 24 MiB: mostly up to 1 MiB, some up to
                            // 16 MiB (those fill memory while the engine catches up).
                            let off = rnd(24 << 20);
                            let max = if rnd(4) == 0 { 16 << 20 } else { 1 << 20 };
                            let len = 1 + rnd(max) as usize;
                            let seed = rnd(u64::MAX);
                            let data = if seed % 5 == 0 { random_bytes(len, seed) } else { compressible(len, seed) };
                            let h = OpenOptions::new().write(true).create(true).truncate(false).open(&path).unwrap();
                            h.write_all_at(&data, off).unwrap_or_else(|e| panic!("write {}: {e}", f.path));
                            let end = off as usize + len;
                            if f.model.len() < end {
                                f.model.resize(end, 0);
                            }
                            f.model[off as usize..end].copy_from_slice(&data);
                            if seed % 7 == 0 {
                                h.sync_data().unwrap();
                            }
                        }
                        5..=7 => {
                            // Read a range back and compare.
                            let got = fs::read(&path).unwrap_or_default();
                            assert_eq!(got.len(), f.model.len(), "{}: size", f.path);
                            assert!(got == f.model, "{}: contents differ from the model", f.path);
                        }
                        8 => {
                            let to = rnd(f.model.len() as u64 + 1);
                            if path.exists() {
                                OpenOptions::new().write(true).open(&path).unwrap().set_len(to).unwrap();
                                f.model.truncate(to as usize);
                            }
                        }
                        _ => {
                            // Rename into another directory.
                            if path.exists() {
                                let name = f.path.rsplit('/').next().unwrap().to_string();
                                let new = format!("d{}/{name}", rnd(4));
                                fs::rename(&path, mnt.join(&new)).unwrap();
                                f.path = new;
                            }
                        }
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker failed");
    }
    stop.store(true, Ordering::Relaxed);
    monitor.join().unwrap();
    let peak_rss = status_kb(pid, "VmHWM:") << 10;
    let fds = max_fds.load(Ordering::Relaxed);
    eprintln!(
        "{} ops in {seconds}s by {THREADS} threads; daemon peak RSS {} MiB (cache_size {} MiB + constant {} MiB allowed); peak open fds {fds}",
        ops.load(Ordering::Relaxed),
        peak_rss >> 20,
        CACHE >> 20,
        CONSTANT >> 20
    );
    assert!(peak_rss <= CACHE + CONSTANT, "daemon peak RSS {} MiB over the bound", peak_rss >> 20);
    assert!(fds < 256, "{fds} descriptors open");
    // Everything reads back, before and after a remount.
    for f in files.iter() {
        let f = f.lock().unwrap();
        assert!(fs::read(m.path(&f.path)).unwrap_or_default() == f.model, "{}", f.path);
    }
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    for f in files.iter() {
        let f = f.lock().unwrap();
        assert!(fs::read(m.path(&f.path)).unwrap_or_default() == f.model, "{} after remount", f.path);
    }
    m.unmount();
}

/// Sixteen writers streaming faster than gzip-9 compresses: without the budget each file could
/// hold 64 MiB in flight (1 GiB in all); with `cache_size=64M` the daemon stays near 64 MiB.
#[test]
fn a_burst_of_writers_faster_than_the_codec_stays_within_the_memory_budget() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, &format!("compression=gzip-9,cache_size={CACHE}"));
    let pid = m.child.as_ref().unwrap().id();
    let per_file = 24usize << 20;
    let writers: Vec<_> = (0..THREADS)
        .map(|t| {
            let path = m.path(&format!("burst{t}"));
            std::thread::spawn(move || {
                let f = OpenOptions::new().write(true).create(true).truncate(true).open(&path).unwrap();
                for (i, chunk) in (0..per_file / (4 << 20)).map(|i| (i, compressible(4 << 20, (t * 100 + i) as u64))) {
                    f.write_all_at(&chunk, (i * (4 << 20)) as u64).unwrap();
                }
                f.sync_all().unwrap();
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let peak_rss = status_kb(pid, "VmHWM:") << 10;
    eprintln!("burst: {} MiB written by {THREADS} writers; daemon peak RSS {} MiB", (per_file * THREADS) >> 20, peak_rss >> 20);
    assert!(peak_rss <= CACHE + CONSTANT, "daemon peak RSS {} MiB over the bound", peak_rss >> 20);
    for t in 0..THREADS {
        let got = fs::read(m.path(&format!("burst{t}"))).unwrap();
        let want: Vec<u8> = (0..per_file / (4 << 20)).flat_map(|i| compressible(4 << 20, (t * 100 + i) as u64)).collect();
        assert!(got == want, "burst{t}");
    }
    m.unmount();
}

/// Hundreds of files open at once, each holding part of a record (a demultiplexer writing one
/// output per sample does this): once their records fill `cache_size`, a write must not wait for
/// room that only a close would free. Landed records the files kept decoded for reads once held
/// the whole budget, and every later write waited two seconds (the wait's bound) for nothing.
#[test]
fn hundreds_of_open_files_with_partial_records_never_leave_a_writer_waiting() {
    const SMALL_CACHE: u64 = 16 << 20;
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, &format!("compression=lz4,cache_size={SMALL_CACHE}"));
    let pid = m.child.as_ref().unwrap().id();
    fs::create_dir(m.path("samples")).unwrap();
    let data = random_bytes(100 << 10, 3); // most of a 128 KiB record
    let mut files = Vec::new();
    for i in 0..400 {
        let f = OpenOptions::new().write(true).create(true).truncate(true).open(m.path(&format!("samples/{i}"))).unwrap();
        let start = Instant::now();
        f.write_all_at(&data, 0).unwrap();
        // A write that waited for room stayed blocked for the whole bound (2 s).
        assert!(start.elapsed() < Duration::from_millis(1500), "write {i} waited {:?} for memory", start.elapsed());
        files.push(f);
    }
    drop(files);
    let peak_rss = status_kb(pid, "VmHWM:") << 10;
    assert!(peak_rss <= SMALL_CACHE + CONSTANT, "daemon peak RSS {} MiB over the bound", peak_rss >> 20);
    for i in 0..400 {
        assert!(fs::read(m.path(&format!("samples/{i}"))).unwrap() == data, "samples/{i}");
    }
    m.unmount();
}

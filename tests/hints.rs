//! Size hints (docs/FORMAT.md, "Size hints and runs"): a closed file's logical size kept on its
//! lower file, so that a cold listing reads no headers; trusted only from runs that ended
//! cleanly, and never left naming a size the header no longer records.

mod common;

use common::{compressible, Dirs, Mount};
use densefs::format::hints::{RunRecord, SizeHint, RUN_RECORD_XATTR, SIZE_HINT_XATTR};
use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cpath(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// An extended attribute of a lower file or directory, if it has it.
fn lower_xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let (path, name) = (cpath(path), CString::new(name).unwrap());
    let mut buf = vec![0u8; 256];
    // SAFETY: both strings are NUL-terminated; getxattr writes at most buf.len() bytes.
    let n = unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}

fn set_lower_xattr(path: &Path, name: &str, value: &[u8]) {
    let (path, name) = (cpath(path), CString::new(name).unwrap());
    // SAFETY: both strings are NUL-terminated; setxattr reads value.len() bytes of `value`.
    let r = unsafe { libc::lsetxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    assert_eq!(r, 0, "setxattr: {}", std::io::Error::last_os_error());
}

fn remove_lower_xattr(path: &Path, name: &str) {
    let (path, name) = (cpath(path), CString::new(name).unwrap());
    // SAFETY: both strings are NUL-terminated.
    unsafe { libc::lremovexattr(path.as_ptr(), name.as_ptr()) };
}

fn hint(lower_file: &Path) -> Option<SizeHint> {
    lower_xattr(lower_file, SIZE_HINT_XATTR).map(|v| SizeHint::decode(&v).expect("a hint this densefs reads"))
}

fn run_record(lower: &Path) -> RunRecord {
    RunRecord::decode(&lower_xattr(lower, RUN_RECORD_XATTR).expect("a run record")).expect("a record this densefs reads")
}

/// Bytes the daemon has read with read(2)-like calls so far (`rchar` of /proc/PID/io): header
/// reads count, extended attributes and directory listings do not.
fn daemon_bytes_read(m: &Mount) -> u64 {
    let pid = m.child.as_ref().expect("a running daemon").id();
    let io = fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines().find_map(|l| l.strip_prefix("rchar: ")).unwrap().trim().parse().unwrap()
}

fn file_sizes(i: usize) -> usize {
    [1, 700, 4_096, 20_000, 70_001, 150_000][i % 6] + i
}

#[test]
fn a_cold_listing_takes_sizes_from_hints_and_reads_no_headers() {
    const FILES: usize = 120;
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,recordsize=16K");
    fs::create_dir(m.path("dir")).unwrap();
    for i in 0..FILES {
        fs::write(m.path(&format!("dir/f{i}")), compressible(file_sizes(i), i as u64)).unwrap();
    }
    assert!(run_record(&d.lower).running, "a writing run marks itself running");
    m.unmount();
    assert!(!run_record(&d.lower).running, "a clean unmount marks the run ended");
    for i in 0..FILES {
        let h = hint(&d.lower.join(format!("dir/f{i}"))).unwrap_or_else(|| panic!("f{i} has no hint"));
        assert_eq!((h.size, h.record_shift), (file_sizes(i) as u64, 14), "f{i}'s hint");
        assert_eq!(h.lower_len, fs::metadata(d.lower.join(format!("dir/f{i}"))).unwrap().len(), "f{i}'s lower length");
    }

    // The listing a cold `ls -l` makes: sizes right, and no header read.
    let listed = |m: &Mount| {
        // The daemon's statistics first: where the last run could not save them (its walk, on
        // idle-priority threads, had not ended on a busy machine), the new run walks the tree,
        // reading every header, and those reads must not count as the listing's.
        common::wait_until("the statistics known", || !common::engine_snapshot(&m.mnt)["usage"].is_null());
        let before = daemon_bytes_read(m);
        for e in fs::read_dir(m.path("dir")).unwrap() {
            let e = e.unwrap();
            let i: usize = e.file_name().to_str().unwrap()[1..].parse().unwrap();
            assert_eq!(e.metadata().unwrap().len(), file_sizes(i) as u64, "f{i}'s size");
        }
        daemon_bytes_read(m) - before
    };
    // Statuses over a second old: the listing keeps the sizes of the hints it read ahead,
    // where newer ones are read again at each file's lookup.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let m = Mount::new(&d.lower, &d.mnt, "");
    let with_hints = listed(&m);
    assert_eq!(fs::read(m.path("dir/f5")).unwrap(), compressible(file_sizes(5), 5), "a hinted file reads back");
    m.unmount();
    assert!(with_hints < (FILES as u64) * 4096 / 8, "a cold listing read {with_hints} bytes of the lower files");

    // Without hints the same listing reads every header (which shows the measure sees them).
    for i in 0..FILES {
        remove_lower_xattr(&d.lower.join(format!("dir/f{i}")), SIZE_HINT_XATTR);
    }
    let m = Mount::new(&d.lower, &d.mnt, "");
    let without = listed(&m);
    m.unmount();
    assert!(without >= (FILES as u64) * 2048, "without hints the listing read only {without} bytes");
    eprintln!("a cold listing of {FILES} files read {with_hints} bytes with hints, {without} without");
}

#[test]
fn hints_written_up_to_a_run_cut_short_are_not_trusted() {
    let d = Dirs::new();
    let data = compressible(50_000, 1);
    let m = Mount::new(&d.lower, &d.mnt, "compression=zstd-3");
    fs::write(m.path("a"), &data).unwrap();
    m.unmount();
    // A hint its header contradicts, as a power cut can leave one (the hint kept, the header
    // write it followed undone).
    let lower_a = d.lower.join("a");
    let mut stale = hint(&lower_a).unwrap();
    stale.size = 12_345;
    set_lower_xattr(&lower_a, SIZE_HINT_XATTR, &stale.encode().unwrap());
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(fs::metadata(m.path("a")).unwrap().len(), 12_345, "a clean run's hint is taken as it is");
    m.kill();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert!(m.log_text().contains("did not end cleanly"), "the next run says so");
    assert_eq!(fs::metadata(m.path("a")).unwrap().len(), 50_000, "after a run cut short, the header's size");
    assert!(fs::read(m.path("a")).unwrap() == data);
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "ro");
    assert_eq!(fs::metadata(m.path("a")).unwrap().len(), 50_000, "and in every run after it");
    m.unmount();
    let record = run_record(&d.lower);
    assert!(stale.run < record.trusted_from && !record.running, "{record:?}");

    // A hint of another tree (a lower copied in with its attributes) is not this tree's.
    let m = Mount::new(&d.lower, &d.mnt, "");
    fs::write(m.path("b"), &data).unwrap();
    m.unmount();
    let lower_b = d.lower.join("b");
    let good = hint(&lower_b).unwrap();
    let foreign = SizeHint { tree: good.tree.wrapping_add(1), size: 777, ..good };
    set_lower_xattr(&lower_b, SIZE_HINT_XATTR, &foreign.encode().unwrap());
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(fs::metadata(m.path("b")).unwrap().len(), 50_000, "another tree's hint");
    m.unmount();
}

#[test]
fn a_file_whose_size_changes_never_keeps_a_hint_of_the_old_size() {
    let d = Dirs::new();
    let mut data = compressible(100_000, 2);
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,recordsize=16K");
    fs::write(m.path("a"), &data).unwrap();
    m.unmount();
    let lower_a = d.lower.join("a");
    assert_eq!(hint(&lower_a).unwrap().size, 100_000);

    let m = Mount::new(&d.lower, &d.mnt, "");
    let mut f = fs::OpenOptions::new().append(true).open(m.path("a")).unwrap();
    let tail = compressible(5_000, 3);
    f.write_all(&tail).unwrap();
    data.extend_from_slice(&tail);
    f.sync_all().unwrap();
    // The header now records the new size, and the old hint went before it. (A process another
    // test forks meanwhile holds a copy of `f` until its exec closes it: that close is a FLUSH,
    // which may already have given the file the new size's hint.)
    let after_sync = hint(&lower_a);
    assert!(after_sync.is_none_or(|h| h.size == 105_000), "a hint of the old size outlived the header's change: {after_sync:?}");
    drop(f);
    // (The kernel sends the last close's RELEASE without waiting for it.)
    let hint_becomes =
        |size: u64| common::wait_until(&format!("a hint of {size} bytes"), || hint(&lower_a).is_some_and(|h| h.size == size));
    hint_becomes(105_000); // the last close writes the new one

    // Cut through an open file, then by name (a file no handle holds).
    fs::OpenOptions::new().write(true).open(m.path("a")).unwrap().set_len(70_000).unwrap();
    data.truncate(70_000);
    hint_becomes(70_000);
    let path = cpath(&m.path("a"));
    // SAFETY: `path` is NUL-terminated.
    assert_eq!(unsafe { libc::truncate(path.as_ptr(), 30_000) }, 0);
    data.truncate(30_000);
    hint_becomes(30_000);
    // Emptied, the lower file is empty, and keeps no hint.
    fs::write(m.path("a"), b"").unwrap();
    common::wait_until("an empty lower file without a hint", || fs::metadata(&lower_a).unwrap().len() == 0 && hint(&lower_a).is_none());
    // Times set on an open file (tar and cp -p set them as they close it) give it the hint of the
    // size it has then; writing on past it removes that hint before the header grows.
    let mut f = fs::OpenOptions::new().write(true).open(m.path("a")).unwrap();
    f.write_all(&data[..20_000]).unwrap();
    f.set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000)).unwrap();
    assert_eq!(hint(&lower_a).map(|h| h.size), Some(20_000), "the hint a utimensat gives");
    f.write_all(&data[20_000..]).unwrap();
    f.sync_all().unwrap();
    let after_sync = hint(&lower_a);
    assert!(
        after_sync.is_none_or(|h| h.size == 30_000),
        "a hint of the size at the utimensat outlived the header's change: {after_sync:?}"
    );
    drop(f);
    hint_becomes(30_000);
    m.unmount();
    assert_eq!(hint(&lower_a).unwrap().size, 30_000);
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(fs::metadata(m.path("a")).unwrap().len(), 30_000);
    assert!(fs::read(m.path("a")).unwrap() == data);
    m.unmount();
}

/// Whether the first page of a lower file is in the page cache.
fn header_cached(path: &Path) -> bool {
    let f = fs::File::open(path).unwrap();
    // SAFETY: the mount is idle while the page is mapped; mincore writes one byte per page.
    let map = unsafe { memmap2::MmapOptions::new().len(4096).map(&f) }.unwrap();
    let mut resident = [0u8; 1];
    assert_eq!(unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, 4096, resident.as_mut_ptr()) }, 0);
    resident[0] & 1 != 0
}

/// Drops a lower file's pages from the page cache.
fn evict(path: &Path) {
    let f = fs::File::open(path).unwrap();
    // SAFETY: posix_fadvise only reads its integer arguments.
    assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
}

/// A listing that took its sizes from hints read no headers, so a program opening the files
/// it listed, in order (`find | xargs cat`), would wait for each header in turn: its first
/// open asks for the starts of the files listed after it instead.
#[test]
fn opening_listed_files_in_order_reads_the_next_headers_ahead() {
    let d = Dirs::new();
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs writes into the struct it is given; the path is NUL-terminated.
    assert_eq!(unsafe { libc::statfs(cpath(&d.lower).as_ptr(), &mut sfs) }, 0);
    if sfs.f_type == libc::TMPFS_MAGIC {
        eprintln!("skipped: the test directory is on tmpfs, whose pages cannot be dropped");
        return;
    }
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    fs::create_dir(m.path("dir")).unwrap();
    for i in 0..100 {
        fs::write(m.path(&format!("dir/f{i}")), compressible(30_000, i)).unwrap();
    }
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let names: Vec<String> = fs::read_dir(d.lower.join("dir")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    for name in &names {
        let lower = d.lower.join("dir").join(name);
        fs::File::open(&lower).unwrap().sync_all().unwrap();
        evict(&lower);
    }
    let listed: Vec<String> = fs::read_dir(m.path("dir")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    let cached = |names: &[String]| names.iter().filter(|n| header_cached(&d.lower.join("dir").join(n))).count();
    assert_eq!(cached(&listed), 0, "the listing read headers");
    let mut first = Vec::new();
    fs::File::open(m.path(&format!("dir/{}", listed[0]))).unwrap().read_to_end(&mut first).unwrap();
    let next = &listed[1..33];
    common::wait_until("the next files' headers cached", || cached(next) == next.len());
    assert!(cached(&listed[70..]) < 10, "far beyond the batch: {} of 30 cached", cached(&listed[70..]));
    m.unmount();
}

/// A daemon whose lower another took over (multihost: it stalled) must not record its own
/// clean end over the other run's record: that would hide how the other run ends.
#[test]
fn a_run_whose_record_another_run_took_leaves_it_alone() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    fs::write(m.path("a"), compressible(10_000, 1)).unwrap();
    let ours = run_record(&d.lower);
    let theirs = RunRecord { run: ours.run + 1, ..ours };
    set_lower_xattr(&d.lower, RUN_RECORD_XATTR, &theirs.encode());
    m.unmount();
    assert_eq!(run_record(&d.lower), theirs, "the other run's record");
    // Without the takeover, the same unmount records the end.
    let m = Mount::new(&d.lower, &d.mnt, "");
    m.unmount();
    assert!(!run_record(&d.lower).running);
}

//! Reliability under faults: a full lower file system, I/O errors from the lower file system,
//! corrupt containers. Each test mounts a real densefs and checks real bytes.

mod common;

use common::{compressible, random_bytes, wait_until, Dirs, Mount, SmallDisk, BIN};
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// Writes `chunk` repeatedly until an error; returns the bytes acknowledged and the errno.
fn fill(path: &Path, seed: u64) -> (Vec<u8>, i32) {
    let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(path).unwrap();
    let mut acknowledged = Vec::new();
    for i in 0..200 {
        let chunk = random_bytes(1 << 20, seed + i);
        match f.write(&chunk) {
            // A write the kernel sent in two requests, the second refused, is short (as on a
            // local file system that fills mid-write); the next write gets the error.
            Ok(n) => acknowledged.extend_from_slice(&chunk[..n]),
            Err(e) => return (acknowledged, errno(&e)),
        }
    }
    let e = f.sync_all().expect_err("the disk never filled");
    (acknowledged, errno(&e))
}

#[test]
fn a_full_disk_gives_enospc_loses_nothing_and_recovers_when_space_is_freed() {
    let d = Dirs::new();
    let _disk = SmallDisk::new(&d.lower, "24M");
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    // Data written and fsync'd before the disk fills.
    let a = random_bytes(6 << 20, 1);
    let c = compressible(8 << 20, 2);
    fs::write(m.path("a"), &a).unwrap();
    fs::write(m.path("c"), &c).unwrap();
    OpenOptions::new().write(true).open(m.path("c")).unwrap().sync_all().unwrap();
    // Fill it: the writer is told ENOSPC, nothing else.
    let (b, err) = fill(&m.path("b"), 100);
    assert_eq!(err, libc::ENOSPC, "expected ENOSPC, got errno {err}");
    assert!(b.len() >= 4 << 20, "filled after only {} bytes", b.len());
    // As on a local file system, the write that did not fit was refused, not acknowledged into
    // memory: everything acknowledged is on the disk, so an fsync succeeds while it is full.
    let f = OpenOptions::new().write(true).open(m.path("b")).unwrap();
    f.sync_all().expect("fsync of everything acknowledged on a full disk");
    drop(f);
    // Everything acknowledged reads back while the disk is full.
    assert!(fs::read(m.path("a")).unwrap() == a, "a changed");
    assert!(fs::read(m.path("c")).unwrap() == c, "c changed");
    let got_b = fs::read(m.path("b")).unwrap();
    assert_eq!(got_b.len(), b.len(), "b lost acknowledged bytes");
    assert!(got_b == b, "b reads other bytes");
    // Rewriting compressed records with incompressible data needs new space: ENOSPC again, and
    // what was acknowledged stays readable.
    let mut c_model = c.clone();
    let f = OpenOptions::new().read(true).write(true).open(m.path("c")).unwrap();
    let mut rewrite_err = None;
    for i in 0..8u64 {
        let chunk = random_bytes(1 << 20, 200 + i);
        match f.write_all_at(&chunk, i << 20) {
            Ok(()) => c_model[(i << 20) as usize..((i + 1) << 20) as usize].copy_from_slice(&chunk),
            Err(e) => {
                rewrite_err = Some(errno(&e));
                break;
            }
        }
    }
    let rewrite_err = rewrite_err.or_else(|| f.sync_all().err().map(|e| errno(&e)));
    assert_eq!(rewrite_err, Some(libc::ENOSPC));
    drop(f);
    assert!(fs::read(m.path("c")).unwrap() == c_model, "c does not read what was acknowledged");
    // Metadata still works on a full disk.
    fs::rename(m.path("a"), m.path("a2")).unwrap();
    fs::set_permissions(m.path("a2"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(m.path("a2")).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(fs::read(m.path("a2")).unwrap() == a);
    // Free space: what was kept in memory lands, and new writes succeed.
    fs::remove_file(m.path("a2")).unwrap();
    let f = OpenOptions::new().write(true).open(m.path("b")).unwrap();
    wait_until("b to be written back", || f.sync_all().is_ok());
    drop(f);
    let f = OpenOptions::new().write(true).open(m.path("c")).unwrap();
    wait_until("c to be written back", || f.sync_all().is_ok());
    drop(f);
    let e = compressible(1 << 20, 3);
    fs::write(m.path("e"), &e).unwrap();
    m.unmount();
    // After a remount, everything is there, from the lower files.
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert!(fs::read(m.path("b")).unwrap() == b, "b after remount");
    assert!(fs::read(m.path("c")).unwrap() == c_model, "c after remount");
    assert!(fs::read(m.path("e")).unwrap() == e, "e after remount");
    let scrub = Command::new(BIN).arg("scrub").arg(&m.mnt).output().unwrap();
    assert!(scrub.status.success(), "{}", String::from_utf8_lossy(&scrub.stdout));
    m.unmount();
}

/// A lower directory may hold another file system's mount point: each file is judged by the free
/// space of the file system it is on, not of the one a write to another file saw.
#[test]
fn a_small_file_system_mounted_inside_the_lower_fills_at_its_own_size() {
    let d = Dirs::new();
    let small = d.lower.join("small");
    fs::create_dir(&small).unwrap();
    let _disk = SmallDisk::new(&small, "16M");
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    // A write to the large file system first (its free space is seen), then fill the small one.
    let big = random_bytes(4 << 20, 40);
    fs::write(m.path("big"), &big).unwrap();
    let (b, err) = fill(&m.path("small/b"), 400);
    assert_eq!(err, libc::ENOSPC, "expected ENOSPC, got errno {err}");
    assert!(b.len() >= 8 << 20 && b.len() <= 16 << 20, "{} bytes acknowledged on a 16 MiB file system", b.len());
    let f = OpenOptions::new().write(true).open(m.path("small/b")).unwrap();
    f.sync_all().expect("fsync of everything acknowledged on the full small file system");
    drop(f);
    assert!(fs::read(m.path("small/b")).unwrap() == b);
    assert!(fs::read(m.path("big")).unwrap() == big);
    m.unmount();
}

/// Writes are admitted against the lower's free space, but another program can take that space
/// before they land: the shim's ".enospc-write" makes the lower refuse this file's writes with
/// ENOSPC, as a disk filled behind densefs's back would.
#[test]
fn a_file_closed_on_a_full_disk_keeps_its_data_until_it_can_be_written() {
    let d = Dirs::new();
    let shim = fault_shim(d.root.path());
    let _disk = SmallDisk::new(&d.lower, "64M");
    let m = Mount::with_env(&d.lower, &d.mnt, "compression=lz4", &[("LD_PRELOAD", shim.to_str().unwrap())]);
    // Written, then closed: the writer hears ENOSPC at a write or not at all (close's error is
    // not visible through std); what matters is the data.
    let data = random_bytes(8 << 20, 10);
    let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(m.path("late.enospc-write")).unwrap();
    let mut acknowledged = Vec::new();
    while acknowledged.len() < data.len() {
        let at = acknowledged.len();
        match f.write(&data[at..(at + (1 << 20)).min(data.len())]) {
            Ok(n) => acknowledged.extend_from_slice(&data[at..at + n]),
            Err(e) => {
                assert_eq!(errno(&e), libc::ENOSPC);
                break;
            }
        }
    }
    drop(f);
    assert!(!acknowledged.is_empty(), "nothing was acknowledged");
    let mut back = Vec::new();
    fs::File::open(m.path("late.enospc-write")).unwrap().read_to_end(&mut back).unwrap();
    assert!(back == acknowledged, "closed file lost acknowledged data ({} of {} bytes)", back.len(), acknowledged.len());
    // `df` counts what is held in memory as used: the mount shows that much less free than the
    // lower (a private tmpfs: nothing else writes to it).
    let held = free_bytes(&d.lower) - free_bytes(&m.mnt);
    assert!(held >= acknowledged.len() as u64, "df through the mount hides {} bytes held in memory (shows {held})", acknowledged.len());
    // `densefs umount` refuses to drop it, and says why and what to do. (The kernel sends the
    // RELEASE of the reads above without waiting for it: until it is done, the file is open.)
    let mut said = String::new();
    wait_until("umount to refuse for the closed file", || {
        let refused = Command::new(BIN).arg("umount").arg(&m.mnt).output().unwrap();
        assert!(!refused.status.success(), "umount dropped a file held in memory only");
        said = String::from_utf8_lossy(&refused.stderr).into_owned();
        said.contains("1 closed file(s)")
    });
    assert!(said.contains("densefs umount --force"), "{said}");
    // Space comes back: background writeback lands it without anyone reopening the file.
    fs::rename(m.path("late.enospc-write"), m.path("late")).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !m.log_text().contains("now written") {
        assert!(std::time::Instant::now() < deadline, "not written back; log: {}", m.log_text());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(free_bytes(&d.lower) - free_bytes(&m.mnt) < 1 << 20, "df still counts landed data as held");
    assert!(fs::read(m.path("late")).unwrap() == acknowledged, "written back, still there");
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert!(fs::read(m.path("late")).unwrap() == acknowledged);
    m.unmount();
}

/// Deleting the file that filled the disk gives its space back at once, as on a local file
/// system: the daemon's descriptor of it closes only at the kernel's FORGET, which comes a
/// moment after `rm` returned, and a write made right away was refused with ENOSPC (one round
/// in about 30). Each round fills the disk through the mount, deletes the file (closed, or
/// still open and closed just after) and writes a small file at once.
#[test]
fn a_write_right_after_deleting_the_file_that_filled_the_disk_is_admitted() {
    let d = Dirs::new();
    let _disk = SmallDisk::new(&d.lower, "16M");
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    let small = compressible(64 << 10, 7);
    for round in 0..48 {
        // Half the rounds as `cp` then `cat >>`: the appending writer's close finds the disk
        // full and keeps what it could not land in memory until the rm.
        if round % 4 >= 2 {
            fs::write(m.path("big"), random_bytes(8 << 20, round)).unwrap();
        }
        let mut f = OpenOptions::new().append(true).create(true).open(m.path("big")).unwrap();
        let err = (0..64).find_map(|i| f.write_all(&random_bytes(1 << 20, round * 100 + i)).err()).expect("the disk fills");
        assert_eq!(errno(&err), libc::ENOSPC, "round {round}: the disk fills");
        drop(f);
        let held = (round % 2 == 1).then(|| fs::File::open(m.path("big")).unwrap());
        fs::remove_file(m.path("big")).unwrap();
        drop(held);
        let name = format!("small{round}");
        fs::write(m.path(&name), &small).unwrap_or_else(|e| panic!("round {round}: a write right after the rm: {e}"));
        assert!(fs::read(m.path(&name)).unwrap() == small, "round {round}: {name} reads back");
    }
    m.unmount();
}

/// A record rewritten lands beside its old copy, which the next sync frees; a truncate's copies
/// are freed by the next sync too. On a nearly full disk the writer does not hear ENOSPC while
/// such copies could be freed: they are freed first (as ext4 commits its journal before it says
/// ENOSPC), so rewriting a file that fills most of the disk works like on a local file system.
#[test]
fn rewriting_a_file_that_fills_most_of_the_disk_frees_its_old_copies_instead_of_failing() {
    let d = Dirs::new();
    let _disk = SmallDisk::new(&d.lower, "24M");
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    let size = 15 << 20;
    fs::write(m.path("x"), random_bytes(size, 30)).unwrap();
    // Over it in place (no truncate), twice, then `cp`-style (O_TRUNC), with no sync between.
    let mut last = Vec::new();
    for (i, truncate) in [(31, false), (32, false), (33, true)] {
        last = random_bytes(size, i);
        let mut f = OpenOptions::new().write(true).truncate(truncate).open(m.path("x")).unwrap();
        f.write_all(&last).unwrap_or_else(|e| panic!("rewrite {i} (truncate: {truncate}): {e}"));
        drop(f);
        assert!(fs::read(m.path("x")).unwrap() == last, "rewrite {i} reads back other bytes");
    }
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert!(fs::read(m.path("x")).unwrap() == last, "x after remount");
    m.unmount();
}

/// A user's fsync of a record or two lands it uncompressed (it waits for no codec). On a disk
/// with room for the record compressed but not uncompressed, the fsync must still succeed: the
/// record is landed again with the file's codec.
#[test]
fn a_small_fsync_on_a_nearly_full_disk_lands_compressed_what_does_not_fit_uncompressed() {
    let d = Dirs::new();
    let _disk = SmallDisk::new(&d.lower, "12M");
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    let mut data = compressible(1 << 20, 21);
    fs::write(m.path("db"), &data).unwrap();
    let f = OpenOptions::new().read(true).write(true).open(m.path("db")).unwrap();
    f.sync_all().unwrap();
    // Leave 96 KiB free, behind densefs's back: a 128 KiB record fits compressed (about 60 KiB
    // with lz4), not uncompressed.
    let sv = free_bytes(&d.lower);
    let leave = 96 << 10;
    let ok = Command::new("fallocate").args(["-l", &(sv - leave).to_string()]).arg(d.lower.join("filler")).status().unwrap();
    assert!(ok.success());
    assert!(free_bytes(&d.lower) <= leave);
    data[200_000..200_100].fill(b'x');
    f.write_all_at(&data[200_000..200_100], 200_000).unwrap();
    f.sync_data().expect("an fsync whose record fits compressed must succeed");
    drop(f);
    assert!(fs::read(m.path("db")).unwrap() == data);
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert!(fs::read(m.path("db")).unwrap() == data, "db after remount");
    m.unmount();
}

/// Bytes free on the file system holding `dir`, for an unprivileged writer.
fn free_bytes(dir: &Path) -> u64 {
    let out = Command::new("stat").args(["-f", "-c", "%a %S"]).arg(dir).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut it = text.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    it.next().unwrap() * it.next().unwrap()
}

/// Preallocation cannot reserve compressed space, but it must not promise room the lower plainly
/// lacks: as on OpenZFS, fallocate and posix_fallocate fail at once with ENOSPC, and what fits
/// still succeeds (the size changes, the bytes read as zeros).
#[test]
fn fallocate_beyond_the_lower_free_space_is_enospc() {
    let d = Dirs::new();
    let _disk = SmallDisk::new(&d.lower, "32M");
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    let f = OpenOptions::new().create_new(true).read(true).write(true).open(m.path("pre")).unwrap();
    let falloc = |mode: i32, offset: i64, len: i64| {
        // SAFETY: fallocate on a descriptor the test owns.
        if unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), mode, offset, len) } == 0 {
            Ok(())
        } else {
            Err(errno(&std::io::Error::last_os_error()))
        }
    };
    assert_eq!(falloc(0, 0, 64 << 20), Err(libc::ENOSPC), "64 MiB on a 32 MiB lower");
    assert_eq!(falloc(libc::FALLOC_FL_KEEP_SIZE, 0, 64 << 20), Err(libc::ENOSPC), "keep size, 64 MiB");
    assert_eq!(f.metadata().unwrap().len(), 0, "a refused fallocate changed the size");
    assert_eq!(falloc(0, 0, 8 << 20), Ok(()), "8 MiB fits");
    // Within what the file already covers nothing grows: no space is needed.
    assert_eq!(falloc(0, 1 << 20, 7 << 20), Ok(()), "a range inside the file");
    assert_eq!(f.metadata().unwrap().len(), 8 << 20);
    let mut buf = vec![1u8; 4096];
    f.read_exact_at(&mut buf, 5 << 20).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "preallocated bytes read as zeros");
    drop(f);
    m.unmount();
}

/// Builds tests/fault/libfault.c (the LD_PRELOAD shim that fails I/O on marked files).
fn fault_shim(dir: &Path) -> PathBuf {
    let out = dir.join("libfault.so");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fault/libfault.c");
    let ok = Command::new("cc").args(["-shared", "-fPIC", "-O2", "-o"]).arg(&out).arg(&src).arg("-ldl").status().expect("cc");
    assert!(ok.success(), "cannot build the fault shim");
    out
}

fn is_eio(result: std::io::Result<impl Sized>) -> bool {
    matches!(result, Err(e) if e.raw_os_error() == Some(libc::EIO))
}

#[test]
fn lower_io_errors_reach_the_caller_as_eio_never_as_wrong_data() {
    let d = Dirs::new();
    let shim = fault_shim(d.root.path());
    let env = [("LD_PRELOAD", shim.to_str().unwrap())];
    let data = compressible(4 << 20, 5);
    let other = compressible(1 << 20, 6);
    fs::write(d.lower.join("plain.eio-read"), b"a plain lower file").unwrap();
    let m = Mount::with_env(&d.lower, &d.mnt, "compression=zstd-3", &env);
    fs::write(m.path("r"), &data).unwrap();
    fs::write(m.path("other"), &other).unwrap();
    m.unmount();
    // Reads: a failing lower read is EIO at open or read; other files are untouched.
    let m = Mount::with_env(&d.lower, &d.mnt, "", &env);
    fs::rename(m.path("r"), m.path("r.eio-read")).unwrap();
    assert!(is_eio(fs::read(m.path("r.eio-read"))), "a failed lower read was not EIO");
    assert!(is_eio(fs::read(m.path("plain.eio-read"))));
    assert!(fs::read(m.path("other")).unwrap() == other);
    let scrub = Command::new(BIN).arg("scrub").arg(&m.mnt).output().unwrap();
    assert!(!scrub.status.success(), "scrub missed an unreadable file");
    assert!(String::from_utf8_lossy(&scrub.stdout).contains("r.eio-read"), "{}", String::from_utf8_lossy(&scrub.stdout));
    fs::rename(m.path("r.eio-read"), m.path("r")).unwrap();
    assert!(fs::read(m.path("r")).unwrap() == data, "after the fault, the data reads back");
    // Writes: the writer hears EIO (at write, fsync or close); the data is kept, and lands once
    // the lower file can be written again.
    let w = compressible(3 << 20, 7);
    // Creating writes nothing to the lower (an empty file stays empty): the first data does.
    let mut x = fs::File::create(m.path("x.eio-write")).unwrap();
    x.write_all(b"x").unwrap();
    assert!(is_eio(x.sync_all()), "the first write to a failing file is EIO at fsync");
    drop(x);
    fs::write(m.path("w"), b"").unwrap();
    let f = OpenOptions::new().read(true).write(true).open(m.path("w")).unwrap();
    f.write_all_at(b"start", 0).unwrap();
    f.sync_all().unwrap();
    fs::rename(m.path("w"), m.path("w.eio-write")).unwrap();
    let mut acknowledged = 0;
    let mut write_failed = false;
    for (i, chunk) in w.chunks(1 << 20).enumerate() {
        if is_eio(f.write_all_at(chunk, (i << 20) as u64)) {
            write_failed = true;
            break;
        }
        acknowledged += chunk.len();
    }
    assert!(write_failed || is_eio(f.sync_all()), "a failed lower write was not reported as EIO");
    let mut back = vec![0u8; acknowledged];
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(back == w[..acknowledged], "acknowledged data is not what reads back");
    fs::rename(m.path("w.eio-write"), m.path("w")).unwrap();
    wait_until("w to be written", || f.sync_all().is_ok());
    drop(f);
    // fsync: EIO, never success.
    let s = compressible(1 << 20, 8);
    let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(m.path("s")).unwrap();
    fs::rename(m.path("s"), m.path("s.eio-sync")).unwrap();
    f.write_all(&s).unwrap();
    assert!(is_eio(f.sync_all()), "a failed lower fsync was not EIO");
    drop(f);
    fs::rename(m.path("s.eio-sync"), m.path("s")).unwrap();
    // The daemon is alive and serving.
    assert!(m.child.as_ref().is_some(), "daemon handle");
    fs::write(m.path("after"), b"still here").unwrap();
    // The file whose first write failed is held in memory since its close (umount would refuse
    // to drop it): once its lower file takes writes again, it lands.
    fs::rename(m.path("x.eio-write"), m.path("x")).unwrap();
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(fs::read(m.path("x")).unwrap(), b"x");
    assert!(fs::read(m.path("r")).unwrap() == data);
    assert!(fs::read(m.path("w")).unwrap()[..acknowledged] == w[..acknowledged]);
    assert!(fs::read(m.path("s")).unwrap() == s);
    assert_eq!(fs::read(m.path("after")).unwrap(), b"still here");
    m.unmount();
}

// ---- corrupt containers ------------------------------------------------------------------

const RS: u64 = 64 << 10; // the record size these tests write with

/// Lower offset of group 0's descriptor of `record`'s `slot` (docs/FORMAT.md).
fn descriptor_off(record: u64, slot: u64) -> u64 {
    assert!(record < 32);
    2048 + record * 64 + slot * 32
}

fn slot_off(path: &Path, record: u64, slot: u64) -> u64 {
    common::copy_offset(path, record, slot as usize)
}

fn patch(path: &Path, at: u64, f: impl FnOnce(&mut [u8])) {
    let file = OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = vec![0u8; 128];
    file.read_exact_at(&mut b, at).unwrap();
    f(&mut b);
    file.write_all_at(&b, at).unwrap();
}

fn stored_len(path: &Path, record: u64, slot: u64) -> u64 {
    common::copy_descriptor(path, record, slot as usize).1
}

/// Reads record `r` of a mounted file: Ok(bytes) or the errno.
fn read_record(path: &Path, r: u64) -> Result<Vec<u8>, i32> {
    let f = fs::File::open(path).map_err(|e| errno(&e))?;
    let mut buf = vec![0u8; RS as usize];
    let n = f.read_at(&mut buf, r * RS).map_err(|e| errno(&e))?;
    buf.truncate(n);
    Ok(buf)
}

#[test]
fn every_kind_of_corruption_is_eio_for_that_file_or_record_only_and_scrub_lists_them_all() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "recordsize=64K,compression=gzip-6");
    let data = compressible(48 * RS as usize, 11); // two groups of records
    let names = ["flip", "trunc", "zero_header", "garbage_header", "future", "descriptor", "ok"];
    for n in names {
        fs::write(m.path(n), &data).unwrap();
    }
    m.unmount();
    let lower = |n: &str| d.lower.join(n);
    // A flipped bit in record 5's stored bytes.
    let mid = slot_off(&lower("flip"), 5, 0) + stored_len(&lower("flip"), 5, 0) / 2;
    patch(&lower("flip"), mid, |b| b[0] ^= 0x10);
    // Truncated in the middle of record 20's copy: the records of group 0 (whose table is in
    // block 0) whose copies lay past the cut lose them (lengths point past EOF). Copies lie in
    // the order they landed, about the records' order.
    let cut = slot_off(&lower("trunc"), 20, 0) + 100;
    let lost: Vec<u64> = (0..32)
        .filter(|&r| {
            let (at, len) = common::copy_descriptor(&lower("trunc"), r, 0);
            at + len > cut
        })
        .collect();
    assert!(lost.contains(&20) && lost.len() > 5 && lost.len() < 25, "records cut: {lost:?}");
    OpenOptions::new().write(true).open(lower("trunc")).unwrap().set_len(cut).unwrap();
    // Both header copies zeroed, or overwritten with garbage.
    patch(&lower("zero_header"), 0, |b| b.fill(0));
    patch(&lower("garbage_header"), 0, |b| b.iter_mut().enumerate().for_each(|(i, x)| *x = (i * 37 + 11) as u8));
    // A header from a future format version (valid checksum).
    patch(&lower("future"), 0, |b| {
        for at in [0usize, 64] {
            b[at + 8] = 9;
            let crc = crc32c::crc32c(&b[at..at + 60]);
            b[at + 60..at + 64].copy_from_slice(&crc.to_le_bytes());
        }
    });
    // Record 3's descriptors damaged (a flipped bit in each slot's).
    patch(&lower("descriptor"), descriptor_off(3, 0), |b| {
        b[5] ^= 1;
        b[32 + 5] ^= 1;
    });
    let m = Mount::new(&d.lower, &d.mnt, "");
    let rec = |r: u64| data[(r * RS) as usize..((r + 1) * RS) as usize].to_vec();
    // Damage to records: EIO for those records, the others read.
    assert_eq!(read_record(&m.path("flip"), 5).map(|b| b.len()), Err(libc::EIO));
    assert_eq!(read_record(&m.path("flip"), 4).map(|b| b == rec(4)), Ok(true));
    assert_eq!(read_record(&m.path("flip"), 6).map(|b| b == rec(6)), Ok(true));
    for r in 0..32 {
        let expected = if lost.contains(&r) { Err(libc::EIO) } else { Ok(true) };
        assert_eq!(read_record(&m.path("trunc"), r).map(|b| b == rec(r)), expected, "trunc record {r}");
    }
    assert_eq!(read_record(&m.path("descriptor"), 3).map(|b| b.len()), Err(libc::EIO), "a damaged descriptor must not read as zeros");
    assert_eq!(read_record(&m.path("descriptor"), 2).map(|b| b == rec(2)), Ok(true));
    // Damage to headers: the whole file is EIO, with a clear log line.
    for n in ["zero_header", "garbage_header", "future"] {
        assert_eq!(read_record(&m.path(n), 0).map(|b| b.len()), Err(libc::EIO), "{n}");
    }
    assert!(fs::read(m.path("ok")).unwrap() == data);
    let log = m.log_text();
    let trunc_says = format!("record {}", lost[0]);
    for (file, says) in [
        ("flip", "record 5"),
        ("trunc", trunc_says.as_str()),
        ("descriptor", "record=3"),
        ("zero_header", "header is gone"),
        ("future", "format version 9"),
    ] {
        assert!(log.lines().any(|l| l.contains(file) && l.contains(says)), "no log line for {file} saying '{says}':\n{log}");
    }
    // scrub finds every damaged file (and record), and not the intact one.
    let out = Command::new(BIN).args(["scrub", "--json"]).arg(&m.mnt).output().unwrap();
    assert!(!out.status.success());
    let report = String::from_utf8_lossy(&out.stdout);
    for n in &names[..6] {
        assert!(report.contains(&format!("/{n}")), "scrub missed {n}: {report}");
    }
    assert!(!report.contains("/ok\""), "scrub blamed an intact file: {report}");
    m.unmount();
}

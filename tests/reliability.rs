//! Reliability under faults: a full lower file system, I/O errors from the lower file system,
//! corrupt containers. Each test mounts a real densefs and checks real bytes.

mod common;

use common::{compressible, random_bytes, Dirs, Mount, BIN};
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A size-limited tmpfs mounted on `dir` for the test's lifetime (the "small disk").
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    fn new(dir: &Path, size: &str) -> SmallDisk {
        let ok = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(dir).status().unwrap();
        assert!(ok.success(), "mount tmpfs (needs root)");
        SmallDisk { dir: dir.to_path_buf() }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

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
            Ok(n) => {
                assert_eq!(n, chunk.len(), "short write");
                acknowledged.extend_from_slice(&chunk);
            }
            Err(e) => return (acknowledged, errno(&e)),
        }
    }
    let e = f.sync_all().expect_err("the disk never filled");
    (acknowledged, errno(&e))
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
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
    // Fill it: the writer is told ENOSPC (at a write, or at fsync), nothing else.
    let (b, err) = fill(&m.path("b"), 100);
    assert_eq!(err, libc::ENOSPC, "expected ENOSPC, got errno {err}");
    assert!(b.len() >= 4 << 20, "filled after only {} bytes", b.len());
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

#[test]
fn a_file_closed_on_a_full_disk_keeps_its_data_until_it_can_be_written() {
    let d = Dirs::new();
    let _disk = SmallDisk::new(&d.lower, "12M");
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    let filler = random_bytes(7 << 20, 9);
    fs::write(m.path("filler"), &filler).unwrap();
    // Written, then closed: close reports ENOSPC, the data stays readable.
    let data = random_bytes(8 << 20, 10);
    let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(m.path("late")).unwrap();
    let mut acknowledged = Vec::new();
    for chunk in data.chunks(1 << 20) {
        if f.write_all(chunk).is_err() {
            break;
        }
        acknowledged.extend_from_slice(chunk);
    }
    drop(f); // close: its error, if any, is not visible through std; what matters is the data
    let mut back = Vec::new();
    fs::File::open(m.path("late")).unwrap().read_to_end(&mut back).unwrap();
    assert!(back == acknowledged, "closed file lost acknowledged data ({} of {} bytes)", back.len(), acknowledged.len());
    // Space comes back: background writeback lands it without anyone reopening the file.
    fs::remove_file(m.path("filler")).unwrap();
    wait_until("the log to say it was written", || m.log_text().contains("now written"));
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert!(fs::read(m.path("late")).unwrap() == acknowledged);
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
    assert!(is_eio(fs::write(m.path("x.eio-write"), b"x")), "creating a container on a failing file is EIO");
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
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert!(fs::read(m.path("r")).unwrap() == data);
    assert!(fs::read(m.path("w")).unwrap()[..acknowledged] == w[..acknowledged]);
    assert!(fs::read(m.path("s")).unwrap() == s);
    assert_eq!(fs::read(m.path("after")).unwrap(), b"still here");
    m.unmount();
}

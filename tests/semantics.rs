//! Everyday semantics real tools rely on (rsync, make, backups keyed on ctime): reading never
//! writes, timestamps move as on ext4 (checked against ext4 itself, in the same run), a write far
//! out costs nothing, a deleted file's space comes back, an empty file takes no space, recompress
//! never grows a file. Each test mounts a real densefs and looks at the lower files too.

mod common;

use common::{compressible, random_bytes, wait_until, Dirs, Mount, SmallDisk, BIN};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// What a backup or rsync looks at, per lower entry: times (ns), size, blocks, content.
type Snapshot = BTreeMap<PathBuf, (i64, i64, i64, i64, u64, u64, u64)>;

fn snapshot(root: &Path) -> Snapshot {
    let mut out = Snapshot::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let m = fs::symlink_metadata(&path).unwrap();
            let mut h = std::collections::hash_map::DefaultHasher::new();
            if m.is_file() {
                fs::read(&path).unwrap().hash(&mut h);
            }
            if m.is_dir() {
                stack.push(path.clone());
            }
            out.insert(
                path.strip_prefix(root).unwrap().to_path_buf(),
                (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec(), m.len(), m.blocks(), h.finish()),
            );
        }
    }
    out
}

/// A tree like users copy in: empty, small, multi-record and multi-group files, a sparse one,
/// a subdirectory, a symlink. Returns each file's contents.
fn make_tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    fs::create_dir(root.join("sub")).unwrap();
    files.insert("empty".to_string(), Vec::new());
    files.insert("small.txt".to_string(), b"hello, world\n".repeat(9));
    files.insert("three-records".to_string(), compressible(300_000, 1));
    files.insert("sub/two-groups".to_string(), compressible(5 << 20, 2));
    files.insert("sub/random".to_string(), random_bytes(200_000, 3));
    for (name, data) in &files {
        fs::write(root.join(name), data).unwrap();
    }
    let sparse = File::create(root.join("sparse")).unwrap();
    sparse.write_all_at(b"far out", 10 << 20).unwrap();
    drop(sparse);
    let mut far = vec![0u8; (10 << 20) + 7];
    far[10 << 20..].copy_from_slice(b"far out");
    files.insert("sparse".to_string(), far);
    std::os::unix::fs::symlink("small.txt", root.join("link")).unwrap();
    files
}

fn read_everything(mnt: &Path, files: &BTreeMap<String, Vec<u8>>) {
    for (name, data) in files {
        let path = mnt.join(name);
        assert!(fs::read(&path).unwrap() == *data, "{name} reads back wrong");
        fs::metadata(&path).unwrap();
        // A reader's fsync has nothing of its own to make durable.
        File::open(&path).unwrap().sync_all().unwrap();
    }
    let f = File::open(mnt.join("sparse")).unwrap();
    let at = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
    assert!(at >= 0);
    fs::read_link(mnt.join("link")).unwrap();
    assert!(fs::read_dir(mnt.join("sub")).unwrap().count() == 2);
}

#[test]
fn reading_a_tree_never_writes_the_lower_nor_moves_a_timestamp() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    let files = make_tree(&d.mnt); // closed without fsync: the next run finds copies to heal
    m.unmount();
    let before = snapshot(&d.lower);
    std::thread::sleep(Duration::from_millis(50));

    for options in ["", "ro", "noatime,compression=gzip-9"] {
        let m = Mount::new(&d.lower, &d.mnt, options);
        read_everything(&d.mnt, &files);
        if options == "ro" {
            let e = OpenOptions::new().write(true).open(m.path("small.txt")).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EROFS));
        }
        m.unmount();
        assert_eq!(snapshot(&d.lower), before, "a read-only pass (-o {options:?}) changed the lower files");
    }

    // Over a lower that is itself read-only (a read-only bind mount): rw and ro mounts read it.
    let robind = d.root.path().join("robind");
    fs::create_dir(&robind).unwrap();
    assert!(Command::new("mount").arg("--bind").arg(&d.lower).arg(&robind).status().unwrap().success());
    let remounted = Command::new("mount").args(["-o", "remount,bind,ro"]).arg(&robind).status().unwrap().success();
    let result = std::panic::catch_unwind(|| {
        assert!(remounted, "remount the bind read-only");
        for options in ["ro", ""] {
            let m = Mount::new(&robind, &d.mnt, options);
            read_everything(&d.mnt, &files);
            let e = OpenOptions::new().write(true).open(m.path("small.txt")).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EROFS), "-o {options:?} over a read-only lower");
            m.unmount();
        }
    });
    let _ = Command::new("umount").arg(&robind).status();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    assert_eq!(snapshot(&d.lower), before);
}

fn times(path: &Path) -> (i128, i128) {
    let m = fs::symlink_metadata(path).unwrap();
    (m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128, m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128)
}

fn path_c(path: &Path) -> std::ffi::CString {
    std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap()
}

/// One operation, run the same way on ext4 and through densefs.
struct Op {
    name: &'static str,
    /// The file's contents before the operation.
    initial: usize,
    run: fn(&Path, &Path),
}

fn fallocate(path: &Path, mode: i32, offset: i64, len: i64) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    assert_eq!(unsafe { libc::fallocate(f.as_raw_fd(), mode, offset, len) }, 0, "{}", std::io::Error::last_os_error());
}

const OPS: &[Op] = &[
    Op { name: "truncate(2) up from 0", initial: 0, run: |f, _| assert_eq!(unsafe { libc::truncate(path_c(f).as_ptr(), 123) }, 0) },
    Op { name: "truncate(2) up", initial: 300_000, run: |f, _| assert_eq!(unsafe { libc::truncate(path_c(f).as_ptr(), 400_000) }, 0) },
    Op { name: "truncate(2) down", initial: 300_000, run: |f, _| assert_eq!(unsafe { libc::truncate(path_c(f).as_ptr(), 123) }, 0) },
    Op { name: "truncate(2) down to 0", initial: 300_000, run: |f, _| assert_eq!(unsafe { libc::truncate(path_c(f).as_ptr(), 0) }, 0) },
    Op {
        name: "truncate(2) to the same size",
        initial: 300_000,
        run: |f, _| assert_eq!(unsafe { libc::truncate(path_c(f).as_ptr(), 300_000) }, 0),
    },
    Op { name: "ftruncate up", initial: 1000, run: |f, _| OpenOptions::new().write(true).open(f).unwrap().set_len(200_000).unwrap() },
    Op { name: "ftruncate down", initial: 300_000, run: |f, _| OpenOptions::new().write(true).open(f).unwrap().set_len(5).unwrap() },
    Op { name: "open O_TRUNC", initial: 300_000, run: |f, _| drop(OpenOptions::new().write(true).truncate(true).open(f).unwrap()) },
    Op {
        name: "open O_TRUNC of an empty file",
        initial: 0,
        run: |f, _| drop(OpenOptions::new().write(true).truncate(true).open(f).unwrap()),
    },
    Op {
        name: "open O_RDONLY|O_TRUNC (Linux truncates)",
        initial: 300_000,
        run: |f, _| {
            drop(OpenOptions::new().read(true).custom_flags(libc::O_TRUNC).open(f).unwrap());
            assert_eq!(fs::metadata(f).unwrap().len(), 0);
        },
    },
    Op { name: "fallocate growing", initial: 1000, run: |f, _| fallocate(f, 0, 0, 300_000) },
    Op { name: "fallocate keep size", initial: 300_000, run: |f, _| fallocate(f, libc::FALLOC_FL_KEEP_SIZE, 400_000, 100_000) },
    Op {
        name: "punch hole",
        initial: 300_000,
        run: |f, _| fallocate(f, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 0, 131072),
    },
    Op { name: "zero range", initial: 300_000, run: |f, _| fallocate(f, libc::FALLOC_FL_ZERO_RANGE, 4096, 8192) },
    Op { name: "link", initial: 1000, run: |f, dir| fs::hard_link(f, dir.join("another-name")).unwrap() },
    Op { name: "chmod", initial: 1000, run: |f, _| fs::set_permissions(f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap() },
    Op {
        name: "write, then utimensat setting atime only while the write is still open",
        initial: 300_000,
        run: |f, _| {
            let file = OpenOptions::new().write(true).open(f).unwrap();
            file.write_all_at(&[7u8; 200_000], 50_000).unwrap();
            let before = times(f).0;
            std::thread::sleep(Duration::from_millis(30));
            let ts = [libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW }, libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT }];
            assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, path_c(f).as_ptr(), ts.as_ptr(), 0) }, 0);
            assert_eq!(times(f).0, before, "UTIME_OMIT moved mtime");
            drop(file);
            assert_eq!(times(f).0, before, "closing moved the mtime of the last write");
        },
    },
    Op {
        name: "write, then set the mtime while the file is open (tar, cp -p), then close",
        initial: 300_000,
        run: |f, _| {
            let file = OpenOptions::new().write(true).open(f).unwrap();
            file.write_all_at(&[7u8; 200_000], 50_000).unwrap();
            let set = std::time::UNIX_EPOCH + Duration::new(1_000_000_000, 123_456_789);
            file.set_modified(set).unwrap();
            assert_eq!(fs::metadata(f).unwrap().modified().unwrap(), set, "the mtime set while open");
            drop(file);
            assert_eq!(fs::metadata(f).unwrap().modified().unwrap(), set, "closing moved the mtime set");
        },
    },
];

#[test]
fn timestamps_move_as_on_ext4_and_never_for_writes_the_user_did_not_make() {
    let d = Dirs::new();
    let plain = d.root.path().join("ext4");
    fs::create_dir(&plain).unwrap();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,recordsize=128K");
    let mut after_op = Vec::new();
    for (i, op) in OPS.iter().enumerate() {
        let mut changed = Vec::new();
        for base in [&plain, &d.mnt] {
            let dir = base.join(format!("op{i}"));
            fs::create_dir(&dir).unwrap();
            let file = dir.join("f");
            fs::write(&file, compressible(op.initial, i as u64)).unwrap();
            let (m0, c0) = times(&file);
            std::thread::sleep(Duration::from_millis(30));
            (op.run)(&file, &dir);
            let (m1, c1) = times(&file); // right after: no waiting for caches
            changed.push((m1 != m0, c1 != c0));
            if base == &d.mnt {
                after_op.push((op.name, file, m1));
            }
        }
        assert_eq!(changed[1], changed[0], "{}: (mtime changed, ctime changed) through densefs vs ext4", op.name);
    }
    // Closed, written back, the attribute cache expired, remounted: the mtime stays the user's.
    std::thread::sleep(Duration::from_millis(1100));
    for (name, file, mtime) in &after_op {
        assert_eq!(times(file).0, *mtime, "{name}: mtime moved after the operation");
    }
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    for (name, file, mtime) in &after_op {
        assert_eq!(times(file).0, *mtime, "{name}: mtime moved across a remount");
    }
    m.unmount();
}

#[test]
fn landing_fsync_punching_and_recompress_keep_the_users_mtime_and_blksize_stays() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,recordsize=64K");
    let path = m.path("f");
    let mut f = File::create(&path).unwrap();
    for chunk in compressible(3 << 20, 4).chunks(100_000) {
        f.write_all(chunk).unwrap();
    }
    let written = times(&path).0;
    let blksize = fs::metadata(&path).unwrap().blksize();
    std::thread::sleep(Duration::from_millis(50));
    f.sync_all().unwrap();
    assert_eq!(times(&path).0, written, "fsync moved mtime");
    // Rewriting a record leaves an old copy, freed at close or by the writeback tick after an
    // fsync (not a user write).
    f.write_all_at(b"rewritten", 10).unwrap();
    let rewritten = times(&path).0;
    assert!(rewritten > written);
    std::thread::sleep(Duration::from_millis(50));
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(times(&path).0, rewritten, "fsync/close moved mtime");
    assert_eq!(fs::metadata(&path).unwrap().blksize(), blksize, "st_blksize changed at close");
    fs::rename(&path, m.path("g")).unwrap();
    assert_eq!(fs::metadata(m.path("g")).unwrap().blksize(), blksize, "st_blksize changed at rename");
    std::thread::sleep(Duration::from_millis(50));
    let out = Command::new(BIN).args(["recompress", "-o", "compression=gzip-9"]).arg(m.path("g")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(times(&m.path("g")).0, rewritten, "recompress moved mtime");
    assert_eq!(times(&d.lower.join("g")).0, rewritten, "recompress moved the lower's mtime");
    m.unmount();
}

fn seek(f: &File, offset: i64, whence: i32) -> Result<i64, i32> {
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset, whence) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(r)
    }
}

fn assert_quick<T>(what: &str, limit: Duration, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    assert!(start.elapsed() < limit, "{what} took {:?}", start.elapsed());
    out
}

/// Writes 4 KiB at `far` and checks SEEK_DATA/SEEK_HOLE, fsync, reopen, stat and scrub all cost
/// in proportion to the data, not the offset.
fn far_write_is_cheap(m: &Mount, far: u64) {
    let path = m.path("far");
    let data = random_bytes(4096, 5);
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    f.write_all_at(&data, far).unwrap();
    let limit = Duration::from_secs(5);
    assert_quick("SEEK_DATA in memory", limit, || assert_eq!(seek(&f, 0, libc::SEEK_DATA), Ok(far as i64)));
    assert_quick("fsync", limit, || f.sync_all().unwrap());
    drop(f);
    let f = File::open(&path).unwrap();
    assert_quick("SEEK_DATA", limit, || assert_eq!(seek(&f, 0, libc::SEEK_DATA), Ok(far as i64)));
    assert_eq!(seek(&f, 0, libc::SEEK_HOLE), Ok(0));
    assert_eq!(seek(&f, far as i64, libc::SEEK_HOLE), Ok(far as i64 + 4096));
    assert_eq!(seek(&f, far as i64 + 4096, libc::SEEK_DATA), Err(libc::ENXIO));
    let mut back = vec![0u8; 4096];
    f.read_exact_at(&mut back, far).unwrap();
    assert!(back == data);
    drop(f);
    for cmd in ["stat", "scrub"] {
        let out = assert_quick(cmd, Duration::from_secs(10), || Command::new(BIN).arg(cmd).arg(&path).output().unwrap());
        assert!(out.status.success(), "{cmd}: {}", String::from_utf8_lossy(&out.stdout));
    }
    assert_quick("truncate", limit, || OpenOptions::new().write(true).open(&path).unwrap().set_len(far / 2).unwrap());
    assert_eq!(seek(&File::open(&path).unwrap(), 0, libc::SEEK_DATA), Err(libc::ENXIO));
}

#[test]
fn a_write_far_out_costs_in_proportion_to_the_data_not_the_offset() {
    // ext4 (this machine's /tmp): 4 TiB out fits the lower; 2^50 does not, and the write is
    // refused at once with EFBIG, as ext4 itself refuses it.
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "recordsize=128K");
    far_write_is_cheap(&m, 1 << 42);
    let plain = File::create(d.root.path().join("plain")).unwrap();
    let ext4 = plain.write_at(b"x", 1 << 50).unwrap_err().raw_os_error();
    let f = File::create(m.path("too-far")).unwrap();
    let ours = assert_quick("refusing", Duration::from_secs(5), || f.write_at(b"x", 1 << 50).unwrap_err().raw_os_error());
    assert_eq!((ours, ext4), (Some(libc::EFBIG), Some(libc::EFBIG)));
    drop(f);
    m.unmount();

    // tmpfs holds 2^50 (its limit is 2^63).
    let d = Dirs::new();
    let _disk = SmallDisk::new(&d.lower, "64M");
    let m = Mount::new(&d.lower, &d.mnt, "recordsize=4K");
    far_write_is_cheap(&m, 1 << 50);
    m.unmount();
}

#[test]
fn sigterm_ends_the_daemon_cleanly_with_open_files_written_back() {
    let d = Dirs::new();
    let mut m = Mount::new(&d.lower, &d.mnt, "");
    let data = compressible(3 << 20, 6);
    let mut f = File::create(m.path("open")).unwrap();
    f.write_all(&data).unwrap(); // never closed before the signal
    let pid = m.child.as_ref().unwrap().id() as i32;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = m.child.as_mut().unwrap().try_wait().unwrap() {
            break status;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the daemon ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    m.child = None;
    drop(f);
    assert!(status.success(), "daemon exit: {status}");
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert!(fs::read(m.path("open")).unwrap() == data, "data of a file open at SIGTERM was lost");
    m.unmount();
}

fn free_bytes(path: &Path) -> u64 {
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(path_c(path).as_ptr(), &mut sv) }, 0);
    sv.f_bavail * sv.f_frsize
}

/// Bytes the daemon has passed to write system calls (/proc/PID/io's wchar).
fn daemon_bytes_written(m: &Mount) -> u64 {
    let pid = m.child.as_ref().expect("daemon running").id();
    let io = fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines().find_map(|l| l.strip_prefix("wchar: ")).expect("wchar").trim().parse().unwrap()
}

/// Fills the disk through `path` with incompressible data and closes it (close fails: the data
/// that could not land stays in the daemon's memory).
fn fill_and_close(path: &Path) {
    let mut f = File::create(path).unwrap();
    for i in 0..40 {
        if f.write_all(&random_bytes(1 << 20, 100 + i)).is_err() {
            break;
        }
    }
    drop(f);
}

#[test]
fn deleting_or_truncating_the_file_that_filled_the_disk_gives_the_space_back() {
    let d = Dirs::new();
    let _disk = SmallDisk::new(&d.lower, "16M");
    {
        let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
        let empty = free_bytes(&d.lower);
        fill_and_close(&m.path("filler"));
        assert!(free_bytes(&d.lower) < 1 << 20, "the disk did not fill");
        fs::remove_file(m.path("filler")).unwrap();
        wait_until("space after unlink", || free_bytes(&d.lower) > empty - (1 << 20));

        fill_and_close(&m.path("filler2"));
        assert!(free_bytes(&d.lower) < 1 << 20);
        assert_eq!(unsafe { libc::truncate(path_c(&m.path("filler2")).as_ptr(), 0) }, 0);
        wait_until("space after truncate", || free_bytes(&d.lower) > empty - (1 << 20));
        assert_eq!(fs::read(m.path("filler2")).unwrap().len(), 0);

        // Unlinked while still open: closing writes nothing back (the daemon's write syscalls
        // carry at most replies and a header across the unlink and the close).
        let mut f = File::create(m.path("temp")).unwrap();
        // Its last record (100 KiB of a 128 KiB one) stays in memory until the close.
        f.write_all(&random_bytes((4 << 20) + (100 << 10), 7)).unwrap();
        // The 32 full records land in the background; count from when they have (random data
        // is stored raw, and tmpfs allocates as it is written).
        wait_until("the full records to land", || fs::metadata(d.lower.join("temp")).unwrap().blocks() * 512 >= 4 << 20);
        let written = || daemon_bytes_written(&m);
        let before = written();
        fs::remove_file(m.path("temp")).unwrap();
        drop(f);
        let at_close = written() - before;
        assert!(at_close < 16 << 10, "closing an unlinked file wrote {at_close} bytes");
        wait_until("space after closing an unlinked file", || free_bytes(&d.lower) > empty - (1 << 20));
        m.unmount();
    }
}

/// `cp --sparse=always` punches every hole it leaves, up to the end of the file: punching what
/// is a hole already must write nothing (it once wrote a cleared descriptor for each record,
/// 5 MB and a lower file twice as long for a 10 GiB file). Punching data frees its space.
#[test]
fn punching_a_hole_over_holes_writes_nothing_and_over_data_frees_it() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "recordsize=128K");
    let (path, lower) = (m.path("sparse"), d.lower.join("sparse"));
    let far = 5u64 << 30;
    {
        let f = File::create(&path).unwrap();
        f.set_len(2 * far).unwrap();
        f.write_all_at(b"tail\n", far).unwrap();
        f.sync_all().unwrap();
    }
    let lower_before = fs::metadata(&lower).unwrap();
    let before = daemon_bytes_written(&m);
    let record = 128 << 10;
    fallocate(&path, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, (far + record) as i64, (far - record) as i64);
    fallocate(&path, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 0, far as i64);
    File::open(&path).unwrap().sync_all().unwrap();
    let written = daemon_bytes_written(&m) - before;
    let lower_after = fs::metadata(&lower).unwrap();
    assert!(written < 64 << 10, "punching holes wrote {written} bytes");
    assert_eq!((lower_after.len(), lower_after.blocks()), (lower_before.len(), lower_before.blocks()));
    let f = File::open(&path).unwrap();
    assert_eq!(seek(&f, 0, libc::SEEK_DATA), Ok(far as i64));
    let mut tail = [0u8; 5];
    f.read_exact_at(&mut tail, far).unwrap();
    assert_eq!(&tail, b"tail\n");
    drop(f);

    // Over data: the bytes read as zeros, the edges keep theirs, the space comes back.
    let data = random_bytes(8 << 20, 11);
    fs::write(m.path("full"), &data).unwrap();
    File::open(m.path("full")).unwrap().sync_all().unwrap();
    assert!(fs::metadata(d.lower.join("full")).unwrap().blocks() * 512 >= 8 << 20);
    fallocate(&m.path("full"), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 4096, (8 << 20) - 8192);
    File::open(m.path("full")).unwrap().sync_all().unwrap();
    let back = fs::read(m.path("full")).unwrap();
    assert_eq!(back.len(), data.len());
    assert!(back[..4096] == data[..4096] && back[back.len() - 4096..] == data[data.len() - 4096..]);
    assert!(back[4096..back.len() - 4096].iter().all(|&b| b == 0));
    wait_until("space after punching data", || fs::metadata(d.lower.join("full")).unwrap().blocks() * 512 < 1 << 20);
    m.unmount();
}

/// The kernel does not wait for RELEASE: a stat right after close(2) races the daemon writing the
/// file back. Here that last close empties the file (an `O_RDONLY|O_TRUNC` open emptied it in
/// memory), and the lookup the next open makes must show it empty, not the lower's old length.
#[test]
fn a_stat_right_after_the_last_close_shows_what_that_close_wrote() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=off,recordsize=64K");
    let path = m.path("f");
    let data = random_bytes(600_000, 3);
    let mut stale = vec![];
    for round in 0..300 {
        let f = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).unwrap();
        f.write_all_at(&data, 0).unwrap();
        f.sync_all().unwrap();
        drop(f);
        drop(OpenOptions::new().read(true).custom_flags(libc::O_TRUNC).open(&path).unwrap());
        let exists = OpenOptions::new().write(true).create_new(true).open(&path).unwrap_err();
        assert_eq!(exists.raw_os_error(), Some(libc::EEXIST));
        let size = fs::metadata(&path).unwrap().len();
        if size != 0 {
            stale.push((round, size));
        }
    }
    assert!(stale.is_empty(), "emptied, then shown with a size in {} of 300 rounds: {stale:?}", stale.len());
    m.unmount();
}

#[test]
fn an_empty_file_takes_no_space_and_recompress_never_grows_a_file() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    File::create(m.path("empty")).unwrap();
    OpenOptions::new().read(true).write(true).open(m.path("empty")).unwrap();
    fs::write(m.path("emptied"), compressible(500_000, 8)).unwrap();
    File::create(m.path("emptied")).unwrap(); // O_TRUNC, as `: > file`
    for name in ["empty", "emptied"] {
        let lower = fs::metadata(d.lower.join(name)).unwrap();
        assert_eq!((lower.len(), lower.blocks()), (0, 0), "{name} takes lower space");
        assert_eq!(fs::metadata(m.path(name)).unwrap().len(), 0);
    }

    // Small text files like a C header tree, and a multi-record one, written with lz4.
    fs::create_dir(m.path("include")).unwrap();
    let mut contents = BTreeMap::new();
    for i in 0..60u64 {
        let len = [40, 300, 1500, 2100, 2500, 6000, 40_000, 400_000][i as usize % 8];
        let text = compressible(len, 1000 + i);
        let name = format!("include/h{i}.h");
        fs::write(m.path(&name), &text).unwrap();
        contents.insert(name, text);
    }
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let before = snapshot(&d.lower.join("include"));
    let out = Command::new(BIN).args(["recompress", "-r", "-o", "compression=gzip-9"]).arg(m.path("include")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let after = snapshot(&d.lower.join("include"));
    let mut shrunk = 0;
    for (name, b) in &before {
        let a = &after[name];
        assert!(a.5 <= b.5, "{name:?}: {} blocks after recompress, {} before", a.5, b.5);
        if b.4 <= 128 * 1024 {
            assert!(a.4 <= b.4, "{name:?}: lower length {} after recompress, {} before", a.4, b.4);
        }
        shrunk += (a.5 < b.5) as u32;
    }
    assert!(shrunk > 0, "gzip-9 saved nothing anywhere");
    for (name, data) in &contents {
        assert!(fs::read(m.path(name)).unwrap() == *data, "{name} changed");
    }
    m.unmount();
}

/// The mount's blocks and ctime of `name` against the lower file's.
fn attrs_match_lower(m: &Mount, name: &str) -> Result<(), String> {
    let (upper, lower) = (fs::metadata(m.path(name)).unwrap(), fs::metadata(m.lower.join(name)).unwrap());
    let (u, l) = ((upper.blocks(), upper.ctime(), upper.ctime_nsec()), (lower.blocks(), lower.ctime(), lower.ctime_nsec()));
    if u == l {
        Ok(())
    } else {
        Err(format!("{name}: (blocks, ctime s, ns) {u:?} through the mount, {l:?} on the lower"))
    }
}

/// A writable mount lets the kernel keep attributes for long, so what the daemon writes on its
/// own after a reply (the records a close lands, the writeback tick's landings, a recompress)
/// must make the kernel drop the attributes it got before: `du` right after `tar` or `cp -p`
/// (both set attributes before the close) shows what the lower holds.
#[test]
fn attributes_handed_out_before_the_daemon_writes_on_its_own_are_dropped() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    let data = compressible(60_000, 21); // less than a record: it lands at close
    let mut stale = vec![];
    for i in 0..20 {
        let name = format!("f{i}");
        let f = File::create(m.path(&name)).unwrap();
        f.write_all_at(&data, 0).unwrap();
        if i % 2 == 0 {
            f.metadata().unwrap(); // GETATTR before the close
        } else {
            f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
            // SETATTR, as tar does
        }
        drop(f);
        stale.extend(attrs_match_lower(&m, &name).err());
    }
    assert!(stale.is_empty(), "attributes from before the close's landing kept: {stale:?}");

    // Kept open: the writeback tick lands the records, and the mount follows.
    let f = File::create(m.path("open")).unwrap();
    f.write_all_at(&data, 0).unwrap();
    f.metadata().unwrap();
    wait_until("the writeback tick to land the open file", || fs::metadata(d.lower.join("open")).unwrap().blocks() > 0);
    wait_until("the mount to show the landed blocks of the open file", || attrs_match_lower(&m, "open").is_ok());
    drop(f);
    attrs_match_lower(&m, "open").unwrap();

    let before = fs::metadata(m.path("f0")).unwrap().blocks();
    let out = Command::new(BIN).args(["recompress", "-o", "compression=gzip-9"]).arg(m.path("f0")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    attrs_match_lower(&m, "f0").unwrap();
    assert!(fs::metadata(m.path("f0")).unwrap().blocks() < before, "gzip-9 took no less than lz4");

    // Another record size moves the file into a new lower file under its name: the kernel's
    // entry for the name must not keep leading to the old one (an append would be lost).
    let out = Command::new(BIN).args(["recompress", "-o", "recordsize=16K"]).arg(m.path("f1")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    OpenOptions::new().append(true).open(m.path("f1")).unwrap().write_all(b"appended").unwrap();
    // The kernel does not wait for RELEASE, whose sync frees the rewritten record's old copy.
    wait_until("the mount to show f1's blocks after the append", || attrs_match_lower(&m, "f1").is_ok());
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let back = fs::read(m.path("f1")).unwrap();
    assert!(back.len() == data.len() + 8 && back.ends_with(b"appended"), "{} bytes read back", back.len());
    m.unmount();
}

/// A writable mount is the lower's only writer, so the kernel keeps names and attributes
/// (a warm `stat` asks the daemon nothing); a read-only one may look at a lower another
/// machine writes, so it asks again after a second. Seen here by changing the lower behind
/// the mounts' backs (which users must not do to a writable mount).
#[test]
fn a_writable_mount_keeps_attributes_and_a_read_only_one_asks_again() {
    use std::os::unix::fs::PermissionsExt;
    let d = Dirs::new();
    fs::write(d.lower.join("plain"), b"not a container").unwrap();
    fs::set_permissions(d.lower.join("plain"), fs::Permissions::from_mode(0o644)).unwrap();
    for (options, follows) in [("", false), ("ro", true)] {
        let m = Mount::new(&d.lower, &d.mnt, options);
        assert_eq!(fs::metadata(m.path("plain")).unwrap().mode() & 0o777, 0o644);
        fs::set_permissions(d.lower.join("plain"), fs::Permissions::from_mode(0o600)).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let seen = fs::metadata(m.path("plain")).unwrap().mode() & 0o777;
        assert_eq!(seen, if follows { 0o600 } else { 0o644 }, "-o {options:?}: mode {seen:o} 1.5 s after the lower changed");
        fs::set_permissions(d.lower.join("plain"), fs::Permissions::from_mode(0o644)).unwrap();
        m.unmount();
    }
}

/// Names and inode numbers of a directory as readdir gives them.
fn listing(dir: &Path) -> BTreeMap<String, u64> {
    use std::os::unix::fs::DirEntryExt;
    fs::read_dir(dir).unwrap().map(|e| e.unwrap()).map(|e| (e.file_name().into_string().unwrap(), e.ino())).collect()
}

/// A writable mount lets the kernel keep directory listings: each listing must still show
/// every change made through the mount since the last, and the inode number each name leads
/// to now, also after a recompress moved a file into a new lower file under its name.
#[test]
fn listings_the_kernel_keeps_follow_every_change() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    let dir = m.path("d");
    fs::create_dir(&dir).unwrap();
    let data = compressible(50_000, 5);
    for i in 0..40 {
        fs::write(dir.join(format!("f{i}")), &data).unwrap();
    }
    let agrees = |when: &str| {
        let listed = listing(&dir);
        let lower: std::collections::BTreeSet<String> =
            fs::read_dir(d.lower.join("d")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(listed.keys().cloned().collect::<std::collections::BTreeSet<_>>(), lower, "{when}: names listed");
        for (name, ino) in &listed {
            let st = fs::symlink_metadata(dir.join(name)).unwrap();
            assert_eq!(*ino, st.ino(), "{when}: {name} listed with another inode than stat gives");
        }
    };
    agrees("first listing");
    agrees("second listing");
    fs::write(dir.join("new"), b"x").unwrap();
    agrees("after a create");
    fs::remove_file(dir.join("f3")).unwrap();
    agrees("after an unlink");
    fs::rename(dir.join("f4"), dir.join("f4-renamed")).unwrap();
    agrees("after a rename");
    fs::rename(dir.join("f5"), m.path("f5-moved-out")).unwrap();
    agrees("after a rename out");
    fs::rename(dir.join("f6"), dir.join("f7")).unwrap();
    agrees("after a rename over a name");
    fs::hard_link(dir.join("f8"), dir.join("f8-link")).unwrap();
    std::os::unix::fs::symlink("f9", dir.join("f9-link")).unwrap();
    fs::create_dir(dir.join("sub")).unwrap();
    agrees("after link, symlink and mkdir");
    fs::remove_dir(dir.join("sub")).unwrap();
    agrees("after rmdir");
    let old = listing(&dir)["f10"];
    let out = Command::new(BIN).args(["recompress", "-o", "recordsize=16K"]).arg(dir.join("f10")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_ne!(fs::metadata(dir.join("f10")).unwrap().ino(), old, "recompress kept the lower inode");
    agrees("after a recompress into a new lower file");
    assert_eq!(fs::read(dir.join("f10")).unwrap(), data);
    m.unmount();
}

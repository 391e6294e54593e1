//! Integration tests on real FUSE mounts: what a user of a local file system expects.

mod common;

use common::{compressible, random_bytes, wait_until, Dirs, Mount, BIN};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::process::Command;

fn lower_blocks(path: &std::path::Path) -> u64 {
    fs::metadata(path).unwrap().blocks()
}

#[test]
fn copy_in_compresses_reads_back_and_reports_physical_blocks() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=gzip-6,recordsize=128K");
    let data = compressible(8 << 20, 1);
    fs::write(m.path("reads.fastq"), &data).unwrap();
    assert_eq!(fs::read(m.path("reads.fastq")).unwrap(), data);
    // Let the lower file system allocate what it delayed (its extent blocks count in st_blocks
    // from then on): the daemon's writeback tick sees the change and the mount follows.
    Command::new("sync").status().unwrap();
    let meta = fs::metadata(m.path("reads.fastq")).unwrap();
    assert_eq!(meta.len(), data.len() as u64);
    let physical = lower_blocks(&d.lower.join("reads.fastq")) * 512;
    assert!(physical * 2 < data.len() as u64, "compressed to {physical} bytes only");
    wait_until("du through the mount to show the lower's blocks", || {
        fs::metadata(m.path("reads.fastq")).unwrap().blocks() == lower_blocks(&d.lower.join("reads.fastq"))
    });
    // The lower file is a container, not the plain bytes.
    let raw = fs::read(d.lower.join("reads.fastq")).unwrap();
    assert_eq!(&raw[..8], b"DENSEFS\0");
    m.unmount();
}

#[test]
fn plain_files_already_in_the_lower_directory_are_served_and_stay_plain() {
    let d = Dirs::new();
    let before = random_bytes(300_000, 9);
    fs::write(d.lower.join("old.bin"), &before).unwrap();
    fs::create_dir(d.lower.join("olddir")).unwrap();
    fs::write(d.lower.join("olddir/notes.txt"), b"kept as is\n").unwrap();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(fs::read(m.path("old.bin")).unwrap(), before);
    assert_eq!(fs::read(m.path("olddir/notes.txt")).unwrap(), b"kept as is\n");
    let mut f = OpenOptions::new().append(true).open(m.path("olddir/notes.txt")).unwrap();
    f.write_all(b"appended\n").unwrap();
    drop(f);
    assert_eq!(fs::read(d.lower.join("olddir/notes.txt")).unwrap(), b"kept as is\nappended\n");
    m.unmount();
    assert_eq!(fs::read(d.lower.join("old.bin")).unwrap(), before);
}

#[test]
fn files_keep_their_settings_across_remounts_with_other_options() {
    let d = Dirs::new();
    let a = compressible(1 << 20, 2);
    let m = Mount::new(&d.lower, &d.mnt, "compression=gzip-9,recordsize=4K,checksum=xxh3");
    fs::write(m.path("a"), &a).unwrap();
    m.unmount();
    let header = common::current_header(&d.lower.join("a"));
    assert_eq!(header[10], 12, "record shift of 4K");
    assert_eq!(header[12], 2, "deflate codec");
    let m = Mount::new(&d.lower, &d.mnt, "compression=off,recordsize=1M");
    assert_eq!(fs::read(m.path("a")).unwrap(), a);
    // Rewriting part of the old file keeps its own settings.
    File::options().write(true).open(m.path("a")).unwrap().write_all_at(b"XYZ", 5000).unwrap();
    fs::write(m.path("b"), &a).unwrap();
    m.unmount();
    let raw_a = common::current_header(&d.lower.join("a"));
    let raw_b = common::current_header(&d.lower.join("b"));
    assert_eq!((raw_a[10], raw_a[12]), (12, 2));
    assert_eq!((raw_b[10], raw_b[12]), (20, 0));
    let m = Mount::new(&d.lower, &d.mnt, "");
    let mut expect = a.clone();
    expect[5000..5003].copy_from_slice(b"XYZ");
    assert_eq!(fs::read(m.path("a")).unwrap(), expect);
    assert_eq!(fs::read(m.path("b")).unwrap(), a);
    m.unmount();
}

#[test]
fn sparse_files_use_no_space_and_report_holes() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "recordsize=64K");
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.path("sparse")).unwrap();
    f.set_len(1 << 30).unwrap();
    f.write_all_at(b"data in the middle", 512 << 20).unwrap();
    f.sync_all().unwrap();
    let meta = fs::metadata(m.path("sparse")).unwrap();
    assert_eq!(meta.len(), 1 << 30);
    assert!(meta.blocks() * 512 < 1 << 20, "a 1 GiB sparse file uses {} blocks", meta.blocks());
    let fd = f.as_raw_fd();
    let data = unsafe { libc::lseek(fd, 0, libc::SEEK_DATA) };
    assert_eq!(data, 512 << 20);
    let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
    assert_eq!(hole, (512 << 20) + (64 << 10));
    let mut buf = vec![1u8; 4096];
    f.read_exact_at(&mut buf, 4096).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    // Zeros written explicitly also become holes.
    f.write_all_at(&vec![0u8; 256 << 10], 0).unwrap();
    f.sync_all().unwrap();
    assert!(fs::metadata(m.path("sparse")).unwrap().blocks() * 512 < 1 << 20);
    drop(f);
    m.unmount();
}

#[test]
fn truncate_append_fallocate_and_mmap_behave_like_a_local_file() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "recordsize=4K,compression=zstd-1");
    let p = m.path("f");
    let mut expect = compressible(50_000, 3);
    fs::write(&p, &expect).unwrap();
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    f.set_len(10_001).unwrap();
    expect.truncate(10_001);
    f.set_len(20_000).unwrap();
    expect.resize(20_000, 0);
    assert_eq!(fs::read(&p).unwrap(), expect);
    let mut app = OpenOptions::new().append(true).open(&p).unwrap();
    app.write_all(b"tail").unwrap();
    expect.extend_from_slice(b"tail");
    let r = unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 100, 9000) };
    assert_eq!(r, 0);
    expect[100..9100].fill(0);
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 30_000) };
    assert_eq!(r, 0);
    expect.resize(30_000, 0);
    assert_eq!(fs::read(&p).unwrap(), expect);
    {
        let mut map = unsafe { memmap2::MmapMut::map_mut(&f).unwrap() };
        map[20_000..20_005].copy_from_slice(b"mmap!");
        map.flush().unwrap();
    }
    expect[20_000..20_005].copy_from_slice(b"mmap!");
    drop(f);
    drop(app);
    assert_eq!(fs::read(&p).unwrap(), expect);
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(fs::read(m.path("f")).unwrap(), expect);
    m.unmount();
}

#[test]
fn names_links_modes_xattrs_and_special_files_pass_through() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    fs::create_dir_all(m.path("a/b")).unwrap();
    fs::write(m.path("a/b/file"), b"hello").unwrap();
    std::os::unix::fs::symlink("b/file", m.path("a/link")).unwrap();
    assert_eq!(fs::read(m.path("a/link")).unwrap(), b"hello");
    assert_eq!(fs::read_link(m.path("a/link")).unwrap().to_str(), Some("b/file"));
    fs::hard_link(m.path("a/b/file"), m.path("a/hard")).unwrap();
    let (m1, m2) = (fs::metadata(m.path("a/b/file")).unwrap(), fs::metadata(m.path("a/hard")).unwrap());
    assert_eq!((m1.ino(), m1.nlink()), (m2.ino(), 2));
    assert_eq!(m1.ino(), fs::metadata(d.lower.join("a/b/file")).unwrap().ino(), "inode numbers follow the lower");
    fs::set_permissions(m.path("a/b/file"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(d.lower.join("a/b/file")).unwrap().mode() & 0o7777, 0o640);
    let status = Command::new("setfattr").args(["-n", "user.color", "-v", "blue"]).arg(m.path("a/b/file")).status();
    if status.map(|s| s.success()).unwrap_or(false) {
        let out = Command::new("getfattr").args(["--only-values", "-n", "user.color"]).arg(m.path("a/b/file")).output().unwrap();
        assert_eq!(out.stdout, b"blue");
    }
    let fifo = std::ffi::CString::new(m.path("a/fifo").to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    assert!(fs::metadata(d.lower.join("a/fifo")).unwrap().file_type().is_fifo_like());
    // rename with RENAME_NOREPLACE and RENAME_EXCHANGE
    fs::write(m.path("x"), b"X").unwrap();
    fs::write(m.path("y"), b"Y").unwrap();
    let cx = std::ffi::CString::new(m.path("x").to_str().unwrap()).unwrap();
    let cy = std::ffi::CString::new(m.path("y").to_str().unwrap()).unwrap();
    let r = unsafe { libc::renameat2(libc::AT_FDCWD, cx.as_ptr(), libc::AT_FDCWD, cy.as_ptr(), libc::RENAME_NOREPLACE) };
    assert_eq!((r, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::EEXIST)));
    let r = unsafe { libc::renameat2(libc::AT_FDCWD, cx.as_ptr(), libc::AT_FDCWD, cy.as_ptr(), libc::RENAME_EXCHANGE) };
    assert_eq!(r, 0);
    assert_eq!(fs::read(m.path("x")).unwrap(), b"Y");
    assert_eq!(fs::read(m.path("y")).unwrap(), b"X");
    fs::rename(m.path("x"), m.path("a/b/moved")).unwrap();
    assert!(fs::read(d.lower.join("a/b/moved")).is_ok());
    let mut names: Vec<_> = fs::read_dir(m.path("a")).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["b", "fifo", "hard", "link"]);
    fs::remove_file(m.path("a/hard")).unwrap();
    fs::remove_dir(m.path("a/b")).unwrap_err();
    m.unmount();
}

trait FifoLike {
    fn is_fifo_like(&self) -> bool;
}
impl FifoLike for fs::FileType {
    fn is_fifo_like(&self) -> bool {
        std::os::unix::fs::FileTypeExt::is_fifo(self)
    }
}

#[test]
fn permissions_are_enforced_for_other_users() {
    let d = Dirs::new();
    // The test tree must be reachable by "nobody" for the check to mean anything.
    fs::set_permissions(d.root.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let m = Mount::new(&d.lower, &d.mnt, "");
    fs::write(m.path("secret"), b"root only").unwrap();
    fs::set_permissions(m.path("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(m.path("public"), b"everyone").unwrap();
    fs::set_permissions(m.path("public"), fs::Permissions::from_mode(0o644)).unwrap();
    let as_nobody = |file: &str| Command::new("runuser").args(["-u", "nobody", "--", "cat"]).arg(m.path(file)).output().expect("runuser");
    let denied = as_nobody("secret");
    assert!(!denied.status.success());
    assert!(String::from_utf8_lossy(&denied.stderr).contains("Permission denied"));
    assert_eq!(as_nobody("public").stdout, b"everyone");
    // Files created by a user belong to that user.
    fs::set_permissions(&d.mnt, fs::Permissions::from_mode(0o777)).unwrap();
    let made = Command::new("runuser").args(["-u", "nobody", "--", "touch"]).arg(m.path("mine")).status().unwrap();
    assert!(made.success());
    let nobody_uid = fs::metadata(m.path("mine")).unwrap().uid();
    assert_ne!(nobody_uid, 0);
    m.unmount();
}

#[test]
fn a_corrupt_record_gives_eio_for_that_record_only_and_is_logged() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "recordsize=4K,compression=lz4");
    let data = compressible(64 << 10, 5);
    fs::write(m.path("victim"), &data).unwrap();
    m.unmount();
    // A byte of record 3's copy (slot 0: the file was written once).
    let slot_off = common::copy_offset(&d.lower.join("victim"), 3, 0) + 10;
    let lower_file = OpenOptions::new().read(true).write(true).open(d.lower.join("victim")).unwrap();
    let mut b = [0u8; 1];
    lower_file.read_exact_at(&mut b, slot_off).unwrap();
    lower_file.write_all_at(&[b[0] ^ 0x40], slot_off).unwrap();
    drop(lower_file);
    let m = Mount::new(&d.lower, &d.mnt, "");
    let f = File::open(m.path("victim")).unwrap();
    let mut buf = vec![0u8; 4096];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, data[..4096]);
    let err = f.read_exact_at(&mut buf, 3 * 4096).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    f.read_exact_at(&mut buf, 4 * 4096).unwrap();
    assert_eq!(buf, data[4 * 4096..5 * 4096]);
    let log = m.log_text();
    assert!(log.contains("victim") && log.contains("record") && log.contains('3'), "log: {log}");
    drop(f);
    m.unmount();
}

#[test]
fn a_header_from_a_future_version_is_refused_clearly() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    fs::write(m.path("f"), b"some bytes").unwrap();
    m.unmount();
    let mut raw = fs::read(d.lower.join("f")).unwrap();
    for at in [0usize, 64] {
        if &raw[at..at + 8] == b"DENSEFS\0" {
            raw[at + 8] = 9;
            let crc = crc32c::crc32c(&raw[at..at + 60]);
            raw[at + 60..at + 64].copy_from_slice(&crc.to_le_bytes());
        }
    }
    fs::write(d.lower.join("f"), &raw).unwrap();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let err = File::open(m.path("f")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert!(m.log_text().contains("format version 9"), "log: {}", m.log_text());
    m.unmount();
}

#[test]
fn bad_options_and_paths_are_refused_with_a_clear_message() {
    let d = Dirs::new();
    for (args, needle) in [
        (vec!["-o", "compression=gzip-12"], "unknown compression"),
        (vec!["-o", "recordsize=3K"], "invalid recordsize"),
        (vec!["-o", "frobnicate"], "unknown mount option"),
    ] {
        let out = Command::new(BIN).arg("mount").args(&args).arg(&d.lower).arg(&d.mnt).output().unwrap();
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains(needle), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = Command::new(BIN).arg("mount").arg(d.root.path().join("missing")).arg(&d.mnt).output().unwrap();
    assert!(!out.status.success());
    // A second daemon on the same lower directory is refused.
    let m = Mount::new(&d.lower, &d.mnt, "");
    let other = d.root.path().join("other");
    fs::create_dir(&other).unwrap();
    let out = Command::new(BIN).arg("mount").arg(&d.lower).arg(&other).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("already served"));
    m.unmount();
}

#[test]
fn the_daemonized_mount_and_umount_commands_work() {
    let d = Dirs::new();
    let out = Command::new(BIN).arg("mount").args(["-o", "compression=zstd"]).arg(&d.lower).arg(&d.mnt).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    fs::write(d.mnt.join("f"), compressible(1 << 20, 4)).unwrap();
    let out = Command::new(BIN).arg("umount").arg(&d.mnt).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!fs::read_to_string("/proc/self/mountinfo").unwrap().contains(d.mnt.to_str().unwrap()));
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(fs::read(m.path("f")).unwrap(), compressible(1 << 20, 4));
    let mut f = File::open(m.path("f")).unwrap();
    f.seek(SeekFrom::Start(1000)).unwrap();
    let mut s = String::new();
    f.take(5).read_to_string(&mut s).unwrap();
    assert_eq!(s.as_bytes(), &compressible(1 << 20, 4)[1000..1005]);
    m.unmount();
}

#[test]
fn a_mount_waits_for_the_unmounted_daemon_that_still_holds_the_lower_and_says_why() {
    let d = Dirs::new();
    let out = Command::new(BIN).arg("mount").arg(&d.lower).arg(&d.mnt).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let data = compressible(1 << 20, 7);
    let mut open = File::create(d.mnt.join("f")).unwrap();
    open.write_all(&data).unwrap();
    // Detached with a file still open: the daemon goes on serving that file, and until it is
    // closed the daemon holds the lower though no mount of it is left (as one still writing back
    // after umount does).
    let mnt = std::ffi::CString::new(d.mnt.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: umount2 reads a NUL-terminated path that lives until the call returns.
    assert_eq!(unsafe { libc::umount2(mnt.as_ptr(), libc::MNT_DETACH) }, 0);
    let second = d.root.path().join("second");
    fs::create_dir(&second).unwrap();
    let mut mount = Command::new(BIN).arg("mount").arg(&d.lower).arg(&second).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let stderr = mount.stderr.take().unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    // The first thing it says: before it takes the lower, a mount prints only this or a refusal.
    let said = lines.recv_timeout(std::time::Duration::from_secs(600)).unwrap();
    assert!(said.contains("waiting for the daemon that served") && said.contains("to finish writing back"), "{said}");
    assert!(mount.try_wait().unwrap().is_none(), "the mount did not wait");
    drop(open);
    let status = mount.wait().unwrap();
    let rest: Vec<String> = lines.try_iter().collect();
    assert!(status.success(), "{rest:?}");
    assert_eq!(fs::read(second.join("f")).unwrap(), data);
    let out = Command::new(BIN).arg("umount").arg(&second).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn mounting_over_the_lower_directory_itself_works() {
    let d = Dirs::new();
    fs::write(d.lower.join("before.txt"), b"was here first\n").unwrap();
    let m = Mount::new(&d.lower, &d.lower, "compression=gzip-1");
    assert_eq!(fs::read(d.lower.join("before.txt")).unwrap(), b"was here first\n");
    let data = compressible(1 << 20, 11);
    fs::write(d.lower.join("new.fastq"), &data).unwrap();
    assert!(fs::metadata(d.lower.join("new.fastq")).unwrap().blocks() * 512 < (data.len() / 2) as u64);
    m.unmount();
    // Underneath: the old file untouched, the new one a container; mounted again, both read back.
    assert_eq!(fs::read(d.lower.join("before.txt")).unwrap(), b"was here first\n");
    assert_eq!(&fs::read(d.lower.join("new.fastq")).unwrap()[..8], b"DENSEFS\0");
    let m = Mount::new(&d.lower, &d.lower, "");
    assert_eq!(fs::read(d.lower.join("new.fastq")).unwrap(), data);
    m.unmount();
}

#[test]
fn a_small_file_takes_a_single_block() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=zstd-3");
    let text = compressible(5000, 12);
    fs::write(m.path("small.txt"), &text).unwrap();
    fs::write(m.path("tiny.bin"), random_bytes(1500, 3)).unwrap();
    fs::write(m.path("bigger.bin"), random_bytes(3000, 4)).unwrap();
    assert_eq!(fs::metadata(d.lower.join("small.txt")).unwrap().blocks(), 8, "one 4 KiB block");
    assert_eq!(fs::metadata(d.lower.join("tiny.bin")).unwrap().blocks(), 8);
    assert_eq!(fs::metadata(d.lower.join("bigger.bin")).unwrap().blocks(), 16, "header block + one data block");
    // Rewriting moves the record out to its second slot and back; contents stay right.
    let f = OpenOptions::new().write(true).open(m.path("small.txt")).unwrap();
    f.write_all_at(b"edit", 10).unwrap();
    f.sync_all().unwrap();
    f.write_all_at(&random_bytes(4000, 5), 0).unwrap();
    f.sync_all().unwrap();
    f.write_all_at(&text[..4000], 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut expect = text.clone();
    expect[..4000].copy_from_slice(&text[..4000]);
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(fs::read(m.path("small.txt")).unwrap(), expect);
    assert_eq!(fs::read(m.path("tiny.bin")).unwrap(), random_bytes(1500, 3));
    m.unmount();
    // The old copies are freed: header block plus at most one data block remain.
    assert!(fs::metadata(d.lower.join("small.txt")).unwrap().blocks() <= 16);
}

/// A rewriting workload that fsyncs after every write (a database, fio --fsync=1) overwrites
/// the old copies in place: an fsync keeps a rewritten record's old copy allocated for the
/// record's next copy instead of punching it (a punched slot is allocated again by the next
/// rewrite: a journal commit on the lower at every fsync). The space comes back within a
/// writeback tick while the file stays open, and at close.
#[test]
fn fsynced_rewrites_reuse_the_old_copies_blocks_and_free_them_later() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=off,recordsize=64K");
    let data = random_bytes(8 << 16, 1);
    fs::write(m.path("db"), &data).unwrap();
    let lower = d.lower.join("db");
    let blocks = || lower_blocks(&lower);
    let base = blocks();
    // A record's copy is 128 sectors; the lower's own metadata (ext4's extent tree) may take a
    // block or two more as the file's extents split.
    let about = |want: u64| (want..=want + 16).contains(&blocks());
    let f = OpenOptions::new().write(true).open(m.path("db")).unwrap();
    let mut expect = data.clone();
    for (round, record) in [3u64, 3, 5, 3, 5, 3].into_iter().enumerate() {
        let page = random_bytes(4096, 10 + round as u64);
        let at = record as usize * (1 << 16) + 8192;
        f.write_all_at(&page, at as u64).unwrap();
        expect[at..at + 4096].copy_from_slice(&page);
        f.sync_all().unwrap();
        if round == 0 {
            assert!(
                about(base + 128),
                "the rewritten record's old copy stays allocated after the fsync: {} sectors, {base} before",
                blocks()
            );
        }
    }
    assert!(
        about(base + 2 * 128),
        "two records rewritten 6 times: one extra copy each, reused in place: {} sectors, {base} before",
        blocks()
    );
    // While the file stays open, the writeback tick frees them.
    common::wait_until("the old copies freed while the file is open", || about(base));
    f.write_all_at(b"again", 3 << 16).unwrap();
    expect[3 << 16..(3 << 16) + 5].copy_from_slice(b"again");
    f.sync_all().unwrap();
    assert!(about(base + 128), "{} sectors, {base} before", blocks());
    drop(f);
    // The kernel sends the release after close returns.
    common::wait_until("closing frees what an fsync kept", || about(base));
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert!(fs::read(m.path("db")).unwrap() == expect, "the file's bytes after a remount");
    m.unmount();
}

/// A reader's close lands nothing, so the kernel is told not to send its FLUSH (one round trip
/// to the daemon less per file read); a writer's close still flushes, and reports errors there.
#[test]
fn a_readers_close_sends_no_flush_and_a_writers_does() {
    let d = Dirs::new();
    let m = Mount::with_env(&d.lower, &d.mnt, "", &[("DENSEFS_LOG", "fuser=debug")]);
    let flushes = |m: &Mount| m.log_text().lines().filter(|l| l.contains(" FLUSH ")).count();
    for i in 0..5 {
        fs::write(m.path(&format!("f{i}")), compressible(10_000, i)).unwrap();
    }
    let after_writes = flushes(&m);
    assert!(after_writes >= 5, "every writer's close flushes ({after_writes} FLUSH requests for 5 files)");
    for i in 0..5 {
        assert_eq!(fs::read(m.path(&format!("f{i}"))).unwrap(), compressible(10_000, i));
    }
    assert_eq!(flushes(&m), after_writes, "reading 5 files sent FLUSH requests");
    m.unmount();
}

#[test]
fn truncating_to_zero_and_writing_again_leaves_no_stale_records() {
    // Regression (found by the differential test): group 0's table lives in block 0, so cutting
    // the lower file to block 0 did not clear its descriptors.
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lzjb,recordsize=8K");
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.path("f")).unwrap();
    f.write_all_at(&vec![48u8; 246_372], 145_188).unwrap();
    f.sync_all().unwrap();
    f.set_len(0).unwrap();
    let text = compressible(51_681, 13);
    f.write_all_at(&text, 211_778).unwrap();
    drop(f);
    let mut expect = vec![0u8; 211_778];
    expect.extend_from_slice(&text);
    assert_eq!(fs::read(m.path("f")).unwrap(), expect);
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(fs::read(m.path("f")).unwrap(), expect);
    m.unmount();
}

/// Pages of `map` the kernel holds in its page cache (mincore).
fn resident_pages(map: &memmap2::Mmap) -> usize {
    let page = 4096;
    let mut vec = vec![0u8; map.len().div_ceil(page)];
    // SAFETY: the mapping is `map.len()` bytes long and `vec` has a byte per page of it.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, map.len(), vec.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().filter(|v| **v & 1 != 0).count()
}

/// Fraction of the first `part` of `path`'s pages in the page cache.
fn resident_fraction(path: &std::path::Path, part: f64) -> f64 {
    let f = File::open(path).unwrap();
    // SAFETY: nothing changes the file while it is mapped (the mount is idle).
    let map = unsafe { memmap2::MmapOptions::new().len((f.metadata().unwrap().len() as f64 * part) as usize).map(&f) }.unwrap();
    resident_pages(&map) as f64 / map.len().div_ceil(4096) as f64
}

/// Drops a lower file's pages from the page cache (written back first).
fn evict(path: &std::path::Path) {
    let f = File::open(path).unwrap();
    f.sync_all().unwrap();
    // SAFETY: posix_fadvise only reads its integer arguments.
    assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
}

#[test]
fn a_streamed_file_leaves_no_second_compressed_copy_in_the_page_cache() {
    let d = Dirs::new();
    // SAFETY: statfs writes into the struct it is given.
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    let lower_c = std::ffi::CString::new(d.lower.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::statfs(lower_c.as_ptr(), &mut sfs) }, 0);
    if sfs.f_type == libc::TMPFS_MAGIC {
        eprintln!("skipped: the test directory is on tmpfs, whose pages cannot be dropped");
        return;
    }
    let data = compressible(48 << 20, 7);
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,recordsize=128K");
    fs::write(m.path("f"), &data).unwrap();
    m.unmount();
    let lower = d.lower.join("f");

    // Read from start to end: the records the stream has left behind lose their lower pages
    // (the kernel caches what they decoded to).
    evict(&lower);
    let m = Mount::new(&d.lower, &d.mnt, "");
    let mut got = Vec::with_capacity(data.len());
    File::open(m.path("f")).unwrap().read_to_end(&mut got).unwrap();
    assert!(got == data);
    m.unmount();
    let streamed = resident_fraction(&lower, 0.5);

    // The same chunks read in a scattered order are no stream: their lower pages stay cached.
    evict(&lower);
    let m = Mount::new(&d.lower, &d.mnt, "");
    let f = File::open(m.path("f")).unwrap();
    let chunk = 1 << 20;
    let mut buf = vec![0u8; chunk];
    for i in (0..48).map(|i| (i * 29) % 48) {
        f.read_exact_at(&mut buf, (i * chunk) as u64).unwrap();
        assert!(buf[..] == data[i * chunk..(i + 1) * chunk], "chunk {i}");
    }
    drop(f);
    m.unmount();
    let scattered = resident_fraction(&lower, 0.5);
    assert!(
        streamed < 0.1 && scattered > 0.5,
        "first half of the lower file cached: {:.0}% after a stream, {:.0}% after scattered reads",
        streamed * 100.0,
        scattered * 100.0
    );
}

#[test]
fn write_only_opens_bypass_the_page_cache_and_cached_readers_see_what_they_write() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "recordsize=64K");
    let direct = fs::read_to_string(&m.log).unwrap().contains("write-only opens bypass the kernel's page cache");
    let path = m.path("f");
    let mut expect = compressible(1 << 20, 1);
    // Written through a read-write open, then read: the kernel caches it.
    OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap().write_all(&expect).unwrap();
    let reader = File::open(&path).unwrap();
    let mut got = vec![0; expect.len()];
    reader.read_exact_at(&mut got, 0).unwrap();
    assert!(got == expect);
    // SAFETY: the file is not truncated while mapped.
    let map = unsafe { memmap2::MmapOptions::new().map(&reader) }.unwrap();
    assert!(map[..] == expect[..]);
    assert!(resident_pages(&map) > 0, "the reader's pages are cached");

    // A write-only open overwrites the middle and appends: the reader's descriptor, its
    // mapping and a new open all see the new bytes, as on a local file system.
    let middle = random_bytes(200_000, 2);
    OpenOptions::new().write(true).open(&path).unwrap().write_all_at(&middle, 300_000).unwrap();
    expect[300_000..500_000].copy_from_slice(&middle);
    let tail = random_bytes(70_000, 3);
    OpenOptions::new().append(true).open(&path).unwrap().write_all(&tail).unwrap();
    expect.extend_from_slice(&tail);
    assert_eq!(reader.metadata().unwrap().len(), expect.len() as u64);
    let mut got = vec![0; expect.len()];
    reader.read_exact_at(&mut got, 0).unwrap();
    assert!(got == expect, "the reader's descriptor reads the new bytes");
    assert!(map[..] == expect[..map.len()], "the reader's mapping shows the new bytes");
    assert!(fs::read(&path).unwrap() == expect, "a new open reads the new bytes");
    drop(map);

    if direct {
        // What only write-only opens wrote leaves nothing in the kernel's page cache (`cp`,
        // `tar x` and `>` open that way), and reads back from the daemon.
        let data = compressible(2 << 20, 4);
        fs::write(m.path("g"), &data).unwrap();
        let g = File::open(m.path("g")).unwrap();
        // SAFETY: as above.
        let map = unsafe { memmap2::MmapOptions::new().map(&g) }.unwrap();
        assert_eq!(resident_pages(&map), 0, "nothing cached of a file written write-only");
        assert!(map[..] == data[..]);
    }
    drop(reader);
    m.unmount();

    let m = Mount::new(&d.lower, &d.mnt, "");
    assert!(fs::read(m.path("f")).unwrap() == expect, "the bytes reached the lower file");
    m.unmount();
}

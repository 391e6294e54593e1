//! Access times beside ext4: a file read through densefs moves its atime as the same reads move
//! it on a local ext4 directory bind-mounted with the same mode (`strictatime`, `relatime`,
//! `noatime`): /tmp is ext4 on the machines the suite runs on. A read never moves the mtime or
//! the ctime, and densefs's own reads (listings, header reads after a remount, stat, scrub)
//! never move an atime at all.

mod common;
use common::*;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// (atime, mtime, ctime) of `path`, in nanoseconds.
fn times(path: &Path) -> (i128, i128, i128) {
    let m = fs::metadata(path).unwrap();
    let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
    (ns(m.atime(), m.atime_nsec()), ns(m.mtime(), m.mtime_nsec()), ns(m.ctime(), m.ctime_nsec()))
}

fn now_ns() -> i128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as i128
}

/// Waits until the file systems' clock (coarse: a tick of a few ms) has passed every time of
/// `paths`, so that a read now would stamp a newer atime than any they hold.
fn wait_for_the_clock_past(paths: &[&Path]) {
    let latest = paths.iter().map(|p| times(p)).map(|(a, m, c)| a.max(m).max(c)).max().unwrap();
    wait_until("the clock to pass the files' times", || now_ns() > latest + 20_000_000);
}

fn read_whole(path: &Path) {
    let mut buf = Vec::new();
    fs::File::open(path).unwrap().read_to_end(&mut buf).unwrap();
}

/// Sets the atime alone (the ctime moves to now, as for any change of an inode).
fn set_atime(path: &Path, secs_ago: u64) {
    let t = SystemTime::now() - Duration::from_secs(secs_ago);
    fs::File::open(path).unwrap().set_times(fs::FileTimes::new().set_accessed(t)).unwrap();
}

/// A directory of /tmp bind-mounted onto itself with access-time mode `mode`: the local file
/// system the mount is compared with. Unmounted on drop.
struct Ext4 {
    dir: PathBuf,
}

impl Ext4 {
    fn new(dir: &Path, mode: &str) -> Ext4 {
        fs::create_dir(dir).unwrap();
        assert!(Command::new("mount").arg("--bind").arg(dir).arg(dir).status().unwrap().success());
        let ext4 = Ext4 { dir: dir.to_path_buf() };
        let remount = Command::new("mount").args(["-o", &format!("remount,bind,{mode}")]).arg(dir).status().unwrap();
        assert!(remount.success(), "remount {} {mode}", dir.display());
        ext4
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

/// The steps both sides take; after each read, whether the atime moved.
fn steps(file: &Path, lower: &Path) -> Vec<(&'static str, bool)> {
    let mut moved = Vec::new();
    let mut read = |what: &'static str| {
        wait_for_the_clock_past(&[lower]);
        let before = times(lower);
        read_whole(file);
        let after = times(lower);
        assert_eq!((after.1, after.2), (before.1, before.2), "{what}: a read moved the mtime or the ctime");
        moved.push((what, after.0 != before.0));
    };
    fs::write(file, compressible(300_000, 1)).unwrap();
    read("first read after the write");
    read("second read");
    set_atime(file, 2 * 24 * 3600);
    read("read with the atime two days old");
    read("read again");
    fs::OpenOptions::new().append(true).open(file).unwrap().write_all(b"more").unwrap();
    read("read after an append");
    read("read once more");
    moved
}

fn compare(mode: &str) {
    let d = Dirs::new();
    let ext4 = Ext4::new(&d.root.path().join("ext4"), mode);
    let on_ext4 = steps(&ext4.dir.join("f"), &ext4.dir.join("f"));
    let m = Mount::new(&d.lower, &d.mnt, mode);
    let on_densefs = steps(&m.path("f"), &d.lower.join("f"));
    assert_eq!(on_densefs, on_ext4, "{mode}: which reads moved the atime, densefs then ext4");
    // What the mount shows is the lower's atime (the kernel drops its cached atime after a read).
    assert_eq!(fs::metadata(m.path("f")).unwrap().atime(), fs::metadata(d.lower.join("f")).unwrap().atime());
    m.unmount();
    match mode {
        // The comparison must be able to fail: each mode moved some atimes or none, as it should.
        "noatime" => assert!(on_ext4.iter().all(|(_, moved)| !moved), "{on_ext4:?}"),
        "strictatime" => assert!(on_ext4.iter().all(|(_, moved)| *moved), "{on_ext4:?}"),
        _ => assert!(on_ext4.iter().any(|(_, moved)| *moved) && on_ext4.iter().any(|(_, moved)| !moved), "{on_ext4:?}"),
    }
}

#[test]
fn strictatime_moves_the_atime_at_every_read_as_ext4() {
    compare("strictatime");
}

#[test]
fn relatime_moves_the_atime_when_older_than_the_mtime_or_ctime_as_ext4() {
    compare("relatime");
}

#[test]
fn noatime_never_moves_the_atime_as_ext4() {
    compare("noatime");
}

#[test]
fn relatime_is_the_default_and_shows_in_the_mount_options() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let shown = densefs::cli::mountinfo::mountinfo().into_iter().find(|i| i.point == d.mnt).unwrap();
    assert!(shown.mount_options.split(',').any(|o| o == "relatime"), "{}", shown.mount_options);
    m.unmount();
}

/// Under strictatime every read of the user moves an atime; densefs's own reads must move none:
/// listings (which open files and read their headers), stat after a remount (a header read),
/// the reports' walks and scrub.
#[test]
fn densefs_own_reads_never_move_an_atime() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "strictatime");
    fs::create_dir(m.path("d")).unwrap();
    for i in 0..5 {
        fs::write(m.path(&format!("d/f{i}")), compressible(200_000 + i * 1000, i as u64)).unwrap();
    }
    m.unmount();
    for i in 0..5 {
        set_atime(&d.lower.join(format!("d/f{i}")), 3600);
    }
    let before: Vec<_> = (0..5).map(|i| times(&d.lower.join(format!("d/f{i}")))).collect();
    wait_for_the_clock_past(&[&d.lower.join("d/f4")]);
    set_atime(&d.lower.join("d"), 3600);
    let dir_before = times(&d.lower.join("d"));
    wait_for_the_clock_past(&[&d.lower.join("d")]);
    let m = Mount::new(&d.lower, &d.mnt, "strictatime");
    let listed = Command::new("ls").arg("-l").arg(m.path("d")).output().unwrap();
    assert!(listed.status.success());
    assert_eq!(times(&d.lower.join("d")), dir_before, "a listing moved the lower directory's times");
    for i in 0..5 {
        assert_eq!(fs::metadata(m.path(&format!("d/f{i}"))).unwrap().len(), 200_000 + i * 1000);
    }
    let report = Command::new(BIN).args(["get", "all"]).arg(m.path("d")).output().unwrap();
    assert!(report.status.success(), "{}", String::from_utf8_lossy(&report.stderr));
    let scrub = Command::new(BIN).arg("scrub").arg(&m.mnt).output().unwrap();
    assert!(scrub.status.success(), "{}", String::from_utf8_lossy(&scrub.stderr));
    m.unmount();
    let after: Vec<_> = (0..5).map(|i| times(&d.lower.join(format!("d/f{i}")))).collect();
    assert_eq!(after, before, "listing, stat, reports and scrub moved times of the lower files");
}

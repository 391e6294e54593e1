//! Background compression (`background_compression`): files written with a fast codec end in a
//! dense one once closed and left alone, in place, across remounts and crashes, without racing
//! the users of the file.
//!
//! The background threads run only on CPU nothing else wants (SCHED_IDLE), so on a loaded
//! machine they are slow: these tests use small files and fast background codecs where the codec
//! itself is not the point, and wait for conditions with a long limit.

mod common;
use common::*;
use serde_json::Value;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// `densefs stat --json` of one file.
fn stat(path: &Path) -> Value {
    let out = Command::new(BIN).args(["stat", "--json"]).arg(path).output().unwrap();
    assert!(out.status.success(), "densefs stat {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v[0].clone()
}

/// The file's records by how they are stored (`lz4`, `gzip-1`, `hole`, …).
fn records(path: &Path) -> std::collections::BTreeMap<String, u64> {
    let s = stat(path);
    s["stats"]["records"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap())).collect()
}

/// Whether every record that holds data is in `codec`, but for those whose copy in it would not
/// have saved a block (it lands only if smaller): at most one, the last, short one.
fn all_in(path: &Path, codec: &str) -> bool {
    let r = records(path);
    let other: u64 = r.iter().filter(|(k, _)| *k != codec && *k != "hole").map(|(_, n)| n).sum();
    r.get(codec).copied().unwrap_or(0) > 0 && other <= 1
}

fn background(mnt: &Path) -> Value {
    engine_snapshot(mnt)["background"].clone()
}

fn densefs(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// Seconds a test waits for background work: long, for machines busy with other work.
const WAIT: u64 = 600;

#[test]
fn closed_files_end_in_the_background_codec_in_place_and_read_back() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,background_compression=zstd-3,background_delay=1");
    std::fs::create_dir(m.path("gz")).unwrap();
    std::fs::create_dir(m.path("off")).unwrap();
    assert!(densefs(&["set", "background_compression=gzip-1", m.path("gz").to_str().unwrap()]).status.success());
    assert!(densefs(&["set", "background_compression=off", m.path("off").to_str().unwrap()]).status.success());
    let data = compressible(3 << 20, 7);
    let small = compressible(5000, 8);
    for name in ["a", "gz/b", "off/c"] {
        std::fs::write(m.path(name), &data).unwrap();
    }
    std::fs::write(m.path("s"), &small).unwrap();
    // A second name: the pass works on the inode, both names see it.
    std::fs::hard_link(m.path("a"), m.path("a-link")).unwrap();
    let (ino_before, len_before) = std::fs::metadata(d.lower.join("a")).map(|m| (m.ino(), m.len())).unwrap();
    let used_before = stat(&m.path("a"))["stats"]["used"].as_u64().unwrap();
    assert!(records(&m.path("a")).contains_key("lz4"));

    wait_up_to("a in zstd-3", WAIT, || all_in(&m.path("a"), "zstd-3"));
    wait_up_to("gz/b in gzip-1", WAIT, || all_in(&m.path("gz/b"), "gzip-1"));
    // Waits for the passes of every file queued: the one in `off` was never queued.
    wait_up_to("nothing waiting", WAIT, || background(&d.mnt)["waiting_files"] == 0);
    assert_eq!(records(&m.path("off/c")).keys().collect::<Vec<_>>(), ["lz4"]);

    for (name, want) in [("a", &data), ("a-link", &data), ("gz/b", &data), ("off/c", &data), ("s", &small)] {
        assert!(std::fs::read(m.path(name)).unwrap() == *want, "{name} reads back");
    }
    // In place: the same lower inode, still holding both names; the file's own codec (what new
    // writes get) is unchanged.
    let lower_a = std::fs::metadata(d.lower.join("a")).unwrap();
    assert_eq!((lower_a.ino(), lower_a.nlink()), (ino_before, 2));
    // The new copies, placed past the old ones, were moved down into the space the old ones
    // left: the lower file ends up shorter, not longer.
    assert!(lower_a.len() < len_before, "lower length {} after the pass, {len_before} before", lower_a.len());
    assert_eq!(stat(&m.path("a"))["properties"]["compression"]["value"], "lz4");
    let used_after = stat(&m.path("a"))["stats"]["used"].as_u64().unwrap();
    assert!(used_after < used_before, "zstd-3 stores less than lz4: {used_after} vs {used_before}");
    let b = background(&d.mnt);
    assert!(b["files_done"].as_u64().unwrap() >= 3, "{b}");
    assert!(b["bytes_in"].as_u64().unwrap() >= 2 * data.len() as u64, "{b}");
    // Shown by `densefs get`.
    let out = densefs(&["get", "-H", "all", d.mnt.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("engine.background.files_done"), "{text}");

    // Appended to later: the new records come in with lz4, and go to zstd-3 after the next close.
    use std::io::Write;
    let more = compressible(1 << 20, 9);
    std::fs::OpenOptions::new().append(true).open(m.path("a")).unwrap().write_all(&more).unwrap();
    wait_up_to("a in zstd-3 again", WAIT, || all_in(&m.path("a"), "zstd-3"));
    let mut want = data.clone();
    want.extend_from_slice(&more);
    assert!(std::fs::read(m.path("a")).unwrap() == want);
    m.unmount();
}

#[test]
fn a_file_open_is_left_alone_and_a_users_write_during_the_pass_wins() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,background_compression=gzip-1,background_delay=2");
    let data = compressible(2 << 20, 11);
    std::fs::write(m.path("held"), &data).unwrap();
    // Queued at its last close (the RELEASE after close(2)); opened again before its time.
    wait_up_to("held queued", 30, || background(&d.mnt)["waiting_files"] == 1);
    let reader = std::fs::File::open(m.path("held")).unwrap();
    // The pass found it open and put it off; it is still as written.
    wait_up_to("a pass put off", WAIT, || background(&d.mnt)["postponed"].as_u64().unwrap() >= 1);
    assert_eq!(records(&m.path("held")).keys().collect::<Vec<_>>(), ["lz4"]);
    drop(reader);
    wait_up_to("held in gzip-1 once closed", WAIT, || all_in(&m.path("held"), "gzip-1"));
    assert!(std::fs::read(m.path("held")).unwrap() == data);

    // Writes while passes run: every byte the user wrote is there, whichever came first.
    let mut want = compressible(4 << 20, 12);
    std::fs::write(m.path("busy"), &want).unwrap();
    use std::os::unix::fs::FileExt;
    for round in 0..20u64 {
        std::thread::sleep(Duration::from_millis(150));
        let f = std::fs::OpenOptions::new().write(true).open(m.path("busy")).unwrap();
        let at = (round * 200_003) % (want.len() as u64 - 5000);
        let patch = random_bytes(3000, round);
        f.write_all_at(&patch, at).unwrap();
        want[at as usize..at as usize + patch.len()].copy_from_slice(&patch);
        drop(f);
        assert!(std::fs::read(m.path("busy")).unwrap() == want, "round {round}");
    }
    wait_up_to("nothing waiting", WAIT, || background(&d.mnt)["waiting_files"] == 0);
    assert!(std::fs::read(m.path("busy")).unwrap() == want);
    // Deleted while waiting or during its pass: dropped, nothing else disturbed.
    std::fs::write(m.path("gone"), compressible(2 << 20, 13)).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    std::fs::remove_file(m.path("gone")).unwrap();
    std::fs::write(m.path("after"), &data).unwrap();
    wait_up_to("after in gzip-1", WAIT, || all_in(&m.path("after"), "gzip-1"));
    wait_up_to("nothing waiting", WAIT, || background(&d.mnt)["waiting_files"] == 0);
    assert_eq!(background(&d.mnt)["failed"], 0);
    m.unmount();
    let fresh = Mount::new(&d.lower, &d.mnt, "");
    assert!(std::fs::read(fresh.path("busy")).unwrap() == want);
    assert!(std::fs::read(fresh.path("after")).unwrap() == data);
    let scrub = densefs(&["scrub", d.mnt.to_str().unwrap()]);
    assert!(scrub.status.success(), "{}", String::from_utf8_lossy(&scrub.stdout));
    fresh.unmount();
}

#[test]
fn waiting_files_outlive_an_unmount_and_a_kill() {
    let d = Dirs::new();
    let data = compressible(2 << 20, 21);
    // Queued with an hour's delay, then unmounted: the work log keeps it (hidden from users).
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,background_compression=gzip-1,background_delay=3600");
    std::fs::write(m.path("f"), &data).unwrap();
    wait_up_to("f waiting", 30, || background(&d.mnt)["waiting_files"] == 1);
    let names: Vec<_> = std::fs::read_dir(&d.mnt).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["f"]);
    m.unmount();
    assert!(std::fs::read_to_string(d.lower.join(".densefs.background")).unwrap().starts_with("+ "));
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,background_compression=gzip-1,background_delay=1");
    wait_up_to("f in gzip-1 after the remount", WAIT, || all_in(&m.path("f"), "gzip-1"));
    assert!(std::fs::read(m.path("f")).unwrap() == data);

    m.unmount();

    // Killed during a pass: every record reads back (old or new copy), and the next mount
    // finishes the work.
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,background_compression=gzip-6,background_delay=1");
    let big = compressible(8 << 20, 22);
    std::fs::write(m.path("big"), &big).unwrap();
    let deadline = Instant::now() + Duration::from_secs(WAIT);
    while background(&d.mnt)["records"].as_u64().unwrap() == 0 {
        assert!(Instant::now() < deadline, "the pass never began");
        std::thread::sleep(Duration::from_millis(10));
    }
    m.kill();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,background_compression=gzip-6,background_delay=1");
    assert!(std::fs::read(m.path("big")).unwrap() == big);
    wait_up_to("big in gzip-6 after the kill", WAIT, || all_in(&m.path("big"), "gzip-6"));
    wait_up_to("nothing waiting", WAIT, || background(&d.mnt)["waiting_files"] == 0);
    assert!(std::fs::read(m.path("big")).unwrap() == big);
    m.unmount();
    // Done work leaves nothing to do at the next mount.
    let log = std::fs::read_to_string(d.lower.join(".densefs.background")).unwrap();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,background_compression=gzip-1,background_delay=1");
    assert_eq!(background(&d.mnt)["waiting_files"], 0, "log was: {log}");
    m.unmount();
}

#[test]
fn a_full_lower_fails_the_pass_quietly_and_it_is_retried() {
    let d = Dirs::new();
    let _disk = SmallDisk::new(&d.lower, "48M");
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,background_compression=gzip-1,background_delay=1");
    let data = compressible(8 << 20, 31);
    // Filled behind densefs's back (another program on the lower) before the pass can begin.
    let filler = d.lower.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        std::fs::write(m.path("f"), &data).unwrap();
        let chunk = vec![0x5au8; 1 << 20];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.write_all(&chunk[..4096]);
        let _ = f.sync_all();
    }
    wait_up_to("a failed pass", WAIT, || background(&d.mnt)["failed"].as_u64().unwrap() >= 1);
    // The foreground sees nothing: the file reads back, nothing is left unwritten.
    assert!(std::fs::read(m.path("f")).unwrap() == data);
    // The pass's copies that did not land are dropped (the old ones are intact), so nothing
    // waits in memory for room (`densefs umount` would refuse while something did).
    wait_up_to("nothing held in memory", 30, || engine_snapshot(&d.mnt)["memory"]["used"].as_u64().unwrap() == 0);
    // Room again: the pass comes back and finishes.
    std::fs::remove_file(&filler).unwrap();
    wait_up_to("f in gzip-1", WAIT, || all_in(&m.path("f"), "gzip-1"));
    assert!(std::fs::read(m.path("f")).unwrap() == data);
    m.unmount();
}

#[test]
fn a_mount_remounted_read_only_writes_nothing_until_it_is_writable_again() {
    let d = Dirs::new();
    // Long enough a delay to remount before the pass can begin.
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,background_compression=gzip-1,background_delay=5");
    let data = compressible(2 << 20, 41);
    std::fs::write(m.path("f"), &data).unwrap();
    wait_up_to("f waiting", 30, || background(&d.mnt)["waiting_files"] == 1);
    // `-i`: the superblock's flags only, without /sbin/mount.fuse (it runs `densefs`, which a
    // fresh machine has on no PATH before scripts/install).
    let remount = |how: &str| {
        let ok = Command::new("mount").args(["-i", "-o", &format!("remount,{how}")]).arg(&d.mnt).status().unwrap();
        assert!(ok.success(), "remount,{how}");
    };
    remount("ro");
    let lower_before = std::fs::read(d.lower.join("f")).unwrap();
    wait_up_to("a pass put off while read-only", WAIT, || background(&d.mnt)["postponed"].as_u64().unwrap() >= 1);
    assert!(std::fs::read(d.lower.join("f")).unwrap() == lower_before, "a read-only mount's lower file changed");
    remount("rw");
    wait_up_to("f in gzip-1 once writable", WAIT, || all_in(&m.path("f"), "gzip-1"));
    assert!(std::fs::read(m.path("f")).unwrap() == data);
    m.unmount();
}

/// `background_rate` bounds the pass's lower I/O: a file whose lz4 copies take B bytes is read
/// and written back (2B at most) no faster than the rate allows, whatever the CPU could do.
#[test]
fn the_pass_keeps_to_its_rate_of_lower_io() {
    const RATE: u64 = 1 << 20;
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,background_compression=gzip-1,background_delay=0,background_rate=1M");
    assert_eq!(background(&d.mnt)["rate_bytes_per_second"], RATE);
    let data = compressible(8 << 20, 11);
    std::fs::write(m.path("f"), &data).unwrap();
    let closed = Instant::now();
    // What the lower file held in lz4 (its header and tables are a few blocks).
    let stored = std::fs::metadata(d.lower.join("f")).unwrap().blocks() * 512;
    wait_up_to("f in gzip-1", WAIT, || all_in(&m.path("f"), "gzip-1"));
    wait_up_to("nothing waiting", WAIT, || background(&d.mnt)["waiting_files"] == 0);
    let took = closed.elapsed().as_secs_f64();
    // Charged: each copy read, and as much again for its new copy; a second's worth goes ahead.
    let least = (2 * stored.saturating_sub(64 << 10)).saturating_sub(RATE) as f64 / RATE as f64;
    assert!(least > 2.0, "the file is too small to show the rate ({stored} bytes stored)");
    assert!(took >= least * 0.95, "the pass took {took:.1} s for {stored} stored bytes at 1 MiB/s (at least {least:.1} s)");
    // The bound made the pass wait, unless the pass was no faster than the rate by itself: its
    // threads get only CPU nothing else wants, which on a loaded machine is little (an idle
    // one takes well under a second for this file, so the time above fails without the bound).
    let b = background(&d.mnt);
    if b["rate_waits_ms"].as_u64().unwrap() == 0 {
        eprintln!("the pass never got ahead of the rate by itself (a loaded machine): {b}");
    }
    assert!(std::fs::read(m.path("f")).unwrap() == data);
    m.unmount();
}

#[test]
fn bad_values_are_refused() {
    let d = Dirs::new();
    for options in [
        "background_compression=auto",
        "background_compression=zstd-99",
        "background_delay=soon",
        "background_delay=100000",
        "background_rate=fast",
        "background_rate=100K",
    ] {
        let out = densefs(&["mount", "-o", options, d.lower.to_str().unwrap(), d.mnt.to_str().unwrap()]);
        assert!(!out.status.success(), "{options} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("background_"), "{options}: {err}");
    }
    let m = Mount::new(&d.lower, &d.mnt, "");
    std::fs::create_dir(m.path("d")).unwrap();
    let out = densefs(&["set", "background_compression=auto", m.path("d").to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("fixed codec"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(densefs(&["set", "background_compression=gzip-9", m.path("d").to_str().unwrap()]).status.success());
    let out = densefs(&["get", "-H", "background_compression", m.path("d").to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.trim().split('\t').nth(2), Some("gzip-9"), "{text}");
    m.unmount();
}

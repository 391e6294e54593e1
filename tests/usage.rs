//! The mount's statistics as counters (issue 47, `core/usage/`): `densefs get` on the mount
//! root answers from counters kept as files change, saved at a clean unmount and rebuilt by a
//! walk after a crash; a dataset (a directory with its own properties) has counters of its
//! subtree once walked, which follow changes or, where they cannot, give way to a walk again.
//! After any workload they equal what a walk of the lower files finds (`densefs scrub` walks
//! every time).

mod common;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::process::Command;

/// Seconds to wait for the mount's own walk: its thread is the kernel's last choice for a CPU.
const WAIT: u64 = 300;

/// A report on a directory (`user.densefs.report` or `.scrub`), read in one call.
fn report(mnt: &Path, kind: &str) -> Value {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(mnt.as_os_str().as_bytes()).unwrap();
    let name = std::ffi::CString::new(format!("user.densefs.{kind}")).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    // SAFETY: getxattr writes at most buf.len() bytes into buf; both strings are NUL-terminated.
    let n = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n > 0, "getxattr {kind}: {}", std::io::Error::last_os_error());
    serde_json::from_slice(&buf[..n as usize]).unwrap()
}

/// What the counters and a walk must agree on.
fn totals(r: &Value) -> Value {
    serde_json::json!({"stats": r["stats"], "files": r["files"], "containers": r["containers"], "directories": r["directories"]})
}

/// The counters now, and a walk: equal, but for `used`, which may lag the lower's own writeback:
/// ext4 adds the extent blocks of a fragmented file (one with holes) to its block count when it
/// writes the file back, after densefs counted it (at most a block per file here).
fn assert_counters_agree(mnt: &Path, when: &str) -> Value {
    wait_until_closed(mnt);
    let counted = report(mnt, "report");
    assert_eq!(counted["stats_from"], "counters", "{when}: {counted}");
    let walked = report(mnt, "scrub");
    assert_eq!(walked["stats_from"], "walk");
    assert_totals_match(totals(&counted), totals(&walked), when);
    for dataset in DATASETS.iter().map(|d| mnt.join(d)).filter(|d| d.is_dir()) {
        assert_dataset_agrees(&dataset, &format!("{when}, {}", dataset.display()));
    }
    totals(&walked)
}

/// A last close's RELEASE reaches the daemon after close(2) returned, and may land, sync or
/// free old copies: reports compared must see the same tree.
fn wait_until_closed(mnt: &Path) {
    wait_up_to("every file closed", WAIT, || engine_snapshot(mnt)["inodes"]["open_files"] == 0);
}

/// The datasets the random workload changes (`a/deep` moves to `b/deep` and back).
const DATASETS: [&str; 4] = ["a", "b", "a/deep", "b/deep"];

/// A dataset's report, from its counters or (where it has none now) a walk, equals a walk's.
/// Says where it came from.
fn assert_dataset_agrees(dir: &Path, when: &str) -> String {
    let counted = report(dir, "report");
    let walked = report(dir, "scrub");
    assert_totals_match(totals(&counted), totals(&walked), when);
    counted["stats_from"].as_str().unwrap().to_string()
}

/// Equal totals, `used` within a block per file (`assert_counters_agree`).
fn assert_totals_match(mut c: Value, mut w: Value, when: &str) {
    let used = |t: &mut Value| t["stats"].as_object_mut().unwrap().remove("used").unwrap().as_i64().unwrap();
    let (used_c, used_w) = (used(&mut c), used(&mut w));
    assert_eq!(c, w, "{when}: counters (left) and a walk (right) differ");
    let files = w["files"].as_i64().unwrap();
    assert!((used_c - used_w).abs() <= 4096 * files, "{when}: used {used_c} counted, {used_w} walked ({files} files)");
}

/// Files and directories changed at random through the mount: writes, appends, holes,
/// truncates, hard links, renames within and across directories and over other files, deletes
/// (some while open), directories made and removed, a recompress that moves a file, and a
/// plain lower file written in place.
fn random_workload(mnt: &Path, seed: u64, ops: usize) {
    let mut done = [0usize; 100];
    let mut rng = StdRng::seed_from_u64(seed);
    let dirs = ["", "a", "b", "a/deep"];
    let names: Vec<String> =
        dirs.iter().flat_map(|d| (0..6).map(move |i| if d.is_empty() { format!("f{i}") } else { format!("{d}/f{i}") })).collect();
    let mut held = Vec::new();
    for op in 0..ops {
        let name = &names[rng.gen_range(0..names.len())];
        let path = mnt.join(name);
        let other = mnt.join(&names[rng.gen_range(0..names.len())]);
        let kind = rng.gen_range(0..100);
        let result = match kind {
            0..=29 => {
                let len = [0, 100, 5000, 70_000, 300_000][rng.gen_range(0..5)];
                fs::write(&path, compressible(len, op as u64))
            }
            30..=39 => OpenOptions::new()
                .append(true)
                .open(&path)
                .and_then(|mut f| f.write_all(&compressible(rng.gen_range(1..200_000), op as u64))),
            40..=44 => OpenOptions::new().write(true).create(true).truncate(false).open(&path).and_then(|mut f| {
                // A hole, then data.
                f.seek(SeekFrom::Start(rng.gen_range(0..2_000_000)))?;
                f.write_all(&random_bytes(rng.gen_range(1..50_000), op as u64))
            }),
            45..=49 => OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(rng.gen_range(0..400_000))),
            50..=54 => OpenOptions::new().write(true).open(&path).and_then(|f| f.write_all_at(b"overwritten in the middle", 1000)),
            55..=59 => fs::hard_link(&path, &other),
            60..=69 => fs::rename(&path, &other),
            70..=79 => fs::remove_file(&path),
            80..=82 => OpenOptions::new().read(true).write(true).open(&path).map(|f| {
                // Deleted while open, then written: it counts no more.
                let _ = fs::remove_file(&path);
                let _ = f.write_all_at(&compressible(10_000, op as u64), 0);
                held.push(f);
            }),
            83 => {
                held.clear();
                Ok(())
            }
            84..=85 => OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_TMPFILE)
                .open(mnt.join(dirs[rng.gen_range(0..dirs.len())]))
                .and_then(|f| {
                    // An unnamed file: named by linkat, held open unnamed, or dropped.
                    f.write_all_at(&compressible(rng.gen_range(1..300_000), op as u64), 0)?;
                    match rng.gen_range(0..3) {
                        0 => link_at(&f, &path),
                        1 => {
                            held.push(f);
                            Ok(())
                        }
                        _ => Ok(()),
                    }
                }),
            86..=89 => fs::create_dir(mnt.join(format!("{}/tmp{op}", dirs[rng.gen_range(0..dirs.len())]))),
            90..=92 => {
                for d in &dirs {
                    if let Ok(entries) = fs::read_dir(mnt.join(d)) {
                        for e in entries.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("tmp")) {
                            let _ = fs::remove_dir(e.path());
                        }
                    }
                }
                Ok(())
            }
            93..=95 => {
                // Moves the file to a new lower inode (another record size).
                let rs = ["64K", "128K", "32K"][rng.gen_range(0..3)];
                if path.is_file() {
                    let _ = recompress(&[&path], false, &format!("recordsize={rs},compression=gzip-1"));
                }
                Ok(())
            }
            _ => fs::rename(mnt.join(dirs[1]).join("deep"), mnt.join(dirs[2]).join("deep"))
                .or_else(|_| fs::rename(mnt.join("b/deep"), mnt.join("a/deep"))),
        };
        if result.is_ok() {
            done[kind] += 1;
        }
    }
    // The workload did what it says: writes, links, renames and deletes succeeded.
    let sum = |r: std::ops::Range<usize>| done[r].iter().sum::<usize>();
    assert!(sum(0..30) > 0 && sum(55..60) > 0 && sum(60..70) > 0 && sum(70..80) > 0, "{done:?}");
    // The seeds are fixed: the longer workloads make O_TMPFILE files.
    assert!(ops < 300 || sum(84..86) > 0, "{done:?}");
    eprintln!("workload {seed}: {} of {ops} operations succeeded", done.iter().sum::<usize>());
}

#[test]
fn counters_agree_with_a_walk_after_a_workload_a_clean_remount_and_a_kill() {
    let d = Dirs::new();
    // A plain lower file from before densefs, written in place through it later.
    fs::write(d.lower.join("plain"), b"a plain lower file").unwrap();
    let m = Mount::new(&d.lower, &d.mnt, "compression=zstd-3,recordsize=64K");
    for dir in ["a", "b", "a/deep"] {
        fs::create_dir(m.path(dir)).unwrap();
    }
    // Three datasets, one inside another.
    set(&m.path("b"), "compression=off");
    set(&m.path("a"), "compression=gzip-1");
    set(&m.path("a/deep"), "recordsize=32K");
    // No clean run counted this tree: the mount counts it by a walk of its own.
    wait_up_to("the counters built", WAIT, || !engine_snapshot(&d.mnt)["usage"].is_null());

    random_workload(&d.mnt, 1, 400);
    OpenOptions::new().write(true).open(m.path("plain")).unwrap().write_all_at(&compressible(100_000, 3), 10).unwrap();
    let before = assert_counters_agree(&d.mnt, "after a workload");
    assert!(before["files"].as_u64().unwrap() > 5, "{before}");

    // A clean unmount saves them: the next mount answers without a walk.
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "compression=zstd-3,recordsize=64K");
    let counted = report(&d.mnt, "report");
    assert_eq!(counted["stats_from"], "counters", "after a clean remount: {counted}");
    assert_totals_match(totals(&counted), before, "saved and read back");
    // The datasets' too (each was walked, and so counted, before the unmount).
    for dataset in ["a", "b"] {
        assert_eq!(assert_dataset_agrees(&m.path(dataset), "after a clean remount"), "counters", "{dataset}");
    }

    random_workload(&d.mnt, 2, 300);
    assert_counters_agree(&d.mnt, "after a second workload");

    // A crash: the saved counters are the last clean run's, not trusted (the workload before
    // the kill changed the tree); the mount counts again by a walk in the background, with no
    // request asking (the metrics show them once it has).
    random_workload(&d.mnt, 3, 100);
    m.kill();
    let m = Mount::new(&d.lower, &d.mnt, "compression=zstd-3,recordsize=64K");
    wait_up_to("the counters rebuilt", WAIT, || !engine_snapshot(&d.mnt)["usage"].is_null());
    let rebuilt = engine_snapshot(&d.mnt)["usage"].clone();
    let walked = report(&d.mnt, "scrub");
    assert_eq!(rebuilt["files"], walked["files"], "{rebuilt} {walked}");
    // Within a block per file: the lower writes back what the killed daemon left in its page
    // cache between the two walks, and adds extent blocks as it does (assert_counters_agree).
    let (used_rebuilt, used_walked) = (rebuilt["used"].as_i64().unwrap(), walked["stats"]["used"].as_i64().unwrap());
    assert!((used_rebuilt - used_walked).abs() <= 4096 * walked["files"].as_i64().unwrap(), "{rebuilt} {walked}");
    assert_counters_agree(&d.mnt, "after a kill");
    random_workload(&d.mnt, 4, 200);
    assert_counters_agree(&d.mnt, "after a kill, a walk and a workload");
    m.unmount();
}

fn set(dir: &Path, assignment: &str) {
    let out = Command::new(BIN).arg("set").arg(assignment).arg(dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Each dataset's report comes from its counters (`from` says which may walk) and equals a
/// walk's.
fn assert_datasets(mnt: &Path, datasets: &[&str], walking: &[&str], when: &str) {
    wait_until_closed(mnt);
    for d in datasets {
        let from = assert_dataset_agrees(&mnt.join(d), &format!("{when}: {d}"));
        let expected = if walking.contains(d) { "walk" } else { "counters" };
        assert_eq!(from, expected, "{when}: {d}");
    }
}

#[test]
fn dataset_counters_follow_files_moving_between_datasets_and_give_way_where_they_cannot() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=zstd-3");
    // A dataset's walk is kept as its counters only once the mount's are known (a walk of its
    // own at a first mount, on an idle thread: slow on a loaded machine).
    wait_up_to("the counters built", WAIT, || !engine_snapshot(&d.mnt)["usage"].is_null());
    for dir in ["x", "x/sub", "y", "x/plain", "x/plain/inner"] {
        fs::create_dir(m.path(dir)).unwrap();
    }
    set(&m.path("x"), "compression=gzip-1");
    set(&m.path("x/sub"), "recordsize=32K");
    set(&m.path("y"), "compression=lz4");
    set(&m.path("x/plain/inner"), "compression=off");
    for (i, f) in ["x/a", "x/b", "x/sub/c", "x/sub/d", "y/e", "x/plain/f", "x/plain/inner/g"].iter().enumerate() {
        fs::write(m.path(f), compressible(50_000 + 70_000 * i, i as u64)).unwrap();
    }
    let all = ["x", "x/sub", "y", "x/plain/inner"];
    // Each dataset's first report walks; from then on its counters answer.
    assert_datasets(&d.mnt, &all, &all, "first reports");
    assert_datasets(&d.mnt, &all, &[], "second reports");

    // Changes the counters follow: writes, appends, truncates, files moving between datasets
    // (open or not, over another file or not), deletes, directories made and removed, an
    // O_TMPFILE named in another dataset, a plain lower file written in place.
    fs::write(m.path("x/sub/new"), compressible(300_000, 9)).unwrap();
    OpenOptions::new().append(true).open(m.path("x/a")).unwrap().write_all(&compressible(100_000, 10)).unwrap();
    OpenOptions::new().write(true).open(m.path("x/b")).unwrap().set_len(10_000).unwrap();
    fs::rename(m.path("x/sub/c"), m.path("y/c")).unwrap();
    fs::rename(m.path("y/e"), m.path("x/sub/e")).unwrap();
    fs::rename(m.path("x/plain/f"), m.path("y/c")).unwrap();
    {
        let mut open = OpenOptions::new().append(true).open(m.path("x/sub/d")).unwrap();
        open.write_all(&compressible(80_000, 11)).unwrap();
        fs::rename(m.path("x/sub/d"), m.path("x/plain/inner/d")).unwrap();
        open.write_all(&compressible(80_000, 12)).unwrap();
    }
    fs::remove_file(m.path("x/plain/inner/g")).unwrap();
    fs::create_dir(m.path("x/sub/dir")).unwrap();
    fs::create_dir(m.path("y/gone")).unwrap();
    fs::remove_dir(m.path("y/gone")).unwrap();
    let tmp = OpenOptions::new().read(true).write(true).custom_flags(libc::O_TMPFILE).open(m.path("x/sub")).unwrap();
    tmp.write_all_at(&compressible(200_000, 13), 0).unwrap();
    link_at(&tmp, &m.path("y/named")).unwrap();
    drop(tmp);
    assert_datasets(&d.mnt, &all, &[], "after changes the counters follow");

    // A directory moved from one dataset to another: both walk again (a dataset inside it
    // keeps its counters), then count on.
    fs::rename(m.path("x/plain"), m.path("y/plain")).unwrap();
    assert_datasets(&d.mnt, &["x", "y", "x/sub"], &["x", "y"], "a directory moved from x to y");
    assert_datasets(&d.mnt, &["y/plain/inner"], &[], "a directory moved from x to y");
    assert_datasets(&d.mnt, &["x", "y"], &[], "after their walk");

    // A hard link from one dataset into another: those it touched walk again.
    fs::hard_link(m.path("x/a"), m.path("y/link")).unwrap();
    assert_datasets(&d.mnt, &["x", "y", "x/sub"], &["y"], "a hard link from x into y");
    OpenOptions::new().append(true).open(m.path("y/link")).unwrap().write_all(&compressible(5_000, 14)).unwrap();
    // Which datasets hold a hard-linked file's names is not known: every one walks again.
    let now = ["x", "y", "x/sub", "y/plain/inner"];
    assert_datasets(&d.mnt, &now, &now, "a hard-linked file written");

    // A directory that becomes a dataset, or stops being one, starts without counters.
    set(&m.path("x/sub/dir"), "compression=gzip-9");
    fs::write(m.path("x/sub/dir/h"), compressible(90_000, 15)).unwrap();
    assert_datasets(&d.mnt, &["x/sub/dir", "x/sub"], &["x/sub/dir"], "a new dataset");
    let out = Command::new(BIN).args(["inherit", "compression"]).arg(m.path("x/sub/dir")).output().unwrap();
    assert!(out.status.success());
    set(&m.path("x/sub/dir"), "compression=zstd-9");
    assert_datasets(&d.mnt, &["x/sub/dir"], &["x/sub/dir"], "a dataset again");

    // A clean remount keeps them.
    let datasets = ["x", "x/sub", "y", "y/plain/inner", "x/sub/dir"];
    assert_datasets(&d.mnt, &datasets, &[], "before the unmount");
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "compression=zstd-3");
    assert_datasets(&d.mnt, &datasets, &[], "after a clean remount");
    // Not after a kill: each walks once again.
    fs::write(m.path("y/after"), compressible(10_000, 16)).unwrap();
    m.kill();
    let m = Mount::new(&d.lower, &d.mnt, "compression=zstd-3");
    wait_up_to("the counters rebuilt", WAIT, || !engine_snapshot(&d.mnt)["usage"].is_null());
    assert_datasets(&d.mnt, &datasets, &datasets, "after a kill");
    assert_datasets(&d.mnt, &datasets, &[], "after a kill and a walk");
    m.unmount();
}

#[test]
fn a_read_only_mount_uses_the_counters_a_clean_run_saved() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    fs::write(m.path("x"), compressible(200_000, 1)).unwrap();
    fs::create_dir(m.path("d")).unwrap();
    let counted = totals(&report(&d.mnt, "report"));
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "ro");
    let r = report(&d.mnt, "report");
    assert_eq!((r["stats_from"].as_str(), totals(&r)), (Some("counters"), counted));
    assert_eq!(r["files"], 1);
    assert_eq!(r["directories"], 2);
    m.unmount();
}

//! The mount's statistics as counters (issue 47, `core/usage.rs`): `densefs get` on the mount
//! root answers from counters kept as files change, saved at a clean unmount and rebuilt by a
//! walk after a crash; after any workload they equal what a walk of the lower files finds
//! (`densefs scrub` walks every time).

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

/// A report on the mount root (`user.densefs.report` or `.scrub`), read in one call.
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
    // A last close's RELEASE reaches the daemon after close(2) returned, and may land, sync or
    // free old copies: the two reports must see the same tree.
    wait_up_to("every file closed", WAIT, || engine_snapshot(mnt)["inodes"]["open_files"] == 0);
    let counted = report(mnt, "report");
    assert_eq!(counted["stats_from"], "counters", "{when}: {counted}");
    let walked = report(mnt, "scrub");
    assert_eq!(walked["stats_from"], "walk");
    assert_totals_match(totals(&counted), totals(&walked), when);
    totals(&walked)
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
    let out = Command::new(BIN).args(["set", "compression=off"]).arg(m.path("b")).output().unwrap();
    assert!(out.status.success());
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

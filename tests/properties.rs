//! Datasets and properties: `densefs set/inherit/get/list/stat/scrub` on real mounts.

mod common;

use common::{compressible, random_bytes, wait_until, Dirs, Mount, BIN};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output};

fn densefs(args: &[&str], paths: &[&Path]) -> Output {
    Command::new(BIN).args(args).args(paths).output().expect("run densefs")
}

fn ok(out: Output) -> String {
    assert!(out.status.success(), "densefs failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// `densefs get -H -p -o value PROP PATH`
fn value(prop: &str, path: &Path) -> String {
    ok(densefs(&["get", "-H", "-p", "-o", "value", prop], &[path])).trim().to_string()
}

fn source(prop: &str, path: &Path) -> String {
    ok(densefs(&["get", "-H", "-o", "source", prop], &[path])).trim().to_string()
}

/// Codec id and record shift of a lower container.
fn stored_as(lower_file: &Path) -> (u8, u8) {
    let header = common::current_header(lower_file);
    (header[12], header[10])
}

#[test]
fn properties_are_inherited_overridden_and_survive_remounts() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    let (backup, deep, other) = (m.path("backup"), m.path("backup/deep"), m.path("other"));
    fs::create_dir_all(&deep).unwrap();
    fs::create_dir_all(&other).unwrap();
    ok(densefs(&["set", "compression=gzip-9", "recordsize=64K"], &[&backup]));
    ok(densefs(&["set", "compression=zstd-1"], &[&deep]));
    assert_eq!(value("compression", &backup), "gzip-9");
    assert_eq!(source("compression", &backup), "local");
    assert_eq!(value("compression", &deep), "zstd-1");
    assert_eq!(value("recordsize", &deep), "64K");
    assert_eq!(source("recordsize", &deep), format!("inherited from {}", backup.display()));
    assert_eq!(value("compression", &other), "lz4");
    assert_eq!(source("compression", &other), "default");
    let data = compressible(300_000, 1);
    for dir in [&backup, &deep, &other] {
        fs::write(dir.join("f"), &data).unwrap();
    }
    // New subdirectories inherit too.
    fs::create_dir(deep.join("sub")).unwrap();
    fs::write(deep.join("sub/g"), &data).unwrap();
    assert_eq!(stored_as(&d.lower.join("backup/f")), (2, 16));
    assert_eq!(stored_as(&d.lower.join("backup/deep/f")), (3, 16));
    assert_eq!(stored_as(&d.lower.join("backup/deep/sub/g")), (3, 16));
    assert_eq!(stored_as(&d.lower.join("other/f")), (1, 17));
    // The property store is invisible through the mount.
    let names: Vec<_> = fs::read_dir(&backup).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(value("compression", &backup), "gzip-9");
    assert_eq!(value("compression", &deep), "zstd-1");
    ok(densefs(&["inherit", "compression"], &[&deep]));
    assert_eq!(value("compression", &deep), "gzip-9");
    assert_eq!(source("compression", &deep), format!("inherited from {}", backup.display()));
    fs::write(deep.join("h"), &data).unwrap();
    assert_eq!(stored_as(&d.lower.join("backup/deep/h")).0, 2);
    // Everything reads back whatever it was written with.
    for f in ["backup/f", "backup/deep/f", "backup/deep/sub/g", "other/f", "backup/deep/h"] {
        assert_eq!(fs::read(m.path(f)).unwrap(), data, "{f}");
    }
    m.unmount();
}

#[test]
fn bad_property_commands_are_refused_clearly() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    fs::write(m.path("file"), b"x").unwrap();
    for (args, needle) in [
        (vec!["set", "compression=gzip-10"], "unknown compression"),
        (vec!["set", "colour=blue"], "unknown property"),
        (vec!["set", "compression"], "PROPERTY=VALUE"),
        (vec!["inherit", "compressratio"], "cannot be inherited"),
    ] {
        let out = densefs(&args, &[&d.mnt]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains(needle), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = densefs(&["set", "compression=zstd"], &[&m.path("file")]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("directories"));
    let out = densefs(&["get", "all"], &[d.root.path()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not on a densefs mount"), "{}", String::from_utf8_lossy(&out.stderr));
    m.unmount();
}

#[test]
fn accounting_matches_the_lower_files_and_survives_a_crash() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=gzip-6,recordsize=16K");
    fs::create_dir(m.path("data")).unwrap();
    fs::write(m.path("data/text"), compressible(2 << 20, 2)).unwrap();
    fs::write(m.path("data/noise"), random_bytes(256 << 10, 3)).unwrap();
    let sparse = fs::File::create(m.path("data/sparse")).unwrap();
    sparse.set_len(10 << 20).unwrap();
    drop(sparse);
    // Let the lower file system allocate what it delayed (its extent blocks count in st_blocks).
    Command::new("sync").status().unwrap();
    let lower_blocks_now =
        || -> u64 { ["text", "noise", "sparse"].iter().map(|f| fs::metadata(d.lower.join("data").join(f)).unwrap().blocks() * 512).sum() };
    let dir = m.path("data");
    // A process forked while a file was being written (another test's `Command`) closes its copy
    // of the descriptor: that FLUSH lands a record the write had half filled, the write's next
    // request lands it again, and the first copy's block is freed a moment later. `used` is the
    // lower files' blocks whenever the two are read together.
    let mut used_now = 0;
    wait_until("used to equal the lower files' blocks", || {
        used_now = value("used", &dir).parse::<u64>().unwrap();
        used_now == lower_blocks_now()
    });
    let lower_blocks = used_now;
    assert_eq!(value("logicalused", &dir).parse::<u64>().unwrap(), (2 << 20) + (256 << 10), "holes are not data");
    assert_eq!(value("written", &dir).parse::<u64>().unwrap(), (2 << 20) + (256 << 10) + (10 << 20));
    let ratio: f64 = value("compressratio", &dir).parse().unwrap();
    let expect = ((2 << 20) + (256 << 10)) as f64 / lower_blocks as f64;
    assert!((ratio - expect).abs() < 0.01, "{ratio} vs {expect}");
    assert!(ratio > 2.0);
    assert_eq!(value("records_gzip-6", &dir), "128");
    assert_eq!(value("records_raw", &dir), "16");
    assert_eq!(value("records_raw_low_savings", &dir), "16");
    let stat = ok(densefs(&["stat"], &[&m.path("data/text")]));
    assert!(stat.contains("gzip-6 128"), "{stat}");
    let lower_len = std::fs::metadata(d.lower.join("data/text")).unwrap().len();
    let format = densefs::format::FORMAT_VERSION;
    assert!(stat.contains(&format!("container (format {format}, lower file {lower_len} bytes long)")), "{stat}");
    let json: serde_json::Value = serde_json::from_str(&ok(densefs(&["stat", "--json"], &[&m.path("data/noise")]))).unwrap();
    assert_eq!(json[0]["stats"]["records"]["raw"], 16);
    m.kill();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(value("used", &m.path("data")).parse::<u64>().unwrap(), lower_blocks, "counters recomputed after a crash");
    let list = ok(densefs(&["list", "-r", "-H"], &[&d.mnt]));
    assert!(list.starts_with(&format!("{}\t", d.mnt.display())), "{list}");
    m.unmount();
}

#[test]
fn scrub_finds_a_record_corrupted_behind_the_mounts_back() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,recordsize=4K");
    fs::create_dir(m.path("dir")).unwrap();
    fs::write(m.path("dir/good"), compressible(64 << 10, 4)).unwrap();
    fs::write(m.path("dir/victim"), compressible(64 << 10, 5)).unwrap();
    let out = densefs(&["scrub"], &[&d.mnt]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    // Flip a byte of record 5's stored bytes (slot 0: the file was written once).
    let lower = d.lower.join("dir/victim");
    let mut raw = fs::read(&lower).unwrap();
    raw[common::copy_offset(&lower, 5, 0) as usize + 7] ^= 0x20;
    fs::write(&lower, &raw).unwrap();
    let out = densefs(&["scrub"], &[&d.mnt]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("dir/victim: record 5: slot 0: checksum mismatch"), "{text}");
    assert!(text.contains(": 1 problem\n"), "{text}");
    assert!(!text.contains("good"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&String::from_utf8_lossy(&densefs(&["scrub", "--json"], &[&d.mnt]).stdout)).unwrap();
    assert_eq!(json["problem_count"], 1);
    m.unmount();
}

#[test]
fn mount_helper_and_completions_work() {
    let d = Dirs::new();
    let helper = d.root.path().join("mount.densefs");
    std::os::unix::fs::symlink(BIN, &helper).unwrap();
    let out = Command::new(&helper).arg(&d.lower).arg(&d.mnt).args(["-o", "compression=zstd-3,rw,noatime"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(value("compression", &d.mnt), "zstd-3");
    let out = Command::new(BIN).arg("umount").arg(&d.mnt).output().unwrap();
    assert!(out.status.success());
    let bash = ok(densefs(&["completions", "bash"], &[]));
    assert!(bash.contains("densefs") && bash.contains("scrub"));
}

#[test]
fn recompress_turns_an_lz4_tree_into_gzip9_online_with_every_byte_intact() {
    let d = Dirs::new();
    // A plain file from before densefs, and an lz4 tree written through it.
    fs::create_dir_all(d.lower.join("old")).unwrap();
    let plain = compressible(3 << 20, 20);
    fs::write(d.lower.join("old/plain.fq"), &plain).unwrap();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,recordsize=32K");
    fs::create_dir_all(m.path("a/b")).unwrap();
    let mut expect = vec![("old/plain.fq".to_string(), plain)];
    for (i, name) in ["a/one", "a/b/two", "a/b/three"].iter().enumerate() {
        let data = if i == 2 { random_bytes(200_000, 7) } else { compressible(2 << 20, i as u64) };
        fs::write(m.path(name), &data).unwrap();
        expect.push((name.to_string(), data));
    }
    let before: u64 = value("used", &d.mnt).parse().unwrap();
    // Read a file over and over while the tree is rewritten under it.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (path, want, stop) = (m.path("a/one"), expect[1].1.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert!(fs::read(&path).unwrap() == want, "a file being recompressed read back wrong");
                reads += 1;
            }
            reads
        })
    };
    let out = ok(densefs(&["recompress", "-r", "-q", "-o", "compression=gzip-9"], &[&d.mnt]));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    assert!(out.contains("recompressed 4 of 4 files"), "{out}");
    for (name, data) in &expect {
        assert!(fs::read(m.path(name)).unwrap() == *data, "{name} changed");
        assert_eq!(stored_as(&d.lower.join(name)).0, 2, "{name} is gzip now");
    }
    let after: u64 = value("used", &d.mnt).parse().unwrap();
    assert!(after < before, "gzip-9 uses less than lz4 ({after} vs {before})");
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    for (name, data) in &expect {
        assert!(fs::read(m.path(name)).unwrap() == *data, "{name} after remount");
    }
    // Changing the record size copies the file into a new container.
    ok(densefs(&["recompress", "-q", "-o", "recordsize=1M,compression=zstd-3"], &[&m.path("a/one")]));
    assert_eq!(stored_as(&d.lower.join("a/one")), (3, 20));
    assert!(fs::read(m.path("a/one")).unwrap() == expect[1].1);
    m.unmount();
}

#[test]
fn reports_and_opens_running_together_do_not_deadlock() {
    // Regression: a report (or the 5-second writeback) held the inode table while waiting for a
    // file's open lock, while an open held that lock and waited for the table.
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,recordsize=4K");
    fs::create_dir(m.path("dir")).unwrap();
    const FILES: u64 = 300;
    for i in 0..FILES {
        fs::write(m.path(&format!("dir/f{i}")), compressible(5000, i)).unwrap();
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let openers: Vec<_> = (0..3)
        .map(|t| {
            let (dir, stop) = (m.path("dir"), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    drop(fs::File::open(dir.join(format!("f{}", (n * 7 + t) % FILES))).unwrap());
                    n += 1;
                }
                n
            })
        })
        .collect();
    // A deadlock blocks in the kernel for ever: a watchdog turns it into a failure.
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    {
        let (progress, stop) = (progress.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut last = u64::MAX;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_secs(20));
                let now = progress.load(std::sync::atomic::Ordering::Relaxed);
                if now == last && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    eprintln!("reports_and_opens_running_together_do_not_deadlock: no report for 20 s: the daemon is deadlocked");
                    std::process::exit(101);
                }
                last = now;
            }
        });
    }
    // Reports straight through the xattr interface, as fast as the daemon answers.
    let dir = std::ffi::CString::new(m.path("dir").to_str().unwrap()).unwrap();
    let name = std::ffi::CString::new("user.densefs.report").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(4);
    let mut reports = 0;
    let mut buf = vec![0u8; 65536];
    while std::time::Instant::now() < deadline {
        let n = unsafe { libc::getxattr(dir.as_ptr(), name.as_ptr(), buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
        assert!(n > 0, "report failed: {}", std::io::Error::last_os_error());
        reports += 1;
        progress.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for o in openers {
        assert!(o.join().unwrap() > 0);
    }
    assert!(reports > 0);
    m.unmount();
}

#[test]
fn sizes_read_the_same_in_set_recompress_and_mount_options() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "recordsize=32KiB");
    assert_eq!(value("recordsize", &d.mnt), "32K");
    let dir = m.path("d");
    fs::create_dir(&dir).unwrap();
    ok(densefs(&["set", "recordsize=64KiB"], &[&dir]));
    assert_eq!(value("recordsize", &dir), "64K");
    let data = compressible(300_000, 3);
    fs::write(dir.join("f"), &data).unwrap();
    assert_eq!(stored_as(&d.lower.join("d/f")).1, 16);
    ok(densefs(&["recompress", "-q", "-o", "recordsize=128KiB"], &[&dir.join("f")]));
    assert_eq!(stored_as(&d.lower.join("d/f")).1, 17);
    assert!(fs::read(dir.join("f")).unwrap() == data);
    let out = densefs(&["set", "recordsize=1G"], &[&dir]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid recordsize '1G'"), "{out:?}");
    m.unmount();
}

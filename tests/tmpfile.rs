//! O_TMPFILE (FUSE_TMPFILE, Linux 6.1+): an unnamed file that `linkat` names and that is gone
//! with its last descriptor, a daemon's kill included; the same answers as the lower file
//! system's own O_TMPFILE, side by side. (tests/usage.rs makes them in its random workload and
//! checks the statistics.)

mod common;

use common::{compressible, link_at, Dirs, Mount};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

fn tmpfile(dir: &Path, excl: bool) -> std::io::Result<File> {
    let flags = libc::O_TMPFILE | if excl { libc::O_EXCL } else { 0 };
    OpenOptions::new().read(true).write(true).mode(0o640).custom_flags(flags).open(dir)
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// What a program sees of O_TMPFILE in `dir`, step by step.
fn story(dir: &Path) -> Vec<String> {
    let data = compressible(700_000, 5);
    let mut seen = Vec::new();
    let f = tmpfile(dir, false).unwrap();
    f.write_all_at(&data, 0).unwrap();
    let st = f.metadata().unwrap();
    seen.push(format!("unnamed: links {} mode {:o} size {} listed {:?}", st.nlink(), st.mode() & 0o7777, st.len(), names(dir)));
    link_at(&f, &dir.join("named")).unwrap();
    f.write_all_at(b"after the link", data.len() as u64).unwrap();
    seen.push(format!("linked: links {} listed {:?}", f.metadata().unwrap().nlink(), names(dir)));
    seen.push(format!("named again: {:?}", link_at(&f, &dir.join("named")).map_err(|e| e.raw_os_error())));
    drop(f);
    let mut want = data.clone();
    want.extend_from_slice(b"after the link");
    seen.push(format!("read back by name: {}", std::fs::read(dir.join("named")).unwrap() == want));
    // Closed unnamed: gone.
    let g = tmpfile(dir, false).unwrap();
    g.write_all_at(&data, 0).unwrap();
    drop(g);
    seen.push(format!("closed unnamed: listed {:?}", names(dir)));
    // O_EXCL: never to be named.
    let h = tmpfile(dir, true).unwrap();
    seen.push(format!("O_EXCL linked: {:?}", link_at(&h, &dir.join("excl")).map_err(|e| e.raw_os_error())));
    seen.push(format!("not a directory: {:?}", tmpfile(&dir.join("named"), false).map(|_| ()).map_err(|e| e.raw_os_error())));
    seen
}

#[test]
fn o_tmpfile_answers_as_the_lower_does_and_leaves_nothing_behind() {
    let d = Dirs::new();
    let reference = d.root.path().join("ext4");
    std::fs::create_dir(&reference).unwrap();
    let m = Mount::new(&d.lower, &d.mnt, "compression=zstd-3");
    if tmpfile(&d.mnt, false).is_err_and(|e| e.raw_os_error() == Some(libc::EOPNOTSUPP)) {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        eprintln!("SKIP: this kernel ({}) sends no FUSE_TMPFILE (Linux 6.1+)", release.trim());
        m.unmount();
        return;
    }
    let ours = story(&d.mnt);
    let theirs = story(&reference);
    assert_eq!(ours, theirs, "densefs (left) and the lower file system (right)");
    // What was named is stored compressed; the lower holds nothing else.
    assert_eq!(names(&d.lower), vec!["named".to_string()]);
    let stored = std::fs::metadata(d.lower.join("named")).unwrap().blocks() * 512;
    assert!(stored < 350_000, "a named O_TMPFILE file took {stored} bytes for 700 KB of text");
    let log = m.log_text();
    m.unmount();
    assert!(!log.contains("Not Implemented"), "{log}");
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(std::fs::read(m.path("named")).unwrap().len(), 700_000 + "after the link".len());
    m.unmount();
}

#[test]
fn an_unnamed_file_vanishes_when_the_daemon_is_killed() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let Ok(f) = tmpfile(&d.mnt, false) else {
        eprintln!("SKIP: no O_TMPFILE through FUSE here (Linux 6.1+)");
        return m.unmount();
    };
    f.write_all_at(&compressible(2 << 20, 9), 0).unwrap();
    f.sync_all().unwrap();
    m.kill();
    drop(f);
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert!(names(&m.mnt).is_empty() && names(&d.lower).is_empty(), "{:?} {:?}", names(&m.mnt), names(&d.lower));
    m.unmount();
}

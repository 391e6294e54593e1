//! Attributes that must not change unless the file does: st_blksize in every kind of reply
//! (CREATE, SETATTR, GETATTR, LOOKUP, READDIRPLUS), beside the same steps on the lower's own
//! file system.

mod common;

use common::{Dirs, Mount};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// The steps, each with the file's st_blksize afterwards and whether the file was empty. Each
/// step makes the kernel take the attributes from another kind of reply.
fn blksizes(dir: &Path, remount: &mut dyn FnMut()) -> Vec<(&'static str, bool, u64)> {
    use std::os::unix::fs::FileExt;
    let mut seen = Vec::new();
    let stat = |name: &str| fs::metadata(dir.join(name)).unwrap().blksize();
    let f = OpenOptions::new().read(true).write(true).create_new(true).open(dir.join("e")).unwrap();
    File::create(dir.join("other")).unwrap();
    seen.push(("create", true, f.metadata().unwrap().blksize()));
    drop(f);
    seen.push(("close", true, stat("e")));
    fs::set_permissions(dir.join("e"), fs::Permissions::from_mode(0o600)).unwrap();
    seen.push(("chmod", true, stat("e")));
    fs::rename(dir.join("e"), dir.join("f")).unwrap();
    seen.push(("rename", true, stat("f")));
    seen.push(("open for reading", true, File::open(dir.join("f")).unwrap().metadata().unwrap().blksize()));
    remount();
    // A listing's attributes (READDIRPLUS), then a LOOKUP's.
    assert_eq!(fs::read_dir(dir).unwrap().count(), 2);
    seen.push(("listed", true, stat("f")));
    seen.push(("looked up", true, stat("other")));
    let f = OpenOptions::new().read(true).write(true).open(dir.join("f")).unwrap();
    f.set_len(0).unwrap(); // a SETATTR through the open handle
    seen.push(("open for writing", true, f.metadata().unwrap().blksize()));
    f.write_all_at(b"data", 0).unwrap();
    seen.push(("written", false, f.metadata().unwrap().blksize()));
    fs::set_permissions(dir.join("f"), fs::Permissions::from_mode(0o644)).unwrap();
    seen.push(("chmod with data", false, stat("f")));
    drop(f);
    seen.push(("closed with data", false, stat("f")));
    let f = OpenOptions::new().write(true).open(dir.join("f")).unwrap();
    f.set_len(0).unwrap();
    seen.push(("truncated to 0", true, f.metadata().unwrap().blksize()));
    drop(f);
    seen.push(("closed empty", true, stat("f")));
    fs::set_permissions(dir.join("f"), fs::Permissions::from_mode(0o600)).unwrap();
    seen.push(("chmod empty", true, stat("f")));
    seen
}

/// st_blksize is the record size once a file holds data, and the lower's (an empty lower file
/// is read as a plain one) while it is empty, in every reply: the CREATE reply said 128 KiB
/// and the chmod or rename after it 4096, for the same empty file.
#[test]
fn st_blksize_changes_only_with_the_file() {
    let d = Dirs::new();
    let reference = d.root.path().join("ext4");
    fs::create_dir(&reference).unwrap();
    let want = blksizes(&reference, &mut || {});
    let lower_blksize = want[0].2;
    assert!(want.iter().all(|s| s.2 == lower_blksize), "the lower's own answers: {want:?}");
    let options = "recordsize=64K";
    let mut m = Some(Mount::new(&d.lower, &d.mnt, options));
    let (lower, mnt) = (d.lower.clone(), d.mnt.clone());
    // Remounted: the kernel forgets every attribute it holds.
    let got = blksizes(&d.mnt, &mut || {
        m.take().unwrap().unmount();
        m = Some(Mount::new(&lower, &mnt, options));
    });
    let wrong: Vec<_> = got.iter().filter(|&&(_, empty, blksize)| blksize != if empty { lower_blksize } else { 64 << 10 }).collect();
    assert!(wrong.is_empty(), "st_blksize of an empty file {lower_blksize}, else 65536; wrong after: {wrong:?} (all: {got:?})");
    m.take().unwrap().unmount();
}

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

/// Birth time (`stat`'s "Birth:", statx's STATX_BTIME) is the lower inode's, through FUSE_STATX,
/// for files, directories and symlinks, old and new, and before and after a remount; a caller
/// that asks for the basic attributes only costs no STATX.
#[test]
fn birth_time_is_the_lower_inodes() {
    let d = Dirs::new();
    fs::write(d.lower.join("old"), b"before densefs").unwrap();
    fs::create_dir(d.lower.join("dir")).unwrap();
    std::os::unix::fs::symlink("old", d.lower.join("link")).unwrap();
    let Some(lower_birth) = birth(&d.lower.join("old")) else {
        eprintln!("SKIP: the lower file system keeps no birth time");
        return;
    };
    assert!(lower_birth > 0);
    let m = Mount::new(&d.lower, &d.mnt, "");
    fs::write(m.path("new"), b"through densefs").unwrap();
    let check = |mnt: &Path| {
        for name in ["old", "dir", "link", "new"] {
            assert_eq!(birth(&mnt.join(name)), birth(&d.lower.join(name)), "{name}");
        }
    };
    check(&d.mnt);
    assert!(common::requests(&d.mnt, "statx") >= 1, "no STATX reached the daemon");
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    check(&d.mnt);
    m.unmount();
}

/// A path's birth time in nanoseconds (statx, not following a symlink), if its file system
/// keeps one.
fn birth(path: &Path) -> Option<i128> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `statx` is a plain C struct of integers; all zeros is a valid value.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated; statx writes only into `sx`.
    let r = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), libc::AT_SYMLINK_NOFOLLOW, libc::STATX_BTIME, &mut sx) };
    assert_eq!(r, 0, "statx {}: {}", path.display(), std::io::Error::last_os_error());
    (sx.stx_mask & libc::STATX_BTIME != 0).then(|| sx.stx_btime.tv_sec as i128 * 1_000_000_000 + sx.stx_btime.tv_nsec as i128)
}

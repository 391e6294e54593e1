//! Extended attributes on symlinks, through real mounts: set, read, list and remove them on the
//! link itself (never its target), in every namespace the lower file system allows there, and
//! keep them through remounts and `cp -a` / `rsync -aX` (what GlusterFS bricks need:
//! `trusted.gfid` on every inode).

mod common;

use common::{random_bytes, Dirs, Mount};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

/// lsetxattr: Ok or the errno.
fn lset(p: &Path, name: &str, value: &[u8], flags: i32) -> Result<(), i32> {
    let r = unsafe { libc::lsetxattr(cpath(p).as_ptr(), c(name).as_ptr(), value.as_ptr().cast(), value.len(), flags) };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// lgetxattr (size probe first, as getfattr does): the value or the errno.
fn lget(p: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let (path, name) = (cpath(p), c(name));
    let len = unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    if len < 0 {
        return Err(errno());
    }
    let mut buf = vec![0u8; len as usize];
    let n = unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(errno());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// llistxattr, sorted.
fn llist(p: &Path) -> Vec<String> {
    let path = cpath(p);
    let len = unsafe { libc::llistxattr(path.as_ptr(), std::ptr::null_mut(), 0) };
    assert!(len >= 0, "llistxattr {}: errno {}", p.display(), errno());
    let mut buf = vec![0u8; len as usize];
    let n = unsafe { libc::llistxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0, "llistxattr {}: errno {}", p.display(), errno());
    buf.truncate(n as usize);
    let mut names: Vec<String> = buf.split(|&b| b == 0).filter(|n| !n.is_empty()).map(|n| String::from_utf8(n.to_vec()).unwrap()).collect();
    names.sort();
    names
}

fn lremove(p: &Path, name: &str) -> Result<(), i32> {
    let r = unsafe { libc::lremovexattr(cpath(p).as_ptr(), c(name).as_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// `getfattr -h -d -m - -e hex PATH` on the lower tree: the link's own attributes as text.
fn getfattr_h(p: &Path) -> String {
    let out = Command::new("getfattr")
        .args(["-h", "-d", "-m", "-", "-e", "hex", "--absolute-names"])
        .arg(p)
        .output()
        .expect("getfattr (apt-get install attr)");
    assert!(out.status.success(), "getfattr {}: {}", p.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const GFID: &str = "trusted.gfid";
const SEC: &str = "security.densefs-test";

#[test]
fn symlinks_carry_their_own_xattrs_without_following() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    fs::create_dir(m.path("dir")).unwrap();
    fs::write(m.path("target"), b"the target").unwrap();
    lset(&m.path("target"), "user.color", b"blue", 0).unwrap();
    lset(&m.path("target"), "trusted.mine", b"target's", 0).unwrap();
    std::os::unix::fs::symlink("../target", m.path("dir/to_file")).unwrap();
    std::os::unix::fs::symlink("nowhere", m.path("dangling")).unwrap();
    std::os::unix::fs::symlink("dir", m.path("to_dir")).unwrap();
    let links = ["dir/to_file", "dangling", "to_dir"];
    let gfids: Vec<Vec<u8>> = (0..links.len()).map(|i| random_bytes(16, 7 + i as u64)).collect();

    for (link, gfid) in links.iter().zip(&gfids) {
        let (mp, lp) = (m.path(link), d.lower.join(link));
        assert!(fs::symlink_metadata(&lp).unwrap().file_type().is_symlink());
        let before = llist(&lp); // whatever the lower puts there itself (an LSM label)
        lset(&mp, GFID, gfid, libc::XATTR_CREATE).unwrap_or_else(|e| panic!("{link}: set {GFID}: errno {e}"));
        lset(&mp, SEC, b"label", 0).unwrap_or_else(|e| panic!("{link}: set {SEC}: errno {e}"));
        assert_eq!(lset(&mp, GFID, gfid, libc::XATTR_CREATE), Err(libc::EEXIST), "{link}");
        assert_eq!(lset(&mp, "trusted.absent", b"x", libc::XATTR_REPLACE), Err(libc::ENODATA), "{link}");
        // Read back through the mount and on the lower link itself.
        assert_eq!(lget(&mp, GFID).unwrap(), *gfid, "{link}");
        assert_eq!(lget(&mp, SEC).unwrap(), b"label", "{link}");
        assert_eq!(lget(&lp, GFID).unwrap(), *gfid, "{link}: on the lower");
        let text = getfattr_h(&lp);
        assert!(text.contains(&format!("{GFID}=0x{}", hex(gfid))), "{link}: {text}");
        assert!(text.contains(&format!("{SEC}=0x{}", hex(b"label"))), "{link}: {text}");
        // Listed the same on both sides.
        let mut want = before.clone();
        want.extend([GFID.to_string(), SEC.to_string()]);
        want.sort();
        assert_eq!(llist(&mp), want, "{link}");
        assert_eq!(llist(&lp), want, "{link}: on the lower");
        // Remove one.
        lremove(&mp, SEC).unwrap();
        assert_eq!(lget(&mp, SEC), Err(libc::ENODATA), "{link}");
        assert_eq!(lget(&lp, SEC), Err(libc::ENODATA), "{link}: on the lower");
        assert_eq!(lremove(&mp, SEC), Err(libc::ENODATA), "{link}");
        assert_eq!(llist(&mp).len(), before.len() + 1, "{link}");

        // user.*: whatever the lower answers for its own symlink (Linux: EPERM / ENODATA).
        let lower_set = lset(&lp, "user.x", b"v", 0);
        assert_eq!(lset(&mp, "user.x", b"v", 0), lower_set, "{link}: user.* as on the lower");
        assert_eq!(lget(&mp, "user.x"), lget(&lp, "user.x"), "{link}");
        assert_eq!(lremove(&mp, "user.x"), lremove(&lp, "user.x"), "{link}");
        // densefs's own names do not apply to symlinks and never reach the lower.
        assert_eq!(lget(&mp, "user.densefs.compression"), Err(libc::ENODATA), "{link}");
        assert_eq!(lget(&mp, "user.densefs.report"), Err(libc::ENODATA), "{link}");
        assert_eq!(lset(&mp, "user.densefs.compression", b"gzip-9", 0), Err(libc::EPERM), "{link}");
        assert_eq!(lset(&mp, "user.densefs.recompress", b"", 0), Err(libc::EPERM), "{link}");
        assert_eq!(lremove(&mp, "user.densefs.compression"), Err(libc::EPERM), "{link}");
    }

    // The targets are untouched.
    let mut want = vec!["trusted.mine".to_string(), "user.color".to_string()];
    want.sort();
    // On the lower, a file written through densefs also carries its birth header (FORMAT.md),
    // which the mount never lists.
    assert_eq!(without_own(llist(&d.lower.join("target"))), want);
    assert_eq!(llist(&m.path("target")), want);
    assert_eq!(lget(&m.path("target"), "user.color").unwrap(), b"blue");
    assert!(!llist(&d.lower.join("dir")).iter().any(|n| n.starts_with("trusted.") || n.starts_with("user.densefs")));
    assert!(!d.lower.join("dir/.densefs.props").exists());
    assert!(!d.lower.join("nowhere").exists(), "a dangling link's target is not created");
    // Following calls through the link reach the target, as on any file system.
    assert_eq!(fs::read(m.path("dir/to_file")).unwrap(), b"the target");
    let follow = unsafe { libc::getxattr(cpath(&m.path("dir/to_file")).as_ptr(), c(GFID).as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!((follow, errno()), (-1, libc::ENODATA), "getxattr follows to the target, which has no gfid");

    // After a remount (fresh inode table, fresh descriptors) they are still there.
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    for (link, gfid) in links.iter().zip(&gfids) {
        assert_eq!(lget(&m.path(link), GFID).unwrap(), *gfid, "{link} after a remount");
        assert_eq!(lget(&m.path(link), SEC), Err(libc::ENODATA), "{link} after a remount");
    }
    // A renamed link keeps its attributes, and they are reached under the new name.
    fs::rename(m.path("dangling"), m.path("dir/moved")).unwrap();
    assert_eq!(lget(&m.path("dir/moved"), GFID).unwrap(), gfids[1]);
    lset(&m.path("dir/moved"), "trusted.after-rename", b"1", 0).unwrap();
    assert_eq!(lget(&d.lower.join("dir/moved"), "trusted.after-rename").unwrap(), b"1");
    m.unmount();
}

/// A source tree outside the mount: a file with xattrs, a link to it, a dangling link and a link
/// to a directory, the links carrying trusted.gfid and a security.* attribute.
fn source_tree(src: &Path) {
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("file"), b"data").unwrap();
    lset(&src.join("file"), "trusted.a", b"1", 0).unwrap();
    lset(&src.join("file"), "user.b", b"2", 0).unwrap();
    std::os::unix::fs::symlink("file", src.join("link")).unwrap();
    std::os::unix::fs::symlink("nowhere", src.join("sub/dangling")).unwrap();
    std::os::unix::fs::symlink("..", src.join("sub/up")).unwrap();
    for (i, l) in ["link", "sub/dangling", "sub/up"].iter().enumerate() {
        lset(&src.join(l), GFID, &random_bytes(16, 100 + i as u64), 0).unwrap();
        lset(&src.join(l), SEC, format!("label{i}").as_bytes(), 0).unwrap();
    }
}

/// Every path's attributes below `root`, relative paths and values, as getfattr prints them.
/// The names but densefs's own (`user.densefs.*`, kept on lower files only).
fn without_own(names: Vec<String>) -> Vec<String> {
    names.into_iter().filter(|n| !n.starts_with("user.densefs.")).collect()
}

/// [`dump`] of a lower tree, without densefs's own attributes (a container's birth header).
fn dump_lower(root: &Path) -> String {
    dump(root).lines().filter(|l| !l.starts_with("user.densefs.")).map(|l| format!("{l}\n")).collect()
}

fn dump(root: &Path) -> String {
    let out =
        Command::new("getfattr").args(["-h", "-R", "-d", "-m", "-", "-e", "hex"]).arg(".").current_dir(root).output().expect("getfattr");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn cp_a_and_rsync_ax_keep_symlink_xattrs() {
    let d = Dirs::new();
    let src = d.root.path().join("src");
    source_tree(&src);
    let want = dump(&src);
    assert_eq!(want.matches(GFID).count(), 3, "{want}");
    let m = Mount::new(&d.lower, &d.mnt, "");
    let cp = Command::new("cp").arg("-a").arg(&src).arg(m.path("by-cp")).status().unwrap();
    assert!(cp.success());
    let rsync = Command::new("rsync").arg("-aX").arg(format!("{}/", src.display())).arg(m.path("by-rsync")).status();
    let rsync = match rsync {
        Ok(s) => s,
        Err(e) => panic!("rsync: {e} (apt-get install rsync)"),
    };
    assert!(rsync.success());
    for copy in ["by-cp", "by-rsync"] {
        assert_eq!(dump(&m.path(copy)), want, "{copy}: through the mount");
        assert_eq!(dump_lower(&d.lower.join(copy)), want, "{copy}: on the lower");
        assert_eq!(fs::read_link(m.path(copy).join("sub/dangling")).unwrap().to_str(), Some("nowhere"));
        assert_eq!(fs::read(m.path(copy).join("link")).unwrap(), b"data");
    }
    // Copying back out of the mount keeps them too.
    let back = d.root.path().join("back");
    assert!(Command::new("rsync").arg("-aX").arg(format!("{}/", m.path("by-cp").display())).arg(&back).status().unwrap().success());
    assert_eq!(dump(&back), want);
    m.unmount();
}

/// `ls -l` asks every entry for its SELinux label. Without SELinux on the host, a file with no
/// label says labels are unsupported (EOPNOTSUPP, not ENODATA), which makes `ls` stop asking
/// for the rest of the mount; a label that is set is read, shown and removed as on ext4.
#[test]
fn an_unlabelled_file_says_labels_are_unsupported_and_a_set_label_still_reads_back() {
    let selinux = Path::new("/sys/fs/selinux/enforce").exists();
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let (plain, labelled) = (m.path("plain"), m.path("labelled"));
    fs::write(&plain, random_bytes(1000, 1)).unwrap();
    fs::write(&labelled, random_bytes(1000, 2)).unwrap();
    let absent = if selinux { libc::ENODATA } else { libc::EOPNOTSUPP };
    assert_eq!(lget(&plain, "security.selinux"), Err(absent));
    if !selinux {
        let label = b"system_u:object_r:user_home_t:s0";
        lset(&labelled, "security.selinux", label, 0).unwrap();
        assert_eq!(lget(&labelled, "security.selinux").unwrap(), label);
        // One `ls` each: after a file without a label, `ls` asks no other file of the mount.
        let mode = |p: &Path| {
            let ls = Command::new("ls").arg("-l").arg(p).output().unwrap();
            String::from_utf8_lossy(&ls.stdout).split(' ').next().unwrap().to_string()
        };
        assert_eq!((mode(&labelled).as_str(), mode(&plain).as_str()), ("-rw-r--r--.", "-rw-r--r--"));
        lremove(&labelled, "security.selinux").unwrap();
        assert_eq!(lget(&labelled, "security.selinux"), Err(libc::EOPNOTSUPP));
    }
    // Other security attributes still answer ENODATA when absent.
    assert_eq!(lget(&plain, "security.capability"), Err(libc::ENODATA));
    m.unmount();
}

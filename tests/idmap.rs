//! Idmapped mounts (FUSE_ALLOW_IDMAP, Linux 6.12+), as container runtimes make them: the same
//! users create, chown, write and are refused through an idmapped mount of densefs and through
//! one of the lower directory itself, and owners, modes and answers come out the same, seen
//! through the idmapped mounts and on disk.

mod common;

use common::{Dirs, Mount};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// The ids the idmapped mounts shift by: on-disk id N shows as N + SHIFT.
const SHIFT: u32 = 10_000;

/// A user namespace mapping 0..65536 inside to SHIFT.. outside (a process kept asleep in it).
struct UserNs {
    child: Child,
    fd: OwnedFd,
}

impl UserNs {
    fn new() -> UserNs {
        let child = Command::new("unshare").args(["--user", "sleep", "600"]).spawn().expect("run unshare");
        let ns = format!("/proc/{}/ns/user", child.id());
        // Wait until the child is in its own namespace, then map it as root may.
        common::wait_up_to("unshare to enter its user namespace", 30, || {
            std::fs::read_link(&ns).ok() != std::fs::read_link("/proc/self/ns/user").ok()
        });
        for map in ["uid_map", "gid_map"] {
            std::fs::write(format!("/proc/{}/{map}", child.id()), format!("0 {SHIFT} 65536")).unwrap();
        }
        let fd = std::fs::File::open(&ns).unwrap().into();
        UserNs { child, fd }
    }
}

impl Drop for UserNs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `struct mount_attr` (linux/mount.h).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// An idmapped copy of the mount at `src` (open_tree, mount_setattr, move_mount), on `dst`.
fn idmapped(src: &Path, dst: &Path, ns: &UserNs) -> std::io::Result<()> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
    let check = |r: libc::c_long| if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(r) };
    let src = CString::new(src.as_os_str().as_encoded_bytes()).unwrap();
    let dst = CString::new(dst.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: open_tree reads a NUL-terminated path and returns a new descriptor or -1.
    let tree = check(unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, src.as_ptr(), OPEN_TREE_CLONE) })?;
    // SAFETY: the descriptor was just returned to us and nothing else owns it.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    let attr = MountAttr { attr_set: MOUNT_ATTR_IDMAP, attr_clr: 0, propagation: 0, userns_fd: ns.fd.as_raw_fd() as u64 };
    // SAFETY: the kernel reads `size_of::<MountAttr>()` bytes of `attr` and an empty path.
    check(unsafe {
        libc::syscall(libc::SYS_mount_setattr, tree.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, &attr, std::mem::size_of::<MountAttr>())
    })?;
    // SAFETY: empty source path (the descriptor) and a NUL-terminated target.
    check(unsafe {
        libc::syscall(libc::SYS_move_mount, tree.as_raw_fd(), c"".as_ptr(), libc::AT_FDCWD, dst.as_ptr(), MOVE_MOUNT_F_EMPTY_PATH)
    })?;
    Ok(())
}

/// Runs `sh -c script` in `dir` as uid/gid (no capabilities), or as root where uid is 0;
/// what it printed to stderr, with `dir` taken out.
fn run_as(uid: u32, gid: u32, dir: &Path, script: &str) -> String {
    let mut cmd = if uid == 0 {
        Command::new("sh")
    } else {
        let mut c = Command::new("setpriv");
        c.args([format!("--reuid={uid}"), format!("--regid={gid}"), "--clear-groups".into(), "sh".into()]);
        c
    };
    let out = cmd.arg("-c").arg(script).current_dir(dir).output().expect("run sh");
    String::from_utf8_lossy(&out.stderr).replace(&dir.display().to_string(), "DIR")
}

/// Every entry below `dir`: (relative path, uid, gid, mode).
fn owners(dir: &Path) -> Vec<(String, u32, u32, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(dir.join(&rel)).unwrap() {
            let e = e.unwrap();
            let path = rel.join(e.file_name());
            let m = std::fs::symlink_metadata(dir.join(&path)).unwrap();
            if m.is_dir() {
                stack.push(path.clone());
            }
            out.push((path.display().to_string(), m.uid(), m.gid(), m.mode()));
        }
    }
    out.sort();
    out
}

/// The same users at work in `dir` (an idmapped mount): creating, refused, chowning, writing
/// setuid and setgid files (which must lose those bits), truncating.
fn workload(dir: &Path) -> Vec<String> {
    let (owner, other) = (SHIFT, SHIFT + 1000);
    vec![
        run_as(
            owner,
            owner,
            dir,
            "touch a && mkdir d && ln -s a s && mkfifo p && echo data > w && chmod 6755 w && echo x > g && chmod 2745 g",
        ),
        run_as(other, other, dir, "touch d/refused; echo more >> w"),
        run_as(owner, owner, dir, "chmod 777 d . && chown 10005:10006 a; chmod 6757 w; chmod 2747 g"),
        run_as(other, other, dir, "touch d/b && mkdir d/sub && echo hi > d/b && echo more >> w; echo y >> g"),
        run_as(
            0,
            0,
            dir,
            &format!("chown {}:{} d/b; chown 5:5 s; touch unmapped; chown {owner}:{owner} g && chmod 2747 g", SHIFT + 7, SHIFT + 8),
        ),
        run_as(other, SHIFT + 2000, dir, "echo z >> g; truncate -s 1 w; echo no > d/b"),
    ]
}

#[test]
fn an_idmapped_mount_of_densefs_maps_as_one_of_the_lower() {
    let d = Dirs::new();
    let reference = d.root.path().join("ext4");
    std::fs::create_dir(&reference).unwrap();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let ns = UserNs::new();
    let (ours, theirs) = (d.root.path().join("idmapped-densefs"), d.root.path().join("idmapped-ext4"));
    std::fs::create_dir(&ours).unwrap();
    std::fs::create_dir(&theirs).unwrap();
    idmapped(&reference, &theirs, &ns).expect("an idmapped mount of ext4");
    if let Err(e) = idmapped(&d.mnt, &ours, &ns) {
        let _ = Command::new("umount").arg(&theirs).status();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        eprintln!("SKIP: this kernel ({}) mounts no FUSE file system idmapped (Linux 6.12+)", release.trim());
        m.unmount();
        return;
    }
    let said_ours = workload(&ours);
    let said_theirs = workload(&theirs);
    let seen = (owners(&ours), owners(&d.mnt), owners(&theirs), owners(&reference));
    for dir in [&ours, &theirs] {
        let _ = Command::new("umount").arg(dir).status();
    }
    assert_eq!(said_ours, said_theirs, "what the workload was told: densefs (left), ext4 (right)");
    assert!(said_ours.iter().any(|s| s.contains("Permission denied")), "the workload was refused nothing: {said_ours:?}");
    assert_eq!(seen.0, seen.2, "owners and modes through the idmapped mounts: densefs (left), ext4 (right)");
    assert_eq!(seen.1, seen.3, "owners and modes on disk: densefs (left), ext4 (right)");
    // On disk the ids are shifted back: what the owner made is root's.
    assert!(seen.1.iter().any(|(p, uid, _, _)| p == "d/sub" && *uid == 1000), "{:?}", seen.1);
    m.unmount();
}

//! File attributes (`lsattr`, `chattr`): `i` and `a` enforced as ext4 enforces them (the same
//! operations, side by side, answer the same), kept across a remount; `c` and `m` as btrfs
//! sets and inherits them, mapped onto densefs's compression; the lower's own flags passed
//! through.

mod common;

use common::{compressible, errno, Dirs, Mount};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

fn chattr(args: &str, path: &Path) -> Result<(), String> {
    let out = Command::new("chattr").args(args.split_whitespace()).arg(path).output().expect("run chattr");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// The flags as lsattr prints them (e.g. `----i---c-----e-------`).
fn lsattr(path: &Path) -> String {
    let out = Command::new("lsattr").arg("-d").arg(path).output().expect("run lsattr");
    assert!(out.status.success(), "lsattr {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_string()
}

fn has(flags: &str, letter: char) -> bool {
    flags.contains(letter)
}

fn set_xattr(path: &Path, name: &str, value: &[u8], remove: bool) -> std::io::Result<()> {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: NUL-terminated strings and a buffer that outlive the calls.
    let r = unsafe {
        if remove {
            libc::removexattr(p.as_ptr(), n.as_ptr())
        } else {
            libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0)
        }
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn fallocate(f: &File, mode: i32, offset: i64, len: i64) -> std::io::Result<()> {
    // SAFETY: a plain call on a descriptor `f` owns.
    if unsafe { libc::fallocate(f.as_raw_fd(), mode, offset, len) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn utimens(path: &Path, now: bool) -> std::io::Result<()> {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let t = if now { libc::UTIME_NOW } else { 12345 };
    let times = [libc::timespec { tv_sec: 1_000_000, tv_nsec: t }, libc::timespec { tv_sec: 1_000_000, tv_nsec: t }];
    // SAFETY: NUL-terminated path and two timespecs that outlive the call.
    if unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Every kind of change to `dir/f` (protected by `flag`, with a descriptor `early` opened for
/// writing before), and what each answered; the file's bytes afterwards.
fn try_everything(dir: &Path, early: &File) -> (Vec<(&'static str, Option<i32>)>, Vec<u8>) {
    let f = dir.join("f");
    std::fs::write(dir.join("other"), b"other").unwrap();
    let open = |opts: &mut OpenOptions| errno(opts.open(&f));
    let append_write = OpenOptions::new().append(true).open(&f).and_then(|mut h| h.write_all(b"+appended"));
    let answers = vec![
        ("read", errno(std::fs::read(&f))),
        ("open for writing", open(OpenOptions::new().write(true))),
        ("open O_RDWR", open(OpenOptions::new().read(true).write(true))),
        ("open O_APPEND", open(OpenOptions::new().append(true))),
        ("open O_TRUNC", open(OpenOptions::new().write(true).truncate(true))),
        ("append through O_APPEND", errno(append_write)),
        ("write before the end, opened before", errno(early.write_at(b"X", 0))),
        ("truncate", errno(OpenOptions::new().write(true).open(&f).and_then(|h| h.set_len(1)))),
        ("truncate(2)", errno(File::options().read(true).open(&f).and_then(|h| h.set_len(2)))),
        ("fallocate keep size", errno(File::open(&f).and_then(|h| fallocate(&h, libc::FALLOC_FL_KEEP_SIZE, 0, 4096)))),
        ("fallocate keep size (writable descriptor)", errno(fallocate(early, libc::FALLOC_FL_KEEP_SIZE, 0, 4096))),
        ("punch hole", errno(fallocate(early, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 0, 4096))),
        ("chmod", errno(std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o600)))),
        ("chown", errno(std::os::unix::fs::chown(&f, Some(1), Some(1)))),
        ("touch (now)", errno(utimens(&f, true))),
        ("utimes (given)", errno(utimens(&f, false))),
        ("setxattr", errno(set_xattr(&f, "user.test", b"v", false))),
        ("removexattr", errno(set_xattr(&f, "user.kept", b"", true))),
        ("hard link", errno(std::fs::hard_link(&f, dir.join("link")))),
        ("rename away", errno(std::fs::rename(&f, dir.join("moved")))),
        ("rename over it", errno(std::fs::rename(dir.join("other"), &f))),
        ("unlink", errno(std::fs::remove_file(&f))),
    ];
    let bytes = std::fs::read(&f).unwrap_or_default();
    (answers, bytes)
}

/// `f` written, an xattr set, a descriptor opened for writing, then `chattr +flag`.
fn protected_file(dir: &Path, flag: char) -> File {
    std::fs::write(dir.join("f"), compressible(200_000, 3)).unwrap();
    set_xattr(&dir.join("f"), "user.kept", b"k", false).unwrap();
    let early = OpenOptions::new().read(true).write(true).open(dir.join("f")).unwrap();
    chattr(&format!("+{flag}"), &dir.join("f")).unwrap();
    assert!(has(&lsattr(&dir.join("f")), flag), "{}: {}", dir.display(), lsattr(&dir.join("f")));
    early
}

fn clean(dir: &Path) {
    for name in ["f", "other", "link", "moved"] {
        let _ = chattr("-i -a", &dir.join(name));
        let _ = std::fs::remove_file(dir.join(name));
    }
}

#[test]
fn immutable_and_append_only_refuse_what_ext4_refuses_and_survive_a_remount() {
    let d = Dirs::new();
    // The reference: a directory of the same ext4 file system the lower is on.
    let reference = d.root.path().join("ext4");
    std::fs::create_dir(&reference).unwrap();
    let m = Mount::new(&d.lower, &d.mnt, "compression=zstd-3");
    for flag in ['i', 'a'] {
        let (want, want_bytes) = try_everything(&reference, &protected_file(&reference, flag));
        let (got, got_bytes) = try_everything(&d.mnt, &protected_file(&d.mnt, flag));
        assert_eq!(got, want, "+{flag}: densefs (left) and ext4 (right) answered differently");
        assert!(
            got_bytes == want_bytes,
            "+{flag}: the file's bytes differ from ext4's ({} vs {} bytes)",
            got_bytes.len(),
            want_bytes.len()
        );
        assert!(want.iter().any(|(_, e)| *e == Some(libc::EPERM)), "+{flag} refused nothing on ext4: {want:?}");
        clean(&reference);
        clean(&d.mnt);
    }

    // Kept across a remount, and what the flags say is what lsattr and FS_IOC_FSGETXATTR show.
    std::fs::write(m.path("kept"), b"log line\n").unwrap();
    chattr("+a", &m.path("kept")).unwrap();
    std::fs::write(m.path("frozen"), b"frozen").unwrap();
    chattr("+i", &m.path("frozen")).unwrap();
    let log = m.log_text();
    m.unmount();
    assert!(!log.contains("Not Implemented"), "{log}");
    let m = Mount::new(&d.lower, &d.mnt, "compression=zstd-3");
    assert!(has(&lsattr(&m.path("kept")), 'a') && has(&lsattr(&m.path("frozen")), 'i'));
    let xflags = |path: &Path| {
        let out = Command::new("xfs_io").args(["-r", "-c", "lsattr"]).arg(path).output().expect("run xfs_io");
        String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_string()
    };
    assert!(
        xflags(&m.path("kept")).contains('a') && xflags(&m.path("frozen")).contains('i'),
        "{} {}",
        xflags(&m.path("kept")),
        xflags(&m.path("frozen"))
    );
    assert_eq!(errno(std::fs::remove_file(m.path("frozen"))), Some(libc::EPERM));
    assert_eq!(errno(std::fs::write(m.path("kept"), b"over")), Some(libc::EPERM));
    OpenOptions::new().append(true).open(m.path("kept")).unwrap().write_all(b"another\n").unwrap();
    assert_eq!(std::fs::read(m.path("kept")).unwrap(), b"log line\nanother\n");
    // Only the owner, and i/a only with CAP_LINUX_IMMUTABLE: the kernel asks before the daemon.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "chattr", "-i"])
        .arg(m.path("frozen"))
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Operation not permitted"));
    // xfs_io's chattr (FS_IOC_FSSETXATTR) takes `i` away again.
    let out = Command::new("xfs_io").args(["-r", "-c", "chattr -i"]).arg(m.path("frozen")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!has(&lsattr(&m.path("frozen")), 'i'));
    std::fs::remove_file(m.path("frozen")).unwrap();
    chattr("-a", &m.path("kept")).unwrap();
    std::fs::remove_file(m.path("kept")).unwrap();
    m.unmount();
}

#[test]
fn the_lowers_own_flags_pass_through() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    std::fs::write(m.path("f"), b"data").unwrap();
    std::fs::create_dir(m.path("dir")).unwrap();
    // nodump (d) and noatime (A), on a file and a directory: the lower inode's, as ext4 shows them.
    for name in ["f", "dir"] {
        chattr("+d +A", &m.path(name)).unwrap();
        let ours = lsattr(&m.path(name));
        let lowers = lsattr(&d.lower.join(name));
        assert!(has(&ours, 'd') && has(&ours, 'A'), "{name}: {ours}");
        assert!(has(&lowers, 'd') && has(&lowers, 'A') && !has(&lowers, 'c'), "{name} on the lower: {lowers}");
        chattr("-d -A", &m.path(name)).unwrap();
        assert!(!has(&lsattr(&m.path(name)), 'd'));
    }
    // `i` on a directory is the lower directory's, which refuses new entries.
    chattr("+i", &m.path("dir")).unwrap();
    assert_eq!(errno(File::create(m.path("dir/new"))), Some(libc::EPERM));
    chattr("-i", &m.path("dir")).unwrap();
    File::create(m.path("dir/new")).unwrap();
    m.unmount();
}

/// The stored bytes of `name` under `lower`.
fn stored(lower: &Path, name: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(lower.join(name)).unwrap().blocks() * 512
}

/// The c/m letters of lsattr's answer.
fn compression_letters(path: &Path) -> String {
    lsattr(path).chars().filter(|&c| c == 'c' || c == 'm').collect()
}

/// What `steps` (chattr arguments) leave of c/m on a file and a directory, and on a file
/// created in that directory afterwards, under `root`.
fn compression_steps(root: &Path) -> Vec<String> {
    let mut seen = Vec::new();
    let f = root.join("f");
    std::fs::write(&f, b"x").unwrap();
    for step in ["+c", "-c +m", "-m +c"] {
        chattr(step, &f).unwrap();
        seen.push(format!("file {step}: {}", compression_letters(&f)));
    }
    let dir = root.join("dir");
    std::fs::create_dir(&dir).unwrap();
    chattr("-c +m", &dir).unwrap();
    std::fs::write(dir.join("a"), b"a").unwrap();
    seen.push(format!("dir +m: {} new file {}", compression_letters(&dir), compression_letters(&dir.join("a"))));
    chattr("-m +c", &dir).unwrap();
    std::fs::write(dir.join("b"), b"b").unwrap();
    seen.push(format!("dir +c: {} new file {}", compression_letters(&dir), compression_letters(&dir.join("b"))));
    seen
}

#[test]
fn c_and_m_follow_btrfs_and_set_how_densefs_stores() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=zstd-3");
    let ours = compression_steps(&d.mnt);
    // btrfs beside it, where it can be made.
    let image = d.root.path().join("btrfs.img");
    let btrfs = d.root.path().join("btrfs");
    std::fs::create_dir(&btrfs).unwrap();
    std::fs::File::create(&image).unwrap().set_len(300 << 20).unwrap();
    let made = Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&image).output().is_ok_and(|o| o.status.success())
        && Command::new("mount").args(["-o", "loop"]).arg(&image).arg(&btrfs).status().is_ok_and(|s| s.success());
    if made {
        let theirs = compression_steps(&btrfs);
        let _ = Command::new("umount").arg(&btrfs).status();
        assert_eq!(ours, theirs, "densefs (left) and btrfs (right)");
    } else {
        eprintln!("SKIP the comparison with btrfs: no mkfs.btrfs or no btrfs module here");
        assert_eq!(ours[2], "file -m +c: c");
    }

    // `m` stores what is written from now on as it is; `c` compresses it again.
    let data = compressible(1 << 20, 7);
    let write = |name: &str| {
        let mut f = OpenOptions::new().write(true).create(true).truncate(false).open(m.path(name)).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    };
    File::create(m.path("raw")).unwrap();
    chattr("+m", &m.path("raw")).unwrap();
    write("raw");
    File::create(m.path("dense")).unwrap();
    write("dense");
    assert!(stored(&d.lower, "raw") >= data.len() as u64, "a +m file took {} bytes for {}", stored(&d.lower, "raw"), data.len());
    assert!(stored(&d.lower, "dense") * 2 < data.len() as u64, "a compressed file took {} bytes", stored(&d.lower, "dense"));
    assert_eq!(compression_letters(&m.path("raw")), "m");
    assert_eq!(std::fs::read(m.path("raw")).unwrap(), data);
    // A directory's `m` is its compression property.
    let prop = Command::new("getfattr").args(["--only-values", "-n", "user.densefs.compression"]).arg(m.path("dir")).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&prop.stdout), "zstd-3", "after -m +c the directory compresses with the mount's codec");
    // Kept across a remount.
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "compression=zstd-3");
    assert_eq!(compression_letters(&m.path("raw")), "m");
    assert_eq!(compression_letters(&m.path("dense")), "c");
    // A plain file (there before the mount) is stored as it is: `m`, and `+c` says how to compress it.
    drop(m);
    std::fs::write(d.lower.join("plain"), b"plain text").unwrap();
    let m = Mount::new(&d.lower, &d.mnt, "compression=zstd-3");
    assert_eq!(compression_letters(&m.path("plain")), "m");
    let refused = chattr("-m +c", &m.path("plain")).unwrap_err();
    assert!(refused.contains("Operation not supported"), "{refused}");
    common::wait_up_to("the log to say what to do", 10, || m.log_text().contains("densefs recompress"));
    m.unmount();
}

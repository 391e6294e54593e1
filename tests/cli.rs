//! The command line as people use it: output into `head`, permission errors, paths outside a
//! mount, a second mount on a mount point, `mount -o remount`, findmnt, no syslog. Real mounts
//! and real processes; root only (as the other mount tests).

mod common;

use common::{Dirs, Mount, BIN};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn densefs(args: &[&str]) -> Output {
    Command::new(BIN).args(args).stdin(Stdio::null()).output().expect("run densefs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs densefs with stdout a pipe whose reading end is already closed (`| head` that is done).
fn into_closed_pipe(args: &[&str]) -> Output {
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    Command::new(BIN).args(args).stdin(Stdio::null()).stdout(Stdio::from(write)).stderr(Stdio::piped()).output().unwrap()
}

#[test]
fn output_into_a_closed_pipe_ends_quietly_and_the_daemon_lives_on() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    for i in 0..50 {
        let dir = m.path(&format!("d{i}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("f"), common::compressible(10_000, i)).unwrap();
        assert!(densefs(&["set", "compression=gzip-1", dir.to_str().unwrap()]).status.success());
    }
    let mnt = d.mnt.to_str().unwrap();
    let file = m.path("d0/f");
    let cases: Vec<Vec<&str>> = vec![
        vec!["get", "all", mnt],
        vec!["get", "--json", "all", mnt],
        vec!["list", "-r", mnt],
        vec!["list"],
        vec!["stat", file.to_str().unwrap()],
        vec!["scrub", mnt],
        vec!["iostat", "-w", "0.05", "-c", "3", mnt],
        vec!["--help"],
        vec!["mount", "--help"],
        vec!["--version"],
        vec!["completions", "bash"],
        vec!["completions", "zsh"],
    ];
    for args in cases {
        let out = into_closed_pipe(&args);
        let err = text(&out.stderr);
        assert!(!err.contains("panicked"), "densefs {args:?} panicked: {err}");
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "densefs {args:?}: {:?} {err}", out.status);
    }
    // The daemon (which ignores SIGPIPE) still serves.
    std::fs::write(m.path("after"), b"still here").unwrap();
    assert_eq!(std::fs::read(m.path("after")).unwrap(), b"still here");
    // `| head -1` for real.
    let out =
        Command::new("bash").arg("-c").arg(format!("'{BIN}' list -r '{mnt}' | head -1; echo \"${{PIPESTATUS[*]}}\"")).output().unwrap();
    let shown = text(&out.stdout);
    assert!(shown.starts_with("NAME"), "{shown}");
    assert!(!text(&out.stderr).contains("panicked"), "{}", text(&out.stderr));
    m.unmount();
}

/// Puts /dev/fuse's mode back when dropped, even when the test fails.
struct DevFuseMode(u32);

impl DevFuseMode {
    fn save() -> DevFuseMode {
        DevFuseMode(std::fs::metadata("/dev/fuse").unwrap().permissions().mode() & 0o7777)
    }
    fn set(&self, mode: u32) {
        std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

impl Drop for DevFuseMode {
    fn drop(&mut self) {
        let _ = std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(self.0));
    }
}

fn as_nobody(args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(BIN)
        .args(args)
        .env("HOME", "/nonexistent")
        .stdin(Stdio::null())
        .output()
        .expect("run setpriv")
}

#[test]
fn permission_errors_name_dev_fuse_and_fuse_conf() {
    let d = Dirs::new();
    std::fs::set_permissions(d.root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for p in [&d.lower, &d.mnt] {
        std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
    }
    let (lower, mnt) = (d.lower.to_str().unwrap(), d.mnt.to_str().unwrap());
    let mode = DevFuseMode::save();

    mode.set(0o600);
    let out = as_nobody(&["mount", "-f", lower, mnt]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("/dev/fuse is mode 0600") && err.contains("chmod 0666 /dev/fuse"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    // fusermount3 refuses allow_other to users unless /etc/fuse.conf has user_allow_other.
    let conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
    let allowed = conf.lines().any(|l| l.trim() == "user_allow_other");
    if Command::new("fusermount3").arg("-V").output().is_ok() && !allowed {
        mode.set(0o666);
        let out = as_nobody(&["mount", "-f", "-o", "allow_other", lower, mnt]);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains("user_allow_other") && err.contains("/etc/fuse.conf"), "{err}");
        assert!(!err.contains("/dev/fuse is mode"), "{err}");
    } else {
        eprintln!("skipped the allow_other case: no fusermount3, or user_allow_other is set");
    }
    drop(mode);
    assert!(!std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(mnt));
}

#[test]
fn commands_refuse_paths_outside_densefs_mounts() {
    let d = Dirs::new();
    let dir = d.root.path().join("plain");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("f"), b"plain").unwrap();
    let (p, f) = (dir.to_str().unwrap(), dir.join("f"));
    let f = f.to_str().unwrap();
    for args in [
        vec!["set", "compression=gzip-9", p],
        vec!["inherit", "compression", p],
        vec!["get", "compression", p],
        vec!["get", "all", p],
        vec!["list", p],
        vec!["stat", f],
        vec!["scrub", p],
        vec!["recompress", f],
        vec!["recompress", "-r", p],
        vec!["iostat", "-c", "1", p],
    ] {
        let out = densefs(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "densefs {args:?}: {err}");
        assert!(err.contains("not on a densefs mount"), "densefs {args:?}: {err}");
    }
    // `set` left no attribute behind.
    let name = c"user.densefs.compression";
    let path = std::ffi::CString::new(p).unwrap();
    let n = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    assert!(n < 0, "densefs set wrote an xattr on a plain directory");
}

fn mounts_at(mnt: &Path) -> usize {
    densefs::cli::mountinfo::mountinfo().iter().filter(|m| m.point == mnt).count()
}

#[test]
fn a_second_mount_on_a_densefs_mount_point_is_refused() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let other = d.root.path().join("lower2");
    std::fs::create_dir(&other).unwrap();
    for foreground in [true, false] {
        let mut args = vec!["mount"];
        if foreground {
            args.push("-f");
        }
        args.extend([other.to_str().unwrap(), d.mnt.to_str().unwrap()]);
        let out = densefs(&args);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains("already holds a densefs mount"), "{err}");
    }
    assert_eq!(mounts_at(&d.mnt), 1);
    m.unmount();
}

#[test]
fn findmnt_shows_fuse_densefs_and_paths_with_spaces_work() {
    let d = Dirs::new();
    let mnt = d.root.path().join("mount point");
    std::fs::create_dir(&mnt).unwrap();
    let m = Mount::new(&d.lower, &mnt, "");
    let out = Command::new("findmnt").args(["-n", "-o", "FSTYPE,SOURCE"]).arg(&mnt).output().unwrap();
    let shown = text(&out.stdout);
    assert_eq!(shown.split_whitespace().collect::<Vec<_>>(), ["fuse.densefs", d.lower.to_str().unwrap()], "{shown}");
    // The mountinfo escapes (\040) are decoded: list finds it, umount finds it.
    let out = densefs(&["list", "-H"]);
    assert!(text(&out.stdout).lines().any(|l| l.starts_with(&format!("{}\t", mnt.display()))), "{}", text(&out.stdout));
    m.unmount();
    assert_eq!(mounts_at(&mnt), 0);
}

/// Runs a bash script in a private mount namespace (so bind mounts there leave the machine alone).
fn in_private_namespace(script: &str, tmp: &Path) -> Output {
    Command::new("unshare")
        .args(["-m", "--propagation", "private", "bash", "-c", script])
        .env("BIN", BIN)
        .env("T", tmp)
        .stdin(Stdio::null())
        .output()
        .expect("run unshare")
}

#[test]
fn mount_o_remount_changes_ro_rw_and_explains_what_cannot_change() {
    let d = Dirs::new();
    // mount(8) runs helpers from /sbin: put mount.densefs and mount.fuse.densefs (as
    // scripts/install does) there through a read-only overlay, in this namespace only.
    let script = r#"
        set -u
        mkdir -p "$T/sbin" "$T/varlog"
        mount --bind "$T/varlog" /var/log || exit 9
        ln -s "$BIN" "$T/sbin/mount.densefs"; ln -s "$BIN" "$T/sbin/mount.fuse.densefs"
        mount -t overlay overlay -o "lowerdir=$T/sbin:/usr/sbin" /usr/sbin || exit 9
        mount -t densefs -o compression=zstd-3,strictatime,nodiratime "$T/lower" "$T/mnt" 2>/dev/null || exit 10
        echo "type $(findmnt -n -o FSTYPE "$T/mnt")"
        findmnt -n -o OPTIONS "$T/mnt" | tr , '\n' | grep -x -e relatime -e noatime -e nodiratime | sed 's/^/atime /'
        mount -o remount,relatime "$T/mnt" 2>"$T/err"; echo "remount-relatime $?"
        echo "err $(cat "$T/err")"
        mount -o remount,ro "$T/mnt"; echo "remount-ro $?"
        echo x > "$T/mnt/a" 2>/dev/null; echo "write-ro $?"
        findmnt -n -o OPTIONS "$T/mnt" | cut -d, -f1 | sed 's/^/opts /'
        mount -o remount,rw "$T/mnt"; echo "remount-rw $?"
        echo x > "$T/mnt/b"; echo "write-rw $?"
        mount -o remount,compression=gzip-9 "$T/mnt" 2>"$T/err"; echo "remount-compression $?"
        echo "err $(cat "$T/err")"
        mount -o remount,compression=zstd-3,noexec "$T/mnt"; echo "remount-same $?"
        findmnt -n -o OPTIONS "$T/mnt" | tr , '\n' | grep -x noexec | sed 's/^/opts /'
        exec 5>"$T/mnt/open"; mount -o remount,ro "$T/mnt" 2>"$T/err"; echo "remount-busy $?"; exec 5>&-
        echo "err $(cat "$T/err")"
        "$BIN" mount -o remount,ro "$T/lower" "$T/mnt"; echo "densefs-remount $?"
        echo x > "$T/mnt/c" 2>/dev/null; echo "write-ro2 $?"
        "$BIN" umount "$T/mnt"; echo "umount $?"
    "#;
    let out = in_private_namespace(script, d.root.path());
    let shown = text(&out.stdout);
    let expect = [
        "type fuse.densefs",
        "atime nodiratime",
        "remount-relatime 1",
        "remount-ro 0",
        "write-ro 1",
        "opts ro",
        "remount-rw 0",
        "write-rw 0",
        "remount-compression 1",
        "remount-same 0",
        "opts noexec",
        "remount-busy 1",
        "densefs-remount 0",
        "write-ro2 1",
        "umount 0",
    ];
    for line in expect {
        assert!(shown.lines().any(|l| l == line), "missing '{line}' in:\n{shown}\nstderr: {}", text(&out.stderr));
    }
    assert!(shown.contains("compression cannot change on a live mount (it is zstd-3)"), "{shown}");
    assert!(!shown.contains("atime relatime") && !shown.contains("atime noatime"), "strictatime shows neither: {shown}");
    assert!(shown.contains("access-time mode cannot change on a live mount (it is strictatime)"), "{shown}");
    assert!(shown.contains("densefs set compression=gzip-9"), "{shown}");
    assert!(shown.contains("read-only: files are open for writing"), "{shown}");
    assert_eq!(std::fs::read(d.lower.join("b")).map(|b| !b.is_empty()).ok(), Some(true));
    assert!(!d.lower.join("a").exists());
}

#[test]
fn without_syslog_the_daemon_logs_to_a_file_and_says_where() {
    let d = Dirs::new();
    // /var/log is a private directory here, and /dev/log (where there is one) is hidden.
    let script = r#"
        set -u
        mkdir -p "$T/varlog"
        mount --bind "$T/varlog" /var/log || exit 9
        if [ -e /dev/log ] || [ -L /dev/log ]; then mount --bind /dev/null /dev/log || exit 9; fi
        "$BIN" mount "$T/lower" "$T/mnt" 2>"$T/err"; echo "mount $?"
        echo hello > "$T/mnt/f"
        "$BIN" umount "$T/mnt"; echo "umount $?"
    "#;
    let out = in_private_namespace(script, d.root.path());
    let shown = text(&out.stdout);
    assert!(shown.contains("mount 0") && shown.contains("umount 0"), "{shown} {}", text(&out.stderr));
    let err = std::fs::read_to_string(d.root.path().join("err")).unwrap();
    let name = format!("{}.log", d.mnt.to_str().unwrap().trim_start_matches('/').replace('/', "-"));
    let expected = format!("/var/log/densefs/{name}");
    assert!(err.contains(&format!("the daemon logs to {expected}")), "{err}");
    let log = std::fs::read_to_string(d.root.path().join("varlog/densefs").join(&name)).unwrap();
    assert!(log.contains("mounted") && log.contains("unmounted"), "{log}");
}

#[test]
fn list_names_a_mount_whose_daemon_is_gone_and_lists_the_others() {
    let live_dirs = Dirs::new();
    let dead_dirs = Dirs::new();
    let live = Mount::new(&live_dirs.lower, &live_dirs.mnt, "");
    let mut dead = Mount::new(&dead_dirs.lower, &dead_dirs.mnt, "");
    // SIGKILL without detaching: the mount point stays, answering ENOTCONN.
    let mut child = dead.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let out = densefs(&["list", "-H"]);
    let detach = || Command::new("fusermount3").args(["-u", "-z"]).arg(&dead_dirs.mnt).status();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    detach().unwrap();
    assert!(stdout.lines().any(|l| l.starts_with(&format!("{}\t", live_dirs.mnt.display()))), "{stdout}");
    assert!(!stdout.contains(dead_dirs.mnt.to_str().unwrap()), "{stdout}");
    assert!(stderr.contains(&format!("{}: its densefs daemon is gone", dead_dirs.mnt.display())), "{stderr}");
    assert!(stderr.contains("umount -l"), "{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    drop(dead);
    live.unmount();
}

/// A lower on a read-only file system (a snapshot, a read-only export) mounts read-only: files
/// read, writes fail with EROFS in the kernel, and findmnt says `ro`.
#[test]
fn a_lower_on_a_read_only_file_system_mounts_read_only() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=gzip-1");
    let data = common::compressible(300_000, 7);
    std::fs::write(m.path("kept"), &data).unwrap();
    m.unmount();
    let script = r#"
        set -u
        mkdir -p "$T/varlog" "$T/rolower"
        mount --bind "$T/varlog" /var/log || exit 9
        mount --bind "$T/lower" "$T/rolower" && mount -o remount,bind,ro "$T/rolower" || exit 9
        "$BIN" mount "$T/rolower" "$T/mnt" 2>"$T/err"; echo "mount $?"
        findmnt -n -o OPTIONS "$T/mnt" | cut -d, -f1 | sed 's/^/opts /'
        cmp -s "$T/mnt/kept" "$T/expected"; echo "read $?"
        echo x 2>"$T/werr" > "$T/mnt/new"; echo "write $?"
        "$BIN" umount "$T/mnt"; echo "umount $?"
        echo "err $(cat "$T/err")"
        echo "werr $(cat "$T/werr")"
    "#;
    std::fs::write(d.root.path().join("expected"), &data).unwrap();
    let out = in_private_namespace(script, d.root.path());
    let shown = text(&out.stdout);
    for line in ["mount 0", "opts ro", "read 0", "write 1", "umount 0"] {
        assert!(shown.lines().any(|l| l == line), "missing '{line}' in:\n{shown}\nstderr: {}", text(&out.stderr));
    }
    assert!(shown.contains("is on a read-only file system: mounting read-only"), "{shown}");
    assert!(shown.contains("Read-only file system"), "{shown}");
    assert!(!d.lower.join("new").exists());
}

// Issue 47, item 5: what a new user hit.

#[test]
fn offload_to_a_missing_device_is_refused_by_set_as_by_mount() {
    let d = Dirs::new();
    let mounted = densefs(&["mount", "-o", "offload=gpu", d.lower.to_str().unwrap(), d.mnt.to_str().unwrap()]);
    if mounted.status.success() {
        // A machine with a GPU: both take it.
        assert!(densefs(&["umount", d.mnt.to_str().unwrap()]).status.success());
        let m = Mount::new(&d.lower, &d.mnt, "");
        let out = densefs(&["set", "offload=gpu", m.mnt.to_str().unwrap()]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        return;
    }
    let refused = text(&mounted.stderr);
    assert!(refused.contains("offload=gpu: no gpu backend available"), "{refused}");
    let m = Mount::new(&d.lower, &d.mnt, "");
    std::fs::create_dir(m.path("dir")).unwrap();
    let out = densefs(&["set", "offload=gpu", m.path("dir").to_str().unwrap()]);
    assert!(!out.status.success(), "set offload=gpu was accepted without a GPU");
    assert!(text(&out.stderr).contains("offload=gpu: no gpu backend available"), "{}", text(&out.stderr));
    // The daemon refuses it itself: written as the xattr `densefs set` uses, it is refused too.
    let dir = std::ffi::CString::new(m.path("dir").to_str().unwrap()).unwrap();
    // SAFETY: both strings are NUL-terminated and the value is 3 bytes long.
    let set = unsafe { libc::setxattr(dir.as_ptr(), c"user.densefs.offload".as_ptr(), b"gpu".as_ptr().cast(), 3, 0) };
    assert_eq!((set, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::ENODEV)));
    // Nothing was stored: the directory still inherits.
    let get = densefs(&["get", "-H", "-o", "value,source", "offload", m.path("dir").to_str().unwrap()]);
    assert!(text(&get.stdout).starts_with("auto\t"), "{}", text(&get.stdout));
    assert!(densefs(&["set", "offload=cpu", m.path("dir").to_str().unwrap()]).status.success());
}

#[test]
fn read_only_properties_are_named_read_only() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    for args in [vec!["set", "compressratio=2"], vec!["set", "records_gzip-6=1"], vec!["inherit", "used"]] {
        let out = Command::new(BIN).args(&args).arg(&m.mnt).output().unwrap();
        assert!(!out.status.success());
        let err = text(&out.stderr);
        assert!(err.contains("is a read-only property") && !err.contains("unknown"), "{args:?}: {err}");
    }
    let out = Command::new(BIN).args(["set", "bogus=1"]).arg(&m.mnt).output().unwrap();
    assert!(text(&out.stderr).contains("unknown property 'bogus'"), "{}", text(&out.stderr));
}

#[test]
fn stat_of_a_small_or_plain_file_shows_ratio_one() {
    let d = Dirs::new();
    std::fs::create_dir_all(&d.lower).unwrap();
    std::fs::write(d.lower.join("plain.txt"), b"hello, plain world!!\n").unwrap();
    let m = Mount::new(&d.lower, &d.mnt, "");
    std::fs::write(m.path("small.txt"), b"hello, densefs world\n").unwrap();
    std::fs::write(m.path("big.txt"), common::compressible(1 << 20, 1)).unwrap();
    Command::new("sync").status().unwrap();
    let ratio = |name: &str| -> f64 {
        let out = densefs(&["stat", m.path(name).to_str().unwrap()]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let s = text(&out.stdout);
        let r = s.split("ratio ").nth(1).and_then(|r| r.split('x').next()).unwrap_or_else(|| panic!("{s}"));
        r.parse().unwrap()
    };
    assert_eq!(ratio("plain.txt"), 1.0);
    assert_eq!(ratio("small.txt"), 1.0);
    assert!(ratio("big.txt") > 2.0);
}

#[test]
fn list_names_datasets_below_the_path_as_given() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    std::fs::create_dir_all(m.path("a/b")).unwrap();
    for dir in ["a", "a/b"] {
        assert!(densefs(&["set", "compression=gzip-1", m.path(dir).to_str().unwrap()]).status.success());
    }
    let names = |cwd: &Path, arg: &Path| -> Vec<String> {
        let out = Command::new(BIN).args(["list", "-r", "-H"]).arg(arg).current_dir(cwd).output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).lines().map(|l| l.split('\t').next().unwrap().to_string()).collect()
    };
    let parent = d.mnt.parent().unwrap();
    let rel = Path::new(d.mnt.file_name().unwrap());
    let r = rel.to_str().unwrap();
    assert_eq!(names(parent, rel), [r.to_string(), format!("{r}/a"), format!("{r}/a/b")]);
    let abs = d.mnt.to_str().unwrap();
    assert_eq!(names(parent, &d.mnt), [abs.to_string(), format!("{abs}/a"), format!("{abs}/a/b")]);
    // Below a dataset: named from the path given too.
    assert_eq!(names(&d.mnt, Path::new("a")), ["a".to_string(), "a/b".to_string()]);
}

#[test]
fn scrub_counts_in_the_singular_for_one() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    std::fs::create_dir(m.path("one")).unwrap();
    std::fs::write(m.path("one/f"), common::compressible(10_000, 2)).unwrap();
    let out = densefs(&["scrub", m.path("one").to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.contains("scrubbed 1 file (1 compressed) in 1 directory: no problems"), "{s}");
}

#[test]
fn a_busy_unmount_names_the_processes_that_hold_it() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    std::fs::write(m.path("f"), b"data").unwrap();
    let mut in_dir = Command::new("sleep").arg("60").current_dir(&m.mnt).spawn().unwrap();
    // A process elsewhere (its cwd outside the mount) is not named.
    let mut reader = Command::new("sleep").arg("60").current_dir(d.root.path()).spawn().unwrap();
    let mut holder = Command::new("sh").arg("-c").arg(format!("exec 3<{}; exec sleep 60", m.path("f").display())).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = densefs(&["umount", m.mnt.to_str().unwrap()]);
    for c in [&mut in_dir, &mut reader, &mut holder] {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    assert!(!out.status.success(), "a busy mount was unmounted");
    let err = text(&out.stderr);
    assert!(err.contains(&format!("pid {} (sleep: cwd)", in_dir.id())), "{err}");
    assert!(err.contains(&format!("pid {} (sleep: 1 open file)", holder.id())), "{err}");
    assert!(!err.contains(&format!("pid {} ", reader.id())), "{err}");
    m.unmount();
}

#[test]
fn recompress_right_after_close_does_not_find_the_file_open() {
    // close(2) returns before the kernel's RELEASE reaches the daemon; a recompress that
    // changes the record size (it needs the file closed) must not call it open meanwhile.
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "recordsize=64K");
    for round in 0..40 {
        let f = m.path(&format!("f{round}"));
        std::fs::write(&f, common::compressible(200_000, round as u64)).unwrap();
        let size = if round % 2 == 0 { "32K" } else { "128K" };
        let (ok, out) = common::recompress(&[&f], false, &format!("recordsize={size}"));
        assert!(ok, "round {round}: {out}");
        assert_eq!(std::fs::read(&f).unwrap(), common::compressible(200_000, round as u64), "round {round}");
    }
    // A writer that has just closed one descriptor (its FLUSH came) and closes its last one
    // while the recompress waits: it goes through.
    let f = m.path("held");
    std::fs::write(&f, common::compressible(200_000, 99)).unwrap();
    let held = std::fs::OpenOptions::new().append(true).open(&f).unwrap();
    drop(held.try_clone().unwrap());
    let closer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(held);
    });
    let (ok, out) = common::recompress(&[&f], false, "recordsize=32K");
    closer.join().unwrap();
    assert!(ok, "a file closed 200 ms into the recompress: {out}");
    assert_eq!(std::fs::read(&f).unwrap(), common::compressible(200_000, 99));
    // A file someone holds open is still refused.
    let _reader = std::fs::File::open(&f).unwrap();
    let (ok, out) = common::recompress(&[&f], false, "recordsize=64K");
    assert!(!ok, "recompressed a file held open: {out}");
}

#[test]
fn bash_completes_property_names_mount_options_and_values() {
    // The completion bash loads, asked as bash asks it (COMP_LINE up to the cursor).
    let script = densefs(&["completions", "bash"]);
    assert!(script.status.success());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("densefs.bash");
    std::fs::write(&path, &script.stdout).unwrap();
    let complete = |line: &str| -> String {
        let probe = format!(
            "source {}; COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}; COMP_WORDS=($COMP_LINE); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             _densefs_values densefs x y; echo \"${{COMPREPLY[*]}}\"",
            path.display()
        );
        let out = Command::new("bash").args(["-c", &probe]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).trim().to_string()
    };
    assert_eq!(complete("densefs get compr"), "compression compressratio");
    assert_eq!(complete("densefs set recor"), "recordsize=");
    assert_eq!(complete("densefs inherit chec"), "checksum");
    assert!(complete("densefs set compression=gzip-").split(' ').any(|w| w == "gzip-9"));
    assert_eq!(complete("densefs mount -o compression=lz4,cache_s"), "lz4,cache_size=");
    assert_eq!(complete("densefs mount -o io_uring=of"), "off");
    assert_eq!(complete("densefs recompress -o rec"), "recordsize=");
    assert_eq!(complete("densefs get compression,recordsize,use"), "compression,recordsize,used");
}

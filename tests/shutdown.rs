//! FS_IOC_SHUTDOWN (`xfs_io -x -c shutdown`, `godown`): afterwards every request fails with EIO,
//! cached attributes and pages included, and nothing more reaches the lower until the next
//! mount; the flush variants keep everything written before them, the plain one what an fsync
//! made durable (tests/crash.rs shuts down during a workload and checks that).

mod common;

use common::{compressible, errno, free_port, http_get, shut_down, wait_up_to, Dirs, Mount};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

/// FS_IOC_SHUTDOWN's flags: everything synced first, the log (for densefs: what the daemon
/// holds) landed first, or nothing more.
const GOING_DEFAULT: u32 = 0;
const GOING_LOGFLUSH: u32 = 1;
const GOING_NOLOGFLUSH: u32 = 2;

/// Every kind of request on a shut-down mount, and what it answered (None: it worked).
fn answers_after_shutdown(m: &Mount, open: &File) -> Vec<(&'static str, Option<i32>)> {
    let mut buf = [0u8; 16];
    vec![
        ("stat", errno(std::fs::metadata(m.path("kept")))),
        ("open", errno(File::open(m.path("kept")))),
        ("create", errno(File::create(m.path("new")))),
        ("readdir", errno(std::fs::read_dir(&m.mnt).and_then(|mut d| d.next().transpose()))),
        ("read an open file", errno(open.read_at(&mut buf, 0))),
        ("write an open file", errno(open.write_at(b"late", 0))),
        ("mkdir", errno(std::fs::create_dir(m.path("dir")))),
        ("statfs", errno(nix_statfs(&m.mnt))),
    ]
}

fn nix_statfs(path: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a zeroed statfs is a valid out-parameter; `c` is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Writes `kept` (and leaves `open` open with unsynced data in it), shuts down with `flags`,
/// checks that everything then fails with EIO, remounts and returns what `kept` and `open`
/// hold.
fn write_then_shut_down(flags: u32, options: &str) -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>) {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, options);
    let synced = compressible(3 << 20, 1);
    let unsynced = compressible(5 << 20, 2);
    {
        let mut f = File::create(m.path("kept")).unwrap();
        f.write_all(&synced).unwrap();
        f.sync_all().unwrap();
    }
    let open = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.path("open")).unwrap();
    open.write_all_at(&unsynced, 0).unwrap();
    // Cached attributes and pages, which the shutdown must take back too.
    std::fs::metadata(m.path("kept")).unwrap();
    assert_eq!(std::fs::read(m.path("kept")).unwrap(), synced);

    shut_down(&m.mnt, flags).unwrap();
    // The kernel drops its caches on the daemon's word, told from another thread: wait for it.
    wait_up_to("cached attributes and pages to fail after the shutdown", 30, || {
        errno(std::fs::metadata(m.path("kept"))) == Some(libc::EIO) && errno(open.read_at(&mut [0u8; 16], 0)) == Some(libc::EIO)
    });
    let answers = answers_after_shutdown(&m, &open);
    for (what, answer) in &answers {
        assert_eq!(*answer, Some(libc::EIO), "{what} after a shutdown: {answers:?}");
    }
    assert_eq!(errno(std::fs::read(m.path("kept"))), Some(libc::EIO), "cached pages after a shutdown");
    drop(open);
    let log = m.log_text();
    m.unmount();
    assert!(!log.contains("Not Implemented"), "{log}");

    // What the lower kept: the next mount finds a run that did not end cleanly.
    let m = Mount::new(&d.lower, &d.mnt, options);
    assert!(m.log_text().contains("the last run did not end cleanly"), "{}", m.log_text());
    assert!(!d.lower.join("new").exists() && !d.lower.join("dir").exists(), "a request after the shutdown changed the lower");
    let kept = std::fs::read(m.path("kept")).unwrap();
    let open = std::fs::read(m.path("open")).unwrap();
    m.unmount();
    (kept, synced, open, unsynced)
}

#[test]
fn a_shutdown_that_syncs_first_keeps_everything_written_before_it() {
    for flags in [GOING_DEFAULT, GOING_LOGFLUSH] {
        let (kept, synced, open, unsynced) = write_then_shut_down(flags, "compression=zstd-3");
        assert!(kept == synced, "flags {flags}: the fsync'd file changed");
        assert!(
            open == unsynced,
            "flags {flags}: a file written before the shutdown lost data ({} of {} bytes)",
            open.len(),
            unsynced.len()
        );
    }
}

#[test]
fn a_shutdown_without_flush_keeps_what_fsync_made_durable_and_no_garbage() {
    // A large memory budget: the unsynced file is still in memory when the shutdown comes.
    let (kept, synced, open, unsynced) = write_then_shut_down(GOING_NOLOGFLUSH, "compression=gzip-6,recordsize=1M");
    assert!(kept == synced, "the fsync'd file changed");
    // Each record reads back as written or not at all (zeros, or cut off): never anything else.
    const RECORD: usize = 1 << 20;
    for (i, chunk) in open.chunks(RECORD).enumerate() {
        let want = &unsynced[i * RECORD..(i * RECORD + chunk.len()).min(unsynced.len())];
        assert!(chunk == want || chunk.iter().all(|&b| b == 0), "record {i} of the unsynced file is neither what was written nor empty");
    }
}

#[test]
fn shutdown_needs_cap_sys_admin_and_other_ioctls_are_not_this_file_systems() {
    let d = Dirs::new();
    let port = free_port();
    let m = Mount::new(&d.lower, &d.mnt, &format!("metrics=127.0.0.1:{port}"));
    let shut_down_gauge = || {
        let (status, body) = http_get(port, "/metrics").expect("scrape");
        assert_eq!(status, 200);
        body.lines().find_map(|l| l.strip_prefix("densefs_shut_down ")).map(str::to_string)
    };
    assert_eq!(shut_down_gauge().as_deref(), Some("0"));
    std::fs::write(m.path("a"), b"still here").unwrap();
    // xfs_io as a user without capabilities: refused, and the mount goes on serving.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "xfs_io", "-x", "-c", "shutdown"])
        .arg(&d.mnt)
        .output()
        .expect("run setpriv xfs_io");
    let said = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("Operation not permitted"), "xfs_io shutdown as nobody: {said}");
    assert_eq!(std::fs::read(m.path("a")).unwrap(), b"still here");
    std::fs::write(m.path("b"), b"new").unwrap();

    // An ioctl no local file system here knows: ENOTTY, as ext4 answers, and no log noise.
    const UNKNOWN: libc::c_ulong = 0x8004_7a01; // _IOR('z', 1, __u32)
    let f = File::open(m.path("a")).unwrap();
    let mut word = 0u32;
    // SAFETY: the kernel writes at most a u32 at the address given, which outlives the call.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), UNKNOWN, &mut word as *mut u32) };
    assert_eq!((r, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::ENOTTY)));
    drop(f);

    // xfs_io's own shutdown (NOLOGFLUSH) as root works, and what was closed before it is there.
    let out = Command::new("xfs_io").args(["-x", "-c", "shutdown"]).arg(&d.mnt).output().expect("run xfs_io");
    assert!(out.status.success(), "xfs_io shutdown: {}", String::from_utf8_lossy(&out.stderr));
    wait_up_to("stat to fail after the shutdown", 30, || errno(std::fs::metadata(m.path("a"))) == Some(libc::EIO));
    // Monitoring sees it: the daemon still serves its metrics.
    assert_eq!(shut_down_gauge().as_deref(), Some("1"));
    let log = m.log_text();
    m.unmount();
    assert!(!log.contains("Not Implemented"), "{log}");
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(std::fs::read(m.path("a")).unwrap(), b"still here");
    m.unmount();
}

//! Shared helpers for integration tests: real densefs mounts in temporary directories.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_densefs");

/// A lower directory and a mount point under one temporary directory.
pub struct Dirs {
    pub root: tempfile::TempDir,
    pub lower: PathBuf,
    pub mnt: PathBuf,
}

impl Dirs {
    pub fn new() -> Dirs {
        let root = tempfile::Builder::new().prefix("densefs-test-").tempdir().expect("tempdir");
        let lower = root.path().join("lower");
        let mnt = root.path().join("mnt");
        std::fs::create_dir(&lower).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        Dirs { root, lower, mnt }
    }
}

fn is_mounted(mnt: &Path) -> bool {
    densefs::cli::mountinfo::mountinfo().iter().any(|m| m.point == mnt)
}

/// A densefs daemon running in the foreground as a child process; unmounted on drop.
pub struct Mount {
    pub child: Option<Child>,
    pub mnt: PathBuf,
    pub lower: PathBuf,
    pub log: PathBuf,
}

impl Mount {
    /// Mounts `lower` on `mnt` with `-o options` (may be empty).
    pub fn new(lower: &Path, mnt: &Path, options: &str) -> Mount {
        Mount::with_env(lower, mnt, options, &[])
    }

    /// As `new`, with extra environment variables for the daemon (e.g. a test accelerator).
    pub fn with_env(lower: &Path, mnt: &Path, options: &str, env: &[(&str, &str)]) -> Mount {
        let mut cmd = Command::new(BIN);
        cmd.envs(env.iter().copied());
        Mount::spawn(cmd, lower, mnt, options)
    }

    /// As `new`, with the daemon held to `limit` open descriptors, as `ulimit -n` does where
    /// it may not be raised: the daemon loses CAP_SYS_RESOURCE (it would raise its limit to
    /// fs.nr_open with it) before the limit is set.
    pub fn with_fd_limit(lower: &Path, mnt: &Path, options: &str, limit: u64) -> Mount {
        use std::os::unix::process::CommandExt;
        const CAP_SYS_RESOURCE: libc::c_ulong = 24; // linux/capability.h
        let mut cmd = Command::new(BIN);
        // SAFETY: prctl and setrlimit are async-signal-safe and only read their arguments.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_CAPBSET_DROP, CAP_SYS_RESOURCE, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let lim = libc::rlimit { rlim_cur: limit, rlim_max: limit };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Mount::spawn(cmd, lower, mnt, options)
    }

    fn spawn(mut cmd: Command, lower: &Path, mnt: &Path, options: &str) -> Mount {
        let log = mnt.with_extension(format!("log.{}", std::process::id()));
        cmd.arg("mount").arg("-f");
        if !options.is_empty() {
            cmd.arg("-o").arg(options);
        }
        cmd.arg("--log").arg(&log).arg(lower).arg(mnt).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::inherit());
        // The mount shows before the daemon's threads run: wait for the daemon's own word, which
        // it sends (sd_notify's READY=1) once every thread of it serves, ring entries
        // registered, and "mounted" is in its log (`Session::run_then`).
        let socket = mnt.with_extension(format!("notify.{}", std::process::id()));
        let _ = std::fs::remove_file(&socket);
        let notify = std::os::unix::net::UnixDatagram::bind(&socket).expect("bind the notify socket");
        notify.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
        cmd.env("NOTIFY_SOCKET", &socket);
        let mut child = cmd.spawn().expect("spawn densefs");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut ready = false;
        while !ready || !is_mounted(mnt) {
            let mut buf = [0u8; 64];
            ready |= notify.recv(&mut buf).is_ok_and(|n| buf[..n].starts_with(b"READY=1"));
            if let Ok(Some(status)) = child.try_wait() {
                panic!("densefs exited before mounting: {status}; log: {}", std::fs::read_to_string(&log).unwrap_or_default());
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                let _ = Command::new("fusermount3").args(["-u", "-z"]).arg(mnt).status();
                panic!("densefs did not mount {}; log: {}", mnt.display(), std::fs::read_to_string(&log).unwrap_or_default());
            }
        }
        let _ = std::fs::remove_file(&socket);
        Mount { child: Some(child), mnt: mnt.to_path_buf(), lower: lower.to_path_buf(), log }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }

    /// Clean unmount through `densefs umount`; waits for the daemon to exit.
    pub fn unmount(mut self) {
        self.unmount_inner();
    }

    fn unmount_inner(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        // A sibling test forking a process can hold our files open for a moment: retry "busy".
        let mut status = Command::new(BIN).arg("umount").arg(&self.mnt).status().expect("run densefs umount");
        for _ in 0..50 {
            if status.success() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
            status = Command::new(BIN).arg("umount").arg(&self.mnt).stderr(Stdio::null()).status().expect("run densefs umount");
        }
        if !status.success() {
            let _ = Command::new("fusermount3").args(["-u", "-z"]).arg(&self.mnt).status();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(status.success(), "densefs umount failed");
    }

    /// SIGKILL the daemon (a crash) and detach the dead mount.
    pub fn kill(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("fusermount3").args(["-u", "-z"]).arg(&self.mnt).stderr(Stdio::null()).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while is_mounted(&self.mnt) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// What the daemon logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.child.is_some() {
            if std::thread::panicking() {
                let _ = Command::new("fusermount3").args(["-u", "-z"]).arg(&self.mnt).status();
                if let Some(mut c) = self.child.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            } else {
                self.unmount_inner();
            }
        }
    }
}

/// Deterministic, compressible bytes (FASTQ-like text with some noise).
pub fn compressible(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut out = Vec::with_capacity(len);
    let bases = b"ACGT";
    let mut n = 0u64;
    while out.len() < len {
        n += 1;
        out.extend_from_slice(format!("@READ.{n} len=100\n").as_bytes());
        for _ in 0..100 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.push(bases[(x % 4) as usize]);
        }
        out.extend_from_slice(
            b"\n+\nIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIII99999IIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIII\n",
        );
    }
    out.truncate(len);
    out
}

pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

/// The current header copy of a lower container file (the valid one with the higher sequence).
pub fn current_header(lower_file: &Path) -> Vec<u8> {
    let raw = std::fs::read(lower_file).unwrap();
    let copy = |at: usize| {
        let c = &raw[at..at + 64];
        (&c[..8] == b"DENSEFS\0").then(|| (u64::from_le_bytes(c[24..32].try_into().unwrap()), c.to_vec()))
    };
    [copy(0), copy(64)].into_iter().flatten().max_by_key(|(seq, _)| *seq).expect("not a container").1
}

/// A size-limited tmpfs mounted on `dir` for the test's lifetime (the "small disk").
pub struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    pub fn new(dir: &Path, size: &str) -> SmallDisk {
        let ok = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(dir).status().unwrap();
        assert!(ok.success(), "mount tmpfs (needs root)");
        SmallDisk { dir: dir.to_path_buf() }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// A loop-mounted ext4 image with few inodes (64 MiB): every freed inode number is handed out
/// again at once, so each file densefs moves into a new lower inode takes a number another file
/// had. None where it cannot be made (no root, no mkfs.ext4).
pub struct SmallExt4 {
    dir: PathBuf,
}

impl SmallExt4 {
    pub fn new(image: &Path, dir: &Path, inodes: u32) -> Option<SmallExt4> {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::File::create(image).unwrap().set_len(64 << 20).unwrap();
        let made = Command::new("mkfs.ext4").args(["-q", "-F", "-N", &inodes.to_string()]).arg(image).status().is_ok_and(|s| s.success());
        if !made || !Command::new("mount").args(["-o", "loop"]).arg(image).arg(dir).status().is_ok_and(|s| s.success()) {
            return None;
        }
        Some(SmallExt4 { dir: dir.to_path_buf() })
    }
}

impl Drop for SmallExt4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// `densefs recompress -q [-r] [-o SPEC] PATH...`: whether it succeeded, and what it printed.
pub fn recompress(paths: &[&Path], recursive: bool, spec: &str) -> (bool, String) {
    let mut cmd = Command::new(BIN);
    cmd.arg("recompress").arg("-q");
    if recursive {
        cmd.arg("-r");
    }
    if !spec.is_empty() {
        cmd.arg("-o").arg(spec);
    }
    let out = cmd.args(paths).output().expect("run densefs recompress");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The daemon's live counters, `user.densefs.engine`.
pub fn engine_snapshot(mnt: &Path) -> serde_json::Value {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(mnt.as_os_str().as_bytes()).unwrap();
    let name = c"user.densefs.engine";
    let mut buf = vec![0u8; 1 << 16];
    // SAFETY: getxattr writes at most buf.len() bytes into buf; both strings are NUL-terminated.
    let n = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n > 0, "getxattr user.densefs.engine: {}", std::io::Error::last_os_error());
    serde_json::from_slice(&buf[..n as usize]).unwrap()
}

/// The daemon's inode table: (inodes known, descriptors open), from `user.densefs.engine`.
pub fn census(mnt: &Path) -> (u64, u64) {
    let v = engine_snapshot(mnt);
    (v["inodes"]["known"].as_u64().expect("inodes.known"), v["inodes"]["descriptors"].as_u64().expect("inodes.descriptors"))
}

/// Requests of kind `kind` (the kernel's name, lower case: "lookup") the mount's daemon has
/// received since it was mounted, from `user.densefs.engine`. Counted as each arrives, before it
/// is answered.
pub fn requests(mnt: &Path, kind: &str) -> u64 {
    engine_snapshot(mnt)["requests"][kind]["count"].as_u64().unwrap_or(0)
}

/// Polls `ok` until it holds (30 s at most).
pub fn wait_until(what: &str, ok: impl FnMut() -> bool) {
    wait_up_to(what, 30, ok)
}

/// Polls `ok` until it holds, for up to `secs` seconds.
pub fn wait_up_to(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Where record `record`'s copy in `slot` lies on a lower container file: where its descriptor
/// says (formats 4 and 5), or its slot (formats 1 to 3).
pub fn copy_offset(lower_file: &Path, record: u64, slot: usize) -> u64 {
    copy_descriptor(lower_file, record, slot).0
}

/// Record `record`'s copy in `slot` on a lower container file: (offset, stored length).
pub fn copy_descriptor(lower_file: &Path, record: u64, slot: usize) -> (u64, u64) {
    use densefs::format::layout::TABLE_SIZE;
    use densefs::format::{decode_table, Header, SlotState};
    let raw = std::fs::read(lower_file).unwrap();
    let layout = Header::decode(&raw[..raw.len().min(4096)]).unwrap().expect("a container").layout;
    let group = layout.record_to_group(record);
    let at = layout.group_to_table_off(group) as usize;
    let table = decode_table(&raw[at..at + TABLE_SIZE as usize], group, layout);
    match table[layout.record_to_entry_index(record)][slot] {
        SlotState::Valid(d) if layout.placed() => (u64::from(d.place) * 4096, u64::from(d.stored_len)),
        SlotState::Valid(d) => (layout.record_to_slot_off(record, slot), u64::from(d.stored_len)),
        other => panic!("record {record} slot {slot}: {other:?}"),
    }
}

/// FS_IOC_SHUTDOWN on the file system holding `path`, with `flags` (0: sync first, 1: flush the
/// log first, 2: nothing more lands).
pub fn shut_down(path: &Path, flags: u32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    const FS_IOC_SHUTDOWN: libc::c_ulong = 0x8004_587d; // _IOR('X', 125, __u32), linux/fs.h
    let f = std::fs::File::open(path)?;
    // SAFETY: the kernel reads a u32 at the address given; `flags` outlives the call.
    if unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_SHUTDOWN, &flags as *const u32) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A TCP port on loopback nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// GET `path` from 127.0.0.1:`port`: (status, body).
pub fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    use std::io::{Read, Write};
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    let status = response.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    // tiny_http answers with a length; Prometheus's API may send chunks: strip their sizes.
    let body = if response.to_ascii_lowercase().contains("transfer-encoding: chunked") { unchunk(&body) } else { body };
    Ok((status, body))
}

fn unchunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// linkat(fd, "", AT_FDCWD, to, AT_EMPTY_PATH): names an O_TMPFILE file, as systemd and rpm
/// name theirs.
pub fn link_at(file: &std::fs::File, to: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let to = std::ffi::CString::new(to.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: NUL-terminated strings that outlive the call; `file` owns its descriptor.
    if unsafe { libc::linkat(file.as_raw_fd(), c"".as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::AT_EMPTY_PATH) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// What a call answered: None where it worked, else its errno.
pub fn errno<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().map(|e| e.raw_os_error().unwrap_or(-1))
}

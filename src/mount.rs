//! `densefs mount` / `densefs umount`: option parsing, daemonizing, serving, unmounting.

use crate::checksum::ChecksumKind;
use crate::codec::Compression;
use crate::core::{DenseFs, Options};
use crate::engine::{Engine, EngineConfig, MinSavings, Offload};
use crate::format::Layout;
use crate::fuse::FuseAdapter;
use fuser::{MountOption, SessionACL};
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How long written data may sit in memory before it is compressed and written to the lower file.
const WRITEBACK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Everything `densefs mount` was asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct MountConfig {
    pub options: Options,
    pub fuse_options: Vec<MountOption>,
    pub allow_other: bool,
    pub threads: usize,
    /// The engine's policy (options set the size window, pre-check and verification).
    pub engine: EngineConfig,
}

fn on_off(key: &str, value: Option<&str>) -> Result<bool, String> {
    match value {
        None | Some("on") => Ok(true),
        Some("off") => Ok(false),
        Some(v) => Err(format!("invalid {key} '{v}' (on or off)")),
    }
}

/// "64K", "16M", "1G" or a plain number of bytes.
pub fn parse_size(text: &str) -> Option<u64> {
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => text.split_at(i),
        None => (text, ""),
    };
    let n: u64 = digits.parse().ok()?;
    let mult = match unit {
        "" => 1,
        "k" | "K" | "KiB" => 1 << 10,
        "m" | "M" | "MiB" => 1 << 20,
        "g" | "G" | "GiB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Parses a comma-separated `-o` list (all `-o` arguments joined).
pub fn parse_mount_options(list: &str) -> Result<MountConfig, String> {
    let mut options = Options::default();
    let mut fuse_options = Vec::new();
    let mut allow_other = unsafe { libc::geteuid() } == 0;
    let mut threads = std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(4, 16);
    let mut engine = EngineConfig::new(std::thread::available_parallelism().map_or(2, |n| n.get()));
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, value) = match item.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (item, None),
        };
        let need = |v: Option<&str>| -> Result<String, String> {
            v.map(str::to_string).ok_or_else(|| format!("mount option '{key}' needs a value ({key}=...)"))
        };
        match key {
            "compression" | "compress" => options.compression = Compression::parse(&need(value)?)?,
            "recordsize" => {
                let v = need(value)?;
                options.layout = parse_size(&v).and_then(Layout::new).ok_or_else(|| {
                    format!("invalid recordsize '{v}' (a power of two from 4K to 1M, e.g. 128K)")
                })?;
            }
            "checksum" => options.checksum = ChecksumKind::parse(&need(value)?)?,
            "min_savings" => options.min_savings = MinSavings::parse(&need(value)?)?,
            "offload" => options.offload = Offload::parse(&need(value)?)?,
            "offload_min" | "offload_max" => {
                let v = need(value)?;
                let n = parse_size(&v).filter(|n| (1..=1 << 20).contains(n)).ok_or_else(|| format!("invalid {key} '{v}' (a size up to 1M, e.g. 4K)"))?;
                if key == "offload_min" { engine.offload_window.0 = n as usize } else { engine.offload_window.1 = n as usize }
            }
            "cache_size" => {
                let v = need(value)?;
                options.cache_size = parse_size(&v).filter(|&n| n >= 8 << 20).ok_or_else(|| format!("invalid cache_size '{v}' (at least 8M, e.g. 256M or 1G)"))? as usize;
            }
            "precheck" => engine.precheck = on_off(key, value)?,
            "verify" => engine.verify = on_off(key, value)?,
            "threads" => {
                let v = need(value)?;
                threads = v.parse().ok().filter(|n| (1..=256).contains(n)).ok_or_else(|| format!("invalid threads '{v}' (1..256)"))?;
            }
            "allow_other" => allow_other = true,
            "allow_root" => allow_other = true,
            "ro" => {
                fuse_options.push(MountOption::RO);
                options.noatime = true;
            }
            "rw" => fuse_options.push(MountOption::RW),
            "suid" => fuse_options.push(MountOption::Suid),
            "nosuid" => fuse_options.push(MountOption::NoSuid),
            "dev" => fuse_options.push(MountOption::Dev),
            "nodev" => fuse_options.push(MountOption::NoDev),
            "exec" => fuse_options.push(MountOption::Exec),
            "noexec" => fuse_options.push(MountOption::NoExec),
            "atime" => fuse_options.push(MountOption::Atime),
            "noatime" => {
                fuse_options.push(MountOption::NoAtime);
                options.noatime = true;
            }
            "sync" => fuse_options.push(MountOption::Sync),
            "async" => fuse_options.push(MountOption::Async),
            "dirsync" => fuse_options.push(MountOption::DirSync),
            // Accepted for fstab lines; they mean nothing to a FUSE mount.
            "defaults" | "auto" | "noauto" | "nofail" | "_netdev" | "user" | "users" | "default_permissions" => {}
            _ => return Err(format!("unknown mount option '{item}' (see densefs mount --help)")),
        }
    }
    if engine.offload_window.0 > engine.offload_window.1 {
        return Err("offload_min is larger than offload_max".to_string());
    }
    Ok(MountConfig { options, fuse_options, allow_other, threads, engine })
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("paths from the command line have no NUL")
}

/// Takes the per-lower-directory lock that keeps two daemons off one lower tree.
fn lock_lower(lower: &Path, wait: bool) -> std::io::Result<File> {
    let dir = File::open(lower)?;
    let how = if wait { libc::LOCK_EX } else { libc::LOCK_EX | libc::LOCK_NB };
    if unsafe { libc::flock(dir.as_raw_fd(), how) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(dir)
}

/// The compression engine the mount asked for, with the accelerators this machine has.
fn build_engine(config: &MountConfig) -> Result<Engine, String> {
    let mut engine_config = config.engine.clone();
    let (devices, notes) = crate::engine::detect_devices(&mut engine_config)?;
    if let Offload::Only(name) = config.options.offload {
        if !devices.iter().any(|d| d.name() == name) {
            return Err(format!("offload={name}: no {name} backend available ({})", notes.join("; ")));
        }
    }
    for d in &devices {
        tracing::info!(device = d.name(), "accelerator found");
    }
    for note in &notes {
        tracing::info!("{note}");
    }
    Ok(Engine::with_devices(engine_config, devices))
}

/// Is some densefs mount serving `lower` right now?
fn is_served(lower: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let sep = fields.iter().position(|f| *f == "-");
        sep.and_then(|s| fields.get(s + 2)).is_some_and(|src| Path::new(&unescape(src)) == lower)
    })
}

/// A mount point left behind by a killed daemon answers ENOTCONN: detach it.
fn clear_dead_mount(mountpoint: &Path) {
    if let Err(e) = std::fs::metadata(mountpoint) {
        if e.raw_os_error() == Some(libc::ENOTCONN) {
            let _ = detach(mountpoint);
        }
    }
}

fn detach(mountpoint: &Path) -> Result<(), String> {
    if unsafe { libc::geteuid() } == 0 && unsafe { libc::umount2(cpath(mountpoint).as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    run_fusermount(&["-u", "-z"], mountpoint)
}

fn run_fusermount(args: &[&str], mountpoint: &Path) -> Result<(), String> {
    let out = std::process::Command::new("fusermount3")
        .args(args)
        .arg(mountpoint)
        .output()
        .map_err(|e| format!("cannot run fusermount3 (install the fuse3 package): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

pub fn mount(lower: &Path, mountpoint: &Path, config: MountConfig, foreground: bool, log: Option<PathBuf>) -> Result<(), String> {
    let lower = std::fs::canonicalize(lower).map_err(|e| format!("lower directory {}: {e}", lower.display()))?;
    if !lower.is_dir() {
        return Err(format!("lower path {} is not a directory", lower.display()));
    }
    clear_dead_mount(mountpoint);
    let mountpoint = std::fs::canonicalize(mountpoint).map_err(|e| format!("mount point {}: {e}", mountpoint.display()))?;
    if !mountpoint.is_dir() {
        return Err(format!("mount point {} is not a directory", mountpoint.display()));
    }
    if lower != mountpoint && (lower.starts_with(&mountpoint) || mountpoint.starts_with(&lower)) {
        // Mounting over the lower directory itself works (the daemon holds it open first);
        // one inside the other would recurse.
        return Err("the lower directory and the mount point must not contain each other".into());
    }
    // A daemon that was just unmounted may still be writing back: give it a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let lock = loop {
        match lock_lower(&lower, false) {
            Ok(lock) => break lock,
            Err(_) if std::time::Instant::now() < deadline && !is_served(&lower) => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Err(_) => return Err(format!("{} is already served by another densefs daemon", lower.display())),
        }
    };
    if foreground {
        return serve(&lower, &mountpoint, &config, lock, None, log);
    }
    let mut fds = [0; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    let (mut ready_rx, ready_tx) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            drop(ready_rx);
            unsafe { libc::setsid() };
            let code = match serve(&lower, &mountpoint, &config, lock, Some(ready_tx), log) {
                Ok(()) => 0,
                Err(_) => 1,
            };
            std::process::exit(code);
        }
        _child => {
            drop(ready_tx);
            drop(lock);
            let mut answer = String::new();
            let _ = ready_rx.read_to_string(&mut answer);
            match answer.strip_prefix("ok") {
                Some(_) => Ok(()),
                None if answer.is_empty() => Err("the densefs daemon exited before mounting".into()),
                None => Err(answer),
            }
        }
    }
}

fn block_termination_signals() -> libc::sigset_t {
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn serve(
    lower: &Path,
    mountpoint: &Path,
    config: &MountConfig,
    _lock: File,
    mut ready: Option<File>,
    log: Option<PathBuf>,
) -> Result<(), String> {
    let fail = |ready: &mut Option<File>, msg: String| {
        match ready.as_mut() {
            Some(pipe) => {
                let _ = pipe.write_all(msg.as_bytes());
            }
            None => eprintln!("densefs: {msg}"),
        }
        msg
    };
    crate::logging::init(log.as_deref(), ready.is_some());
    // Signals go to one thread that unmounts; every thread started from here inherits the mask.
    let signals = block_termination_signals();
    unsafe { libc::umask(0) };
    raise_fd_limit();
    let engine = match build_engine(config) {
        Ok(e) => Arc::new(e),
        Err(e) => return Err(fail(&mut ready, e)),
    };
    let fs = match DenseFs::new(lower, config.options, engine) {
        Ok(fs) => Arc::new(fs),
        Err(e) => return Err(fail(&mut ready, e.to_string())),
    };
    fs.connect_memory_budget();
    let mut fuse_config = fuser::Config::default();
    fuse_config.mount_options = vec![
        MountOption::FSName(lower.display().to_string()),
        MountOption::Subtype("densefs".into()),
        MountOption::DefaultPermissions,
    ];
    fuse_config.mount_options.extend(config.fuse_options.iter().cloned());
    fuse_config.acl = if config.allow_other { SessionACL::All } else { SessionACL::Owner };
    fuse_config.n_threads = Some(config.threads);
    fuse_config.clone_fd = true;
    let session = match fuser::Session::new(FuseAdapter::new(fs.clone()), mountpoint, &fuse_config) {
        Ok(s) => s,
        Err(e) => return Err(fail(&mut ready, format!("cannot mount {}: {e}", mountpoint.display()))),
    };
    let flusher = Arc::downgrade(&fs);
    std::thread::Builder::new()
        .name("densefs-writeback".into())
        .spawn(move || loop {
            std::thread::sleep(WRITEBACK_INTERVAL);
            match flusher.upgrade() {
                Some(fs) => fs.writeback_tick(),
                None => break,
            }
        })
        .map_err(|e| e.to_string())?;
    let target = mountpoint.to_path_buf();
    let session_ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ended, signalled_fs, lower_dir) = (session_ended.clone(), fs.clone(), lower.to_path_buf());
    std::thread::Builder::new()
        .name("densefs-signals".into())
        .spawn(move || {
            let mut sig = 0;
            unsafe { libc::sigwait(&signals, &mut sig) };
            tracing::info!("signal {sig}: unmounting {}", target.display());
            if let Err(e) = detach(&target) {
                tracing::error!("unmount failed: {e}");
            }
            end_after_signal(&ended, &signalled_fs, &lower_dir);
        })
        .map_err(|e| e.to_string())?;
    tracing::info!(
        "mounted {} on {} (compression={}, recordsize={}K)",
        lower.display(),
        mountpoint.display(),
        config.options.compression,
        config.options.layout.record_size() / 1024
    );
    if let Some(mut pipe) = ready.take() {
        let _ = pipe.write_all(b"ok");
        drop(pipe);
        quiet_stdio();
    }
    let result = session.run();
    session_ended.store(true, std::sync::atomic::Ordering::SeqCst);
    fs.flush_all();
    let root = File::open(lower).map_err(|e| e.to_string())?;
    unsafe { libc::syncfs(root.as_raw_fd()) };
    tracing::info!("unmounted {}", mountpoint.display());
    result.map_err(|e| e.to_string())
}

/// How long a detached mount may stay busy (files open) after a termination signal before the
/// daemon writes everything back and exits anyway, and how long that write-back may take.
const SIGNAL_GRACE: std::time::Duration = std::time::Duration::from_secs(3);
const SIGNAL_WRITEBACK_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// After SIGTERM/SIGINT/SIGHUP and the lazy unmount: the session normally ends once nothing uses
/// the mount. Files still open keep it alive, so after a grace period the daemon lands what it
/// holds in memory and exits (their holders then get ENOTCONN); a write-back that cannot finish
/// (a stuck lower disk) is abandoned after a bounded wait.
fn end_after_signal(session_ended: &std::sync::atomic::AtomicBool, fs: &Arc<DenseFs>, lower: &Path) {
    let start = std::time::Instant::now();
    while start.elapsed() < SIGNAL_GRACE {
        if session_ended.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    tracing::warn!("files are still open on the detached mount: writing everything back and exiting");
    let (fs, lower) = (fs.clone(), lower.to_path_buf());
    let _ = std::thread::Builder::new().name("densefs-final-writeback".into()).spawn(move || {
        fs.flush_all();
        if let Ok(root) = File::open(&lower) {
            unsafe { libc::syncfs(root.as_raw_fd()) };
        }
        tracing::info!("written back; exiting");
        std::process::exit(0);
    });
    std::thread::sleep(SIGNAL_WRITEBACK_LIMIT);
    tracing::error!("write-back did not finish within {SIGNAL_WRITEBACK_LIMIT:?}; exiting without it");
    std::process::exit(1);
}

/// The daemon holds one O_PATH descriptor per inode the kernel remembers: allow as many as the
/// system does (root may raise the hard limit up to fs.nr_open; others get their hard limit).
fn raise_fd_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return;
    }
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
    let raised = libc::rlimit { rlim_cur: nr_open.max(lim.rlim_max), rlim_max: nr_open.max(lim.rlim_max) };
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        lim.rlim_cur = lim.rlim_max;
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    }
}

fn quiet_stdio() {
    if let Ok(null) = File::options().read(true).write(true).open("/dev/null") {
        for fd in 0..3 {
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

/// The lower directory a densefs mount point serves (its mount source).
pub fn mount_source(mountpoint: &Path) -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else { continue };
        let point = unescape(fields.get(4)?);
        let fstype = fields.get(sep + 1)?;
        let source = PathBuf::from(unescape(fields.get(sep + 2)?));
        // As root the kernel records plain "fuse" (the subtype needs fusermount); the source is
        // then the lower directory.
        let ours = *fstype == "fuse.densefs" || (*fstype == "fuse" && source.is_dir());
        if Path::new(&point) == mountpoint && ours {
            return Some(source);
        }
    }
    None
}

fn unescape(field: &str) -> String {
    let mut out = String::new();
    let mut chars = field.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            if let Ok(n) = u8::from_str_radix(&code, 8) {
                out.push(n as char);
                continue;
            }
            out.push(c);
            out.push_str(&code);
        } else {
            out.push(c);
        }
    }
    out
}

/// Unmounts, then waits for the daemon to finish writing back and makes the lower durable.
pub fn umount(mountpoint: &Path) -> Result<(), String> {
    let mountpoint = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let source = mount_source(&mountpoint).ok_or_else(|| format!("{} is not a densefs mount", mountpoint.display()))?;
    run_fusermount(&["-u"], &mountpoint).or_else(|e| {
        if unsafe { libc::geteuid() } == 0 && unsafe { libc::umount(cpath(&mountpoint).as_ptr()) } == 0 {
            Ok(())
        } else {
            Err(format!("cannot unmount {}: {e}", mountpoint.display()))
        }
    })?;
    // The daemon holds the lower directory's lock until it has written everything back.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if lock_lower(&source, false).is_ok() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Err(format!("the daemon for {} did not exit within 60 s", source.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_bad_ones_are_explained() {
        let c = parse_mount_options("compression=zstd-3,recordsize=64K,checksum=xxh3,min_savings=20%,ro").unwrap();
        assert_eq!(c.options.compression.to_string(), "zstd-3");
        assert_eq!(c.options.layout.record_size(), 65536);
        assert_eq!(c.options.checksum, ChecksumKind::Xxh3);
        assert_eq!(c.options.min_savings, MinSavings(200));
        assert!(c.fuse_options.contains(&MountOption::RO));
        assert_eq!(parse_mount_options("").unwrap().options, Options::default());
        for bad in ["compression=lz5", "recordsize=3K", "recordsize=2M", "recordsize", "bogus", "threads=0"] {
            let err = parse_mount_options(bad).unwrap_err();
            assert!(!err.is_empty(), "{bad}");
        }
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("12Q"), None);
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(r"/mnt/with\040space"), "/mnt/with space");
    }
}

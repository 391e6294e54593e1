//! `densefs mount` / `densefs umount`: option parsing, daemonizing, serving, unmounting.

use crate::core::{DenseFs, Options};
use crate::engine::{Engine, EngineConfig, Offload};
use crate::fuse::FuseAdapter;
use fuser::{MountOption, SessionACL};
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
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
    crate::core::props::parse_size(text)
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
        // Every property is a mount option too, setting the root's default (core/props.rs's table).
        if let Ok(property) = crate::core::props::property(if key == "compress" { "compression" } else { key }) {
            property.parse_into(&need(value)?, &mut options)?;
            continue;
        }
        match key {
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
    mountinfo().iter().any(|m| m.is_densefs() && m.source == lower)
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

/// `densefs mount` and mount.densefs: a new mount, or with `remount` among the options a change
/// to a live one.
pub fn mount_or_remount(lower: &Path, mountpoint: &Path, options: &str, foreground: bool, log: Option<PathBuf>) -> Result<(), String> {
    if is_remount(options) {
        return remount(mountpoint, options);
    }
    mount(lower, mountpoint, parse_mount_options(options)?, foreground, log)
}

pub fn mount(lower: &Path, mountpoint: &Path, config: MountConfig, foreground: bool, mut log: Option<PathBuf>) -> Result<(), String> {
    // The daemon must outlive whatever read its output: a write to a closed pipe is an error, not
    // a death (the command line resets SIGPIPE to its default for the other commands).
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let lower = std::fs::canonicalize(lower).map_err(|e| format!("lower directory {}: {e}", lower.display()))?;
    if !lower.is_dir() {
        return Err(format!("lower path {} is not a directory", lower.display()));
    }
    clear_dead_mount(mountpoint);
    let mountpoint = std::fs::canonicalize(mountpoint).map_err(|e| format!("mount point {}: {e}", mountpoint.display()))?;
    if !mountpoint.is_dir() {
        return Err(format!("mount point {} is not a directory", mountpoint.display()));
    }
    if let Some(existing) = densefs_mount_at(&mountpoint) {
        return Err(format!(
            "{} already holds a densefs mount (of {}): unmount it first (densefs umount {0})",
            mountpoint.display(),
            existing.source.display()
        ));
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
    if !foreground && log.is_none() && !syslog_available() {
        log = fallback_log(&mountpoint);
        match &log {
            Some(path) => eprintln!("densefs: no syslog (/dev/log): the daemon logs to {}", path.display()),
            None => eprintln!("densefs: no syslog (/dev/log) and no writable log directory: the daemon will not log (use --log FILE)"),
        }
    }
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

/// Can syslog(3) reach a daemon on /dev/log (datagram or stream, as glibc tries)?
fn syslog_available() -> bool {
    let dgram = std::os::unix::net::UnixDatagram::unbound().and_then(|s| s.connect("/dev/log"));
    dgram.is_ok() || std::os::unix::net::UnixStream::connect("/dev/log").is_ok()
}

/// Where a daemon logs without syslog: `/var/log/densefs/MOUNTPOINT.log` for root,
/// `$XDG_STATE_HOME/densefs/` (`~/.local/state/densefs/`) for others, else the temporary
/// directory; the mount point's path names the file (`/srv/data` -> `srv-data.log`).
fn fallback_log(mountpoint: &Path) -> Option<PathBuf> {
    let name = mountpoint.to_string_lossy().trim_matches('/').replace('/', "-");
    let name = format!("{}.log", if name.is_empty() { "root" } else { &name });
    let mut dirs = Vec::new();
    if unsafe { libc::geteuid() } == 0 {
        dirs.push(PathBuf::from("/var/log/densefs"));
    } else if let Some(state) = std::env::var_os("XDG_STATE_HOME").filter(|s| !s.is_empty()) {
        dirs.push(PathBuf::from(state).join("densefs"));
    } else if let Some(home) = std::env::var_os("HOME").filter(|s| !s.is_empty()) {
        dirs.push(PathBuf::from(home).join(".local/state/densefs"));
    }
    dirs.push(std::env::temp_dir().join(format!("densefs-{}", unsafe { libc::geteuid() })));
    dirs.into_iter().map(|d| d.join(&name)).find(|path| {
        let dir = path.parent().expect("BUG: a log path has a directory");
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).is_ok()
            && std::fs::OpenOptions::new().create(true).append(true).open(path).is_ok()
    })
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
    // The daemon tells the waiting parent; in the foreground the caller prints the error.
    let fail = |ready: &mut Option<File>, msg: String| {
        if let Some(pipe) = ready.as_mut() {
            let _ = pipe.write_all(msg.as_bytes());
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
    let adapter = FuseAdapter::new(fs.clone());
    let session = if unsafe { libc::geteuid() } == 0 {
        // Root mounts with its own mount(2), as libfuse does, so that the type is fuse.densefs
        // (fuser passes plain "fuse" and drops the subtype).
        kernel_mount(lower, mountpoint, config).and_then(|fd| {
            fuser::Session::from_fd(adapter, fd, fuse_config.acl, fuse_config.clone()).inspect_err(|_| {
                unsafe { libc::umount2(cpath(mountpoint).as_ptr(), libc::MNT_DETACH) };
            })
        })
    } else {
        fuser::Session::new(adapter, mountpoint, &fuse_config)
    };
    let session = match session {
        Ok(s) => s,
        Err(e) => return Err(fail(&mut ready, format!("cannot mount {}: {}", mountpoint.display(), explain_mount_error(&e)))),
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

/// Mounts /dev/fuse on `mountpoint` as type `fuse.densefs` with source `lower` (root only) and
/// returns the opened device for the session.
fn kernel_mount(lower: &Path, mountpoint: &Path, config: &MountConfig) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::unix::fs::MetadataExt;
    let dev = File::options().read(true).write(true).open("/dev/fuse")?;
    let rootmode = std::fs::metadata(mountpoint)?.mode() & libc::S_IFMT;
    let mut data = format!(
        "fd={},rootmode={rootmode:o},user_id={},group_id={},default_permissions",
        dev.as_raw_fd(),
        unsafe { libc::getuid() },
        unsafe { libc::getgid() }
    );
    if config.allow_other {
        data.push_str(",allow_other");
    }
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    for option in &config.fuse_options {
        match option {
            MountOption::RO => flags |= libc::MS_RDONLY,
            MountOption::RW => flags &= !libc::MS_RDONLY,
            MountOption::Suid => flags &= !libc::MS_NOSUID,
            MountOption::NoSuid => flags |= libc::MS_NOSUID,
            MountOption::Dev => flags &= !libc::MS_NODEV,
            MountOption::NoDev => flags |= libc::MS_NODEV,
            MountOption::Exec => flags &= !libc::MS_NOEXEC,
            MountOption::NoExec => flags |= libc::MS_NOEXEC,
            MountOption::Atime => flags &= !libc::MS_NOATIME,
            MountOption::NoAtime => flags |= libc::MS_NOATIME,
            MountOption::Sync => flags |= libc::MS_SYNCHRONOUS,
            MountOption::Async => flags &= !libc::MS_SYNCHRONOUS,
            MountOption::DirSync => flags |= libc::MS_DIRSYNC,
            _ => {}
        }
    }
    let data = CString::new(data).expect("BUG: no NUL in mount data");
    let r = unsafe {
        libc::mount(cpath(lower).as_ptr(), cpath(mountpoint).as_ptr(), c"fuse.densefs".as_ptr(), flags, data.as_ptr() as *const libc::c_void)
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(dev.into())
}

/// A mount error with what to do about it: permission problems name /dev/fuse and fuse.conf.
fn explain_mount_error(e: &std::io::Error) -> String {
    use std::os::unix::fs::MetadataExt;
    let text = e.to_string().trim().to_string();
    if text.contains("user_allow_other") {
        return format!(
            "{text}: allow_other (other users may enter the mount) needs a line `user_allow_other` in /etc/fuse.conf \
             for mounts by users other than root; add it as root, or mount without -o allow_other"
        );
    }
    let denied = e.kind() == std::io::ErrorKind::PermissionDenied || matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM));
    let usable = unsafe { libc::access(c"/dev/fuse".as_ptr(), libc::R_OK | libc::W_OK) } == 0;
    match std::fs::metadata("/dev/fuse") {
        Err(_) => format!("{text}: /dev/fuse is missing: load the fuse module (modprobe fuse)"),
        Ok(meta) if denied && !usable => format!(
            "{text}: /dev/fuse is mode {:04o} (owner uid {}, group gid {}), so uid {} cannot open it: \
             make it usable by all (chmod 0666 /dev/fuse, as udev's rule for fuse does), or mount as root",
            meta.mode() & 0o7777,
            meta.uid(),
            meta.gid(),
            unsafe { libc::getuid() }
        ),
        Ok(_) => text,
    }
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

/// One line of /proc/self/mountinfo, its fields unescaped.
#[derive(Debug, Clone, PartialEq)]
pub struct MountEntry {
    pub point: PathBuf,
    /// Per-mount options (`rw,nosuid,nodev,relatime`).
    pub mount_options: String,
    pub fstype: String,
    pub source: PathBuf,
    /// Per-superblock options (`rw,user_id=0,...`).
    pub super_options: String,
}

impl MountEntry {
    /// A densefs mount: `fuse.densefs`, or plain `fuse` whose source is a directory (root mounts
    /// made by densefs before it mounted with its own type, through fuser).
    pub fn is_densefs(&self) -> bool {
        self.fstype == "fuse.densefs" || (self.fstype == "fuse" && self.source.is_dir())
    }
}

/// Parses one mountinfo line: `ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER`.
pub fn parse_mountinfo_line(line: &str) -> Option<MountEntry> {
    let fields: Vec<&str> = line.split(' ').collect();
    let sep = fields.iter().position(|f| *f == "-")?;
    Some(MountEntry {
        point: PathBuf::from(unescape(fields.get(4)?)),
        mount_options: fields.get(5)?.to_string(),
        fstype: unescape(fields.get(sep + 1)?).to_string_lossy().into_owned(),
        source: PathBuf::from(unescape(fields.get(sep + 2)?)),
        super_options: fields.get(sep + 3).map_or(String::new(), |s| s.to_string()),
    })
}

/// This process's mounts, in mount order (a later entry on the same point is on top).
pub fn mountinfo() -> Vec<MountEntry> {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default().lines().filter_map(parse_mountinfo_line).collect()
}

/// The densefs mount whose mount point is `mountpoint` (the top one, if several are stacked).
pub fn densefs_mount_at(mountpoint: &Path) -> Option<MountEntry> {
    mountinfo().into_iter().rev().find(|m| m.point == mountpoint).filter(MountEntry::is_densefs)
}

/// The lower directory a densefs mount point serves (its mount source).
pub fn mount_source(mountpoint: &Path) -> Option<PathBuf> {
    densefs_mount_at(mountpoint).map(|m| m.source)
}

/// Decodes the kernel's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` backslash).
fn unescape(field: &str) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes.get(i + 1..i + 4).filter(|c| c.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], code) {
            (b'\\', Some(c)) => {
                let n = c.iter().fold(0u32, |n, b| n * 8 + u32::from(b - b'0'));
                out.push(n as u8);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    std::ffi::OsString::from_vec(out)
}

/// Is `remount` among the options (`mount -o remount,ro`)?
pub fn is_remount(options: &str) -> bool {
    options.split(',').any(|o| o.trim() == "remount")
}

/// `mount -o remount,...`: changes what the kernel can change on a live mount (ro/rw, nosuid,
/// nodev, noexec, atime flags, sync, dirsync). densefs's own options are fixed at mount time;
/// given with their current value (as mount(8) does from an fstab line) they are accepted.
pub fn remount(mountpoint: &Path, options: &str) -> Result<(), String> {
    let mountpoint = std::fs::canonicalize(mountpoint).map_err(|e| format!("mount point {}: {e}", mountpoint.display()))?;
    let entry = densefs_mount_at(&mountpoint).ok_or_else(|| format!("{} is not a densefs mount", mountpoint.display()))?;
    let flag = |name: &str| -> Option<(libc::c_ulong, bool)> {
        Some(match name {
            "ro" => (libc::MS_RDONLY, true),
            "rw" => (libc::MS_RDONLY, false),
            "nosuid" => (libc::MS_NOSUID, true),
            "suid" => (libc::MS_NOSUID, false),
            "nodev" => (libc::MS_NODEV, true),
            "dev" => (libc::MS_NODEV, false),
            "noexec" => (libc::MS_NOEXEC, true),
            "exec" => (libc::MS_NOEXEC, false),
            "noatime" => (libc::MS_NOATIME, true),
            "atime" => (libc::MS_NOATIME, false),
            "nodiratime" => (libc::MS_NODIRATIME, true),
            "diratime" => (libc::MS_NODIRATIME, false),
            "relatime" => (libc::MS_RELATIME, true),
            "norelatime" => (libc::MS_RELATIME, false),
            "strictatime" => (libc::MS_STRICTATIME, true),
            "sync" => (libc::MS_SYNCHRONOUS, true),
            "async" => (libc::MS_SYNCHRONOUS, false),
            "dirsync" => (libc::MS_DIRSYNC, true),
            _ => return None,
        })
    };
    // Start from the mount's flags as they are: MS_REMOUNT sets all of them.
    let mut flags: libc::c_ulong = 0;
    for o in entry.mount_options.split(',').chain(entry.super_options.split(',')) {
        if let Some((bit, true)) = flag(o) {
            flags |= bit;
        }
    }
    let mut fixed = Vec::new();
    for item in options.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, value) = item.split_once('=').unwrap_or((item, ""));
        if let Some((bit, on)) = flag(item) {
            if on { flags |= bit } else { flags &= !bit }
            if bit == libc::MS_STRICTATIME {
                flags &= !(libc::MS_RELATIME | libc::MS_NOATIME);
            }
            continue;
        }
        match key {
            "remount" | "defaults" | "auto" | "noauto" | "nofail" | "_netdev" | "user" | "users" | "default_permissions" => {}
            // What the kernel shows of a FUSE mount, passed back by mount(8) (merged from mountinfo).
            "user_id" | "group_id" | "rootmode" | "max_read" | "blksize" | "fd" | "fsname" | "subtype" => {}
            "allow_other" | "allow_root" if entry.super_options.split(',').any(|o| o == "allow_other") => {}
            "compression" | "compress" | "recordsize" | "checksum" | "min_savings" | "offload" => {
                parse_mount_options(item)?;
                let name = if key == "compress" { "compression" } else { key };
                let live = crate::admin::report(&mountpoint, "properties")
                    .ok()
                    .and_then(|r| r["properties"][name]["value"].as_str().map(String::from));
                let same = live.as_deref().is_some_and(|v| parse_mount_options(&format!("{name}={v}")) == parse_mount_options(item));
                if !same {
                    return Err(format!(
                        "{key}={value}: {name} cannot change on a live mount (it is {}); `densefs set {name}={value} {}` \
                         applies it to files created from now on, or unmount and mount again",
                        live.as_deref().unwrap_or("unknown"),
                        mountpoint.display()
                    ));
                }
            }
            _ => {
                parse_mount_options(item)?;
                fixed.push(item.to_string());
            }
        }
    }
    if !fixed.is_empty() {
        eprintln!("densefs: {}: cannot change on a live mount, left as they were (unmount and mount again to change them)", fixed.join(","));
    }
    let r = unsafe { libc::mount(cpath(&entry.source).as_ptr(), cpath(&mountpoint).as_ptr(), std::ptr::null(), flags | libc::MS_REMOUNT, std::ptr::null()) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EBUSY) if flags & libc::MS_RDONLY != 0 => {
                format!("cannot remount {} read-only: files are open for writing on it", mountpoint.display())
            }
            Some(libc::EPERM) => format!("cannot remount {}: only root can ({e})", mountpoint.display()),
            _ => format!("cannot remount {}: {e}", mountpoint.display()),
        });
    }
    Ok(())
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
    use crate::{checksum::ChecksumKind, engine::MinSavings};

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
        assert_eq!(unescape(r"a\011b\012c\134d\"), "a\tb\nc\\d\\");
        assert_eq!(unescape(r"\303\251t\303\251"), "été");
        let e = parse_mountinfo_line(r"42 27 0:39 / /tmp/a\040b rw,nosuid,nodev,relatime shared:1 - fuse.densefs /tmp/low\040er rw,user_id=0").unwrap();
        assert_eq!(e.point, Path::new("/tmp/a b"));
        assert_eq!(e.source, Path::new("/tmp/low er"));
        assert_eq!((e.fstype.as_str(), e.mount_options.as_str(), e.super_options.as_str()), ("fuse.densefs", "rw,nosuid,nodev,relatime", "rw,user_id=0"));
    }
}

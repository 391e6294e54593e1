//! The densefs daemon: daemonizing, the FUSE session, write-back, and the signals that end it
//! (a busy mount is written back and left after a bounded wait).

use super::is_root;
use super::mount::cpath;
use super::mount_options::{IoUringMode, MountConfig};
use super::owner::{Lease, HEARTBEAT};
use super::unmount::detach;
use crate::core::atime::Atime;
use crate::core::{DenseFs, KernelCache};
use crate::engine::{Engine, Offload};
use crate::fuse::FuseAdapter;
use fuser::{MountOption, SessionACL};
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How long written data may sit in memory before it is compressed and written to the lower file.
const WRITEBACK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// The kernel's switch for FUSE over io_uring (Linux 6.14+): off unless set, with
/// `echo Y > ...` or `fuse.enable_uring=1` on the kernel command line.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// How many ring threads serve each CPU's queue, or 0 for /dev/fuse alone (`offered`: the
/// kernel's switch is on). Two at least, so that one request that waits on the lower disk (an
/// fsync, a cold read) does not hold up the others from programs on the same CPU.
pub fn io_uring_threads(mode: IoUringMode, threads: usize, cpus: usize, offered: bool) -> Result<usize, String> {
    match mode {
        IoUringMode::Off => Ok(0),
        IoUringMode::Auto if !offered => Ok(0),
        IoUringMode::On if !offered => Err(format!(
            "io_uring=on: this kernel does not offer FUSE over io_uring (it needs Linux 6.14 or later and Y in {ENABLE_URING})"
        )),
        IoUringMode::Auto | IoUringMode::On => Ok((threads / cpus.max(1)).max(2)),
    }
}

/// The compression engine the mount asked for, with the accelerators this machine has.
fn build_engine(config: &MountConfig) -> Result<Engine, String> {
    let mut engine_config = config.engine.clone();
    let (devices, notes) = crate::engine::detect_devices(&mut engine_config)?;
    if let Offload::Only(name) = config.options.properties.offload {
        if !devices.iter().any(|d| d.name() == name) {
            return Err(crate::engine::no_device(name, &notes.join("; ")));
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

/// Starts the daemon in the background: a child in its own session serves the mount and tells
/// this process through a pipe when it is mounted ("ok") or why not.
pub(super) fn start(
    lower: &Path,
    mountpoint: &Path,
    config: &MountConfig,
    lock: File,
    lease: Option<Arc<Lease>>,
    log: Option<PathBuf>,
) -> Result<(), String> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: pipe2 just opened both descriptors and nothing else owns them.
    let (mut ready_rx, ready_tx) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    // SAFETY: the command line has started no threads yet, so the child is a whole copy of this
    // process and may do anything; each side keeps only its own end of the pipe.
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            drop(ready_rx);
            // SAFETY: setsid has no preconditions (it fails harmlessly for a group leader).
            unsafe { libc::setsid() };
            let code = match serve(lower, mountpoint, config, lock, lease, Some(ready_tx), log) {
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
    // SAFETY: the set is a plain value the sigset calls fill in; pthread_sigmask only reads it
    // and may be given no old set (null).
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

pub(super) fn serve(
    lower: &Path,
    mountpoint: &Path,
    config: &MountConfig,
    _lock: File,
    lease: Option<Arc<Lease>>,
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
    super::logging::init(log.as_deref(), ready.is_some());
    // Signals go to one thread that unmounts; every thread started from here inherits the mask.
    let signals = block_termination_signals();
    // SAFETY: umask has no preconditions and cannot fail.
    unsafe { libc::umask(0) };
    raise_fd_limit();
    if let Some(lease) = &lease {
        if let Err(e) = lease.adopt() {
            return Err(fail(&mut ready, format!("cannot update the owner record {}: {e}", lease.path().display())));
        }
    }
    let engine = match build_engine(config) {
        Ok(e) => Arc::new(e),
        Err(e) => return Err(fail(&mut ready, e)),
    };
    let fs = match DenseFs::new(lower, config.options, engine) {
        Ok(fs) => Arc::new(fs),
        Err(e) => return Err(fail(&mut ready, e.to_string())),
    };
    fs.connect_memory_budget();
    if let Some(addr) = config.metrics {
        let counters = Arc::downgrade(&fs);
        let snapshot = move || counters.upgrade().map(|fs| fs.engine_snapshot()).unwrap_or_default();
        if let Err(e) = super::metrics::serve(addr, snapshot) {
            return Err(fail(&mut ready, e));
        }
    }
    let mut fuse_config = fuser::Config::default();
    fuse_config.mount_options =
        vec![MountOption::FSName(lower.display().to_string()), MountOption::Subtype("densefs".into()), MountOption::DefaultPermissions];
    fuse_config.mount_options.extend(config.fuse_options.iter().cloned());
    fuse_config.acl = if config.allow_other { SessionACL::All } else { SessionACL::Owner };
    fuse_config.n_threads = Some(config.threads);
    fuse_config.clone_fd = true;
    let offered = std::fs::read_to_string(ENABLE_URING).is_ok_and(|s| s.trim() == "Y");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    fuse_config.io_uring_threads = match io_uring_threads(config.io_uring, config.threads, cpus, offered) {
        Ok(n) => n,
        Err(e) => return Err(fail(&mut ready, e)),
    };
    let adapter = FuseAdapter::new(fs.clone(), config.read_only());
    let read_ahead_knob = adapter.read_ahead_knob();
    let session = if is_root() {
        // Root mounts with its own mount(2), as libfuse does, so that the type is fuse.densefs
        // (fuser passes plain "fuse" and drops the subtype).
        kernel_mount(lower, mountpoint, config).and_then(|fd| {
            fuser::Session::from_fd(adapter, fd, fuse_config.acl, fuse_config.clone()).inspect_err(|_| {
                // SAFETY: umount2 reads a NUL-terminated path that lives until the call returns.
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
    if config.io_uring == IoUringMode::On && !session.uses_io_uring() {
        // The kernel mount exists already (root mounts it itself): take it away again.
        let _ = detach(mountpoint);
        drop(session);
        return Err(fail(
            &mut ready,
            "io_uring=on: FUSE over io_uring could not be set up (the kernel did not offer it at INIT, or this process may not use io_uring: see kernel.io_uring_disabled)".to_string(),
        ));
    }
    let notifier = session.notifier();
    // Names are dropped on a thread of their own: the kernel locks the directory to drop one,
    // and a request holding that lock (a rename over the file) may wait for the very request
    // whose handler asks.
    let (stale_names, to_drop) = crossbeam_channel::unbounded::<(u64, std::ffi::OsString)>();
    let names_notifier = session.notifier();
    std::thread::Builder::new()
        .name("densefs-names".into())
        .spawn(move || {
            for (dir, name) in to_drop {
                // ENOENT: the kernel holds no such name.
                let _ = names_notifier.inval_entry(fuser::INodeNo(dir), &name);
            }
        })
        .map_err(|e| fail(&mut ready, format!("cannot start a thread: {e}")))?;
    fs.on_kernel_cache_stale(Box::new(move |ino, what| {
        // Offset -1: attributes only; 0 (length 0: all): a directory's cached listing too.
        let offset = match what {
            KernelCache::Attrs => -1,
            KernelCache::Listing | KernelCache::Everything => 0,
            KernelCache::Entry(name) => {
                let _ = stale_names.send((ino, name));
                return;
            }
        };
        // ENOENT: the kernel no longer holds the inode.
        let _ = notifier.inval_inode(fuser::INodeNo(ino), offset, 0);
    }));
    if let Some(mount) = super::mountinfo::densefs_mount_at(mountpoint) {
        *read_ahead_knob.lock() = Some(PathBuf::from(format!("/sys/class/bdi/{}/read_ahead_kb", mount.device)));
    }
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
    if let Some(lease) = lease.clone() {
        let target = mountpoint.to_path_buf();
        std::thread::Builder::new().name("densefs-owner".into()).spawn(move || keep_lease(&lease, &target)).map_err(|e| e.to_string())?;
    }
    let target = mountpoint.to_path_buf();
    let session_ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ended, signalled_fs, lower_dir, signalled_lease) = (session_ended.clone(), fs.clone(), lower.to_path_buf(), lease.clone());
    std::thread::Builder::new()
        .name("densefs-signals".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: sigwait reads the set and writes the signal number into `sig`.
            unsafe { libc::sigwait(&signals, &mut sig) };
            tracing::info!("signal {sig}: unmounting {}", target.display());
            if let Err(e) = detach(&target) {
                tracing::error!("unmount failed: {e}");
            }
            end_after_signal(&ended, &signalled_fs, &lower_dir, signalled_lease);
        })
        .map_err(|e| e.to_string())?;
    let transport = if session.uses_io_uring() {
        format!("io_uring, {} threads per CPU", fuse_config.io_uring_threads)
    } else if config.io_uring == IoUringMode::Auto && !offered && Path::new(ENABLE_URING).exists() {
        // The one setting that changes small-file speed most (docs/PERFORMANCE.md); say so.
        format!("/dev/fuse; this kernel has FUSE over io_uring switched off: Y in {ENABLE_URING} before mounting makes small files faster")
    } else {
        "/dev/fuse".to_string()
    };
    // Mounted: only now does this run count as one (a mount that fails leaves the record as
    // the last run left it, and its hints trusted).
    fs.begin_run(!config.read_only());
    fs.start_usage_rebuild();
    if !config.read_only() {
        let at = mountpoint.to_path_buf();
        // Remounted read-only (`mount -o remount,ro`): the kernel's flag, which the daemon reads
        // from mountinfo (a statfs of its own mount point would be a request to itself).
        fs.start_background(Box::new(move || {
            super::mountinfo::densefs_mount_at(&at).is_none_or(|m| !m.mount_options.split(',').any(|o| o == "ro"))
        }));
    }
    // "mounted" (the log line, the parent's "ok") once every thread serves, so that whoever
    // waits for it finds the daemon as it runs (its threads, its rings), not only the mount.
    let result = session.run_then(|| {
        tracing::info!(
            "mounted {} on {} (compression={}, recordsize={}K, requests through {transport})",
            lower.display(),
            mountpoint.display(),
            config.options.properties.compression,
            config.options.properties.layout.record_size() / 1024
        );
        notify_ready();
        if let Some(mut pipe) = ready.take() {
            let _ = pipe.write_all(b"ok");
            drop(pipe);
            quiet_stdio();
        }
    });
    session_ended.store(true, std::sync::atomic::Ordering::SeqCst);
    fs.flush_all();
    let root = File::open(lower).map_err(|e| e.to_string())?;
    // SAFETY: syncfs on a descriptor `root` owns and keeps open across the call.
    if unsafe { libc::syncfs(root.as_raw_fd()) } == 0 {
        fs.end_run();
    }
    if let Some(lease) = &lease {
        lease.release();
    }
    tracing::info!("unmounted {}", mountpoint.display());
    result.map_err(|e| e.to_string())
}

/// Tells whoever started the daemon with `NOTIFY_SOCKET` (systemd's `Type=notify`, the tests'
/// `Mount`) that it serves, as sd_notify(3) does: "READY=1" in a datagram to that socket (a path,
/// or an abstract name after '@'). Whatever the log level lets through.
fn notify_ready() {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let bytes = target.as_encoded_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name),
        None => SocketAddr::from_pathname(&target),
    };
    if let Err(e) = addr.and_then(|addr| UnixDatagram::unbound()?.send_to_addr(b"READY=1\n", &addr)) {
        tracing::warn!("cannot tell NOTIFY_SOCKET that the mount serves: {e}");
    }
}

/// How long a detached mount may stay busy (files open) after a termination signal before the
/// daemon writes everything back and exits anyway, and how long that write-back may take.
const SIGNAL_GRACE: std::time::Duration = std::time::Duration::from_secs(3);
const SIGNAL_WRITEBACK_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// After SIGTERM/SIGINT/SIGHUP and the lazy unmount: the session normally ends once nothing uses
/// the mount. Files still open keep it alive, so after a grace period the daemon lands what it
/// holds in memory and exits (their holders then get ENOTCONN); a write-back that cannot finish
/// (a stuck lower disk) is abandoned after a bounded wait.
fn end_after_signal(session_ended: &std::sync::atomic::AtomicBool, fs: &Arc<DenseFs>, lower: &Path, lease: Option<Arc<Lease>>) {
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
            // SAFETY: syncfs on a descriptor `root` owns and keeps open across the call.
            if unsafe { libc::syncfs(root.as_raw_fd()) } == 0 {
                fs.end_run();
            }
        }
        if let Some(lease) = lease {
            lease.release();
        }
        tracing::info!("written back; exiting");
        std::process::exit(0);
    });
    std::thread::sleep(SIGNAL_WRITEBACK_LIMIT);
    tracing::error!("write-back did not finish within {SIGNAL_WRITEBACK_LIMIT:?}; exiting without it");
    std::process::exit(1);
}

/// Advances the owner record's heartbeat while the daemon serves. If another machine's daemon
/// has taken the lower over (this one stalled past the takeover wait), the mount turns
/// read-only at once: two writers would corrupt each other's files.
fn keep_lease(lease: &Lease, mountpoint: &Path) {
    loop {
        std::thread::sleep(HEARTBEAT);
        if lease.beat() {
            continue;
        }
        tracing::error!(
            "another densefs daemon has taken over this lower directory (its owner record {} is not ours): \
             {} turns read-only; unmount it",
            lease.path().display(),
            mountpoint.display()
        );
        if let Err(e) = super::mount::remount(mountpoint, "ro") {
            tracing::error!("cannot turn {} read-only: {e}", mountpoint.display());
        }
        return;
    }
}

/// Mounts /dev/fuse on `mountpoint` as type `fuse.densefs` with source `lower` (root only) and
/// returns the opened device for the session.
fn kernel_mount(lower: &Path, mountpoint: &Path, config: &MountConfig) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::unix::fs::MetadataExt;
    let dev = File::options().read(true).write(true).open("/dev/fuse")?;
    let rootmode = std::fs::metadata(mountpoint)?.mode() & libc::S_IFMT;
    // SAFETY: getuid and getgid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!("fd={},rootmode={rootmode:o},user_id={uid},group_id={gid},default_permissions", dev.as_raw_fd());
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
    // The mount shows the access-time mode the daemon applies (core/atime.rs).
    flags &= !(libc::MS_NOATIME | libc::MS_RELATIME | libc::MS_STRICTATIME);
    flags |= match config.options.atime {
        Atime::Never => libc::MS_NOATIME,
        Atime::Relative => libc::MS_RELATIME,
        Atime::Strict => libc::MS_STRICTATIME,
    };
    if config.nodiratime {
        flags |= libc::MS_NODIRATIME;
    }
    let data = CString::new(data).expect("BUG: no NUL in mount data");
    // SAFETY: every pointer is to a NUL-terminated string that lives until the call returns.
    let r = unsafe {
        libc::mount(
            cpath(lower).as_ptr(),
            cpath(mountpoint).as_ptr(),
            c"fuse.densefs".as_ptr(),
            flags,
            data.as_ptr() as *const libc::c_void,
        )
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
    // SAFETY: access reads a NUL-terminated literal path.
    let usable = unsafe { libc::access(c"/dev/fuse".as_ptr(), libc::R_OK | libc::W_OK) } == 0;
    match std::fs::metadata("/dev/fuse") {
        Err(_) => format!("{text}: /dev/fuse is missing: load the fuse module (modprobe fuse)"),
        Ok(meta) if denied && !usable => format!(
            "{text}: /dev/fuse is mode {:04o} (owner uid {}, group gid {}), so uid {} cannot open it: \
             make it usable by all (chmod 0666 /dev/fuse, as udev's rule for fuse does), or mount as root",
            meta.mode() & 0o7777,
            meta.uid(),
            meta.gid(),
            // SAFETY: getuid has no preconditions and cannot fail.
            unsafe { libc::getuid() }
        ),
        Ok(_) => text,
    }
}

/// The daemon holds one O_PATH descriptor per inode the kernel remembers: allow as many as the
/// system does (root may raise the hard limit up to fs.nr_open; others get their hard limit).
fn raise_fd_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return;
    }
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
    let raised = libc::rlimit { rlim_cur: nr_open.max(lim.rlim_max), rlim_max: nr_open.max(lim.rlim_max) };
    // SAFETY: setrlimit only reads the rlimit it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: as above.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    }
}

fn quiet_stdio() {
    if let Ok(null) = File::options().read(true).write(true).open("/dev/null") {
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors, which this process owns; `null` stays
            // open across the call.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_uring_is_used_where_offered_and_required_only_with_on() {
        assert_eq!(io_uring_threads(IoUringMode::Auto, 4, 2, true), Ok(2));
        assert_eq!(io_uring_threads(IoUringMode::Auto, 16, 4, true), Ok(4));
        assert_eq!(io_uring_threads(IoUringMode::Auto, 4, 16, true), Ok(2), "two per CPU at least");
        assert_eq!(io_uring_threads(IoUringMode::Auto, 4, 2, false), Ok(0), "auto falls back to /dev/fuse");
        assert_eq!(io_uring_threads(IoUringMode::Off, 4, 2, true), Ok(0));
        let refused = io_uring_threads(IoUringMode::On, 4, 2, false).unwrap_err();
        assert!(refused.contains(ENABLE_URING), "the error says which switch: {refused}");
    }
}

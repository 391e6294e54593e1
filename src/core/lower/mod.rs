//! The core's one way to the system: every raw libc call the file system makes on the lower tree
//! (and the few about the process itself) is a safe wrapper here, with Rust types in and
//! `io::Result` out (errno read right after the failing call). Every path the daemon touches is
//! a single name relative to a directory fd it already holds, opened with O_NOFOLLOW, so nothing
//! resolves outside the lower directory. Descriptors come as `RawFd` (a stale one fails with
//! EBADF, it cannot corrupt memory) or `&File`, names as `&CStr`; flags reach the kernel as given.
//!
//! - this file: names as C strings, opening, stat, the process (time, user, fd limit);
//! - `names.rs`: directory entries (create, link, rename, remove, read a directory);
//! - `attrs.rs`: owner, mode and times;
//! - `xattrs.rs`: extended attributes;
//! - `fileio.rs`: reads, writes, space, syncing and seeking on open files;
//! - `handles.rs`: kernel file handles (inodes opened by number);
//! - `fence.rs`: the shutdown fence every change above asks first.

mod attrs;
pub mod fence;
mod fileio;
mod handles;
mod names;
mod xattrs;

pub use attrs::*;
pub use fileio::*;
pub use handles::*;
pub use names::*;
pub use xattrs::*;

use super::error::check;
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

/// A length-returning call's result (readlink, the xattr calls): the length, or errno on -1.
fn check_len(ret: libc::ssize_t) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

// ---- names and paths ------------------------------------------------------------------

/// `name` as a C string; a name holding a NUL byte is EINVAL.
pub fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The /proc path through which an O_PATH fd can be reopened or passed to path-only calls.
pub fn proc_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).expect("BUG: no NUL in a number")
}

/// What log lines call a lower file: the path its descriptor reaches now (through /proc), or
/// its descriptor number where that is unknown.
pub fn fd_path(fd: RawFd) -> String {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).map(|p| p.display().to_string()).unwrap_or_else(|_| format!("lower fd {fd}"))
}

// ---- opening --------------------------------------------------------------------------

/// Opens `name` in `dir` as an O_PATH descriptor, not following a symlink.
pub fn open_path(dir: RawFd, name: &OsStr) -> io::Result<OwnedFd> {
    let name = cstr(name)?;
    // SAFETY: `name` is NUL-terminated and outlives the call.
    let fd = check(unsafe { libc::openat(dir, name.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) })?;
    // SAFETY: openat just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `name` in `dir` for reading, for a caller that believes it is a regular file (readdir
/// said so): the descriptor then serves both as the inode's handle and to read its container
/// header, saving the O_PATH open and the reopen through /proc. Without moving the access time
/// where allowed (O_NOATIME is refused on files the daemon does not own); O_NONBLOCK so that an
/// entry replaced by a FIFO meanwhile cannot block; never follows a symlink. The caller checks
/// the type of what it got.
pub fn open_readable(dir: RawFd, name: &OsStr) -> io::Result<OwnedFd> {
    let name = cstr(name)?;
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    // SAFETY: `name` is NUL-terminated and outlives the call.
    let mut fd = unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_NOATIME) };
    if fd < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EPERM) {
        // SAFETY: as above.
        fd = unsafe { libc::openat(dir, name.as_ptr(), flags) };
    }
    let fd = check(fd)?;
    // SAFETY: openat just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens the lower root directory (O_PATH).
pub fn open_root(path: &std::path::Path) -> io::Result<OwnedFd> {
    let path = cstr(path.as_os_str())?;
    // SAFETY: `path` is NUL-terminated and outlives the call.
    let fd = check(unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) })?;
    // SAFETY: open just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// openat(2) of `name` in `dir` for I/O, `flags` as given (callers pass O_NOFOLLOW and
/// O_CLOEXEC); `mode` is used when the flags create the file.
pub fn openat(dir: RawFd, name: &CStr, flags: libc::c_int, mode: u32) -> io::Result<File> {
    if flags & (libc::O_CREAT | libc::O_TRUNC) != 0 || flags & libc::O_TMPFILE == libc::O_TMPFILE {
        fence::check()?;
    }
    // SAFETY: `name` is NUL-terminated and outlives the call; the mode is a plain integer.
    let fd = check(unsafe { libc::openat(dir, name.as_ptr(), flags, mode as libc::c_uint) })?;
    // SAFETY: openat just returned this descriptor and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Runs `f` with this thread's umask set to `umask`: the lower file system applies it to what
/// `f` creates, or the parent directory's default ACL instead, exactly as for a local caller.
/// A thread's first call gives it a umask of its own (unshare(CLONE_FS), as virtiofsd does),
/// so requests on other threads never see it.
/// A thread knows its umask after its first call (what it puts back), so a caller whose umask
/// is that already (0 for tar and cp -p as root, the daemon's being 0) costs no umask calls.
pub fn with_umask<T>(umask: u32, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    thread_local! {
        /// This thread's own umask, once it has one (None: it shares the process's).
        static OWN_UMASK: std::cell::Cell<Option<libc::mode_t>> = const { std::cell::Cell::new(None) };
    }
    let umask = (umask & 0o777) as libc::mode_t;
    let own = OWN_UMASK.get();
    if own == Some(umask) {
        return f();
    }
    if own.is_none() {
        // SAFETY: unshare(CLONE_FS) only gives this thread its own copy of cwd, root and umask.
        check(unsafe { libc::unshare(libc::CLONE_FS) })?;
    }
    // SAFETY: umask cannot fail; it changes only this thread's (now private) umask.
    let old = unsafe { libc::umask(umask) };
    let result = f();
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    OWN_UMASK.set(Some(old));
    result
}

/// Opens the inode behind an O_PATH fd for I/O.
pub fn reopen(path_fd: RawFd, flags: libc::c_int) -> io::Result<File> {
    let path = proc_path(path_fd);
    // SAFETY: `path` is NUL-terminated and outlives the call.
    let fd = check(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) })?;
    // SAFETY: open just returned this descriptor and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Opens the inode behind an O_PATH fd for reading. `noatime`: without moving its access time
/// (the daemon's own reads, and every read of a read-only mount); O_NOATIME is refused on files
/// the daemon does not own, which are then opened plainly.
pub fn reopen_read(path_fd: RawFd, noatime: bool) -> io::Result<File> {
    if noatime {
        match reopen(path_fd, libc::O_RDONLY | libc::O_NOATIME) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
            other => return other,
        }
    }
    reopen(path_fd, libc::O_RDONLY)
}

/// Opens the directory behind an O_PATH fd for listing, without moving its access time where
/// allowed (O_NOATIME): listings never move a directory's atime (core/atime.rs).
pub fn reopen_dir(path_fd: RawFd) -> io::Result<File> {
    match reopen(path_fd, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => reopen(path_fd, libc::O_RDONLY | libc::O_DIRECTORY),
        other => other,
    }
}

/// Sets whether reads through `file` leave its access time alone (O_NOATIME, dropped where
/// refused: on files the daemon does not own), and clears the O_NONBLOCK `open_readable` sets:
/// what a descriptor first opened for the daemon's own header reads needs when it starts
/// serving a reader's content, and again when it goes back to the daemon.
pub fn set_noatime(file: &File, noatime: bool) -> io::Result<()> {
    // F_SETFL sets exactly the status flags it may change (O_APPEND, O_ASYNC, O_DIRECT,
    // O_NOATIME, O_NONBLOCK), and the daemon's lower descriptors carry none of the others: one
    // call, with no F_GETFL first (a reader's open and close each made both).
    let wanted = if noatime { libc::O_NOATIME } else { 0 };
    // SAFETY: F_SETFL takes an int of flags and changes only the descriptor's status flags.
    match check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, wanted) }) {
        // SAFETY: as above.
        Err(e) if noatime && e.raw_os_error() == Some(libc::EPERM) => {
            check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, 0) }).map(drop)
        }
        other => other.map(drop),
    }
}

/// Makes `file` (opened read-only) writable in place: the inode is reopened read-write and the
/// new open file description takes over the same descriptor number (dup3 is atomic), so every
/// holder of `file` writes through it from then on.
pub fn upgrade_to_write(file: &File, path_fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL takes no argument and only reads the descriptor `file` owns.
    let flags = check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) })?;
    if flags & libc::O_ACCMODE != libc::O_RDONLY {
        return Ok(());
    }
    let writable = reopen(path_fd, libc::O_RDWR)?;
    // SAFETY: both descriptors are open and owned (`writable`, `file`); dup3 atomically makes
    // file's number refer to the new description, which `file` keeps owning; `writable` still
    // closes only its own number.
    check(unsafe { libc::dup3(writable.as_raw_fd(), file.as_raw_fd(), libc::O_CLOEXEC) })?;
    Ok(())
}

// ---- status ---------------------------------------------------------------------------

/// fstatat(2) of `name` in `dir`, not following a symlink.
pub fn stat_at(dir: RawFd, name: &OsStr) -> io::Result<libc::stat> {
    let name = cstr(name)?;
    // SAFETY: `stat` is a plain C struct of integers; all zeros is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated; fstatat writes only into `st`.
    check(unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

/// The (device, inode number) of `name` in directory `dir`, without following a symlink; `None`
/// if it cannot be stat'ed.
pub fn id_at(dir: RawFd, name: &CStr) -> Option<(u64, u64)> {
    id_and_links_at(dir, name).map(|(dev, ino, _)| (dev, ino))
}

/// As `id_at`, with the entry's link count.
pub fn id_and_links_at(dir: RawFd, name: &CStr) -> Option<(u64, u64, u64)> {
    entry_stat_at(dir, name).map(|st| id_and_links(&st))
}

/// The (device, inode number, link count) a status names.
pub fn id_and_links(st: &libc::stat) -> (u64, u64, u64) {
    #[allow(clippy::useless_conversion)] // nlink_t is u32 on some targets
    (st.st_dev, st.st_ino, u64::from(st.st_nlink))
}

/// The status of `name` in directory `dir`, not following a symlink; `None` if it cannot be
/// stat'ed.
pub fn entry_stat_at(dir: RawFd, name: &CStr) -> Option<libc::stat> {
    // SAFETY: `stat` is a plain C struct of integers; all zeros is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated; fstatat writes only into `st`.
    let found = unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } == 0;
    found.then_some(st)
}

/// fstat of any descriptor, O_PATH ones included (fstatat with AT_EMPTY_PATH), not following a
/// symlink.
pub fn stat_fd(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: `stat` is a plain C struct of integers; all zeros is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the empty path is a NUL-terminated static string; fstatat writes only into `st`.
    check(unsafe { libc::fstatat(fd, c"".as_ptr(), &mut st, libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

/// The birth time of the inode `fd` reaches (statx's STATX_BTIME, not following a symlink),
/// where its file system keeps one (ext4, xfs, btrfs; tmpfs since 5.x).
pub fn birth_time(fd: RawFd) -> Option<(i64, u32)> {
    // SAFETY: `statx` is a plain C struct of integers; all zeros is a valid value.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the empty path is a NUL-terminated static string; statx writes only into `sx`.
    let r = unsafe { libc::statx(fd, c"".as_ptr(), libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW, libc::STATX_BTIME, &mut sx) };
    (r == 0 && sx.stx_mask & libc::STATX_BTIME != 0).then_some((sx.stx_btime.tv_sec, sx.stx_btime.tv_nsec))
}

/// fstatvfs(2): the statistics of the file system `fd` is on.
pub fn fstatvfs(fd: RawFd) -> io::Result<libc::statvfs> {
    // SAFETY: `statvfs` is a plain C struct of integers; all zeros is a valid value.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatvfs writes only into `sv`.
    check(unsafe { libc::fstatvfs(fd, &mut sv) })?;
    Ok(sv)
}

// ---- the process ----------------------------------------------------------------------

/// The current time, as the kernel stamps files.
pub fn now() -> libc::timespec {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes only into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts
}

/// The effective user id of the daemon (0: root).
pub fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

pub fn getegid() -> u32 {
    // SAFETY: getegid has no preconditions and cannot fail.
    unsafe { libc::getegid() }
}

/// The soft limit on open descriptors (getrlimit RLIMIT_NOFILE).
pub fn nofile_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only into `lim`.
    check(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) })?;
    Ok(lim.rlim_cur)
}

/// Makes the calling thread run only when nothing else wants its CPU (SCHED_IDLE) and its disk
/// (the idle I/O class): for background work. Best effort: a kernel that refuses leaves it as it was.
pub fn run_when_idle() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; the kernel only reads `param`.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    const IOPRIO_CLASS_IDLE: libc::c_long = 3;
    const IOPRIO_CLASS_SHIFT: libc::c_long = 13;
    // SAFETY: ioprio_set takes three integers (who 0: the calling thread) and touches no memory.
    unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0 as libc::c_long, IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT) };
}

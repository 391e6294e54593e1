//! Thin wrappers over the *at() system calls the core uses on the lower tree. Every path the
//! daemon touches is a single name relative to a directory fd it already holds, opened with
//! O_NOFOLLOW, so nothing resolves outside the lower directory.

use super::error::check;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

pub fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The /proc path through which an O_PATH fd can be reopened or passed to path-only calls.
pub fn proc_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).expect("BUG: no NUL in a number")
}

pub fn open_path(dir: RawFd, name: &OsStr) -> io::Result<OwnedFd> {
    let name = cstr(name)?;
    let fd = check(unsafe { libc::openat(dir, name.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) })?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn open_root(path: &std::path::Path) -> io::Result<OwnedFd> {
    let path = cstr(path.as_os_str())?;
    let fd = check(unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) })?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens the inode behind an O_PATH fd for I/O.
pub fn reopen(path_fd: RawFd, flags: libc::c_int) -> io::Result<File> {
    let path = proc_path(path_fd);
    let fd = check(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) })?;
    Ok(unsafe { File::from_raw_fd(fd) })
}

pub fn stat_fd(fd: RawFd) -> io::Result<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstatat(fd, c"".as_ptr(), &mut st, libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

pub fn pread_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

pub fn pwrite_all(file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(buf, offset)
}

pub fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    check(unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    })?;
    Ok(())
}

pub fn fdatasync(file: &File) -> io::Result<()> {
    check(unsafe { libc::fdatasync(file.as_raw_fd()) }).map(|_| ())
}

pub fn fsync(file: &File) -> io::Result<()> {
    check(unsafe { libc::fsync(file.as_raw_fd()) }).map(|_| ())
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

/// Makes `file` (opened read-only) writable in place: the inode is reopened read-write and the
/// new open file description takes over the same descriptor number (dup3 is atomic), so every
/// holder of `file` writes through it from then on.
pub fn upgrade_to_write(file: &File, path_fd: RawFd) -> io::Result<()> {
    let flags = check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) })?;
    if flags & libc::O_ACCMODE != libc::O_RDONLY {
        return Ok(());
    }
    let writable = reopen(path_fd, libc::O_RDWR)?;
    check(unsafe { libc::dup3(writable.as_raw_fd(), file.as_raw_fd(), libc::O_CLOEXEC) })?;
    Ok(())
}

/// The first offset at or after `from` holding data (SEEK_DATA), or `None` past the last.
/// A file system without SEEK_DATA reports everything as data, which is only slower.
pub fn seek_data(file: &File, from: u64) -> io::Result<Option<u64>> {
    let Ok(from) = libc::off_t::try_from(from) else { return Ok(None) };
    let r = unsafe { libc::lseek(file.as_raw_fd(), from, libc::SEEK_DATA) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    match io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::ENXIO) => Ok(None),
        e if e.raw_os_error() == Some(libc::EINVAL) => Ok(Some(from as u64)),
        e => Err(e),
    }
}

/// Whether the lower file system allows a file to reach `offset` (its largest file size):
/// llseek refuses positions past it. The descriptor's position is not used for I/O here.
pub fn offset_allowed(file: &File, offset: u64) -> bool {
    libc::off_t::try_from(offset).is_ok_and(|off| unsafe { libc::lseek(file.as_raw_fd(), off, libc::SEEK_SET) } >= 0)
}

/// The current time, as the kernel stamps files.
pub fn now() -> libc::timespec {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts
}

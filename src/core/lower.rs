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

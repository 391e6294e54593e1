//! Open files: positioned reads and writes, space (fallocate), syncing and seeking.

use crate::core::error::check;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

/// Reads until `buf` is full or the file ends: the bytes read.
/// Asks the lower file system to start reading a range into its page cache (read-ahead); it
/// returns without waiting for the I/O.
pub fn will_need(file: &File, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: posix_fadvise only reads its integer arguments; the fd is open for the call.
    let r = unsafe { libc::posix_fadvise(file.as_raw_fd(), offset as libc::off_t, len as libc::off_t, libc::POSIX_FADV_WILLNEED) };
    match r {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

pub fn pread_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
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
    file.write_all_at(buf, offset)
}

/// fallocate(2) with its mode bits (FALLOC_FL_*).
pub fn fallocate(file: &File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: a plain call on the descriptor `file` owns.
    check(unsafe { libc::fallocate(file.as_raw_fd(), mode, offset as libc::off_t, len as libc::off_t) })?;
    Ok(())
}

/// Deallocates a range, keeping the size (nothing for an empty range).
pub fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    fallocate(file, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, len)
}

pub fn fdatasync(file: &File) -> io::Result<()> {
    // SAFETY: a plain call on the descriptor `file` owns.
    check(unsafe { libc::fdatasync(file.as_raw_fd()) }).map(|_| ())
}

pub fn fsync(file: &File) -> io::Result<()> {
    // SAFETY: a plain call on the descriptor `file` owns.
    check(unsafe { libc::fsync(file.as_raw_fd()) }).map(|_| ())
}

/// lseek(2): the new position.
pub fn lseek(file: &File, offset: libc::off_t, whence: libc::c_int) -> io::Result<libc::off_t> {
    // SAFETY: a plain call on the descriptor `file` owns.
    let r = unsafe { libc::lseek(file.as_raw_fd(), offset, whence) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The first offset at or after `from` holding data (SEEK_DATA), or `None` past the last.
/// A file system without SEEK_DATA reports everything as data, which is only slower.
pub fn seek_data(file: &File, from: u64) -> io::Result<Option<u64>> {
    let Ok(from) = libc::off_t::try_from(from) else { return Ok(None) };
    match lseek(file, from, libc::SEEK_DATA) {
        Ok(r) => Ok(Some(r as u64)),
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(Some(from as u64)),
        Err(e) => Err(e),
    }
}

/// Whether the lower file system allows a file to reach `offset` (its largest file size):
/// llseek refuses positions past it. The descriptor's position is not used for I/O here.
pub fn offset_allowed(file: &File, offset: u64) -> bool {
    libc::off_t::try_from(offset).is_ok_and(|off| lseek(file, off, libc::SEEK_SET).is_ok())
}

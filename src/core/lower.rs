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

/// The (device, inode number) of `name` in directory `dir`, without following a symlink; `None`
/// if it cannot be stat'ed.
pub fn id_at(dir: RawFd, name: &std::ffi::CStr) -> Option<(u64, u64)> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let found = unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } == 0;
    found.then_some((st.st_dev, st.st_ino))
}

pub fn stat_fd(fd: RawFd) -> io::Result<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstatat(fd, c"".as_ptr(), &mut st, libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

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
        libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset as libc::off_t, len as libc::off_t)
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

/// A kernel file handle (`struct file_handle` with room for the largest, MAX_HANDLE_SZ).
#[repr(C)]
struct FileHandle {
    bytes: u32,
    kind: i32,
    data: [u8; 128],
}

/// FILEID_INO32_GEN: a 32-bit inode number and a 32-bit generation (ext2/3/4, xfs).
const FILEID_INO32_GEN: i32 = 1;
const EXT_SUPER_MAGIC: libc::c_long = 0xEF53;

fn handle_of(fd: RawFd) -> Option<FileHandle> {
    let mut h = FileHandle { bytes: 128, kind: 0, data: [0; 128] };
    let mut mount_id: libc::c_int = 0;
    let r = unsafe {
        libc::name_to_handle_at(fd, c"".as_ptr(), &mut h as *mut FileHandle as *mut libc::file_handle, &mut mount_id, libc::AT_EMPTY_PATH)
    };
    (r == 0).then_some(h)
}

/// The lower inode's generation (ext4's i_generation) when its file system hands out
/// FILEID_INO32_GEN handles, else 0 (also FUSE's "no generation").
pub fn generation(fd: RawFd) -> u32 {
    match handle_of(fd) {
        Some(h) if h.kind == FILEID_INO32_GEN && h.bytes == 8 => u32::from_ne_bytes(h.data[4..8].try_into().expect("4 bytes")),
        _ => 0,
    }
}

/// Whether inodes of the file system of `fd` can be reopened from their number alone: ext2/3/4,
/// whose FILEID_INO32_GEN handles with generation 0 skip the generation check.
pub fn reopens_by_number(fd: RawFd) -> bool {
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(fd, &mut sfs) } != 0 || sfs.f_type as libc::c_long != EXT_SUPER_MAGIC {
        return false;
    }
    matches!(handle_of(fd), Some(h) if h.kind == FILEID_INO32_GEN && h.bytes == 8)
}

/// Opens (O_PATH) inode `ino` of the file system that `mount_fd` (not O_PATH) is on, by a
/// FILEID_INO32_GEN handle; generation 0 means "any" on ext4. Needs CAP_DAC_READ_SEARCH.
pub fn open_by_number(mount_fd: RawFd, ino: u32, generation: u32) -> io::Result<OwnedFd> {
    let mut h = FileHandle { bytes: 8, kind: FILEID_INO32_GEN, data: [0; 128] };
    h.data[..4].copy_from_slice(&ino.to_ne_bytes());
    h.data[4..8].copy_from_slice(&generation.to_ne_bytes());
    let fd = check(unsafe {
        libc::open_by_handle_at(mount_fd, &mut h as *mut FileHandle as *mut libc::file_handle, libc::O_PATH | libc::O_CLOEXEC)
    })?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The name under which directory `dir` (an O_PATH fd) holds inode `ino` (ENOENT if none).
pub fn name_of_ino(dir: RawFd, ino: u64) -> io::Result<std::ffi::OsString> {
    let d = reopen(dir, libc::O_RDONLY | libc::O_DIRECTORY)?;
    let stream = unsafe { libc::fdopendir(d.as_raw_fd()) };
    if stream.is_null() {
        return Err(io::Error::last_os_error());
    }
    std::mem::forget(d); // closedir closes it
    let mut found = None;
    loop {
        let ent = unsafe { libc::readdir64(stream) };
        if ent.is_null() {
            break;
        }
        let ent = unsafe { &*ent };
        let name = unsafe { std::ffi::CStr::from_ptr(ent.d_name.as_ptr()) }.to_bytes();
        if ent.d_ino == ino && name != b"." && name != b".." {
            found = Some(OsStr::from_bytes(name).to_os_string());
            break;
        }
    }
    unsafe { libc::closedir(stream) };
    found.ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
}

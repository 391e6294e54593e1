//! Directory entries: make, link, rename and remove names in a directory held by descriptor,
//! read a symlink, and read a directory's entries.

use super::check_len;
use crate::core::error::check;
use std::ffi::{CStr, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::ptr::NonNull;

/// mkdirat(2).
pub fn mkdirat(dir: RawFd, name: &CStr, mode: u32) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: `name` is NUL-terminated and outlives the call.
    check(unsafe { libc::mkdirat(dir, name.as_ptr(), mode as libc::mode_t) })?;
    Ok(())
}

/// mknodat(2).
pub fn mknodat(dir: RawFd, name: &CStr, mode: u32, rdev: u64) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: `name` is NUL-terminated and outlives the call.
    check(unsafe { libc::mknodat(dir, name.as_ptr(), mode as libc::mode_t, rdev as libc::dev_t) })?;
    Ok(())
}

/// symlinkat(2): `name` in `dir` becomes a symlink to `target`.
pub fn symlinkat(target: &CStr, dir: RawFd, name: &CStr) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: both strings are NUL-terminated and outlive the call.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir, name.as_ptr()) })?;
    Ok(())
}

/// readlinkat(2) into `buf`: the length of the target read (not NUL-terminated, cut at
/// `buf.len()`).
pub fn readlinkat(dir: RawFd, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `name` is NUL-terminated; the kernel writes at most buf.len() bytes into `buf`.
    check_len(unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// linkat(2): a new name `new` in `new_dir` for `old` in `old_dir`.
pub fn linkat(old_dir: RawFd, old: &CStr, new_dir: RawFd, new: &CStr, flags: libc::c_int) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: both names are NUL-terminated and outlive the call.
    check(unsafe { libc::linkat(old_dir, old.as_ptr(), new_dir, new.as_ptr(), flags) })?;
    Ok(())
}

/// unlinkat(2) (`flags`: 0, or AT_REMOVEDIR for a directory).
pub fn unlinkat(dir: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: `name` is NUL-terminated and outlives the call.
    check(unsafe { libc::unlinkat(dir, name.as_ptr(), flags) })?;
    Ok(())
}

/// renameat(2).
pub fn renameat(from_dir: RawFd, from: &CStr, to_dir: RawFd, to: &CStr) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: both names are NUL-terminated and outlive the call.
    check(unsafe { libc::renameat(from_dir, from.as_ptr(), to_dir, to.as_ptr()) })?;
    Ok(())
}

/// renameat2(2) with its flags (RENAME_NOREPLACE, RENAME_EXCHANGE), by system call number.
pub fn renameat2(from_dir: RawFd, from: &CStr, to_dir: RawFd, to: &CStr, flags: u32) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: renameat2 takes (int, const char *, int, const char *, unsigned int); both names
    // are NUL-terminated and outlive the call.
    let ret = unsafe { libc::syscall(libc::SYS_renameat2, from_dir, from.as_ptr(), to_dir, to.as_ptr(), flags) as libc::c_int };
    check(ret)?;
    Ok(())
}

/// An open directory stream (fdopendir, readdir64, closedir on drop).
pub struct DirStream(NonNull<libc::DIR>);

// SAFETY: a DIR stream belongs to no thread; `&mut self` on every call keeps it used by one at
// a time.
unsafe impl Send for DirStream {}

/// One entry of a [`DirStream`], borrowed until the stream is read again.
pub struct RawEntry<'a> {
    pub ino: u64,
    /// d_type (DT_DIR, DT_REG, ...; DT_UNKNOWN where the file system does not tell).
    pub kind: u8,
    pub name: &'a [u8],
    /// d_off: the lower file system's position of the entry after this one ([`DirStream::seek`]).
    pub next: u64,
}

impl DirStream {
    /// A stream over `dir` (a directory opened for reading), which it then owns.
    pub fn new(dir: OwnedFd) -> io::Result<DirStream> {
        // SAFETY: fdopendir only takes the descriptor number; `dir` is open.
        let stream = unsafe { libc::fdopendir(dir.as_raw_fd()) };
        let Some(stream) = NonNull::new(stream) else { return Err(io::Error::last_os_error()) };
        let _ = dir.into_raw_fd(); // closedir closes it
        Ok(DirStream(stream))
    }

    /// The next entry, or `None` at the end (a read error ends the listing too).
    pub fn next_entry(&mut self) -> Option<RawEntry<'_>> {
        // SAFETY: the stream is open until drop.
        let ent = unsafe { libc::readdir64(self.0.as_ptr()) };
        // SAFETY: a non-null entry stays valid until the next call on this stream, which the
        // borrow of `self` in the result prevents.
        let ent = unsafe { ent.as_ref() }?;
        // SAFETY: d_name is NUL-terminated within the entry.
        let name = unsafe { CStr::from_ptr(ent.d_name.as_ptr()) }.to_bytes();
        Some(RawEntry { ino: ent.d_ino, kind: ent.d_type, name, next: ent.d_off as u64 })
    }

    /// The stream's descriptor (for fstat).
    pub fn fd(&self) -> RawFd {
        // SAFETY: the stream is open until drop.
        unsafe { libc::dirfd(self.0.as_ptr()) }
    }

    /// Continues the listing at `position`, an entry's `next` from any stream of the same
    /// directory (the lower file system keeps these valid across opens, as NFS needs).
    pub fn seek(&mut self, position: u64) {
        // SAFETY: the stream is open until drop; seekdir takes any position.
        unsafe { libc::seekdir(self.0.as_ptr(), position as libc::c_long) };
    }
}

impl Drop for DirStream {
    fn drop(&mut self) {
        // SAFETY: the stream is open and closed only here, with the descriptor it owns.
        unsafe { libc::closedir(self.0.as_ptr()) };
    }
}

/// The name under which directory `dir` (an O_PATH fd) holds inode `ino` (ENOENT if none).
pub fn name_of_ino(dir: RawFd, ino: u64) -> io::Result<OsString> {
    let mut stream = DirStream::new(super::reopen_dir(dir)?.into())?;
    while let Some(ent) = stream.next_entry() {
        if ent.ino == ino && ent.name != b"." && ent.name != b".." {
            return Ok(OsStr::from_bytes(ent.name).to_os_string());
        }
    }
    Err(io::Error::from_raw_os_error(libc::ENOENT))
}

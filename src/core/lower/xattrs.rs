//! Extended attributes, by path (the core passes /proc/self/fd paths, see core/xattr.rs) or on
//! an open file. An empty buffer asks for the length only (a null buffer of size 0).

use super::check_len;
use crate::core::error::check;
use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// The buffer pointer to hand the kernel: null for an empty buffer (a length query).
fn out_ptr(buf: &mut [u8]) -> *mut u8 {
    if buf.is_empty() {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr()
    }
}

/// getxattr(2) into `buf`: the value's length (ERANGE if `buf` is too small; empty: the
/// length only).
pub fn getxattr(path: &CStr, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    let len = buf.len();
    // SAFETY: both strings are NUL-terminated; the kernel writes at most `len` bytes into
    // `buf` (nothing for a null pointer with length 0).
    check_len(unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), out_ptr(buf).cast(), len) })
}

/// listxattr(2) into `buf`: the length of the NUL-separated name list (ERANGE if `buf` is too
/// small; empty: the length only).
pub fn listxattr(path: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    let len = buf.len();
    // SAFETY: `path` is NUL-terminated; the kernel writes at most `len` bytes into `buf`
    // (nothing for a null pointer with length 0).
    check_len(unsafe { libc::listxattr(path.as_ptr(), out_ptr(buf).cast(), len) })
}

/// setxattr(2) (`flags`: 0, XATTR_CREATE or XATTR_REPLACE).
pub fn setxattr(path: &CStr, name: &CStr, value: &[u8], flags: libc::c_int) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: both strings are NUL-terminated; the kernel reads value.len() bytes of `value`.
    check(unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), flags) })?;
    Ok(())
}

/// fsetxattr(2).
pub fn fsetxattr(file: &File, name: &CStr, value: &[u8], flags: libc::c_int) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: `name` is NUL-terminated; the kernel reads value.len() bytes of `value`; `file`
    // owns the descriptor.
    check(unsafe { libc::fsetxattr(file.as_raw_fd(), name.as_ptr(), value.as_ptr().cast(), value.len(), flags) })?;
    Ok(())
}

/// removexattr(2).
pub fn removexattr(path: &CStr, name: &CStr) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: both strings are NUL-terminated and outlive the call.
    check(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) })?;
    Ok(())
}

/// What an xattr call acts on: a path (the core passes /proc/self/fd paths, which reach a
/// symlink or any O_PATH descriptor's inode), or a descriptor open for reading, which needs no
/// path walk.
#[derive(Clone, Copy)]
pub enum XattrOn<'a> {
    Path(&'a CStr),
    Fd(BorrowedFd<'a>),
}

/// getxattr(2) or fgetxattr(2), as [`getxattr`].
pub fn getxattr_on(on: XattrOn<'_>, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    match on {
        XattrOn::Path(path) => getxattr(path, name, buf),
        XattrOn::Fd(fd) => {
            let len = buf.len();
            // SAFETY: `name` is NUL-terminated; `fd` is open for the borrow; the kernel writes
            // at most `len` bytes into `buf` (nothing for a null pointer with length 0).
            check_len(unsafe { libc::fgetxattr(fd.as_raw_fd(), name.as_ptr(), out_ptr(buf).cast(), len) })
        }
    }
}

/// listxattr(2) or flistxattr(2), as [`listxattr`].
pub fn listxattr_on(on: XattrOn<'_>, buf: &mut [u8]) -> io::Result<usize> {
    match on {
        XattrOn::Path(path) => listxattr(path, buf),
        XattrOn::Fd(fd) => {
            let len = buf.len();
            // SAFETY: `fd` is open for the borrow; the kernel writes at most `len` bytes into
            // `buf` (nothing for a null pointer with length 0).
            check_len(unsafe { libc::flistxattr(fd.as_raw_fd(), out_ptr(buf).cast(), len) })
        }
    }
}

/// setxattr(2) or fsetxattr(2) (the descriptor may be read-only: only the inode's permissions
/// count).
pub fn setxattr_on(on: XattrOn<'_>, name: &CStr, value: &[u8], flags: libc::c_int) -> io::Result<()> {
    super::fence::check()?;
    match on {
        XattrOn::Path(path) => setxattr(path, name, value, flags),
        XattrOn::Fd(fd) => {
            // SAFETY: `name` is NUL-terminated; the kernel reads value.len() bytes of `value`;
            // `fd` is open for the borrow.
            check(unsafe { libc::fsetxattr(fd.as_raw_fd(), name.as_ptr(), value.as_ptr().cast(), value.len(), flags) })?;
            Ok(())
        }
    }
}

/// removexattr(2) or fremovexattr(2).
pub fn removexattr_on(on: XattrOn<'_>, name: &CStr) -> io::Result<()> {
    super::fence::check()?;
    match on {
        XattrOn::Path(path) => removexattr(path, name),
        XattrOn::Fd(fd) => {
            // SAFETY: `name` is NUL-terminated; `fd` is open for the borrow.
            check(unsafe { libc::fremovexattr(fd.as_raw_fd(), name.as_ptr()) })?;
            Ok(())
        }
    }
}

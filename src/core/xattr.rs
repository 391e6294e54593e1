//! Extended attributes, passed through to the lower inode. Symlinks carry none (Linux allows
//! only trusted.* and security.* on them, and the daemon cannot reach a symlink without
//! following it through /proc).

use super::error::check;
use super::lower::{self, cstr};
use super::{DenseFs, FsError, FsResult};
use std::ffi::{CString, OsStr};

impl DenseFs {
    fn xattr_target(&self, nodeid: u64) -> FsResult<Option<CString>> {
        let inode = self.inode(nodeid)?;
        if inode.kind == libc::S_IFLNK {
            return Ok(None);
        }
        Ok(Some(lower::proc_path(inode.raw_fd())))
    }

    /// Reads a whole value (sized by asking the lower first).
    pub fn getxattr(&self, nodeid: u64, name: &OsStr) -> FsResult<Vec<u8>> {
        let Some(path) = self.xattr_target(nodeid)? else { return Err(FsError::errno(libc::ENODATA)) };
        let name = cstr(name)?;
        loop {
            let len = check(unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) as libc::c_int })?;
            let mut buf = vec![0u8; len as usize];
            match check(unsafe {
                libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr() as *mut libc::c_void, buf.len()) as libc::c_int
            }) {
                Ok(n) => {
                    buf.truncate(n as usize);
                    return Ok(buf);
                }
                Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue, // grew meanwhile
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The NUL-separated list of names.
    pub fn listxattr(&self, nodeid: u64) -> FsResult<Vec<u8>> {
        let Some(path) = self.xattr_target(nodeid)? else { return Ok(Vec::new()) };
        loop {
            let len = check(unsafe { libc::listxattr(path.as_ptr(), std::ptr::null_mut(), 0) as libc::c_int })?;
            let mut buf = vec![0u8; len as usize];
            match check(unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr() as *mut libc::c_char, buf.len()) as libc::c_int }) {
                Ok(n) => {
                    buf.truncate(n as usize);
                    return Ok(buf);
                }
                Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub fn setxattr(&self, nodeid: u64, name: &OsStr, value: &[u8], flags: i32) -> FsResult<()> {
        let Some(path) = self.xattr_target(nodeid)? else { return Err(FsError::errno(libc::EPERM)) };
        let name = cstr(name)?;
        check(unsafe {
            libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr() as *const libc::c_void, value.len(), flags)
        })?;
        Ok(())
    }

    pub fn removexattr(&self, nodeid: u64, name: &OsStr) -> FsResult<()> {
        let Some(path) = self.xattr_target(nodeid)? else { return Err(FsError::errno(libc::ENODATA)) };
        let name = cstr(name)?;
        check(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) })?;
        Ok(())
    }
}

//! The command line's side of the control interface (`crate::control`): requests to the daemon
//! as `user.densefs.*` extended attributes on paths of a mount, so they work for any user the
//! mount lets in.

use super::mountinfo::mountpoint_of;
use crate::control::Control;
use serde_json::Value;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn c_path(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
}

/// Whether a request failed because the mount's daemon is gone: ENOTCONN, or ECONNABORTED or
/// ECANCELED for a request that met the kernel tearing down the daemon's io_uring queues (a
/// request sent just after the daemon died, before its /dev/fuse closed).
pub fn daemon_gone(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTCONN) | Some(libc::ECONNABORTED) | Some(libc::ECANCELED))
}

/// A failed request as the user should read it: no answer at all means no densefs there.
pub fn os_error(path: &Path, what: &str, e: std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOTSUP) | Some(libc::ENODATA) => format!("{}: not on a densefs mount", path.display()),
        _ if daemon_gone(&e) => {
            let at = mountpoint_of(path).unwrap_or_else(|| path.to_path_buf());
            format!("{}: its densefs daemon is gone (detach the mount with `umount -l {}`)", path.display(), at.display())
        }
        _ => format!("{}: {what}: {e}", path.display()),
    }
}

fn get_xattr(path: &Path, what: Control) -> Result<Vec<u8>, String> {
    let p = c_path(path).map_err(|e| os_error(path, "cannot ask densefs", e))?;
    let name = what.c_name();
    loop {
        // SAFETY: both names are NUL-terminated and outlive the call; a null buffer of size 0
        // asks for the size only.
        let n = unsafe { libc::getxattr(p.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
        if n < 0 {
            return Err(os_error(path, "cannot ask densefs", std::io::Error::last_os_error()));
        }
        let mut buf = vec![0u8; n as usize];
        // SAFETY: as above, and the kernel writes at most buf.len() bytes into buf.
        let m = unsafe { libc::getxattr(p.as_ptr(), name.as_ptr(), buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
        if m >= 0 {
            buf.truncate(m as usize);
            return Ok(buf);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(os_error(path, "cannot ask densefs", e));
        }
    }
}

/// The daemon's JSON answer to a read request on a path (a report or the engine's counters).
pub fn report(path: &Path, what: Control) -> Result<Value, String> {
    let bytes = get_xattr(path, what)?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: unreadable report from densefs: {e}", path.display()))
}

/// A write request: set a property, or ask for a recompress.
pub fn send(path: &Path, what: Control, value: &str) -> std::io::Result<()> {
    let p = c_path(path)?;
    // SAFETY: both names are NUL-terminated and outlive the call; the kernel reads value.len()
    // bytes of value.
    let r = unsafe { libc::setxattr(p.as_ptr(), what.c_name().as_ptr(), value.as_ptr() as *const libc::c_void, value.len(), 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A remove request: a directory's property inherits again.
pub fn remove(path: &Path, what: Control) -> std::io::Result<()> {
    let p = c_path(path)?;
    // SAFETY: both names are NUL-terminated and outlive the call.
    let r = unsafe { libc::removexattr(p.as_ptr(), what.c_name().as_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Refuses paths outside densefs mounts (else `set` would quietly write a plain user xattr).
pub fn require_densefs(path: &Path) -> Result<(), String> {
    std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if mountpoint_of(path).is_none() {
        return Err(format!("{}: not on a densefs mount (see `densefs list` for the mounts)", path.display()));
    }
    Ok(())
}

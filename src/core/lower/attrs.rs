//! Owner, mode and times, by name in a directory, by path, or on an open file.

use crate::core::error::check;
use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// fchownat(2) (`u32::MAX` leaves the uid or gid as it is).
pub fn fchownat(dir: RawFd, name: &CStr, uid: u32, gid: u32, flags: libc::c_int) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: `name` is NUL-terminated and outlives the call.
    check(unsafe { libc::fchownat(dir, name.as_ptr(), uid, gid, flags) })?;
    Ok(())
}

/// fchown(2).
pub fn fchown(file: &File, uid: u32, gid: u32) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: a plain call on the descriptor `file` owns.
    check(unsafe { libc::fchown(file.as_raw_fd(), uid, gid) })?;
    Ok(())
}

/// chmod(2) of a path (here a /proc/self/fd path: follows the magic link to the inode).
pub fn chmod(path: &CStr, mode: u32) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: `path` is NUL-terminated and outlives the call.
    check(unsafe { libc::chmod(path.as_ptr(), mode as libc::mode_t) })?;
    Ok(())
}

/// fchmod(2).
pub fn fchmod(file: &File, mode: u32) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: a plain call on the descriptor `file` owns.
    check(unsafe { libc::fchmod(file.as_raw_fd(), mode as libc::mode_t) })?;
    Ok(())
}

/// utimensat(2): access and modification times (UTIME_NOW, UTIME_OMIT allowed).
pub fn utimensat(dir: RawFd, path: &CStr, times: &[libc::timespec; 2], flags: libc::c_int) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: `path` is NUL-terminated; the kernel reads the two timespecs of `times`.
    check(unsafe { libc::utimensat(dir, path.as_ptr(), times.as_ptr(), flags) })?;
    Ok(())
}

/// futimens(2): access and modification times of an open file (UTIME_NOW, UTIME_OMIT allowed).
pub fn futimens(file: &File, times: &[libc::timespec; 2]) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: the kernel reads the two timespecs of `times`; `file` owns the descriptor.
    check(unsafe { libc::futimens(file.as_raw_fd(), times.as_ptr()) })?;
    Ok(())
}

/// The file attribute ioctls (linux/fs.h), as `lsattr`/`chattr` send them and the kernel
/// forwards them to a FUSE daemon: an int of flags, or a `struct fsxattr`.
pub const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
pub const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
pub const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
pub const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;
/// `struct fsxattr`: xflags, extsize, nextents, projid, cowextsize, 8 bytes of padding.
pub const FSXATTR_SIZE: usize = 28;
/// FS_IOC_SHUTDOWN (`_IOR('X', 125, __u32)`; XFS_IOC_GOINGDOWN is the same number).
pub const FS_IOC_SHUTDOWN: u32 = 0x8004_587d;

/// The inode flags of an open file (`lsattr`; the kernel reads and writes an int).
pub fn get_flags(file: &File) -> io::Result<u32> {
    let mut flags: libc::c_int = 0;
    // SAFETY: the kernel writes one int into `flags`, which outlives the call.
    check(unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_GETFLAGS as libc::c_ulong, &mut flags as *mut libc::c_int) })?;
    Ok(flags as u32)
}

/// Sets the inode flags of an open file (`chattr`).
pub fn set_flags(file: &File, flags: u32) -> io::Result<()> {
    super::fence::check()?;
    let flags = flags as libc::c_int;
    // SAFETY: the kernel reads one int from `flags`, which outlives the call.
    check(unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_SETFLAGS as libc::c_ulong, &flags as *const libc::c_int) })?;
    Ok(())
}

/// An open file's `struct fsxattr`.
pub fn get_fsxattr(file: &File) -> io::Result<[u8; FSXATTR_SIZE]> {
    let mut fsx = [0u8; FSXATTR_SIZE];
    // SAFETY: the kernel writes one struct fsxattr (28 bytes) into `fsx`.
    check(unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FSGETXATTR as libc::c_ulong, fsx.as_mut_ptr()) })?;
    Ok(fsx)
}

/// Sets an open file's `struct fsxattr`.
pub fn set_fsxattr(file: &File, fsx: &[u8; FSXATTR_SIZE]) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: the kernel reads one struct fsxattr (28 bytes) from `fsx`.
    check(unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FSSETXATTR as libc::c_ulong, fsx.as_ptr()) })?;
    Ok(())
}

/// What the kernel holds of a thread for the setuid/setgid rules: its supplementary groups and
/// whether CAP_FSETID is in its effective set.
pub struct Credentials {
    pub groups: Vec<u32>,
    /// The file system gid (the fourth of `Gid:`).
    pub fsgid: u32,
    pub fsetid: bool,
    /// The effective capability set, a bit per capability number.
    pub effective: u64,
}

impl Credentials {
    pub fn has_capability(&self, capability: u32) -> bool {
        self.effective & (1 << capability) != 0
    }
}

/// Reads `buf.len()` bytes at address `addr` of process `pid` (process_vm_readv(2)): an
/// ioctl's argument that the kernel does not copy in (`_IOR` numbers whose data is read all the
/// same, FS_IOC_SHUTDOWN's flags). Needs the daemon's CAP_SYS_PTRACE over the caller.
pub fn read_process_memory(pid: u32, addr: u64, buf: &mut [u8]) -> io::Result<()> {
    let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: buf.len() };
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`, which outlives the call;
    // the remote address is only read, in the other process, by the kernel (EFAULT if bad).
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    match n {
        n if n < 0 => Err(io::Error::last_os_error()),
        n if n as usize == buf.len() => Ok(()),
        _ => Err(io::Error::from_raw_os_error(libc::EFAULT)),
    }
}

/// The credentials of thread `tid` (a FUSE request's pid), from /proc/<tid>/status.
pub fn credentials(tid: u32) -> io::Result<Credentials> {
    const CAP_FSETID: u32 = 4; // linux/capability.h
    let status = std::fs::read_to_string(format!("/proc/{tid}/status"))?;
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("/proc/{tid}/status"));
    let groups = field("Groups:").ok_or_else(bad)?.split_whitespace().map(|g| g.parse().map_err(|_| bad())).collect::<io::Result<_>>()?;
    let effective = u64::from_str_radix(field("CapEff:").ok_or_else(bad)?, 16).map_err(|_| bad())?;
    let fsgid = field("Gid:").and_then(|g| g.split_whitespace().nth(3)?.parse().ok()).ok_or_else(bad)?;
    Ok(Credentials { groups, fsgid, fsetid: effective & (1 << CAP_FSETID) != 0, effective })
}

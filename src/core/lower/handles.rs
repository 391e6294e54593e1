//! Kernel file handles: the lower inode's generation, and inodes opened by number.

use crate::core::error::check;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

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
    // SAFETY: `h` is laid out as struct file_handle (repr(C)) with the 128 data bytes its
    // `bytes` field announces; the empty path is NUL-terminated (AT_EMPTY_PATH); the kernel
    // writes only into `h` and `mount_id`.
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
    // SAFETY: `statfs` is a plain C struct of integers; all zeros is a valid value.
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes only into `sfs`.
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
    // SAFETY: `h` is laid out as struct file_handle (repr(C)) and holds the 8 bytes its `bytes`
    // field announces; the kernel only reads it.
    let fd = check(unsafe {
        libc::open_by_handle_at(mount_fd, &mut h as *mut FileHandle as *mut libc::file_handle, libc::O_PATH | libc::O_CLOEXEC)
    })?;
    // SAFETY: open_by_handle_at just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Access-time modes of a mount (`MOUNT_ATTR_*` of linux/mount.h).
pub const MOUNT_ATTR_RELATIME: u64 = 0x00;
pub const MOUNT_ATTR_NOATIME: u64 = 0x10;
pub const MOUNT_ATTR_STRICTATIME: u64 = 0x20;
const MOUNT_ATTR_ATIME_MASK: u64 = 0x70;
const OPEN_TREE_CLONE: libc::c_uint = 1;

/// `struct mount_attr` of linux/mount.h.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A directory (opened for reading) of a detached copy of the mount `dir` is on, rooted at `dir`, whose access-time mode is
/// `atime` (a `MOUNT_ATTR_*`): reads through files opened under it move access times as that
/// mode says, whatever the mount's own flags. Nothing else sees it. Needs CAP_SYS_ADMIN.
pub fn clone_mount_with_atime(dir: RawFd, atime: u64) -> io::Result<OwnedFd> {
    // SAFETY: open_tree reads a NUL-terminated (empty, AT_EMPTY_PATH) path and returns a new
    // descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dir,
            c"".as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint,
        )
    };
    let fd = check(fd as libc::c_int)?;
    // SAFETY: open_tree just returned this descriptor and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let attr = MountAttr { attr_set: atime, attr_clr: MOUNT_ATTR_ATIME_MASK, propagation: 0, userns_fd: 0 };
    // SAFETY: mount_setattr reads `attr` (its size given) and the empty NUL-terminated path.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            size_of::<MountAttr>(),
        )
    } as libc::c_int)?;
    // open_by_handle_at takes no O_PATH descriptor (what open_tree gives).
    Ok(super::reopen(fd.as_raw_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?.into())
}

/// Opens for reading, under the mount of `mount_fd` (a clone of `fd`'s mount), the inode `fd`
/// is: by its file handle. Needs CAP_DAC_READ_SEARCH.
pub fn reopen_under(mount_fd: RawFd, fd: RawFd) -> io::Result<std::fs::File> {
    let mut h = handle_of(fd).ok_or_else(|| io::Error::from_raw_os_error(libc::EOPNOTSUPP))?;
    // SAFETY: `h` is a struct file_handle as name_to_handle_at filled it; the kernel only reads it.
    let fd = check(unsafe {
        libc::open_by_handle_at(
            mount_fd,
            &mut h as *mut FileHandle as *mut libc::file_handle,
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: open_by_handle_at just returned this descriptor and nothing else owns it.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

//! How many requests of each kind the kernel sent this process's sessions, and how long the
//! filesystem took to answer them (densefs: the request census its benchmarks and statistics
//! read). Counted as each request is dispatched, whichever transport brought it, including
//! those answered without the filesystem (ENOSYS).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Opcodes up to FUSE_STATX (52) and a slot for any other.
const SLOTS: usize = 54;
static COUNTS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static NANOS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

/// A request of kind `opcode` arrived: counted before it is answered, so a program that got
/// the answer finds it counted.
pub(crate) fn arrived(opcode: u32) {
    COUNTS[slot(opcode)].fetch_add(1, Ordering::Relaxed);
}

/// A request of kind `opcode` was dispatched in `took` (from its arrival to the end of its
/// handler: the answer's sending included where the handler answers itself).
pub(crate) fn handled(opcode: u32, took: Duration) {
    NANOS[slot(opcode)].fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
}

fn slot(opcode: u32) -> usize {
    (opcode as usize).min(SLOTS - 1)
}

/// The kernel's name of an opcode, without the FUSE_ prefix, lower case.
fn name(opcode: usize) -> &'static str {
    match opcode {
        1 => "lookup",
        2 => "forget",
        3 => "getattr",
        4 => "setattr",
        5 => "readlink",
        6 => "symlink",
        8 => "mknod",
        9 => "mkdir",
        10 => "unlink",
        11 => "rmdir",
        12 => "rename",
        13 => "link",
        14 => "open",
        15 => "read",
        16 => "write",
        17 => "statfs",
        18 => "release",
        20 => "fsync",
        21 => "setxattr",
        22 => "getxattr",
        23 => "listxattr",
        24 => "removexattr",
        25 => "flush",
        26 => "init",
        27 => "opendir",
        28 => "readdir",
        29 => "releasedir",
        30 => "fsyncdir",
        31 => "getlk",
        32 => "setlk",
        33 => "setlkw",
        34 => "access",
        35 => "create",
        36 => "interrupt",
        37 => "bmap",
        38 => "destroy",
        39 => "ioctl",
        40 => "poll",
        41 => "notify_reply",
        42 => "batch_forget",
        43 => "fallocate",
        44 => "readdirplus",
        45 => "rename2",
        46 => "lseek",
        47 => "copy_file_range",
        48 => "setupmapping",
        49 => "removemapping",
        50 => "syncfs",
        51 => "tmpfile",
        52 => "statx",
        _ => "other",
    }
}

/// Requests received so far, by the kernel's name of their kind (only kinds seen): how many,
/// and the time their handling took in all.
pub fn request_census() -> Vec<(&'static str, u64, Duration)> {
    (0..SLOTS)
        .map(|slot| (name(slot), COUNTS[slot].load(Ordering::Relaxed), Duration::from_nanos(NANOS[slot].load(Ordering::Relaxed))))
        .filter(|&(_, n, _)| n > 0)
        .collect()
}

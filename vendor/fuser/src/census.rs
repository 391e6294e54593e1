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

/// Upper bounds of the handling-time buckets (a Prometheus histogram's `le`), in microseconds;
/// one more bucket counts the rest.
pub const LATENCY_BOUNDS_US: [u64; 10] = [10, 25, 50, 100, 250, 500, 1_000, 2_500, 10_000, 100_000];
const BUCKETS: usize = LATENCY_BOUNDS_US.len() + 1;
static LATENCY: [[AtomicU64; BUCKETS]; SLOTS] = [const { [const { AtomicU64::new(0) }; BUCKETS] }; SLOTS];

/// One kind of request: how many arrived, the time their handling took in all, and how many
/// took at most each of [`LATENCY_BOUNDS_US`] (not cumulative; the last: longer).
#[derive(Clone, Debug)]
pub struct RequestKind {
    /// The kernel's name of the opcode, lower case, without `FUSE_`.
    pub name: &'static str,
    /// How many arrived.
    pub count: u64,
    /// The time their handling took in all.
    pub handled: Duration,
    /// How many took at most each bound of [`LATENCY_BOUNDS_US`], then how many took longer.
    pub buckets: [u64; BUCKETS],
}

/// A request of kind `opcode` arrived: counted before it is answered, so a program that got
/// the answer finds it counted.
pub(crate) fn arrived(opcode: u32) {
    COUNTS[slot(opcode)].fetch_add(1, Ordering::Relaxed);
}

/// A request of kind `opcode` was dispatched in `took` (from its arrival to the end of its
/// handler: the answer's sending included where the handler answers itself).
pub(crate) fn handled(opcode: u32, took: Duration) {
    NANOS[slot(opcode)].fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    let us = took.as_micros() as u64;
    let bucket = LATENCY_BOUNDS_US.iter().position(|&bound| us <= bound).unwrap_or(BUCKETS - 1);
    LATENCY[slot(opcode)][bucket].fetch_add(1, Ordering::Relaxed);
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

/// Requests received so far, by kind (only kinds seen), in opcode order.
pub fn request_census() -> Vec<RequestKind> {
    (0..SLOTS)
        .map(|slot| RequestKind {
            name: name(slot),
            count: COUNTS[slot].load(Ordering::Relaxed),
            handled: Duration::from_nanos(NANOS[slot].load(Ordering::Relaxed)),
            buckets: std::array::from_fn(|b| LATENCY[slot][b].load(Ordering::Relaxed)),
        })
        .filter(|k| k.count > 0)
        .collect()
}

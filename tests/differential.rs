//! Differential test in the spirit of fsx and mountpoint-s3's reference tests: thousands of
//! random operations are applied to a small file tree on a densefs mount and to a plain
//! directory (the reference); every operation's result (return value, errno, bytes read) and,
//! after it, the stat of every name and open file (kind, size, link count) must agree, and at
//! checkpoints the whole trees are compared byte for byte (names, kinds, sizes, link counts,
//! modes, contents read in full, never trusting SEEK_DATA/SEEK_HOLE), and so is every open file,
//! linked or not. The mount is unmounted and remounted halfway through, now and then, and at the
//! end, and the comparison goes on (persistence).
//!
//! Operations: pwrite/pread/write/read (some descriptors O_APPEND, some O_DIRECT on the mount
//! side so requests reach the daemon unaligned and uncached), lseek, ftruncate/truncate, every
//! fallocate mode densefs accepts (and some it must refuse), MAP_SHARED mmap writes + msync and
//! mmap reads, fsync/fdatasync, open (O_CREAT/O_EXCL/O_TRUNC/O_APPEND/O_RDONLY/O_WRONLY) and close,
//! rename (over files, across directories, onto directories), link, unlink, mkdir/rmdir, and
//! "parallel": threads writing interleaved pieces of one region and reading their own back,
//! and recompress (the request `densefs recompress [-r] -o SPEC` makes of the daemon for each
//! file, on the mount only: a record size other than the file's moves it to a new lower inode,
//! whose number ext4 hands out again; its own result is not compared, but everything after it
//! must still agree). Names sharing an inode number on one side must share it on the other.
//!
//! Deliberate differences that are not compared: st_blocks (the lower files are compressed),
//! directory sizes, and where SEEK_DATA/SEEK_HOLE put holes (densefs works per record); for the
//! latter only consistency is checked (every byte in a reported hole reads as zero).
//!
//! Environment:
//! - `DENSEFS_SEED=<n>`: replay a run (the seed is printed at the start of each run);
//! - `DENSEFS_OPS=<n>`: operations per run (default [`DEFAULT_OPS`]);
//! - `DENSEFS_KEEP=i,j,..`: run only these indices of the seed's operation list (a minimised
//!   reproduction, as printed by the minimiser);
//! - `DENSEFS_MINIMIZE=1`: on failure, shrink the operation list (delta debugging, at most
//!   `DENSEFS_MINIMIZE_SECS`, default 900) and print it;
//! - `DENSEFS_TRACE=1`: print every operation, resolved, and its result as it runs;
//! - `DENSEFS_STATS=1`: print how many operations of each kind succeeded, failed, were skipped.
//!
//! One configuration only: `cargo test --test differential zstd3_128k`.

mod common;

use memmap2::MmapOptions;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Operations per run when `DENSEFS_OPS` is not set.
const DEFAULT_OPS: usize = 20000;
/// The name space: two directories (renames move files between them) and six file names.
const PATHS: [&str; 8] = ["a", "b", "f0", "f1", "a/f2", "a/f3", "b/f4", "b/f5"];
const DIRS: usize = 2;
/// Open-file slots; an operation on an empty slot opens it instead (see [`resolve`]).
const SLOTS: usize = 6;
const MAX_OFF: u64 = 2 << 20;
const MAX_LEN: usize = 300 << 10;
/// Records per descriptor table in the container format.
const GROUP_RECORDS: u64 = densefs::format::layout::GROUP_RECORDS;
/// A whole-tree comparison every this many operations.
const CHECK_EVERY: usize = 400;
/// A run that makes no progress for this long has hung: the daemon is killed.
const HANG_LIMIT: Duration = Duration::from_secs(90);
/// What [`Op::Recompress`] asks for: record sizes that mostly differ from the file's, so that the
/// file moves into a new container (a new lower inode); the same size re-encodes it in place.
const RECOMPRESS_SPECS: [&str; 6] = [
    "recordsize=32K",
    "recordsize=64K",
    "recordsize=128K",
    "recordsize=256K",
    "recordsize=64K,compression=zstd-3",
    "recordsize=256K,compression=lz4",
];

// ---- operations -------------------------------------------------------------------------

/// An offset or size, resolved against the reference file's size when the operation runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Off {
    Abs(u64),
    /// Relative to the current end of file.
    Eof(i64),
    /// A fraction of the current size (mmap, which must stay inside the file).
    Frac(f64),
}

impl Off {
    fn resolve(self, size: u64) -> Off {
        Off::Abs(match self {
            Off::Abs(x) => x,
            Off::Eof(d) => size.saturating_add_signed(d),
            Off::Frac(f) => ((size as f64 * f) as u64).min(size.saturating_sub(1)),
        })
    }

    fn abs(self) -> u64 {
        match self {
            Off::Abs(x) => x,
            _ => panic!("BUG: unresolved offset {self:?}"),
        }
    }
}

/// What written bytes look like.
#[derive(Clone, Copy, Debug)]
enum Fill {
    Text(u64),
    Zeros,
    Random(u64),
    /// Runs of text, zeros and random bytes.
    Mixed(u64),
    Byte(u8),
}

impl Fill {
    fn bytes(self, len: usize) -> Vec<u8> {
        match self {
            Fill::Text(s) => common::compressible(len, s),
            Fill::Zeros => vec![0; len],
            Fill::Random(s) => common::random_bytes(len, s),
            Fill::Byte(b) => vec![b; len],
            Fill::Mixed(s) => {
                let mut rng = StdRng::seed_from_u64(s);
                let mut out = Vec::with_capacity(len);
                while out.len() < len {
                    let run = rng.gen_range(1..=16384).min(len - out.len());
                    match rng.gen_range(0..3) {
                        0 => out.extend(common::compressible(run, rng.gen())),
                        1 => out.resize(out.len() + run, 0),
                        _ => out.extend(common::random_bytes(run, rng.gen())),
                    }
                }
                out
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Acc {
    R,
    W,
    RW,
}

#[derive(Clone, Copy, Debug)]
enum Op {
    /// Closes whatever the slot holds, then open(2)s `PATHS[path]` into it.
    /// `direct`: O_DIRECT on the mount side only (ext4 would want aligned buffers), so reads
    /// and writes reach the daemon exactly as issued, not through the page cache.
    Open {
        slot: usize,
        path: &'static str,
        acc: Acc,
        create: bool,
        excl: bool,
        trunc: bool,
        append: bool,
        direct: bool,
    },
    Close {
        slot: usize,
    },
    Pwrite {
        slot: usize,
        off: Off,
        len: usize,
        fill: Fill,
    },
    /// write(2) at the file position (at the end of file for O_APPEND).
    Write {
        slot: usize,
        len: usize,
        fill: Fill,
    },
    Pread {
        slot: usize,
        off: Off,
        len: usize,
    },
    /// read(2) at the file position.
    Read {
        slot: usize,
        len: usize,
    },
    Lseek {
        slot: usize,
        pos: i64,
        whence: i32,
    },
    Ftruncate {
        slot: usize,
        size: Off,
    },
    /// truncate(2) by path (the file may or may not be open).
    Truncate {
        path: &'static str,
        size: Off,
    },
    Fallocate {
        slot: usize,
        mode: i32,
        off: Off,
        len: u64,
    },
    /// MAP_SHARED read/write mapping of the whole file, bytes copied in, msync, munmap.
    MmapWrite {
        slot: usize,
        off: Off,
        len: usize,
        fill: Fill,
    },
    MmapRead {
        slot: usize,
        off: Off,
        len: usize,
    },
    Fsync {
        slot: usize,
        data_only: bool,
    },
    Rename {
        from: &'static str,
        to: &'static str,
    },
    Link {
        from: &'static str,
        to: &'static str,
    },
    Unlink {
        path: &'static str,
    },
    Mkdir {
        dir: &'static str,
    },
    Rmdir {
        dir: &'static str,
    },
    /// SEEK_DATA/SEEK_HOLE: ENXIO at and past the end on both sides; on the mount every byte in
    /// a reported hole must read as zero.
    SeekHoles {
        slot: usize,
    },
    /// Several threads, each with its own descriptors, write disjoint pieces of one region of
    /// the file (pieces of different threads share records), reading back their own pieces and
    /// now and then closing and reopening or fdatasync-ing meanwhile. The reference applies the
    /// same pieces one after another; the final contents do not depend on the order.
    Parallel {
        path: &'static str,
        base: Off,
        len: usize,
        seed: u64,
    },
    /// On the mount only: asks the daemon to rewrite the file with `spec` (as `densefs recompress
    /// -o SPEC` does), or each file below a directory in turn (`-r`). Its result is not
    /// compared: EBUSY (open), EMLINK (hard-linked), ENOENT and EINVAL (not a file) are the
    /// mount's to give.
    Recompress {
        path: &'static str,
        spec: &'static str,
    },
    /// Compares the whole trees (and every open file, linked or not).
    Check,
    /// Closes everything, unmounts, mounts again, compares the trees.
    Remount,
    /// A resolved operation that cannot run (mmap of an empty file).
    Nop,
}

fn gen_off(rng: &mut StdRng, rs: u64) -> Off {
    match rng.gen_range(0..100) {
        0..=34 => Off::Abs(rng.gen_range(0..MAX_OFF)),
        35..=59 => Off::Eof(match rng.gen_range(0..4) {
            0 => 0,
            1 => rng.gen_range(-65536..=0),
            2 => rng.gen_range(1..=65536),
            _ => rng.gen_range(-(MAX_LEN as i64)..=512 << 10),
        }),
        60..=84 => Off::Abs(boundary(rng, rs)),
        _ => Off::Abs(rng.gen_range(0..8192)),
    }
}

fn gen_len(rng: &mut StdRng, rs: u64) -> usize {
    match rng.gen_range(0..100) {
        0..=9 => rng.gen_range(1..=16),
        10..=39 => rng.gen_range(1..=4096),
        40..=69 => rng.gen_range(4096..=65536),
        70..=89 => rng.gen_range(65536..=MAX_LEN),
        _ => (rs as usize * rng.gen_range(1..=4)).min(1 << 20),
    }
}

fn gen_size(rng: &mut StdRng, rs: u64) -> Off {
    match rng.gen_range(0..100) {
        0..=7 => Off::Abs(0),
        8..=39 => Off::Eof(rng.gen_range(-(MAX_LEN as i64)..=MAX_LEN as i64)),
        40..=69 => Off::Abs(rng.gen_range(0..MAX_OFF + MAX_LEN as u64)),
        _ => Off::Abs(boundary(rng, rs)),
    }
}

/// A record boundary, often a few bytes off; now and then around the start of the second or
/// third descriptor group (GROUP_RECORDS records each), which files under MAX_OFF reach only
/// with small records.
fn boundary(rng: &mut StdRng, rs: u64) -> u64 {
    let k = if rng.gen_ratio(1, 25) {
        GROUP_RECORDS * rng.gen_range(1..=2) + rng.gen_range(0..=2) - 1
    } else {
        rng.gen_range(0..=MAX_OFF / rs)
    };
    let delta = if rng.gen_bool(0.4) { 0 } else { rng.gen_range(-64..=64) };
    (k * rs).saturating_add_signed(delta)
}

fn gen_fill(rng: &mut StdRng) -> Fill {
    match rng.gen_range(0..100) {
        0..=34 => Fill::Text(rng.gen()),
        35..=49 => Fill::Zeros,
        50..=69 => Fill::Random(rng.gen()),
        70..=89 => Fill::Mixed(rng.gen()),
        _ => Fill::Byte(rng.gen()),
    }
}

fn gen_falloc(rng: &mut StdRng, rs: u64) -> (i32, u64) {
    use libc::{FALLOC_FL_KEEP_SIZE as KEEP, FALLOC_FL_PUNCH_HOLE as PUNCH, FALLOC_FL_ZERO_RANGE as ZERO};
    let mode = match rng.gen_range(0..100) {
        0..=14 => 0,
        15..=24 => KEEP,
        25..=59 => PUNCH | KEEP,
        60..=79 => ZERO,
        80..=95 => ZERO | KEEP,
        _ => PUNCH, // EOPNOTSUPP: punching must keep the size
    };
    let len = match rng.gen_range(0..100) {
        0..=1 => 0, // EINVAL
        2..=29 => rng.gen_range(1..=8192),
        30..=69 => rng.gen_range(1..=600 << 10),
        _ => rs * rng.gen_range(1..=4),
    };
    (mode, len)
}

fn gen_op(rng: &mut StdRng, rs: u64) -> Op {
    let slot = rng.gen_range(0..SLOTS);
    let file = PATHS[rng.gen_range(DIRS..PATHS.len())];
    let file2 = PATHS[rng.gen_range(DIRS..PATHS.len())];
    let any = PATHS[rng.gen_range(0..PATHS.len())];
    match rng.gen_range(0..1021) {
        0..=219 => Op::Pwrite { slot, off: gen_off(rng, rs), len: gen_len(rng, rs), fill: gen_fill(rng) },
        220..=389 => Op::Pread { slot, off: gen_off(rng, rs), len: gen_len(rng, rs) },
        390..=449 => Op::Write { slot, len: gen_len(rng, rs), fill: gen_fill(rng) },
        450..=479 => Op::Read { slot, len: gen_len(rng, rs) },
        480..=499 => {
            let (pos, whence) = match rng.gen_range(0..3) {
                0 => (rng.gen_range(0..MAX_OFF as i64), libc::SEEK_SET),
                1 => (rng.gen_range(-4096..=4096), libc::SEEK_CUR),
                _ => (rng.gen_range(-65536..=65536), libc::SEEK_END),
            };
            Op::Lseek { slot, pos, whence }
        }
        500..=549 => Op::Ftruncate { slot, size: gen_size(rng, rs) },
        550..=569 => Op::Truncate { path: file, size: gen_size(rng, rs) },
        570..=649 => {
            let (mode, len) = gen_falloc(rng, rs);
            Op::Fallocate { slot, mode, off: gen_off(rng, rs), len }
        }
        650..=689 => Op::MmapWrite { slot, off: Off::Frac(rng.gen()), len: gen_len(rng, rs), fill: gen_fill(rng) },
        690..=709 => Op::MmapRead { slot, off: Off::Frac(rng.gen()), len: gen_len(rng, rs) },
        710..=739 => Op::Fsync { slot, data_only: rng.gen() },
        740..=819 | 850..=869 => {
            let acc = match rng.gen_range(0..20) {
                0..=1 => Acc::R,
                2 => Acc::W,
                _ => Acc::RW,
            };
            Op::Open {
                slot,
                path: if rng.gen_ratio(1, 30) { any } else { file },
                acc,
                create: rng.gen_ratio(3, 4),
                excl: rng.gen_ratio(1, 10),
                trunc: rng.gen_ratio(1, 10),
                append: rng.gen_ratio(1, 5),
                direct: rng.gen_ratio(1, 4),
            }
        }
        820..=849 => Op::Close { slot },
        870..=909 => Op::Rename { from: if rng.gen_ratio(1, 25) { any } else { file }, to: if rng.gen_ratio(1, 10) { any } else { file2 } },
        910..=934 => Op::Unlink { path: if rng.gen_ratio(1, 10) { any } else { file } },
        935..=964 => Op::Link { from: if rng.gen_ratio(1, 20) { any } else { file }, to: if rng.gen_ratio(1, 20) { any } else { file2 } },
        965..=979 => Op::SeekHoles { slot },
        980..=989 => Op::Mkdir { dir: PATHS[rng.gen_range(0..DIRS)] },
        990..=995 => Op::Rmdir { dir: PATHS[rng.gen_range(0..DIRS)] },
        996..=997 => Op::Remount,
        998 => Op::Check,
        999..=1005 => {
            Op::Parallel { path: file, base: gen_off(rng, rs), len: rng.gen_range(1..=4 * rs.max(64 << 10) as usize), seed: rng.gen() }
        }
        _ => Op::Recompress {
            // A directory (or the root) is `densefs recompress -r`: several files one after another.
            path: match rng.gen_range(0..10) {
                0 => "",
                1..=2 => any,
                _ => file,
            },
            spec: RECOMPRESS_SPECS[rng.gen_range(0..RECOMPRESS_SPECS.len())],
        },
    }
}

/// The operation list of one run: a pure function of the seed, so any subset of it can be
/// replayed (an operation on an empty slot opens it, offsets resolve against the current size).
fn gen_ops(seed: u64, n: usize, rs: u64) -> Vec<Op> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ops = Vec::with_capacity(n + n / CHECK_EVERY + 2);
    for i in 0..n {
        if i == n / 2 {
            ops.push(Op::Remount);
        } else if i > 0 && i % CHECK_EVERY == 0 {
            ops.push(Op::Check);
        }
        ops.push(gen_op(&mut rng, rs));
    }
    ops.push(Op::Remount);
    ops
}

// ---- one side (the mount or the reference) ----------------------------------------------

#[derive(Debug, PartialEq)]
enum Out {
    Done,
    Num(u64),
    Data(Vec<u8>),
    Text(String),
    Skipped,
}

type Res = Result<Out, i32>;

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

fn check(ret: libc::c_int) -> Result<libc::c_int, i32> {
    if ret < 0 {
        Err(errno_of(&std::io::Error::last_os_error()))
    } else {
        Ok(ret)
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

struct Side {
    root: PathBuf,
    is_mount: bool,
    slots: Vec<Option<File>>,
}

impl Side {
    fn new(root: &Path, is_mount: bool) -> Side {
        Side { root: root.to_path_buf(), is_mount, slots: (0..SLOTS).map(|_| None).collect() }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// close(2), with its result (a write-back error must show here on both sides alike).
    fn close(&mut self, slot: usize) -> Res {
        match self.slots[slot].take() {
            None => Ok(Out::Skipped),
            Some(f) => {
                let fd = f.into_raw_fd();
                check(unsafe { libc::close(fd) }).map(|_| Out::Done)
            }
        }
    }

    fn close_all(&mut self) -> Vec<Res> {
        (0..SLOTS).map(|s| self.close(s)).collect()
    }

    fn size_of_slot(&self, slot: usize) -> u64 {
        self.slots[slot].as_ref().and_then(|f| f.metadata().ok()).map_or(0, |m| m.len())
    }

    /// Runs a resolved operation; `data` holds the bytes a write operation writes.
    fn exec(&mut self, op: &Op, data: &[u8]) -> Res {
        let file = |side: &Side, slot: usize| side.slots[slot].as_ref().map(|f| f.as_raw_fd());
        macro_rules! slot_file {
            ($slot:expr) => {
                match &self.slots[$slot] {
                    Some(f) => f,
                    None => return Ok(Out::Skipped),
                }
            };
        }
        match *op {
            Op::Open { slot, path, acc, create, excl, trunc, append, direct } => {
                let closed = self.close(slot);
                closed?;
                let mut flags = libc::O_CLOEXEC
                    | match acc {
                        Acc::R => libc::O_RDONLY,
                        Acc::W => libc::O_WRONLY,
                        Acc::RW => libc::O_RDWR,
                    };
                let direct = direct && self.is_mount;
                for (on, bit) in [
                    (create, libc::O_CREAT),
                    (excl, libc::O_EXCL),
                    (trunc, libc::O_TRUNC),
                    (append, libc::O_APPEND),
                    (direct, libc::O_DIRECT),
                ] {
                    if on {
                        flags |= bit;
                    }
                }
                let p = cpath(&self.path(path));
                let mut fd = check(unsafe { libc::open(p.as_ptr(), flags, 0o644 as libc::c_uint) });
                if direct && fd == Err(libc::EINVAL) {
                    // A directory cannot be opened O_DIRECT on FUSE (it can on ext4).
                    fd = check(unsafe { libc::open(p.as_ptr(), flags & !libc::O_DIRECT, 0o644 as libc::c_uint) });
                }
                let fd = fd?;
                self.slots[slot] = Some(unsafe { File::from_raw_fd(fd) });
                Ok(Out::Done)
            }
            Op::Close { slot } => self.close(slot),
            Op::Pwrite { slot, off, .. } => {
                let f = slot_file!(slot);
                f.write_at(data, off.abs()).map(|n| Out::Num(n as u64)).map_err(|e| errno_of(&e))
            }
            Op::Write { slot, .. } => {
                let mut f = slot_file!(slot);
                f.write(data).map(|n| Out::Num(n as u64)).map_err(|e| errno_of(&e))
            }
            Op::Pread { slot, off, len } => {
                let f = slot_file!(slot);
                let mut buf = vec![0u8; len];
                let n = f.read_at(&mut buf, off.abs()).map_err(|e| errno_of(&e))?;
                buf.truncate(n);
                Ok(Out::Data(buf))
            }
            Op::Read { slot, len } => {
                let mut f = slot_file!(slot);
                let mut buf = vec![0u8; len];
                let n = f.read(&mut buf).map_err(|e| errno_of(&e))?;
                buf.truncate(n);
                Ok(Out::Data(buf))
            }
            Op::Lseek { slot, pos, whence } => {
                let Some(fd) = file(self, slot) else { return Ok(Out::Skipped) };
                let r = unsafe { libc::lseek(fd, pos, whence) };
                if r < 0 {
                    Err(errno_of(&std::io::Error::last_os_error()))
                } else {
                    Ok(Out::Num(r as u64))
                }
            }
            Op::Ftruncate { slot, size } => {
                let f = slot_file!(slot);
                f.set_len(size.abs()).map(|_| Out::Done).map_err(|e| errno_of(&e))
            }
            Op::Truncate { path, size } => {
                let p = cpath(&self.path(path));
                check(unsafe { libc::truncate(p.as_ptr(), size.abs() as libc::off_t) }).map(|_| Out::Done)
            }
            Op::Fallocate { slot, mode, off, len } => {
                let Some(fd) = file(self, slot) else { return Ok(Out::Skipped) };
                check(unsafe { libc::fallocate(fd, mode, off.abs() as libc::off_t, len as libc::off_t) }).map(|_| Out::Done)
            }
            Op::MmapWrite { slot, off, len, .. } => {
                let f = slot_file!(slot);
                let mut map = unsafe { MmapOptions::new().map_mut(f) }.map_err(|e| errno_of(&e))?;
                let off = off.abs() as usize;
                if off + len > map.len() {
                    return Err(-1000 - map.len() as i32); // sizes disagree; the size check reports it
                }
                // Fault the pages in first, where a failing read is an error and not SIGBUS;
                // once resident, storing into them reads nothing.
                read_mapping(&map[off..off + len])?;
                map[off..off + len].copy_from_slice(data);
                map.flush().map_err(|e| errno_of(&e))?;
                drop(map);
                Ok(Out::Done)
            }
            Op::MmapRead { slot, off, len } => {
                let f = slot_file!(slot);
                let map = unsafe { MmapOptions::new().map(f) }.map_err(|e| errno_of(&e))?;
                let off = off.abs() as usize;
                if off + len > map.len() {
                    return Err(-1000 - map.len() as i32);
                }
                Ok(Out::Data(read_mapping(&map[off..off + len])?))
            }
            Op::Fsync { slot, data_only } => {
                let f = slot_file!(slot);
                let r = if data_only { f.sync_data() } else { f.sync_all() };
                r.map(|_| Out::Done).map_err(|e| errno_of(&e))
            }
            Op::Rename { from, to } => std::fs::rename(self.path(from), self.path(to)).map(|_| Out::Done).map_err(|e| errno_of(&e)),
            Op::Link { from, to } => std::fs::hard_link(self.path(from), self.path(to)).map(|_| Out::Done).map_err(|e| errno_of(&e)),
            Op::Unlink { path } => std::fs::remove_file(self.path(path)).map(|_| Out::Done).map_err(|e| errno_of(&e)),
            Op::Mkdir { dir } => std::fs::create_dir(self.path(dir)).map(|_| Out::Done).map_err(|e| errno_of(&e)),
            Op::Rmdir { dir } => std::fs::remove_dir(self.path(dir)).map(|_| Out::Done).map_err(|e| errno_of(&e)),
            Op::SeekHoles { slot } => {
                // Only what every file system agrees on: ENXIO at and past the end of file.
                let Some(fd) = file(self, slot) else { return Ok(Out::Skipped) };
                let size = self.size_of_slot(slot) as i64;
                let pos = unsafe { libc::lseek(fd, 0, libc::SEEK_CUR) };
                let mut results = Vec::new();
                for (at, whence, name) in
                    [(size, libc::SEEK_DATA, "SEEK_DATA"), (size, libc::SEEK_HOLE, "SEEK_HOLE"), (size + 1, libc::SEEK_DATA, "SEEK_DATA")]
                {
                    let r = unsafe { libc::lseek(fd, at, whence) };
                    let got = if r < 0 { errno_name(errno_of(&std::io::Error::last_os_error())) } else { r.to_string() };
                    results.push(format!("{name} {at}: {got}"));
                }
                unsafe { libc::lseek(fd, pos, libc::SEEK_SET) };
                Ok(Out::Text(results.join(", ")))
            }
            Op::Parallel { path, base, len, seed } => {
                let plan = parallel_plan(seed, base.abs(), len);
                if self.is_mount {
                    parallel_writers(&self.path(path), &plan, seed)
                } else {
                    let p = cpath(&self.path(path));
                    let fd =
                        check(unsafe { libc::open(p.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, 0o644 as libc::c_uint) })?;
                    let f = unsafe { File::from_raw_fd(fd) };
                    for (off, data) in plan.iter().flatten() {
                        f.write_all_at(data, *off).map_err(|e| errno_of(&e))?;
                    }
                    Ok(Out::Done)
                }
            }
            Op::Recompress { path, spec } => {
                if !self.is_mount {
                    return Ok(Out::Skipped);
                }
                // The CLI's own walk and per-file request (the xattr, with the name it adds).
                use densefs::cli::recompress::{files_below, recompress_file};
                let files = match files_below(&self.path(path), true) {
                    Ok(files) => files,
                    Err(e) => return Ok(Out::Text(e)),
                };
                let said: Vec<String> = files
                    .iter()
                    .map(|(f, _)| {
                        let name = f.strip_prefix(&self.root).unwrap_or(f).display();
                        recompress_file(f, spec).map_or_else(|e| format!("{name}: {e}"), |()| format!("{name}: done"))
                    })
                    .collect();
                Ok(Out::Text(said.join("; ")))
            }
            Op::Check | Op::Remount | Op::Nop => Ok(Out::Skipped),
        }
    }
}

const PARALLEL_THREADS: usize = 3;

/// The pieces each thread writes: `[base, base + len)` cut into pieces of 1 byte to 12 KiB,
/// each given to a random thread.
fn parallel_plan(seed: u64, base: u64, len: usize) -> Vec<Vec<(u64, Vec<u8>)>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut plan: Vec<Vec<(u64, Vec<u8>)>> = (0..PARALLEL_THREADS).map(|_| Vec::new()).collect();
    let mut at = 0;
    while at < len {
        let n = if rng.gen_ratio(1, 8) { rng.gen_range(1..=64) } else { rng.gen_range(1..=12 << 10) }.min(len - at);
        let fill = gen_fill(&mut rng);
        plan[rng.gen_range(0..PARALLEL_THREADS)].push((base + at as u64, fill.bytes(n)));
        at += n;
    }
    plan
}

/// The mount side of [`Op::Parallel`]: a read of a thread's own piece must show what it wrote.
fn parallel_writers(path: &Path, plan: &[Vec<(u64, Vec<u8>)>], seed: u64) -> Res {
    let open = |direct: bool| -> Result<File, i32> {
        let p = cpath(path);
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | if direct { libc::O_DIRECT } else { 0 };
        check(unsafe { libc::open(p.as_ptr(), flags, 0o644 as libc::c_uint) }).map(|fd| unsafe { File::from_raw_fd(fd) })
    };
    // Failing to open at all (ENOENT, EISDIR...) is compared with the reference as an errno.
    let first = open(false)?;
    let barrier = std::sync::Barrier::new(plan.len());
    let barrier = &barrier;
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let threads: Vec<_> = plan
            .iter()
            .enumerate()
            .map(|(t, pieces)| {
                s.spawn(move || -> Result<(), String> {
                    let mut rng = StdRng::seed_from_u64(seed ^ (t as u64 + 1).wrapping_mul(0x9e3779b97f4a7c15));
                    let fail = |what: &str, e: i32| format!("thread {t}: {what}: {}", errno_name(e));
                    // Every descriptor is opened before any thread writes: an open(2) without
                    // FOPEN_KEEP_CACHE drops the inode's page cache, and doing that while another
                    // thread's buffered write is on its way to the daemon lets a concurrent read
                    // bring back the old bytes into the cache, where they stay (a FUSE kernel
                    // race, not densefs's). Closing (FLUSH) meanwhile is fine and is exercised.
                    let opened = open(rng.gen_ratio(1, 2)).and_then(|a| Ok((a, open(rng.gen_ratio(1, 3))?)));
                    barrier.wait(); // also when the open failed, or the others would wait forever
                    let (spare, mut f) = opened.map_err(|e| fail("open", e))?;
                    let mut spare = Some(spare);
                    let verify = |f: &File, (off, data): &(u64, Vec<u8>)| -> Result<(), String> {
                        let mut buf = vec![0u8; data.len()];
                        // Which pages the read can take from the page cache (diagnostics).
                        let cached = if fcntl_direct(f) { None } else { page_cache_residency(f, *off, data.len()) };
                        let n = f.read_at(&mut buf, *off).map_err(|e| fail("pread", errno_of(&e)))?;
                        let Some(at) = first_diff(&buf[..n], data) else { return Ok(()) };
                        let cached = match cached {
                            None => String::new(),
                            Some(pages) => {
                                let page = (*off as usize % 4096 + at) / 4096;
                                format!(" (before the read, the page holding that byte {} in the page cache)", if pages.get(page) == Some(&true) { "was" } else { "was not" })
                            }
                        };
                        // Tell the page cache from the daemon: read again, uncached and cached.
                        let again = |direct: bool| {
                            let mut b = vec![0u8; data.len()];
                            match open(direct).map(|g| g.read_at(&mut b, *off)) {
                                Ok(Ok(n)) => match first_diff(&b[..n], data) {
                                    None => "as written".to_string(),
                                    Some(at) => format!("{n} bytes, differing at +{at}"),
                                },
                                Ok(Err(e)) => format!("error {e}"),
                                Err(e) => format!("open error {}", errno_name(e)),
                            }
                        };
                        Err(format!(
                            "thread {t} ({}): reading back its own piece [{off}, +{}) gave {n} bytes, differing at +{at}{cached}: read {} vs wrote {}; read again at once: O_DIRECT {}, buffered {}",
                            if fcntl_direct(f) { "O_DIRECT" } else { "buffered" },
                            data.len(),
                            show_bytes(&buf[..n], at),
                            show_bytes(data, at),
                            again(true),
                            again(false),
                        ))
                    };
                    for (i, piece) in pieces.iter().enumerate() {
                        let n = f.write_at(&piece.1, piece.0).map_err(|e| fail("pwrite", errno_of(&e)))?;
                        if n != piece.1.len() {
                            return Err(format!("thread {t}: short pwrite at {}: {n} of {}", piece.0, piece.1.len()));
                        }
                        if rng.gen_ratio(1, 3) {
                            verify(&f, &pieces[rng.gen_range(0..=i)])?;
                        }
                        if rng.gen_ratio(1, 12) {
                            if let Some(next) = spare.take() {
                                let fd = std::mem::replace(&mut f, next).into_raw_fd();
                                check(unsafe { libc::close(fd) }).map_err(|e| fail("close", e))?;
                            }
                        }
                        if rng.gen_ratio(1, 25) {
                            f.sync_data().map_err(|e| fail("fdatasync", errno_of(&e)))?;
                        }
                    }
                    for piece in pieces {
                        verify(&f, piece)?;
                    }
                    for g in std::iter::once(f).chain(spare) {
                        check(unsafe { libc::close(g.into_raw_fd()) }).map_err(|e| fail("close", e))?;
                    }
                    Ok(())
                })
            })
            .collect();
        threads.into_iter().map(|h| h.join().unwrap_or_else(|p| Err(format!("thread panicked: {}", panic_text(p))))).collect()
    });
    let closed = check(unsafe { libc::close(first.into_raw_fd()) });
    match results.into_iter().find_map(Result::err) {
        None => closed.map(|_| Out::Done),
        Some(msg) => Ok(Out::Text(msg)),
    }
}

/// Page-cache residency of the pages holding `[off, off + len)`, from mincore(2) on a mapping.
fn page_cache_residency(f: &File, off: u64, len: usize) -> Option<Vec<bool>> {
    let start = off & !4095;
    let span = ((off + len as u64 + 4095) & !4095) - start;
    unsafe {
        let p = libc::mmap(std::ptr::null_mut(), span as usize, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), start as libc::off_t);
        if p == libc::MAP_FAILED {
            return None;
        }
        let mut vec = vec![0u8; (span / 4096) as usize];
        let r = libc::mincore(p, span as usize, vec.as_mut_ptr());
        libc::munmap(p, span as usize);
        (r == 0).then(|| vec.iter().map(|b| b & 1 != 0).collect())
    }
}

fn fcntl_direct(f: &File) -> bool {
    let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
    flags & libc::O_DIRECT != 0
}

/// Marks a mapping page that could not be read in (the file system answered the page fault with
/// an error, which touching the page would turn into SIGBUS and kill the test process).
const MAPPING_FAULT: i32 = -2000;

/// Copies mapped memory with process_vm_readv(2) on this process: a page the file system
/// cannot supply makes it return short (EFAULT) instead of raising SIGBUS.
fn read_mapping(mapped: &[u8]) -> Result<Vec<u8>, i32> {
    let mut out = vec![0u8; mapped.len()];
    if out.is_empty() {
        return Ok(out);
    }
    let local = libc::iovec { iov_base: out.as_mut_ptr() as *mut libc::c_void, iov_len: out.len() };
    let remote = libc::iovec { iov_base: mapped.as_ptr() as *mut libc::c_void, iov_len: mapped.len() };
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n == out.len() as isize {
        Ok(out)
    } else {
        Err(MAPPING_FAULT)
    }
}

// ---- comparisons ------------------------------------------------------------------------

fn errno_name(e: i32) -> String {
    if e == MAPPING_FAULT {
        return "a page of the mapping could not be read in (SIGBUS if touched)".into();
    }
    if e <= -1000 {
        return format!("(mapping shorter than the file: {} bytes)", -1000 - e);
    }
    format!("errno {e} ({})", std::io::Error::from_raw_os_error(e))
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y).or(if a.len() != b.len() { Some(a.len().min(b.len())) } else { None })
}

fn show_bytes(b: &[u8], at: usize) -> String {
    let end = (at + 16).min(b.len());
    format!("{:02x?}", &b[at.min(end)..end])
}

fn show(r: &Res) -> String {
    match r {
        Ok(Out::Data(d)) => format!("{} bytes", d.len()),
        Ok(o) => format!("{o:?}"),
        Err(e) => errno_name(*e),
    }
}

/// Why two results differ, or None.
fn diff_results(mount: &Res, reference: &Res) -> Option<String> {
    if mount == reference {
        return None;
    }
    let mut msg = format!("mount returned {}, reference {}", show(mount), show(reference));
    if let (Ok(Out::Data(m)), Ok(Out::Data(r))) = (mount, reference) {
        if let Some(at) = first_diff(m, r) {
            msg += &format!("; first differing byte at +{at}: mount {} vs reference {}", show_bytes(m, at), show_bytes(r, at));
        }
    }
    Some(msg)
}

#[derive(Debug, PartialEq)]
enum Stat {
    File { size: u64, nlink: u64 },
    Dir,
    Other(u32),
}

fn stat_of(m: &std::fs::Metadata) -> Stat {
    if m.is_file() {
        Stat::File { size: m.len(), nlink: m.nlink() }
    } else if m.is_dir() {
        Stat::Dir
    } else {
        Stat::Other(m.mode())
    }
}

/// Which names and open slots share an inode number: for each, the others with its number (a
/// hard link on one side only, or a name led to another file, shows as a difference).
fn link_groups(ids: &[(String, u64)]) -> BTreeMap<String, Vec<String>> {
    ids.iter().map(|(k, ino)| (k.clone(), ids.iter().filter(|(o, i)| i == ino && o != k).map(|(o, _)| o.clone()).collect())).collect()
}

/// The open slots' inode numbers, as "slot N".
fn slot_inos(side: &Side) -> Vec<(String, u64)> {
    (0..SLOTS).filter_map(|s| Some((format!("slot {s}"), side.slots[s].as_ref()?.metadata().ok()?.ino()))).collect()
}

fn compare_links(mount: &[(String, u64)], reference: &[(String, u64)]) -> Result<(), String> {
    let (m, r) = (link_groups(mount), link_groups(reference));
    for (key, mg) in &m {
        let rg = r.get(key);
        if rg != Some(mg) {
            let ino = |ids: &[(String, u64)]| ids.iter().find(|(k, _)| k == key).map(|(_, i)| *i);
            return Err(format!(
                "{key} shares its inode number with {mg:?} on the mount (ino {:?}), with {rg:?} in the reference (ino {:?})",
                ino(mount),
                ino(reference)
            ));
        }
    }
    Ok(())
}

/// After every operation: the size of every open file and the stat of every name agree, and so
/// do which of them are one inode.
fn post_check(mount: &Side, reference: &Side) -> Result<(), String> {
    let (mut m_ids, mut r_ids) = (slot_inos(mount), slot_inos(reference));
    for slot in 0..SLOTS {
        match (&mount.slots[slot], &reference.slots[slot]) {
            (None, None) => {}
            (Some(m), Some(r)) => {
                let ms = m.metadata().map(|m| stat_of(&m)).map_err(|e| errno_of(&e));
                let rs = r.metadata().map(|m| stat_of(&m)).map_err(|e| errno_of(&e));
                if ms != rs {
                    return Err(format!("slot {slot}: fstat: mount {ms:?}, reference {rs:?}"));
                }
            }
            _ => return Err(format!("slot {slot} open on one side only")),
        }
    }
    for name in PATHS {
        let m = std::fs::symlink_metadata(mount.path(name)).map_err(|e| errno_of(&e));
        let r = std::fs::symlink_metadata(reference.path(name)).map_err(|e| errno_of(&e));
        m_ids.extend(m.as_ref().ok().map(|m| (name.to_string(), m.ino())));
        r_ids.extend(r.as_ref().ok().map(|m| (name.to_string(), m.ino())));
        let (m, r) = (m.map(|m| stat_of(&m)), r.map(|m| stat_of(&m)));
        if m != r {
            return Err(format!("stat {name}: mount {m:?}, reference {r:?}"));
        }
    }
    compare_links(&m_ids, &r_ids)
}

#[derive(Debug, PartialEq)]
enum Node {
    Dir,
    File { size: u64, nlink: u64, perm: u32 },
    Other(u32),
}

/// Every name below `rel` with its node and contents into `out`, its inode number into `inos`.
fn walk(
    root: &Path,
    rel: &Path,
    out: &mut BTreeMap<PathBuf, (Node, Option<Vec<u8>>)>,
    inos: &mut Vec<(String, u64)>,
) -> Result<(), String> {
    fn at(p: &Path) -> impl Fn(std::io::Error) -> String + '_ {
        move |e| format!("{}: {e}", p.display())
    }
    let dir = root.join(rel);
    let mut names: Vec<_> =
        std::fs::read_dir(&dir).and_then(|d| d.map(|e| e.map(|e| e.file_name())).collect::<Result<Vec<_>, _>>()).map_err(at(&dir))?;
    names.sort();
    for name in names {
        let r = rel.join(&name);
        let p = root.join(&r);
        let m = std::fs::symlink_metadata(&p).map_err(at(&p))?;
        inos.push((r.display().to_string(), m.ino()));
        if m.is_dir() {
            out.insert(r.clone(), (Node::Dir, None));
            walk(root, &r, out, inos)?;
        } else if m.is_file() {
            let data = std::fs::read(&p).map_err(at(&p))?;
            out.insert(r, (Node::File { size: m.len(), nlink: m.nlink(), perm: m.mode() & 0o7777 }, Some(data)));
        } else {
            out.insert(r, (Node::Other(m.mode()), None));
        }
    }
    Ok(())
}

/// Whole contents of an open file, through a fresh descriptor (works for unlinked files and
/// write-only descriptors alike).
fn slot_contents(f: &File) -> std::io::Result<Vec<u8>> {
    std::fs::read(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// Every name, kind, size, link count, mode and byte of both trees, which names and open files
/// are one inode, and every open file.
fn compare_trees(mount: &Side, reference: &Side) -> Result<(), String> {
    let mut m = BTreeMap::new();
    let mut r = BTreeMap::new();
    let (mut m_ids, mut r_ids) = (slot_inos(mount), slot_inos(reference));
    walk(&mount.root, Path::new(""), &mut m, &mut m_ids).map_err(|e| format!("reading the mount: {e}"))?;
    walk(&reference.root, Path::new(""), &mut r, &mut r_ids).map_err(|e| format!("reading the reference: {e}"))?;
    let mk: Vec<_> = m.keys().collect();
    let rk: Vec<_> = r.keys().collect();
    if mk != rk {
        return Err(format!("tree names differ: mount {mk:?}, reference {rk:?}"));
    }
    compare_links(&m_ids, &r_ids)?;
    for (path, (mnode, mdata)) in &m {
        let (rnode, rdata) = &r[path];
        if mnode != rnode {
            return Err(format!("{}: mount {mnode:?}, reference {rnode:?}", path.display()));
        }
        if let (Some(md), Some(rd)) = (mdata, rdata) {
            if let Some(at) = first_diff(md, rd) {
                return Err(format!(
                    "{}: contents differ (size {} vs {}) first at byte {at}: mount {} vs reference {}",
                    path.display(),
                    md.len(),
                    rd.len(),
                    show_bytes(md, at),
                    show_bytes(rd, at)
                ));
            }
        }
    }
    for slot in 0..SLOTS {
        if let (Some(mf), Some(rf)) = (&mount.slots[slot], &reference.slots[slot]) {
            let (md, rd) = match (slot_contents(mf), slot_contents(rf)) {
                (Ok(m), Ok(r)) => (m, r),
                // A directory (open(O_RDONLY) of "a") reads as EISDIR on both sides.
                (Err(m), Err(r)) if errno_of(&m) == errno_of(&r) => continue,
                (m, r) => {
                    return Err(format!(
                        "slot {slot}: reading the open file: mount {:?}, reference {:?}",
                        m.map(|d| d.len()),
                        r.map(|d| d.len())
                    ))
                }
            };
            if let Some(at) = first_diff(&md, &rd) {
                return Err(format!(
                    "open file in slot {slot}: contents differ (size {} vs {}) first at byte {at}: mount {} vs reference {}",
                    md.len(),
                    rd.len(),
                    show_bytes(&md, at),
                    show_bytes(&rd, at)
                ));
            }
        }
    }
    Ok(())
}

/// SEEK_DATA/SEEK_HOLE on the mount: extents inside the file, increasing, and every byte
/// outside the data extents zero (in the reference's contents, which the mount must equal).
fn check_holes(mount: &Side, reference: &Side, slot: usize) -> Result<(), String> {
    let (Some(mf), Some(rf)) = (&mount.slots[slot], &reference.slots[slot]) else { return Ok(()) };
    let content = slot_contents(rf).map_err(|e| format!("reading the reference: {e}"))?;
    let size = content.len() as i64;
    let fd = mf.as_raw_fd();
    let saved = unsafe { libc::lseek(fd, 0, libc::SEEK_CUR) };
    let mut extents = Vec::new();
    let mut pos = 0i64;
    let mut unstable = 0;
    let result = loop {
        if pos >= size {
            break Ok(());
        }
        let d = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if d < 0 {
            let e = errno_of(&std::io::Error::last_os_error());
            if e == libc::ENXIO {
                break Ok(());
            }
            break Err(format!("SEEK_DATA {pos}: {}", errno_name(e)));
        }
        let h = unsafe { libc::lseek(fd, d, libc::SEEK_HOLE) };
        if h < 0 {
            break Err(format!("SEEK_HOLE {d}: {}", errno_name(errno_of(&std::io::Error::last_os_error()))));
        }
        if d < pos || h < d || h > size {
            break Err(format!("SEEK_DATA {pos} = {d}, SEEK_HOLE {d} = {h}, size {size}"));
        }
        if h == d {
            // Data at d, then a hole at d: a record landed between the calls as an all-zero
            // (hole) record. Legal for a file that changes; ask again once it has settled.
            unstable += 1;
            if unstable > 100 {
                break Err(format!("SEEK_DATA {pos} = {d} and SEEK_HOLE {d} = {d}, 100 times in a row"));
            }
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        extents.push((d, h));
        pos = h;
    };
    unsafe { libc::lseek(fd, saved, libc::SEEK_SET) };
    result?;
    let mut at = 0i64;
    for &(d, h) in extents.iter().chain([(size, size)].iter()) {
        if let Some(i) = content[at as usize..d as usize].iter().position(|&b| b != 0) {
            return Err(format!(
                "SEEK_DATA/SEEK_HOLE report [{at}, {d}) as a hole but byte {} is {:#04x} (extents {extents:?}, size {size})",
                at + i as i64,
                content[at as usize + i]
            ));
        }
        at = h;
    }
    Ok(())
}

// ---- a run ------------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct Config {
    name: &'static str,
    options: &'static str,
    record_size: u64,
    /// A fault spec for the test accelerator (DENSEFS_TEST_ACCELERATOR), if the mount uses one.
    accelerator: Option<&'static str>,
}

struct Failure {
    index: usize,
    op: String,
    msg: String,
    recent: Vec<String>,
    log: String,
}

/// Progress for the hang watchdog.
struct Watch {
    last: Instant,
    current: String,
    daemon: Option<u32>,
}

fn daemon_pid(m: &common::Mount) -> Option<u32> {
    m.child.as_ref().map(|c| c.id())
}

fn mount_caught(lower: &Path, mnt: &Path, cfg: &Config) -> Result<common::Mount, String> {
    let env: Vec<(&str, &str)> = cfg.accelerator.map(|spec| ("DENSEFS_TEST_ACCELERATOR", spec)).into_iter().collect();
    std::panic::catch_unwind(AssertUnwindSafe(|| common::Mount::with_env(lower, mnt, cfg.options, &env))).map_err(panic_text)
}

/// `densefs umount`, retried while the mount is busy: a sibling test's fork briefly holds
/// copies of this test's descriptors and mappings (until its exec), and umount then fails with
/// EBUSY. Waits for the daemon to exit.
fn unmount_retrying(mut m: common::Mount) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = std::process::Command::new(common::BIN).arg("umount").arg(&m.mnt).output().map_err(|e| e.to_string())?;
        if out.status.success() {
            break;
        }
        let text = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if !text.contains("busy") || Instant::now() > deadline {
            return Err(format!("densefs umount: {text}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut child = m.child.take().expect("a mounted daemon");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("the daemon exited with {status}")),
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("the daemon did not exit within 30 s of unmounting".into());
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn slot_of(op: &Op) -> Option<usize> {
    match *op {
        Op::Close { slot }
        | Op::Pwrite { slot, .. }
        | Op::Write { slot, .. }
        | Op::Pread { slot, .. }
        | Op::Read { slot, .. }
        | Op::Lseek { slot, .. }
        | Op::Ftruncate { slot, .. }
        | Op::Fallocate { slot, .. }
        | Op::MmapWrite { slot, .. }
        | Op::MmapRead { slot, .. }
        | Op::Fsync { slot, .. }
        | Op::SeekHoles { slot } => Some(slot),
        _ => None,
    }
}

/// Resolves offsets against the reference's current sizes. An operation on an empty slot
/// (other than close) becomes an open(O_CREAT|O_RDWR) of some name into it.
fn resolve(index: usize, op: &Op, reference: &Side) -> Op {
    let mut op = *op;
    if let Some(slot) = slot_of(&op) {
        match &reference.slots[slot] {
            None if !matches!(op, Op::Close { .. }) => {
                let path = PATHS[DIRS + (index.wrapping_mul(7) + slot) % (PATHS.len() - DIRS)];
                return Op::Open { slot, path, acc: Acc::RW, create: true, excl: false, trunc: false, append: false, direct: false };
            }
            // A directory (open(O_RDONLY) of "a"): read(2) and fsync(2) are compared, anything
            // else (lseek, SEEK_DATA, mmap) behaves per file system; the slot is closed instead.
            Some(f)
                if f.metadata().is_ok_and(|m| m.is_dir())
                    && !matches!(op, Op::Read { .. } | Op::Pread { .. } | Op::Fsync { .. } | Op::Close { .. }) =>
            {
                return Op::Close { slot };
            }
            _ => {}
        }
    }
    match &mut op {
        Op::Pwrite { slot, off, .. } | Op::Pread { slot, off, .. } | Op::Fallocate { slot, off, .. } => {
            *off = off.resolve(reference.size_of_slot(*slot));
        }
        Op::Ftruncate { slot, size } => *size = size.resolve(reference.size_of_slot(*slot)),
        Op::Truncate { path, size } | Op::Parallel { path, base: size, .. } => {
            let cur = std::fs::symlink_metadata(reference.path(path)).map_or(0, |m| m.len());
            *size = size.resolve(cur);
        }
        Op::MmapWrite { slot, off, len, .. } | Op::MmapRead { slot, off, len } => {
            let size = reference.size_of_slot(*slot);
            if reference.slots[*slot].is_some() && size == 0 {
                return Op::Nop;
            }
            *off = off.resolve(size);
            *len = (*len as u64).min(size - off.abs()) as usize;
        }
        _ => {}
    }
    op
}

fn data_for(op: &Op) -> Vec<u8> {
    match *op {
        Op::Pwrite { len, fill, .. } | Op::Write { len, fill, .. } | Op::MmapWrite { len, fill, .. } => fill.bytes(len),
        _ => Vec::new(),
    }
}

/// Runs `ops` (indices into the full list given by `index`) on a fresh mount and reference.
fn run_ops(cfg: Config, ops: &[(usize, Op)], trace: bool) -> Result<(), Failure> {
    let dirs = common::Dirs::new();
    let ref_root = dirs.root.path().join("reference");
    std::fs::create_dir(&ref_root).unwrap();
    let mut mount = Some(mount_caught(&dirs.lower, &dirs.mnt, &cfg).map_err(|msg| Failure {
        index: 0,
        op: "mount".into(),
        msg,
        recent: vec![],
        log: String::new(),
    })?);
    let mut mnt = Side::new(&dirs.mnt, true);
    let mut reference = Side::new(&ref_root, false);
    for d in &PATHS[..DIRS] {
        std::fs::create_dir(mnt.root.join(d)).unwrap();
        std::fs::create_dir(reference.root.join(d)).unwrap();
    }

    let watch = Arc::new(Mutex::new(Watch { last: Instant::now(), current: String::new(), daemon: mount.as_ref().and_then(daemon_pid) }));
    let stop = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (watch, stop, name) = (watch.clone(), stop.clone(), cfg.name);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let w = watch.lock().unwrap();
                if w.last.elapsed() > HANG_LIMIT {
                    eprintln!("differential {name}: no progress for {HANG_LIMIT:?} in {}; killing the daemon", w.current);
                    if let Some(pid) = w.daemon {
                        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                    }
                    return;
                }
            }
        })
    };

    let mut recent: Vec<String> = Vec::new();
    let mut stats: BTreeMap<String, [u32; 3]> = BTreeMap::new();
    let mut result = Ok(());
    let full = ops.iter().copied().chain(std::iter::once((usize::MAX, Op::Check)));
    for (index, op) in full {
        let resolved = resolve(index, &op, &reference);
        let text = if index == usize::MAX { "final check".to_string() } else { format!("#{index} {resolved:?}") };
        {
            let mut w = watch.lock().unwrap();
            w.last = Instant::now();
            w.current = text.clone();
        }
        if trace {
            eprintln!("{}: {text}", cfg.name);
        }
        let outcome: Result<(), String> = match resolved {
            Op::Check => compare_trees(&mnt, &reference),
            Op::Remount => {
                let mc = mnt.close_all();
                let rc = reference.close_all();
                match mc.iter().zip(&rc).enumerate().find_map(|(s, (m, r))| diff_results(m, r).map(|d| format!("close slot {s}: {d}"))) {
                    Some(d) => Err(d),
                    None => match unmount_retrying(mount.take().unwrap()) {
                        Err(e) => Err(format!("unmount failed: {e}")),
                        Ok(()) => match mount_caught(&dirs.lower, &dirs.mnt, &cfg) {
                            Err(e) => Err(format!("remount failed: {e}")),
                            Ok(m) => {
                                watch.lock().unwrap().daemon = daemon_pid(&m);
                                mount = Some(m);
                                compare_trees(&mnt, &reference).map_err(|e| format!("after remount: {e}"))
                            }
                        },
                    },
                }
            }
            _ => {
                let data = data_for(&resolved);
                let r = reference.exec(&resolved, &data);
                let m = mnt.exec(&resolved, &data);
                let kind = format!("{resolved:?}").split([' ', '{']).next().unwrap_or("").to_string();
                let e = stats.entry(kind).or_insert([0; 3]);
                // A recompress happens on the mount only: its result is the mount's to give.
                let mount_only = matches!(resolved, Op::Recompress { .. });
                match (&r, &m) {
                    (_, Ok(Out::Text(t))) if mount_only && t.is_empty() => e[2] += 1,
                    (_, Ok(Out::Text(t))) if mount_only && t.split("; ").all(|f| f.ends_with(": done")) => e[0] += 1,
                    _ if mount_only => e[1] += 1,
                    (Ok(Out::Skipped), _) => e[2] += 1,
                    (Ok(_), _) => e[0] += 1,
                    (Err(_), _) => e[1] += 1,
                }
                if trace {
                    eprintln!("{}:     -> {}", cfg.name, show(if mount_only { &m } else { &r }));
                }
                match if mount_only { None } else { diff_results(&m, &r) } {
                    Some(d) => Err(d),
                    None => match resolved {
                        Op::SeekHoles { slot } => check_holes(&mnt, &reference, slot),
                        _ => Ok(()),
                    }
                    .and_then(|_| {
                        post_check(&mnt, &reference).map_err(|e| match &m {
                            Ok(Out::Text(said)) if mount_only => format!("after the operation ({said}): {e}"),
                            _ => format!("after the operation: {e}"),
                        })
                    }),
                }
            }
        };
        if let Err(msg) = outcome {
            result = Err(Failure {
                index,
                op: text.clone(),
                msg,
                recent: recent.clone(),
                log: mount.as_ref().map(|m| tail(&m.log_text(), 30)).unwrap_or_default(),
            });
            break;
        }
        recent.push(text);
        if recent.len() > 25 {
            recent.remove(0);
        }
    }

    stop.store(true, Ordering::Relaxed);
    let _ = watchdog.join();
    let mc = mnt.close_all();
    let rc = reference.close_all();
    if result.is_ok() {
        if let Some(d) = mc.iter().zip(&rc).enumerate().find_map(|(s, (m, r))| diff_results(m, r).map(|d| format!("close slot {s}: {d}"))) {
            result = Err(Failure { index: usize::MAX, op: "final close".into(), msg: d, recent, log: String::new() });
        }
    }
    if trace || std::env::var_os("DENSEFS_STATS").is_some() {
        let line: Vec<String> = stats.iter().map(|(k, [ok, err, skip])| format!("{k} {ok}/{err}/{skip}")).collect();
        eprintln!("{}: operations ok/failed/skipped (reference side): {}", cfg.name, line.join(", "));
    }
    if let Some(m) = mount.take() {
        if result.is_ok() {
            if let Err(e) = unmount_retrying(m) {
                result = Err(Failure { index: usize::MAX, op: "final unmount".into(), msg: e, recent: vec![], log: String::new() });
            }
        } else {
            m.kill();
        }
    }
    result
}

/// Delta debugging (ddmin): the smallest sub-list of `ops` that still fails, within `budget`.
fn minimize(cfg: Config, mut ops: Vec<(usize, Op)>, budget: Duration) -> (Vec<(usize, Op)>, Failure) {
    let start = Instant::now();
    let mut last = match run_ops(cfg, &ops, false) {
        Err(f) => f,
        Ok(()) => panic!("the failure did not reproduce on replay (a race?)"),
    };
    let cut = |ops: &mut Vec<(usize, Op)>, f: &Failure| {
        if let Some(p) = ops.iter().position(|(i, _)| *i == f.index) {
            ops.truncate(p + 1);
        }
    };
    cut(&mut ops, &last);
    let mut n = 2usize;
    while ops.len() >= 2 && start.elapsed() < budget {
        let chunk = ops.len().div_ceil(n);
        let mut reduced = false;
        let parts = n; // n may shrink below; this pass walks the parts it started with
        for i in 0..parts {
            let lo = i * chunk;
            if lo >= ops.len() {
                break;
            }
            let hi = (lo + chunk).min(ops.len());
            let candidate: Vec<_> = ops[..lo].iter().chain(&ops[hi..]).copied().collect();
            if let Err(f) = run_ops(cfg, &candidate, false) {
                ops = candidate;
                cut(&mut ops, &f);
                last = f;
                n = (n - 1).max(2);
                reduced = true;
                eprintln!("minimise {}: {} operations left", cfg.name, ops.len());
                break;
            }
            if start.elapsed() > budget {
                break;
            }
        }
        if !reduced {
            if n >= ops.len() {
                break;
            }
            n = (2 * n).min(ops.len());
        }
    }
    (ops, last)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.trim().parse().unwrap_or_else(|_| panic!("{name}={v} is not a number")))
}

fn run(cfg: Config) {
    let seed = env_u64("DENSEFS_SEED").unwrap_or_else(|| {
        let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let salt = cfg.name.bytes().fold(0u64, |h, b| h.wrapping_mul(1099511628211).wrapping_add(b as u64));
        (t.as_nanos() as u64 ^ salt.rotate_left(17)) % 1_000_000_000_000
    });
    let n = env_u64("DENSEFS_OPS").map_or(DEFAULT_OPS, |n| n as usize);
    let trace = std::env::var_os("DENSEFS_TRACE").is_some_and(|v| v != "0");
    let all = gen_ops(seed, n, cfg.record_size);
    let mut ops: Vec<(usize, Op)> = all.iter().copied().enumerate().collect();
    if let Ok(keep) = std::env::var("DENSEFS_KEEP") {
        let keep: Vec<usize> =
            keep.split(',').filter(|s| !s.trim().is_empty()).map(|s| s.trim().parse().expect("DENSEFS_KEEP: indices")).collect();
        ops.retain(|(i, _)| keep.contains(i));
    }
    eprintln!(
        "differential {} ({}): seed {seed}, {} operations; replay with DENSEFS_SEED={seed} DENSEFS_OPS={n} cargo test --test differential {}",
        cfg.name,
        cfg.options,
        ops.len(),
        cfg.name
    );
    let started = Instant::now();
    let Err(failure) = run_ops(cfg, &ops, trace) else {
        eprintln!("differential {}: seed {seed}: all {} operations agree ({:.1?})", cfg.name, ops.len(), started.elapsed());
        return;
    };
    let mut report = format!(
        "differential {} ({}): MISMATCH with seed {seed} (DENSEFS_SEED={seed} DENSEFS_OPS={n}) at operation {}:\n  {}\n  {}\n",
        cfg.name, cfg.options, failure.index, failure.op, failure.msg
    );
    report += "preceding operations:\n";
    for r in &failure.recent {
        report += &format!("    {r}\n");
    }
    if !failure.log.is_empty() {
        report += &format!("daemon log (tail):\n{}\n", failure.log);
    }
    if std::env::var_os("DENSEFS_MINIMIZE").is_some_and(|v| v != "0") {
        eprintln!("{report}minimising...");
        let budget = Duration::from_secs(env_u64("DENSEFS_MINIMIZE_SECS").unwrap_or(900));
        let (min, f) = minimize(cfg, ops, budget);
        report += &format!("\nminimised to {} operations, failing at {}:\n  {}\n", min.len(), f.op, f.msg);
        let keep: Vec<String> = min.iter().map(|(i, _)| i.to_string()).collect();
        report += &format!(
            "replay: DENSEFS_SEED={seed} DENSEFS_OPS={n} DENSEFS_KEEP={} DENSEFS_TRACE=1 cargo test --test differential {}\n",
            keep.join(","),
            cfg.name
        );
        report += "as they ran (offsets resolved; an operation on an empty slot opens it):\n";
        for r in f.recent.iter().chain(std::iter::once(&f.op)) {
            report += &format!("    {r}\n");
        }
        if !f.log.is_empty() {
            report += &format!("daemon log (tail):\n{}\n", f.log);
        }
    }
    panic!("{report}");
}

#[test]
fn lz4_4k() {
    run(Config { name: "lz4_4k", options: "compression=lz4,recordsize=4K", record_size: 4 << 10, accelerator: None });
}

#[test]
fn gzip1_16k() {
    run(Config { name: "gzip1_16k", options: "compression=gzip-1,recordsize=16K", record_size: 16 << 10, accelerator: None });
}

#[test]
fn zstd3_128k() {
    run(Config { name: "zstd3_128k", options: "compression=zstd-3,recordsize=128K", record_size: 128 << 10, accelerator: None });
}

#[test]
fn off_64k() {
    run(Config { name: "off_64k", options: "compression=off,recordsize=64K", record_size: 64 << 10, accelerator: None });
}

#[test]
fn lzjb_8k() {
    run(Config { name: "lzjb_8k", options: "compression=lzjb,recordsize=8K", record_size: 8 << 10, accelerator: None });
}

#[test]
fn zle_4k() {
    run(Config { name: "zle_4k", options: "compression=zle,recordsize=4K", record_size: 4 << 10, accelerator: None });
}

#[test]
fn zstdfast_1m_xxh3() {
    run(Config {
        name: "zstdfast_1m_xxh3",
        options: "compression=zstd-fast-3,recordsize=1M,checksum=xxh3",
        record_size: 1 << 20,
        accelerator: None,
    });
}

/// compression=auto, offloaded to an accelerator that fails now and then (errors, garbage,
/// hangs): every byte must still match the model.
#[test]
fn auto_32k_failing_accelerator() {
    run(Config {
        name: "auto_32k_failing_accelerator",
        options: "compression=auto,recordsize=32K,offload=faulty",
        record_size: 32 << 10,
        accelerator: Some("error=0.02,garbage=0.02,hang=0.01,timeout_ms=300,backoff_ms=10,capacity=8,latency_us=200"),
    });
}

//! Room on the lower file system for what writers were told is written. A write is acknowledged
//! into memory and lands later, compressed; without a check, a writer on a nearly full disk was
//! acknowledged tens of megabytes the disk could never hold, heard ENOSPC only when a landing
//! failed, and kept that data in memory until space came back. Local file systems (ext4, btrfs,
//! ZFS) reserve space at write(2) and refuse the write itself; so does this: a write is admitted
//! while the lower's free space covers it and every byte still unlanded (counted uncompressed,
//! as its compressed size is not known yet). Short of that, the writer starts writeback and
//! waits for landings; when nothing is left to land, or a landing found the disk full, the write
//! is refused with ENOSPC and nothing acknowledged is lost. A sample of the free space only ever
//! admits: a refusal always follows a fresh statvfs, taken after old copies were freed and after
//! the files just deleted were let go of (`DeletedHeld`).

use parking_lot::{Condvar, Mutex};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use super::lower;

/// How long a sample of the lower's free space is trusted, when it leaves this much room beyond
/// everything unlanded (other programs may write to the lower meanwhile); closer to full, every
/// write asks the lower again (one statvfs).
const SAMPLE_FRESH: Duration = Duration::from_secs(1);
const SAMPLE_SLACK: u64 = 256 << 20;

/// How long a writer waits without any landing before it is refused (a landing may be failing
/// for another reason, e.g. a lower I/O error, and never free its bytes).
const MAX_WAIT: Duration = Duration::from_secs(5);

/// Kept free beside the records for what their landings write besides them: descriptor tables
/// and headers (a few blocks per file).
const METADATA_ROOM: u64 = 64 << 10;

/// What a write may do, given the lower's free bytes, the bytes unlanded and the write's length.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    /// Landings may make room: wait for them.
    Wait,
    /// Nothing left to land could make room.
    Full,
}

pub fn judge(free: u64, unlanded: u64, len: u64) -> Verdict {
    if free >= unlanded.saturating_add(len).saturating_add(METADATA_ROOM) {
        Verdict::Admit
    } else if unlanded > 0 {
        Verdict::Wait
    } else {
        Verdict::Full
    }
}

#[derive(Default)]
struct Sample {
    free: u64,
    taken: Option<Instant>,
    /// `released` when it was taken: bytes landed since may have used the free space it saw.
    released: u64,
}

/// The last look at the free space of the file system a file is on: files share one per lower
/// device (`Memory::free_space_of`), as a lower directory may hold other file systems' mount
/// points.
#[derive(Default)]
pub struct FreeSpaceSample(Mutex<Sample>);

#[derive(Default)]
pub struct WriteAdmission {
    unlanded: AtomicU64,
    /// Every byte ever released (landed, or dropped by a truncate): a monotonic clock of landings.
    released: AtomicU64,
    /// Landings refused for want of space (ENOSPC, EDQUOT) so far.
    full_landings: AtomicU64,
    waiting: AtomicUsize,
    lock: Mutex<()>,
    landed: Condvar,
    reclaiming: Mutex<()>,
}

impl WriteAdmission {
    /// Bytes acknowledged to writers and not yet on the lower file system.
    pub fn unlanded(&self) -> u64 {
        self.unlanded.load(Relaxed)
    }

    pub fn charge(&self, bytes: usize) {
        self.unlanded.fetch_add(bytes as u64, Relaxed);
    }

    pub fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let before = self.unlanded.fetch_sub(bytes as u64, Relaxed);
        debug_assert!(before >= bytes as u64, "unlanded accounting went negative");
        self.released.fetch_add(bytes as u64, Relaxed);
        self.wake();
    }

    /// A landing failed because the lower is full: waiting writers are refused at once.
    pub fn landing_found_no_room(&self) {
        self.full_landings.fetch_add(1, Relaxed);
        self.wake();
    }

    fn wake(&self) {
        if self.waiting.load(Relaxed) > 0 {
            let _guard = self.lock.lock();
            self.landed.notify_all();
        }
    }

    /// Admits a write of `len` bytes to a file on the lower file system `fd` is on. Short of
    /// room, it starts writeback and waits while landings may make room; before refusing with
    /// ENOSPC it has every file's old copies freed once (what truncates and rewrites left for
    /// the next sync: the new copies were written beside them), as ext4 commits its journal
    /// before it says ENOSPC.
    pub fn admit(&self, fd: RawFd, len: u64, sample: &FreeSpaceSample, hooks: &Hooks<'_>) -> std::io::Result<()> {
        let released = self.released.load(Relaxed);
        {
            let seen = sample.0.lock();
            // Bytes landed since the sample may have used the room it saw.
            let room = seen.free.saturating_sub(released.saturating_sub(seen.released));
            let fresh = seen.taken.is_some_and(|t| t.elapsed() < SAMPLE_FRESH);
            if fresh && room >= self.unlanded().saturating_add(len).saturating_add(SAMPLE_SLACK) {
                return Ok(());
            }
        }
        let mut guard = self.lock.lock();
        let mut full_landings = self.full_landings.load(Relaxed);
        let (mut wrote_back, mut reclaimed, mut progress) = (false, false, (released, Instant::now()));
        loop {
            let released = self.released.load(Relaxed);
            if released != progress.0 {
                progress = (released, Instant::now());
            }
            // A lower that cannot say (statvfs fails, or counts no blocks at all, as some FUSE
            // and network file systems do) is written as before: its landings report a full disk.
            let Some(free) = lower::fstatvfs(fd).ok().and_then(|sv| writable_bytes(&sv)) else { return Ok(()) };
            *sample.0.lock() = Sample { free, taken: Some(Instant::now()), released };
            let refuse = match judge(free, self.unlanded(), len) {
                Verdict::Admit => return Ok(()),
                Verdict::Full => true,
                Verdict::Wait => progress.1.elapsed() >= MAX_WAIT || self.full_landings.load(Relaxed) != full_landings,
            };
            if refuse && reclaimed {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            if refuse {
                reclaimed = true;
                parking_lot::MutexGuard::unlocked(&mut guard, || {
                    let _one_at_a_time = self.reclaiming.lock();
                    (hooks.reclaim)();
                });
                // Landings refused before may fit now: send them again.
                full_landings = self.full_landings.load(Relaxed);
                progress.1 = Instant::now();
                wrote_back = false;
                continue;
            }
            if !wrote_back {
                wrote_back = true;
                parking_lot::MutexGuard::unlocked(&mut guard, hooks.writeback);
            }
            self.waiting.fetch_add(1, Relaxed);
            self.landed.wait_for(&mut guard, Duration::from_millis(50));
            self.waiting.fetch_sub(1, Relaxed);
        }
    }
}

/// What admission may ask of the file system to make room.
pub struct Hooks<'a> {
    /// Hands every open file's dirty records to the engine.
    pub writeback: &'a dyn Fn(),
    /// Syncs every file holding old copies for the next sync to free, freeing them, and waits
    /// for the files just deleted to be let go of (`DeletedHeld`).
    pub reclaim: &'a dyn Fn(),
}

/// Bytes a file system offers writers: what `df` calls available. Root may write a little past
/// it (ext4's reserve for root), but not into every block `f_bfree` counts (ext4 keeps some for
/// its own metadata), and users see this figure: densefs fills up where `df` says it does.
/// `None` for a file system that counts no blocks (it keeps no account of space).
pub fn writable_bytes(sv: &libc::statvfs) -> Option<u64> {
    (sv.f_blocks > 0).then(|| sv.f_bavail.saturating_mul(sv.f_frsize))
}

/// How long after a file was deleted a writer short of room waits for its space to come back.
const DELETED_WAIT: Duration = Duration::from_secs(1);

/// Deleted files (no name left) whose lower descriptor the daemon still holds: their blocks
/// come back when it is closed, at the kernel's FORGET, which comes a moment after the unlink
/// returned (or after the close(2) of the last handle, whose RELEASE it does not wait for).
/// `rm big; echo x > small` on a full disk must find the space back, as on ext4, so a writer
/// about to be refused waits for those FORGETs first.
#[derive(Default)]
pub struct DeletedHeld {
    /// How many, and when the last was deleted.
    state: Mutex<(usize, Option<Instant>)>,
    let_go: Condvar,
}

impl DeletedHeld {
    pub fn held(&self) {
        let mut state = self.state.lock();
        *state = (state.0 + 1, Some(Instant::now()));
    }

    pub fn closed(&self) {
        let mut state = self.state.lock();
        state.0 = state.0.saturating_sub(1);
        self.let_go.notify_all();
    }

    /// Waits until every deleted file held is let go of, for at most `DELETED_WAIT` after the
    /// last deletion (one the kernel holds on to, say a program's O_PATH descriptor, keeps its
    /// blocks as on any file system). `retry` lets go of those whose FORGET found them busy.
    pub fn wait(&self, retry: impl Fn()) {
        loop {
            retry();
            let mut state = self.state.lock();
            let (1.., Some(last)) = *state else { return };
            let Some(left) = DELETED_WAIT.checked_sub(last.elapsed()) else { return };
            self.let_go.wait_for(&mut state, left.min(Duration::from_millis(10)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::sync::Arc;

    #[test]
    fn a_write_is_admitted_while_free_space_covers_it_and_everything_unlanded() {
        let room = (10 << 20) + METADATA_ROOM;
        assert_eq!(judge(room, 0, 1 << 20), Verdict::Admit);
        assert_eq!(judge(room, 9 << 20, 1 << 20), Verdict::Admit);
        assert_eq!(judge(room, 9 << 20, (1 << 20) + 1), Verdict::Wait);
        assert_eq!(judge(room, 0, (10 << 20) + 1), Verdict::Full);
        assert_eq!(judge(0, u64::MAX, 1), Verdict::Wait, "no overflow");
    }

    #[test]
    fn a_file_system_that_counts_no_blocks_is_not_judged() {
        let dir = tempfile::tempdir().unwrap();
        let mut sv = lower::fstatvfs(std::fs::File::open(dir.path()).unwrap().as_raw_fd()).unwrap();
        (sv.f_blocks, sv.f_bavail, sv.f_frsize) = (0, 0, 4096);
        assert_eq!(writable_bytes(&sv), None, "no blocks: no account of space");
        sv.f_blocks = 100;
        assert_eq!(writable_bytes(&sv), Some(0), "a full one");
        sv.f_bavail = 10;
        assert_eq!(writable_bytes(&sv), Some(40960));
    }

    #[test]
    fn a_writer_waits_for_landings_and_is_refused_when_nothing_is_left_to_land() {
        let dir = tempfile::tempdir().unwrap();
        let fd = std::fs::File::open(dir.path()).unwrap();
        let free = writable_bytes(&lower::fstatvfs(fd.as_raw_fd()).unwrap()).unwrap();
        // Well past the disk, so that other programs freeing space meanwhile change nothing.
        let past = (free + (1 << 30)) as usize;
        let admission = Arc::new(WriteAdmission::default());
        // More unlanded than the disk holds: the writer kicks writeback and waits; a landing that
        // releases it all lets the write in.
        admission.charge(past);
        let kicks = AtomicUsize::new(0);
        let lander = {
            let admission = admission.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                admission.release(past);
            })
        };
        let start = Instant::now();
        let reclaims = AtomicUsize::new(0);
        let hooks = Hooks {
            writeback: &|| {
                kicks.fetch_add(1, Relaxed);
            },
            reclaim: &|| {
                reclaims.fetch_add(1, Relaxed);
            },
        };
        admission.admit(fd.as_raw_fd(), 4096, &FreeSpaceSample::default(), &hooks).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(90), "admitted before anything landed");
        assert_eq!((kicks.load(Relaxed), reclaims.load(Relaxed)), (1, 0), "wrote back, had no need to reclaim");
        lander.join().unwrap();
        // Nothing unlanded and the write is larger than the disk: refused once old copies were
        // freed, without waiting.
        let start = Instant::now();
        let refused = admission.admit(fd.as_raw_fd(), past as u64, &FreeSpaceSample::default(), &hooks).unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::ENOSPC));
        assert_eq!((kicks.load(Relaxed), reclaims.load(Relaxed)), (1, 1));
        assert!(start.elapsed() < Duration::from_secs(1));
        // Unlanded bytes whose landing found the disk full: waiting writers are refused then.
        admission.charge(past);
        let failer = {
            let admission = admission.clone();
            std::thread::spawn(move || {
                // Refused again after the reclaim.
                for _ in 0..2 {
                    std::thread::sleep(Duration::from_millis(100));
                    admission.landing_found_no_room();
                }
            })
        };
        let start = Instant::now();
        let refused = admission.admit(fd.as_raw_fd(), 4096, &FreeSpaceSample::default(), &hooks).unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::ENOSPC));
        assert!(start.elapsed() < MAX_WAIT, "waited out the deadline instead of hearing the failure");
        assert_eq!(reclaims.load(Relaxed), 2);
        failer.join().unwrap();
    }
}

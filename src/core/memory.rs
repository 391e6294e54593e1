//! One memory budget for the file data of every open file (`cache_size=`): records dirty in
//! memory, in flight to the engine, or cached decoded are all charged here. A writer that finds
//! the budget spent starts writeback of every open file (which also drops their cached decoded
//! records) and waits (briefly) for landings to free room, so the daemon's memory stays near
//! `cache_size` however many files are written at once.
//! The dirty and in-flight bytes are also what the lower file system still has to find room for
//! (`admission.rs`): they are charged there too.

use super::admission::{FreeSpaceSample, Hooks, WriteAdmission};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How long a writer waits for room before it goes on anyway (landing may be failing, e.g. on a
/// full disk: the writer then hears that error instead of hanging).
const MAX_WAIT: Duration = Duration::from_secs(2);

pub struct Memory {
    limit: usize,
    used: AtomicUsize,
    lock: Mutex<()>,
    freed: Condvar,
    /// Starts background writeback of every open file (set once by the file system).
    kick: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Frees the old copies every file keeps for its next sync (set once by the file system).
    reclaim: OnceLock<Box<dyn Fn() + Send + Sync>>,
    admission: WriteAdmission,
    /// One free-space sample per lower file system (by device): a file's first write finds
    /// it fresh where another file's write took it, instead of asking the lower (a statfs, a
    /// round trip on a network lower) for each new file.
    free_space: Mutex<HashMap<u64, Arc<FreeSpaceSample>>>,
}

impl Memory {
    pub fn new(limit: usize) -> Memory {
        Memory {
            limit,
            used: AtomicUsize::new(0),
            lock: Mutex::new(()),
            freed: Condvar::new(),
            kick: OnceLock::new(),
            reclaim: OnceLock::new(),
            admission: WriteAdmission::default(),
            free_space: Mutex::new(HashMap::new()),
        }
    }

    /// The free-space sample the files on lower device `dev` share.
    pub fn free_space_of(&self, dev: u64) -> Arc<FreeSpaceSample> {
        self.free_space.lock().entry(dev).or_default().clone()
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn used(&self) -> usize {
        self.used.load(Relaxed)
    }

    pub fn over(&self) -> bool {
        self.used() > self.limit
    }

    pub fn set_kick(&self, kick: Box<dyn Fn() + Send + Sync>) {
        let _ = self.kick.set(kick);
    }

    pub fn set_reclaim(&self, reclaim: Box<dyn Fn() + Send + Sync>) {
        let _ = self.reclaim.set(reclaim);
    }

    pub fn charge(&self, bytes: usize) {
        self.used.fetch_add(bytes, Relaxed);
    }

    /// Charges bytes a writer was told are written and that are not on the lower yet.
    pub fn charge_unlanded(&self, bytes: usize) {
        self.charge(bytes);
        self.admission.charge(bytes);
    }

    pub fn release_unlanded(&self, bytes: usize) {
        self.admission.release(bytes);
        self.release(bytes);
    }

    pub fn admission(&self) -> &WriteAdmission {
        &self.admission
    }

    /// Admits a write of `len` bytes to a file on the lower file system `fd` is on (ENOSPC if
    /// landings cannot make room for it); see `admission.rs`.
    pub fn admit_write(&self, fd: RawFd, len: u64, sample: &FreeSpaceSample) -> std::io::Result<()> {
        let reclaim = || {
            if let Some(reclaim) = self.reclaim.get() {
                reclaim();
            }
        };
        self.admission.admit(fd, len, sample, &Hooks { writeback: &|| self.start_writeback(), reclaim: &reclaim })
    }

    fn start_writeback(&self) {
        if let Some(kick) = self.kick.get() {
            kick();
        }
    }

    pub fn release(&self, bytes: usize) {
        let before = self.used.fetch_sub(bytes, Relaxed);
        debug_assert!(before >= bytes, "memory accounting went negative");
        if before > self.limit && before - bytes <= self.limit {
            let _guard = self.lock.lock();
            self.freed.notify_all();
        }
    }

    /// Called by a writer holding no lock: if the budget is spent, write back and wait for room.
    pub fn wait_for_room(&self) {
        if !self.over() {
            return;
        }
        let deadline = Instant::now() + MAX_WAIT;
        let mut guard = self.lock.lock();
        while self.over() && Instant::now() < deadline {
            if self.kick.get().is_some() {
                drop(guard);
                self.start_writeback();
                guard = self.lock.lock();
            }
            self.freed.wait_for(&mut guard, Duration::from_millis(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_writer_waits_until_landings_free_room() {
        let m = Arc::new(Memory::new(100));
        m.charge(150);
        let m2 = m.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            m2.release(100);
        });
        let start = Instant::now();
        m.wait_for_room();
        assert!(!m.over());
        assert!(start.elapsed() >= Duration::from_millis(20));
        t.join().unwrap();
    }

    #[test]
    fn a_writer_does_not_hang_when_nothing_can_be_freed() {
        let m = Memory::new(10);
        m.charge(20);
        let kicked = Arc::new(AtomicUsize::new(0));
        let k = kicked.clone();
        m.set_kick(Box::new(move || {
            k.fetch_add(1, Relaxed);
        }));
        let start = Instant::now();
        m.wait_for_room();
        assert!(start.elapsed() >= MAX_WAIT && start.elapsed() < MAX_WAIT * 2);
        assert!(kicked.load(Relaxed) >= 1);
    }
}

//! One memory budget for the file data of every open file (`cache_size=`): records dirty in
//! memory, in flight to the engine, or cached decoded are all charged here. A writer that finds
//! the budget spent starts writeback of every open file and waits (briefly) for landings to free
//! room, so the daemon's memory stays near `cache_size` however many files are written at once.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;
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
}

impl Memory {
    pub fn new(limit: usize) -> Memory {
        Memory { limit, used: AtomicUsize::new(0), lock: Mutex::new(()), freed: Condvar::new(), kick: OnceLock::new() }
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

    pub fn charge(&self, bytes: usize) {
        self.used.fetch_add(bytes, Relaxed);
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
            if let Some(kick) = self.kick.get() {
                drop(guard);
                kick();
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

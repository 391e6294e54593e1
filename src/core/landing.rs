//! Landing off the compression workers. The engine's completion callback only queues a
//! compressed record on its container's [`LandingQueue`]; a small pool of landing threads
//! (shared by all containers) drains each queue, one drainer per container at a time, in the
//! order records completed. A slow lower disk so stalls the landing of its own files, never the
//! compression of every file.

use crossbeam_channel::{unbounded, Sender};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::OnceLock;

/// Landing threads: landings of one file are serialised anyway (they hold its `slot_io`), so a
/// few threads let a few files land at once.
const LANDERS: usize = 4;

type Task = Box<dyn FnOnce() + Send>;

/// Runs `task` on the landing pool (started on first use).
pub fn spawn(task: Task) {
    static POOL: OnceLock<Sender<Task>> = OnceLock::new();
    let pool = POOL.get_or_init(|| {
        let (tx, rx) = unbounded::<Task>();
        for i in 0..LANDERS {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("densefs-land-{i}"))
                .spawn(move || {
                    for task in rx {
                        task();
                    }
                })
                .expect("cannot start a landing thread");
        }
        tx
    });
    pool.send(task).expect("BUG: the landing pool never stops");
}

/// One container's records waiting to land, and whether a drainer is on them.
pub struct LandingQueue<T> {
    inner: Mutex<(VecDeque<T>, bool)>,
}

impl<T> Default for LandingQueue<T> {
    fn default() -> Self {
        LandingQueue { inner: Mutex::new((VecDeque::new(), false)) }
    }
}

impl<T> LandingQueue<T> {
    /// Queues an item. `true`: no drainer is running, the caller must start one.
    #[must_use]
    pub fn push(&self, item: T) -> bool {
        let mut q = self.inner.lock();
        q.0.push_back(item);
        !std::mem::replace(&mut q.1, true)
    }

    /// The next item for the drainer; `None` ends the drainer (the next push starts another).
    pub fn pop(&self) -> Option<T> {
        let mut q = self.inner.lock();
        let item = q.0.pop_front();
        if item.is_none() {
            q.1 = false;
        }
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn one_drainer_at_a_time_and_items_in_order() {
        let q = LandingQueue::default();
        assert!(q.push(1));
        assert!(!q.push(2), "a drainer is already on it");
        assert_eq!(q.pop(), Some(1));
        assert_eq!(q.pop(), Some(2));
        assert_eq!(q.pop(), None);
        assert!(q.push(3), "the drainer ended: start another");
    }

    #[test]
    fn the_pool_drains_everything_queued() {
        let q = Arc::new(LandingQueue::default());
        let (tx, rx) = crossbeam_channel::unbounded();
        for i in 0..100 {
            if q.push(i) {
                let (q, tx) = (q.clone(), tx.clone());
                spawn(Box::new(move || {
                    while let Some(i) = q.pop() {
                        tx.send(i).unwrap();
                    }
                }));
            }
        }
        let got: Vec<i32> = (0..100).map(|_| rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap()).collect();
        assert_eq!(got, (0..100).collect::<Vec<_>>());
    }
}

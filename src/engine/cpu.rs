//! The CPU backend: one worker thread per core, fed through two queues. `urgent` holds the
//! short follow-ups of accelerator work (verify, checksum, land), which must not wait behind a
//! long queue of CPU compression or the accelerator's results pile up.

use crossbeam_channel::{select, unbounded, Receiver, Sender};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

pub type Task = Box<dyn FnOnce() + Send>;

pub struct CpuPool {
    normal: Option<Sender<Task>>,
    urgent: Option<Sender<Task>>,
    waiting: Arc<AtomicUsize>,
    workers: Vec<JoinHandle<()>>,
}

fn work(normal: Receiver<Task>, urgent: Receiver<Task>, waiting: Arc<AtomicUsize>) {
    let run_normal = |task: Task| {
        waiting.fetch_sub(1, Relaxed);
        task()
    };
    loop {
        if let Ok(task) = urgent.try_recv() {
            task();
            continue;
        }
        select! {
            recv(urgent) -> task => match task {
                Ok(task) => task(),
                Err(_) => return normal.iter().for_each(run_normal),
            },
            recv(normal) -> task => match task {
                Ok(task) => run_normal(task),
                Err(_) => return urgent.iter().for_each(|t| t()),
            },
        }
    }
}

impl CpuPool {
    pub fn new(threads: usize) -> CpuPool {
        let (normal_tx, normal_rx) = unbounded::<Task>();
        let (urgent_tx, urgent_rx) = unbounded::<Task>();
        let waiting = Arc::new(AtomicUsize::new(0));
        let workers = (0..threads.max(1))
            .map(|i| {
                let (normal, urgent, waiting) = (normal_rx.clone(), urgent_rx.clone(), waiting.clone());
                std::thread::Builder::new()
                    .name(format!("densefs-cpu-{i}"))
                    .spawn(move || work(normal, urgent, waiting))
                    .expect("cannot start a compression thread")
            })
            .collect();
        CpuPool { normal: Some(normal_tx), urgent: Some(urgent_tx), waiting, workers }
    }

    pub fn threads(&self) -> usize {
        self.workers.len()
    }

    /// Tasks queued and not yet started: the load `compression=auto` reads.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Relaxed)
    }

    /// Queues a task; gives it back if the pool has shut down.
    pub fn spawn(&self, task: Task) -> Result<(), Task> {
        let Some(queue) = self.normal.as_ref() else { return Err(task) };
        self.waiting.fetch_add(1, Relaxed);
        queue.send(task).map_err(|e| {
            self.waiting.fetch_sub(1, Relaxed);
            e.into_inner()
        })
    }

    pub fn spawn_urgent(&self, task: Task) -> Result<(), Task> {
        let Some(queue) = self.urgent.as_ref() else { return Err(task) };
        queue.send(task).map_err(|e| e.into_inner())
    }
}

impl Drop for CpuPool {
    fn drop(&mut self) {
        // Closing the queues ends the workers once both drain.
        self.normal = None;
        self.urgent = None;
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

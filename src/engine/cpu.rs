//! The CPU backend: a pool of worker threads, one per core, fed through one queue.

use super::{run_on_cpu, Backend, Job};
use crossbeam_channel::{unbounded, Sender};
use std::thread::JoinHandle;

pub struct CpuPool {
    queue: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

impl CpuPool {
    pub fn new(threads: usize) -> CpuPool {
        let (tx, rx) = unbounded::<Job>();
        let workers = (0..threads.max(1))
            .map(|i| {
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("densefs-cpu-{i}"))
                    .spawn(move || {
                        for job in rx {
                            let result = run_on_cpu(job.work);
                            (job.done)(result);
                        }
                    })
                    .expect("cannot start a compression thread")
            })
            .collect();
        CpuPool { queue: Some(tx), workers }
    }
}

impl Backend for CpuPool {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn submit(&self, jobs: Vec<Job>) {
        let queue = self.queue.as_ref().expect("BUG: submit after shutdown");
        for job in jobs {
            if let Err(err) = queue.send(job) {
                let job = err.into_inner();
                (job.done)(Err(super::EngineError::Stopped));
            }
        }
    }
}

impl Drop for CpuPool {
    fn drop(&mut self) {
        self.queue = None; // closing the queue ends the workers once it drains
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

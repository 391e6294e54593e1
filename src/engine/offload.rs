//! Offload: which records go to an accelerator, and what happens when it cannot or does not
//! deliver. The seeds' QZFS policies, applied to any [`Device`]:
//! 1. size window: only records inside `offload_window` are shipped;
//! 2. compressibility: records whose sample looks random stay on the CPU, where the cheap
//!    pre-check (policy.rs) runs; min_savings decides what is kept, as on the CPU;
//! 3. availability: what a saturated device hands back runs on the CPU at once; a device error,
//!    a timeout or an output that does not decode back to its input redoes that record on the
//!    CPU, marks the device down, redoes everything else it had in flight on the CPU, and
//!    re-initialises it after a back-off that doubles while it keeps failing.
//!
//! Every record gets exactly one result: a job leaves the `pending` table once, by whichever
//! comes first (the device's answer, a timeout, a drain), and a late answer finds nothing.

use super::device::{Device, DeviceError, DeviceJob, DeviceOp};
use super::policy::{self, AutoTarget};
use super::stats::{Fallback, Outcome};
use super::{CompressRequest, Done, Encoded, Inner, Offload};
use crate::codec::{Codec, Compression, Setting};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) enum Route {
    /// Run on the CPU; `Some` when an accelerator was meant to take it (counted as a fallback).
    Cpu(Option<Fallback>),
    Device(usize, Compression),
}

/// A record offered to device `d`, with the (concrete) compression it will get there.
pub(super) struct Offered {
    pub req: CompressRequest,
    pub compression: Compression,
    pub done: Done,
}

struct Pending {
    started: Instant,
    offered: Offered,
}

#[derive(Default)]
struct InFlight {
    jobs: HashMap<u64, Pending>,
    /// Their input bytes (offload=auto weighs them against the CPU's queue).
    bytes: usize,
    /// When `jobs` last became non-empty (utilisation accounting).
    busy_since: Option<Instant>,
}

#[derive(Clone, Copy, Debug)]
enum Health {
    Up { backoff: Duration },
    Down { retry_at: Instant, backoff: Duration },
}

pub(super) struct Offloader {
    pub device: Arc<dyn Device>,
    stats_index: usize,
    first_backoff: Duration,
    health: Mutex<Health>,
    in_flight: Mutex<InFlight>,
    next_id: AtomicU64,
}

impl Offloader {
    pub fn new(device: Arc<dyn Device>, stats_index: usize, first_backoff: Duration) -> Offloader {
        Offloader {
            device,
            stats_index,
            first_backoff,
            health: Mutex::new(Health::Up { backoff: first_backoff }),
            in_flight: Mutex::new(InFlight::default()),
            next_id: AtomicU64::new(1),
        }
    }

    pub fn state(&self) -> String {
        match *self.health.lock() {
            Health::Up { .. } => "up".into(),
            Health::Down { retry_at, .. } => {
                format!("down (retry in {:.1}s)", retry_at.saturating_duration_since(Instant::now()).as_secs_f64())
            }
        }
    }

    fn is_up(&self) -> bool {
        matches!(*self.health.lock(), Health::Up { .. })
    }

    fn busy_ns<'a>(&self, inner: &'a Inner) -> &'a AtomicU64 {
        &inner.stats.backends[self.stats_index].busy_ns
    }

    fn insert(&self, id: u64, pending: Pending) {
        let mut f = self.in_flight.lock();
        if f.jobs.is_empty() {
            f.busy_since = Some(Instant::now());
        }
        f.bytes += pending.offered.req.data.len();
        f.jobs.insert(id, pending);
    }

    fn take(&self, inner: &Inner, id: u64) -> Option<Pending> {
        let mut f = self.in_flight.lock();
        let p = f.jobs.remove(&id)?;
        f.bytes -= p.offered.req.data.len();
        if f.jobs.is_empty() {
            if let Some(since) = f.busy_since.take() {
                self.busy_ns(inner).fetch_add(since.elapsed().as_nanos() as u64, Relaxed);
            }
        }
        Some(p)
    }

    fn take_all(&self, inner: &Inner) -> Vec<Pending> {
        let mut f = self.in_flight.lock();
        if let Some(since) = f.busy_since.take() {
            self.busy_ns(inner).fetch_add(since.elapsed().as_nanos() as u64, Relaxed);
        }
        f.bytes = 0;
        f.jobs.drain().map(|(_, p)| p).collect()
    }

    /// Bytes in flight, and the seconds it has been busy so far (the current stretch included).
    fn load(&self, inner: &Inner) -> (usize, f64) {
        let f = self.in_flight.lock();
        let current = f.busy_since.map_or(0.0, |since| since.elapsed().as_secs_f64());
        (f.bytes, self.busy_ns(inner).load(Relaxed) as f64 / 1e9 + current)
    }

    fn oldest(&self) -> Option<(u64, Instant)> {
        self.in_flight.lock().jobs.iter().map(|(id, p)| (*id, p.started)).min_by_key(|(_, t)| *t)
    }
}

impl Inner {
    /// Decides where one record goes (on the submitting thread: cheap checks only). `planned`:
    /// bytes this submission already routed to each device.
    pub(super) fn route(&self, req: &CompressRequest, planned: &[usize]) -> Route {
        let candidates: Vec<usize> = match req.offload {
            Offload::Cpu => return Route::Cpu(None),
            Offload::Auto if self.devices.is_empty() => return Route::Cpu(None),
            Offload::Auto => (0..self.devices.len()).collect(),
            Offload::Only(name) => match self.devices.iter().position(|d| d.device.name() == name) {
                Some(d) => vec![d],
                None => return Route::Cpu(Some(Fallback::Unavailable)),
            },
        };
        let data = req.data.as_slice();
        let (min, max) = self.config.offload_window;
        if data.len() < min || data.len() > max {
            return Route::Cpu(Some(Fallback::Size));
        }
        if req.compression == Setting::Fixed(Compression::OFF) || policy::is_all_zero(data) {
            return Route::Cpu(None); // nothing to compress
        }
        let entropy = policy::sample_entropy(data);
        let auto = req.compression == Setting::Auto;
        let compression = match req.compression {
            Setting::Fixed(c) => c,
            Setting::Auto => policy::choose_auto(entropy, req.min_savings, AutoTarget::Accelerator),
        };
        let mut why = Fallback::Unsupported;
        for d in candidates {
            let offloader = &self.devices[d];
            if !offloader.device.supports(&DeviceOp::Compress(compression), data.len()) {
                continue;
            }
            if req.offload == Offload::Auto && !offloader.device.worth_it(compression) {
                return Route::Cpu(None); // the CPU does this as well: not a fallback
            }
            if !offloader.is_up() {
                why = Fallback::Unavailable;
                continue;
            }
            if self.config.precheck && !policy::entropy_promises_savings(entropy, req.min_savings) && !compression.codec.is_fast() {
                return Route::Cpu(Some(Fallback::Precheck));
            }
            if req.offload == Offload::Auto && self.cpu_is_sooner(d, compression.codec, data.len(), planned[d]) {
                return Route::Cpu(None); // both have capacity: the CPU takes its share
            }
            if auto {
                self.stats.auto_chose(compression.codec);
            }
            return Route::Device(d, compression);
        }
        Route::Cpu(Some(why))
    }

    /// offload=auto: whether a record would be done sooner on the CPU than on device `d`, by the
    /// work each has waiting and the speed each has shown (the device: bytes a second while
    /// busy; the CPU: each worker's speed with this codec). A device that has not shown its
    /// speed yet gets the record; while the CPU has not shown its speed with the codec, it takes
    /// a record when nothing waits in its queue.
    fn cpu_is_sooner(&self, d: usize, codec: Codec, len: usize, planned: usize) -> bool {
        let offloader = &self.devices[d];
        let (in_flight, busy_s) = offloader.load(self);
        let queued = in_flight + planned;
        let device_bytes = self.stats.backends[offloader.stats_index].compressed_bytes();
        if queued == 0 || device_bytes == 0 || busy_s <= 0.0 {
            return false;
        }
        let device_s = (queued + len) as f64 / (device_bytes as f64 / busy_s);
        let cpu = self.stats.backends[0].compress(codec);
        let (cpu_bytes, cpu_s) = (cpu.bytes_in.load(Relaxed), cpu.busy_ns.load(Relaxed) as f64 / 1e9);
        let waiting = self.cpu.waiting();
        if cpu_bytes == 0 || cpu_s <= 0.0 {
            return waiting == 0;
        }
        let per_worker = cpu_bytes as f64 / cpu_s;
        let cpu_done_s = (waiting as f64 / self.cpu.threads() as f64 + 1.0) * len as f64 / per_worker;
        cpu_done_s < device_s
    }

    /// Hands a batch to device `d`; what it has no room for runs on the CPU.
    pub(super) fn offer(self: &Arc<Self>, d: usize, batch: Vec<Offered>) {
        let offloader = &self.devices[d];
        let mut jobs = Vec::with_capacity(batch.len());
        for offered in batch {
            let id = offloader.next_id.fetch_add(1, Relaxed);
            let input = offered.req.data.clone();
            let op = DeviceOp::Compress(offered.compression);
            offloader.insert(id, Pending { started: Instant::now(), offered });
            let weak = Arc::downgrade(self);
            jobs.push(DeviceJob {
                tag: id,
                op,
                input,
                done: Box::new(move |result| {
                    if let Some(inner) = weak.upgrade() {
                        inner.device_done(d, id, result);
                    }
                }),
            });
        }
        for refused in offloader.device.submit(jobs) {
            if let Some(p) = offloader.take(self, refused.tag) {
                self.stats.fallback(Fallback::Saturated);
                self.cpu_compress(p.offered.req, p.offered.done);
            }
        }
    }

    /// A device's answer for job `id` (any thread).
    fn device_done(self: &Arc<Self>, d: usize, id: u64, result: Result<Vec<u8>, DeviceError>) {
        let offloader = &self.devices[d];
        let Some(pending) = offloader.take(self, id) else { return }; // timed out or drained already
        let latency = pending.started.elapsed();
        match result {
            Err(e) => self.device_failed(d, pending, Fallback::Error, &e.to_string()),
            Ok(bytes) => {
                let me = Arc::clone(self);
                // Verifying and checksumming are CPU work: on a CPU worker, ahead of the queue.
                let task = Box::new(move || me.finish_offloaded(d, pending, bytes, latency));
                if let Err(task) = self.cpu.spawn_urgent(task) {
                    task();
                }
            }
        }
    }

    fn finish_offloaded(self: &Arc<Self>, d: usize, pending: Pending, bytes: Vec<u8>, latency: Duration) {
        let Offered { req, compression, done } = pending.offered;
        let data = req.data.as_slice();
        let worth_keeping = bytes.len() <= req.min_savings.max_kept_len(data.len());
        if worth_keeping && self.config.verify {
            let same = compression.codec.decompress(&bytes, data.len()).is_ok_and(|check| check == data);
            if !same {
                let why = format!("its {compression} output for a {} byte record does not decode back to the input", data.len());
                return self.device_failed(
                    d,
                    Pending { started: pending.started, offered: Offered { req, compression, done } },
                    Fallback::Garbage,
                    &why,
                );
            }
        }
        let (encoded, outcome): (Encoded, Outcome) =
            policy::keep_or_raw(data, compression, worth_keeping.then_some(bytes), req.min_savings, req.checksum);
        let backend = &self.stats.backends[self.devices[d].stats_index];
        backend.compress(compression.codec).add(data.len(), encoded.bytes.len(), latency);
        self.stats.outcome(outcome, data.len());
        if let Health::Up { backoff } = &mut *self.devices[d].health.lock() {
            *backoff = self.devices[d].first_backoff; // it works again: forget earlier failures
        }
        done(Ok(encoded));
    }

    /// Device `d` failed on `pending`: redo it on the CPU, mark the device down, and redo
    /// everything else it had in flight.
    fn device_failed(self: &Arc<Self>, d: usize, pending: Pending, why: Fallback, message: &str) {
        let offloader = &self.devices[d];
        self.stats.backends[offloader.stats_index].errors.fetch_add(1, Relaxed);
        self.stats.fallback(why);
        self.cpu_compress(pending.offered.req, pending.offered.done);
        let was_up = {
            let mut health = offloader.health.lock();
            match *health {
                Health::Up { backoff } => {
                    *health = Health::Down { retry_at: Instant::now() + backoff, backoff };
                    Some(backoff)
                }
                Health::Down { .. } => None,
            }
        };
        if let Some(backoff) = was_up {
            tracing::warn!(
                device = offloader.device.name(),
                "accelerator failed ({}: {message}); its records go to the CPU; retrying in {:.1}s",
                why.name(),
                backoff.as_secs_f64()
            );
        }
        for p in offloader.take_all(self) {
            self.stats.fallback(Fallback::Drained);
            self.cpu_compress(p.offered.req, p.offered.done);
        }
    }

    /// The watchdog's tick: time out stuck jobs, re-initialise devices whose back-off is over.
    pub(super) fn watch(self: &Arc<Self>) {
        for (d, offloader) in self.devices.iter().enumerate() {
            if let Some((id, started)) = offloader.oldest() {
                if started.elapsed() > self.config.timeout {
                    if let Some(p) = offloader.take(self, id) {
                        let message = format!("no answer in {:.1}s", self.config.timeout.as_secs_f64());
                        self.device_failed(d, p, Fallback::Timeout, &message);
                    }
                }
            }
            let health = *offloader.health.lock();
            if let Health::Down { retry_at, backoff } = health {
                if Instant::now() < retry_at {
                    continue;
                }
                // Anything still queued from before the failure was redone already.
                for p in offloader.take_all(self) {
                    self.stats.fallback(Fallback::Drained);
                    self.cpu_compress(p.offered.req, p.offered.done);
                }
                let next = (backoff * 2).min(self.config.backoff.1);
                let name = offloader.device.name();
                match offloader.device.reset() {
                    Ok(()) => {
                        self.stats.backends[offloader.stats_index].resets.fetch_add(1, Relaxed);
                        *offloader.health.lock() = Health::Up { backoff: next };
                        tracing::info!(device = name, "accelerator re-initialised; offloading again");
                    }
                    Err(e) => {
                        *offloader.health.lock() = Health::Down { retry_at: Instant::now() + next, backoff: next };
                        tracing::warn!(device = name, "accelerator re-initialisation failed: {e}; retrying in {:.1}s", next.as_secs_f64());
                    }
                }
            }
        }
    }
}

//! A fault-injecting accelerator for tests: the CPU codecs behind the [`Device`] interface, with
//! settable latency, capacity (saturation) and rates of errors, garbage output, hangs and failed
//! re-initialisations. It proves the offload policies without a GPU, through a real mount too:
//! the daemon adds it when `DENSEFS_TEST_ACCELERATOR` holds a spec (see [`FaultSpec::parse`]).
//! It is a test-only row of the device table: nothing looks for it unless that variable is set.

use super::device::{Device, DeviceError, DeviceJob, DeviceOp};
use crate::codec::Compression;
use crossbeam_channel::{unbounded, Receiver, Sender};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Test-only: a fault spec here ([`FaultSpec::parse`], may be empty) makes the daemon add this
/// device (and `offload=faulty` usable). Production detection never looks for it otherwise.
pub const ENV: &str = "DENSEFS_TEST_ACCELERATOR";

/// The device table's probe (engine/mod.rs `DEVICES`): the device when [`ENV`] selects it,
/// with its engine settings applied to `config`; a bad spec is an error.
pub fn probe(config: &mut super::EngineConfig) -> Result<super::Probe, String> {
    let Ok(text) = std::env::var(ENV) else { return Ok(super::Probe::NotSelected) };
    let spec = FaultSpec::parse(&text).map_err(|e| format!("{ENV}: {e}"))?;
    spec.tune(config);
    Ok(super::Probe::Found(Arc::new(FaultyDevice::new(spec)), None))
}

#[derive(Clone, Debug, PartialEq)]
pub struct FaultSpec {
    /// Time each job takes.
    pub latency: Duration,
    /// Jobs queued or running at most; more are handed back (saturation).
    pub capacity: usize,
    /// Jobs run at once.
    pub workers: usize,
    /// Probability that a job answers with an error.
    pub error: f64,
    /// Probability that a compression answers with wrong bytes or a wrong length.
    pub garbage: f64,
    /// Probability that a job never answers.
    pub hang: f64,
    /// Probability that a re-initialisation fails.
    pub reset_fail: f64,
    pub seed: u64,
    /// Engine settings a test wants shorter than the defaults.
    pub timeout: Option<Duration>,
    pub backoff: Option<Duration>,
}

impl Default for FaultSpec {
    fn default() -> FaultSpec {
        FaultSpec {
            latency: Duration::ZERO,
            capacity: 64,
            workers: 2,
            error: 0.0,
            garbage: 0.0,
            hang: 0.0,
            reset_fail: 0.0,
            seed: 1,
            timeout: None,
            backoff: None,
        }
    }
}

impl FaultSpec {
    /// `latency_us=200,capacity=16,workers=2,error=0.01,garbage=0.01,hang=0.001,reset_fail=0.5,
    /// seed=7,timeout_ms=500,backoff_ms=50`; every key optional.
    pub fn parse(text: &str) -> Result<FaultSpec, String> {
        let mut spec = FaultSpec::default();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item.split_once('=').ok_or_else(|| format!("bad fault spec item '{item}'"))?;
            let num = || value.parse::<f64>().map_err(|_| format!("bad number in '{item}'"));
            let rate = || num().and_then(|p| if (0.0..=1.0).contains(&p) { Ok(p) } else { Err(format!("'{item}': a rate is 0..1")) });
            match key {
                "latency_us" => spec.latency = Duration::from_micros(num()? as u64),
                "capacity" => spec.capacity = (num()? as usize).max(1),
                "workers" => spec.workers = (num()? as usize).max(1),
                "error" => spec.error = rate()?,
                "garbage" => spec.garbage = rate()?,
                "hang" => spec.hang = rate()?,
                "reset_fail" => spec.reset_fail = rate()?,
                "seed" => spec.seed = num()? as u64,
                "timeout_ms" => spec.timeout = Some(Duration::from_millis(num()? as u64)),
                "backoff_ms" => spec.backoff = Some(Duration::from_millis(num()? as u64)),
                _ => return Err(format!("unknown fault spec key '{key}'")),
            }
        }
        Ok(spec)
    }

    /// Applies the engine settings the spec asks for (shorter timeout and back-off in tests).
    pub fn tune(&self, config: &mut super::EngineConfig) {
        config.timeout = self.timeout.unwrap_or(config.timeout);
        if let Some(b) = self.backoff {
            config.backoff = (b, b * 8);
        }
    }
}

struct Shared {
    spec: FaultSpec,
    /// Jobs accepted and not finished.
    occupied: AtomicUsize,
    /// Bumped by reset: queued jobs of an older generation are dropped unanswered.
    generation: AtomicU64,
    rng: Mutex<u64>,
}

impl Shared {
    fn chance(&self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        let mut x = self.rng.lock();
        // xorshift64*
        *x ^= *x >> 12;
        *x ^= *x << 25;
        *x ^= *x >> 27;
        let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        (r as f64 / (1u64 << 53) as f64) < p
    }

    fn run(&self, job: DeviceJob) {
        if !self.spec.latency.is_zero() {
            std::thread::sleep(self.spec.latency);
        }
        if self.chance(self.spec.hang) {
            return; // never answers
        }
        if self.chance(self.spec.error) {
            return (job.done)(Err(DeviceError("injected device error".into())));
        }
        let result = match job.op {
            DeviceOp::Compress(c) => {
                let mut out = vec![0u8; job.input.len() * 2 + 1024];
                let n = c.codec.compress(&job.input, &mut out, c.level).expect("BUG: the output buffer fits any codec");
                out.truncate(n);
                if self.chance(self.spec.garbage) {
                    garble(&mut out, &mut self.rng.lock());
                }
                Ok(out)
            }
            DeviceOp::Decompress { codec, logical_len } => {
                codec.decompress(&job.input, logical_len).map_err(|e| DeviceError(e.to_string()))
            }
        };
        (job.done)(result)
    }
}

/// Wrong bytes, a wrong length, or both.
fn garble(out: &mut Vec<u8>, rng: &mut u64) {
    *rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let r = (*rng >> 33) as usize;
    match r % 3 {
        0 if !out.is_empty() => {
            let i = r % out.len();
            out[i] ^= 0x5a;
        }
        1 => out.truncate(out.len() / 2),
        _ => out.iter_mut().step_by(7).for_each(|b| *b = b.wrapping_add(1)),
    }
}

/// A job and the device generation it was queued in.
type Queued = (u64, DeviceJob);

pub struct FaultyDevice {
    shared: Arc<Shared>,
    queue: Option<Sender<Queued>>,
    workers: Vec<JoinHandle<()>>,
}

impl FaultyDevice {
    pub fn new(spec: FaultSpec) -> FaultyDevice {
        let (tx, rx): (Sender<Queued>, Receiver<Queued>) = unbounded();
        let shared =
            Arc::new(Shared { rng: Mutex::new(spec.seed.max(1)), spec, occupied: AtomicUsize::new(0), generation: AtomicU64::new(0) });
        let workers = (0..shared.spec.workers)
            .map(|i| {
                let (rx, shared) = (rx.clone(), shared.clone());
                std::thread::Builder::new()
                    .name(format!("densefs-faulty-{i}"))
                    .spawn(move || {
                        for (generation, job) in rx {
                            if generation == shared.generation.load(Relaxed) {
                                shared.run(job);
                            }
                            shared.occupied.fetch_sub(1, Relaxed);
                        }
                    })
                    .expect("cannot start a test device thread")
            })
            .collect();
        FaultyDevice { shared, queue: Some(tx), workers }
    }
}

impl Device for FaultyDevice {
    fn name(&self) -> &'static str {
        "faulty"
    }

    fn supports(&self, op: &DeviceOp, _len: usize) -> bool {
        // Whatever the codec table lets an accelerator run under this device's name.
        let codec = match op {
            DeviceOp::Compress(c) => c.codec,
            DeviceOp::Decompress { codec, .. } => *codec,
        };
        codec.row().runs_on(self.name())
    }

    fn worth_it(&self, _: Compression) -> bool {
        true
    }

    fn submit(&self, jobs: Vec<DeviceJob>) -> Vec<DeviceJob> {
        let generation = self.shared.generation.load(Relaxed);
        let queue = self.queue.as_ref().expect("BUG: submit after drop");
        let mut refused = Vec::new();
        for job in jobs {
            if self.shared.occupied.load(Relaxed) >= self.shared.spec.capacity {
                refused.push(job);
                continue;
            }
            self.shared.occupied.fetch_add(1, Relaxed);
            if let Err(e) = queue.send((generation, job)) {
                self.shared.occupied.fetch_sub(1, Relaxed);
                refused.push(e.into_inner().1);
            }
        }
        refused
    }

    fn capacity(&self) -> usize {
        self.shared.spec.capacity
    }

    fn reset(&self) -> Result<(), DeviceError> {
        if self.shared.chance(self.shared.spec.reset_fail) {
            return Err(DeviceError("injected re-initialisation failure".into()));
        }
        self.shared.generation.fetch_add(1, Relaxed);
        Ok(())
    }
}

impl Drop for FaultyDevice {
    fn drop(&mut self) {
        self.queue = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

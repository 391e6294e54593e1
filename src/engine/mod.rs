//! The compression service engine (QZFS's name): the one door through which records reach the
//! codecs, on the CPU or on an accelerator.
//!
//! The file system hands it batches of [`Job`]s to compress and does not wait record by record:
//! each job carries its own completion callback, run by whichever backend finished it, in any
//! order. A read's records decode on the reading thread, helped by idle CPU workers (`shared.rs`).
//! - [`policy`]: pure functions deciding what a record becomes (hole, compressed, raw), the
//!   pre-check for incompressible data and the `compression=auto` selector;
//! - [`cpu`]: the worker pool; [`device`]: the interface an accelerator implements;
//! - [`offload`]: routing to accelerators (size window, saturation, failures, verification,
//!   recovery); [`stats`]: counters for `densefs get` / `densefs iostat`;
//! - [`DEVICES`]: the accelerator table (name, test-only, probe) that detection and `offload=`
//!   read; [`gpu`]: NVIDIA GPUs through nvCOMP; [`faulty`]: a fault-injecting accelerator for
//!   tests, selected only by `DENSEFS_TEST_ACCELERATOR`; [`bench`]: `densefs bench engine`.
//!
//! Decompression runs on the CPU: format v1 checksums the stored bytes, so what a device decodes
//! could not be verified, and CPU decoders run at 1-5 GB/s per core.

pub mod bench;
mod cpu;
pub mod device;
pub mod faulty;
pub mod gpu;
mod offload;
pub mod policy;
mod shared;
pub mod stats;

use crate::checksum::ChecksumKind;
use crate::codec::{Codec, CodecError, Setting};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use cpu::CpuPool;
pub use device::Device;
pub use policy::MinSavings;
use shared::{Decoders, SharedBatch};
use stats::Stats;

/// How one file's records are written besides their codec (from its directory's properties).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordPolicy {
    pub min_savings: MinSavings,
    pub offload: Offload,
}

/// Where compression may run (`offload=` mount option and property).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offload {
    /// An accelerator when one is present and worth it for the codec; the CPU for the rest and
    /// whenever the accelerator is saturated or failing — both busy at once.
    Auto,
    Cpu,
    /// Every record this device can take (falls back to the CPU only as the policies say).
    Only(&'static str),
}

/// What looking for one device found.
pub enum Probe {
    /// There and working, with a line for the log (what it is) if it has one.
    Found(Arc<dyn Device>, Option<String>),
    /// Not on this machine, or not working: why, for the log and for `offload=` errors.
    Absent(String),
    /// A test device that this process was not asked to use.
    NotSelected,
}

/// One accelerator: its name (as its [`Device::name`], shown in statistics, accepted by
/// `offload=`) and how it is found.
pub struct DeviceRow {
    pub name: &'static str,
    /// A test double: only opened when explicitly selected (its `probe` answers
    /// [`Probe::NotSelected`] otherwise), never looked for by production detection, and not
    /// listed in help or error messages.
    pub test_only: bool,
    /// Looks for the device (may adjust the engine's settings). `Err`: what selects it is
    /// wrong, and the mount refuses to start rather than run without it.
    pub probe: fn(&mut EngineConfig) -> Result<Probe, String>,
}

/// The accelerator table. Adding a device: its file (or folder) in `engine/` implementing
/// [`Device`] with a `probe` function, its `mod` line above, and a row here; `offload=`,
/// detection, statistics and `densefs bench engine` take it from here. Which codecs it may run
/// is each codec's `devices` list (`codec/mod.rs`).
pub static DEVICES: [DeviceRow; 2] = [
    DeviceRow { name: "gpu", test_only: false, probe: gpu::probe },
    // Selected only by DENSEFS_TEST_ACCELERATOR (test-only; see faulty.rs).
    DeviceRow { name: "faulty", test_only: true, probe: faulty::probe },
];

/// Why `offload=NAME` (a mount option or `densefs set`) is refused where there is no such device.
pub fn no_device(name: &str, why: &str) -> String {
    format!("offload={name}: no {name} backend available ({why})")
}

/// The values `offload=` accepts, for messages: `auto, cpu or gpu` (test devices left out).
pub fn offload_names() -> String {
    let mut names = vec!["auto", "cpu"];
    names.extend(DEVICES.iter().filter(|d| !d.test_only).map(|d| d.name));
    let last = names.pop().expect("BUG: auto and cpu are always there");
    format!("{} or {last}", names.join(", "))
}

impl Offload {
    pub fn parse(text: &str) -> Result<Offload, String> {
        match text {
            "auto" => Ok(Offload::Auto),
            "cpu" => Ok(Offload::Cpu),
            _ => DEVICES
                .iter()
                .find(|d| d.name == text)
                .map(|d| Offload::Only(d.name))
                .ok_or_else(|| format!("invalid offload '{text}' ({})", offload_names())),
        }
    }
}

impl std::fmt::Display for Offload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Offload::Auto => f.write_str("auto"),
            Offload::Cpu => f.write_str("cpu"),
            Offload::Only(name) => f.write_str(name),
        }
    }
}

/// The engine's policy knobs; the defaults are the seeds' (QZFS) where they name one.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    pub cpu_threads: usize,
    /// Only records with `min <= len <= max` go to an accelerator (QZFS: 4 KiB..1 MiB): tiny ones
    /// cost more to ship than to compress.
    pub offload_window: (usize, usize),
    /// Skip slow codecs on data that looks incompressible (policy::probably_incompressible).
    pub precheck: bool,
    /// Decode every accelerator output on the CPU and compare it with the input before it is
    /// stored. Costs a decode (cheap next to gzip/zstd compression); catches a device that lies.
    pub verify: bool,
    /// An accelerator job older than this marks the device failed.
    pub timeout: Duration,
    /// Wait before re-initialising a failed device: doubles on each failure up to the second value.
    pub backoff: (Duration, Duration),
}

impl EngineConfig {
    pub fn new(cpu_threads: usize) -> EngineConfig {
        EngineConfig {
            cpu_threads,
            offload_window: (4 << 10, 1 << 20),
            precheck: true,
            verify: true,
            timeout: Duration::from_secs(5),
            backoff: (Duration::from_secs(1), Duration::from_secs(60)),
        }
    }
}

/// Accelerators found, and notes on those looked for and not found.
pub type Detected = (Vec<Arc<dyn Device>>, Vec<String>);

/// The accelerators this process can use: every row of [`DEVICES`] that its probe finds (the
/// GPU when its driver, nvCOMP and self-test are there), test devices first and only those
/// explicitly selected. Also returns notes on what was looked for and not found (and on what
/// was found), for the log and for `offload=` errors.
pub fn detect_devices(config: &mut EngineConfig) -> Result<Detected, String> {
    let mut devices: Vec<Arc<dyn Device>> = Vec::new();
    let mut notes = Vec::new();
    let (tests, production): (Vec<&DeviceRow>, Vec<&DeviceRow>) = DEVICES.iter().partition(|d| d.test_only);
    for row in tests.into_iter().chain(production) {
        match (row.probe)(config)? {
            Probe::Found(device, note) => {
                debug_assert_eq!(device.name(), row.name, "BUG: a device row and its device disagree on the name");
                devices.push(device);
                notes.extend(note);
            }
            Probe::Absent(why) => notes.push(why),
            Probe::NotSelected => {}
        }
    }
    Ok((devices, notes))
}

/// A record to encode.
#[derive(Clone)]
pub struct CompressRequest {
    pub data: Arc<Vec<u8>>,
    /// May be [`Setting::Auto`]: the engine picks per record.
    pub compression: Setting,
    pub min_savings: MinSavings,
    pub checksum: ChecksumKind,
    pub offload: Offload,
}

/// A record as it will be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// `Codec::Off` for raw records and holes.
    pub codec: Codec,
    pub level: i8,
    /// Empty for an all-zero record (stored as a hole).
    pub bytes: Vec<u8>,
    pub logical_len: u32,
    pub checksum: u64,
}

/// A stored record to check and decode.
pub struct DecompressRequest {
    pub codec: Codec,
    pub stored: Vec<u8>,
    pub logical_len: usize,
    pub checksum_kind: ChecksumKind,
    pub checksum: u64,
}

impl DecompressRequest {
    /// An encoded record as stored, its checksum of `checksum_kind` (what it was encoded with).
    pub fn of(e: &Encoded, checksum_kind: ChecksumKind) -> DecompressRequest {
        DecompressRequest {
            codec: e.codec,
            stored: e.bytes.clone(),
            logical_len: e.logical_len as usize,
            checksum_kind,
            checksum: e.checksum,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// Stored bytes do not match their checksum: they were never handed to a decoder.
    ChecksumMismatch,
    /// The checksum matched but the codec refused the stream (a codec bug or a checksum collision).
    Codec(CodecError),
    /// The engine is shutting down.
    Stopped,
}

/// A record the format refused: its checksum, or (checksum right) its codec.
impl From<crate::format::FormatError> for EngineError {
    fn from(e: crate::format::FormatError) -> EngineError {
        match e {
            crate::format::FormatError::Codec(c) => EngineError::Codec(c),
            _ => EngineError::ChecksumMismatch,
        }
    }
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::ChecksumMismatch => f.write_str("checksum mismatch"),
            EngineError::Codec(e) => e.fmt(f),
            EngineError::Stopped => f.write_str("compression engine stopped"),
        }
    }
}

impl std::error::Error for EngineError {}

pub type Done = Box<dyn FnOnce(Result<Encoded, EngineError>) + Send>;

type DecodeFn = fn(&Inner, &DecompressRequest) -> Result<Vec<u8>, EngineError>;

/// A record to compress and what to do with the result. (Reads decode on the calling thread:
/// `decompress_all`.)
pub struct Job {
    pub request: CompressRequest,
    pub done: Done,
}

pub struct Engine {
    inner: Arc<Inner>,
    stop: Arc<AtomicBool>,
    watchdog: Option<JoinHandle<()>>,
}

struct Inner {
    config: EngineConfig,
    cpu: CpuPool,
    devices: Vec<offload::Offloader>,
    stats: Stats,
    decoders: Decoders,
}

impl Engine {
    /// A CPU-only engine with the default policy.
    pub fn new(cpu_threads: usize) -> Engine {
        Engine::with_devices(EngineConfig::new(cpu_threads), Vec::new())
    }

    pub fn with_devices(config: EngineConfig, devices: Vec<Arc<dyn Device>>) -> Engine {
        let names: Vec<&'static str> = std::iter::once("cpu").chain(devices.iter().map(|d| d.name())).collect();
        let inner = Arc::new(Inner {
            cpu: CpuPool::new(config.cpu_threads),
            decoders: Decoders::default(),
            devices: devices.into_iter().enumerate().map(|(i, d)| offload::Offloader::new(d, i + 1, config.backoff.0)).collect(),
            stats: Stats::new(&names),
            config,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let watchdog = (!inner.devices.is_empty()).then(|| {
            let (weak, stop) = (Arc::downgrade(&inner), stop.clone());
            let tick = (inner.config.timeout / 4).clamp(Duration::from_millis(5), Duration::from_millis(50));
            std::thread::Builder::new()
                .name("densefs-offload-watchdog".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(tick);
                        match weak.upgrade() {
                            Some(inner) => inner.watch(),
                            None => break,
                        }
                    }
                })
                .expect("cannot start the offload watchdog")
        });
        Engine { inner, stop, watchdog }
    }

    pub fn has_device(&self, name: &str) -> bool {
        self.inner.devices.iter().any(|d| d.device.name() == name)
    }

    pub fn device_names(&self) -> Vec<&'static str> {
        self.inner.devices.iter().map(|d| d.device.name()).collect()
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Queues jobs; each one's callback runs exactly once, on some engine thread.
    pub fn submit(&self, jobs: Vec<Job>) {
        self.inner.submit(jobs);
    }

    /// Compresses one record on the calling thread (a small file's only record at close: no
    /// round trip through the pools), where it would go to the CPU anyway: no accelerator is
    /// open, or the record's policy is the CPU. `None`: submit it.
    pub fn compress_here(&self, req: &CompressRequest) -> Option<Encoded> {
        (self.inner.devices.is_empty() || req.offload == Offload::Cpu).then(|| self.inner.compress_here(req))
    }

    /// Checks and decodes one record on the calling thread (one record: no pool round trip).
    pub fn decode(&self, req: &DecompressRequest) -> Result<Vec<u8>, EngineError> {
        self.inner.decode(req)
    }

    /// Decodes a batch on the calling thread, helped by idle CPU workers, and waits for all of
    /// it (results in request order); see shared.rs.
    pub fn decompress_all(&self, requests: Vec<DecompressRequest>) -> Vec<Result<Vec<u8>, EngineError>> {
        if requests.len() == 1 {
            return vec![self.decode(&requests[0])];
        }
        self.inner.decode_shared(requests, Inner::decode)
    }

    /// Counters and device states as JSON (see stats.rs).
    pub fn snapshot(&self) -> serde_json::Value {
        let mut states = vec!["up".to_string()];
        states.extend(self.inner.devices.iter().map(|d| d.state()));
        let mut value = self.inner.stats.snapshot(&states);
        value["cpu_threads"] = self.inner.cpu.threads().into();
        // Tasks waiting for a CPU worker now (the engine's queue depth).
        value["cpu_queued"] = self.inner.cpu.waiting().into();
        value
    }

    /// The CPU pool's workers (one per core).
    pub fn cpu_threads(&self) -> usize {
        self.inner.cpu.threads()
    }

    /// Tasks waiting for a CPU worker now.
    pub fn cpu_queued(&self) -> usize {
        self.inner.cpu.waiting()
    }

    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.watchdog.take() {
            let _ = w.join();
        }
    }
}

impl Inner {
    fn submit(self: &Arc<Self>, jobs: Vec<Job>) {
        let mut batches: Vec<Vec<offload::Offered>> = self.devices.iter().map(|_| Vec::new()).collect();
        let mut planned = vec![0usize; self.devices.len()];
        for job in jobs {
            let req = job.request;
            match self.route(&req, &planned) {
                offload::Route::Cpu(why) => {
                    if let Some(why) = why {
                        self.stats.fallback(why);
                    }
                    self.cpu_compress(req, job.done);
                }
                offload::Route::Device(d, compression) => {
                    planned[d] += req.data.len();
                    batches[d].push(offload::Offered { req, compression, done: job.done })
                }
            }
        }
        for (d, batch) in batches.into_iter().enumerate() {
            if !batch.is_empty() {
                self.offer(d, batch);
            }
        }
    }

    /// Compresses on a CPU worker; `compression=auto` is resolved there, against the queue then.
    fn cpu_compress(self: &Arc<Self>, req: CompressRequest, done: Done) {
        let me = Arc::clone(self);
        let task = Box::new(move || {
            let result = me.compress_here(&req);
            done(Ok(result))
        });
        // Only fails once the engine is being dropped, when no file has work left in it.
        let _ = self.cpu.spawn(task);
    }

    /// Runs one compression on this thread, with the full policy, and counts it on the CPU.
    fn compress_here(&self, req: &CompressRequest) -> Encoded {
        let start = Instant::now();
        let data = req.data.as_slice();
        let compression = match req.compression {
            Setting::Fixed(c) => c,
            Setting::Auto => {
                let backlog = self.cpu.waiting() as f32 / self.cpu.threads() as f32;
                let target = policy::AutoTarget::Cpu { backlog_per_worker: backlog };
                let chosen = policy::choose_auto(policy::sample_entropy(data), req.min_savings, target);
                self.stats.auto_chose(chosen.codec);
                chosen
            }
        };
        let (encoded, outcome) = policy::encode_record(data, compression, req.min_savings, req.checksum, self.config.precheck);
        let elapsed = start.elapsed();
        let cpu = &self.stats.backends[0];
        cpu.compress(compression.codec).add(data.len(), encoded.bytes.len(), elapsed);
        cpu.busy_ns.fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
        self.stats.outcome(outcome, data.len());
        encoded
    }

    /// `decode` is `Inner::decode` (tests watch which threads run it).
    fn decode_shared(self: &Arc<Self>, requests: Vec<DecompressRequest>, decode: DecodeFn) -> Vec<Result<Vec<u8>, EngineError>> {
        let batch = Arc::new(SharedBatch::new(requests));
        for _ in 0..self.decoders.join(batch.len(), self.cpu.threads()) {
            let (me, batch) = (Arc::clone(self), Arc::clone(&batch));
            let help = Box::new(move || {
                batch.work(|req| decode(&me, req));
                me.decoders.leave();
            });
            if self.cpu.spawn(help).is_err() {
                self.decoders.leave(); // the engine is stopping: the caller decodes alone
            }
        }
        batch.work(|req| decode(self, req));
        self.decoders.leave();
        batch.wait()
    }

    fn decode(&self, req: &DecompressRequest) -> Result<Vec<u8>, EngineError> {
        let start = Instant::now();
        let result = policy::decode_record(req);
        if result.is_ok() {
            let elapsed = start.elapsed();
            let cpu = &self.stats.backends[0];
            cpu.decompress(req.codec).add(req.stored.len(), req.logical_len, elapsed);
            cpu.busy_ns.fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
        }
        result
    }
}

#[cfg(test)]
mod tests;

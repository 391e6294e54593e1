//! Engine counters: what ran where, what it saved, and why records did not go where they were
//! sent. Plain relaxed atomics: a reader sees each counter exact, and sums settle once idle.

use crate::codec::{Codec, CODECS};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

const CODEC_SLOTS: usize = CODECS.len();

#[derive(Default)]
pub struct OpCounters {
    pub records: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub busy_ns: AtomicU64,
}

impl OpCounters {
    pub fn add(&self, bytes_in: usize, bytes_out: usize, busy: Duration) {
        self.records.fetch_add(1, Relaxed);
        self.bytes_in.fetch_add(bytes_in as u64, Relaxed);
        self.bytes_out.fetch_add(bytes_out as u64, Relaxed);
        self.busy_ns.fetch_add(busy.as_nanos() as u64, Relaxed);
    }

    fn json(&self) -> Value {
        json!({
            "records": self.records.load(Relaxed),
            "bytes_in": self.bytes_in.load(Relaxed),
            "bytes_out": self.bytes_out.load(Relaxed),
            "busy_s": self.busy_ns.load(Relaxed) as f64 / 1e9,
        })
    }
}

/// Counters of one backend (`cpu` first, then each accelerator).
pub struct BackendStats {
    pub name: &'static str,
    compress: [OpCounters; CODEC_SLOTS],
    decompress: [OpCounters; CODEC_SLOTS],
    /// Failed jobs (error status, timeout, output that did not verify).
    pub errors: AtomicU64,
    /// Re-initialisations after a failure.
    pub resets: AtomicU64,
    /// CPU: time workers spent on jobs (may exceed wall time: several cores). Accelerators: time
    /// with at least one job in flight (its utilisation, as iostat's %util).
    pub busy_ns: AtomicU64,
}

impl BackendStats {
    fn new(name: &'static str) -> BackendStats {
        BackendStats {
            name,
            compress: Default::default(),
            decompress: Default::default(),
            errors: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
        }
    }

    /// Counters of records compressed with `codec` (the one asked for, whatever was kept).
    pub fn compress(&self, codec: Codec) -> &OpCounters {
        &self.compress[codec as usize]
    }

    /// Input bytes of every record it compressed, whatever the codec.
    pub fn compressed_bytes(&self) -> u64 {
        self.compress.iter().map(|c| c.bytes_in.load(Relaxed)).sum()
    }

    pub fn decompress(&self, codec: Codec) -> &OpCounters {
        &self.decompress[codec as usize]
    }

    fn json(&self, state: &str) -> Value {
        let table = |ops: &[OpCounters; CODEC_SLOTS]| -> Value {
            let mut m = Map::new();
            for (row, op) in CODECS.iter().zip(ops) {
                if op.records.load(Relaxed) > 0 {
                    m.insert(row.name.to_string(), op.json());
                }
            }
            Value::Object(m)
        };
        json!({
            "name": self.name,
            "state": state,
            "busy_s": self.busy_ns.load(Relaxed) as f64 / 1e9,
            "errors": self.errors.load(Relaxed),
            "resets": self.resets.load(Relaxed),
            "compress": table(&self.compress),
            "decompress": table(&self.decompress),
        })
    }
}

/// Why a record ran on the CPU instead of the accelerator the offload setting sent it to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// Outside the offload size window.
    Size,
    /// The accelerator has no such codec.
    Unsupported,
    /// No free room on the accelerator: running now on the CPU beats waiting.
    Saturated,
    /// The accelerator is absent or recovering from a failure.
    Unavailable,
    /// The sample looked incompressible: the CPU probes it cheaply instead.
    Precheck,
    /// The accelerator reported an error.
    Error,
    /// The accelerator did not answer in time.
    Timeout,
    /// The accelerator's output did not decode back to the input.
    Garbage,
    /// In flight on an accelerator when it failed: redone on the CPU.
    Drained,
}

impl Fallback {
    pub const ALL: [Fallback; 9] = [
        Fallback::Size,
        Fallback::Unsupported,
        Fallback::Saturated,
        Fallback::Unavailable,
        Fallback::Precheck,
        Fallback::Error,
        Fallback::Timeout,
        Fallback::Garbage,
        Fallback::Drained,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fallback::Size => "size",
            Fallback::Unsupported => "unsupported",
            Fallback::Saturated => "saturated",
            Fallback::Unavailable => "unavailable",
            Fallback::Precheck => "precheck",
            Fallback::Error => "error",
            Fallback::Timeout => "timeout",
            Fallback::Garbage => "garbage",
            Fallback::Drained => "drained",
        }
    }
}

/// What the policy made of records, engine-wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// All zeros: stored as a hole.
    Hole,
    /// Compressed and kept.
    Compressed,
    /// Compressed, but it saved less than min_savings: stored raw.
    RawLowSavings,
    /// The pre-check found it incompressible: stored raw without running the codec.
    RawPrecheck,
    /// compression=off.
    RawOff,
}

pub struct Stats {
    started: Instant,
    pub backends: Vec<BackendStats>,
    fallbacks: [AtomicU64; Fallback::ALL.len()],
    holes: AtomicU64,
    raw_low_savings: AtomicU64,
    precheck_skipped: AtomicU64,
    precheck_skipped_bytes: AtomicU64,
    /// Records compression=auto gave each codec.
    auto: [AtomicU64; CODEC_SLOTS],
}

impl Stats {
    pub fn new(backend_names: &[&'static str]) -> Stats {
        Stats {
            started: Instant::now(),
            backends: backend_names.iter().map(|n| BackendStats::new(n)).collect(),
            fallbacks: Default::default(),
            holes: AtomicU64::new(0),
            raw_low_savings: AtomicU64::new(0),
            precheck_skipped: AtomicU64::new(0),
            precheck_skipped_bytes: AtomicU64::new(0),
            auto: Default::default(),
        }
    }

    pub fn fallback(&self, why: Fallback) {
        self.fallbacks[why as usize].fetch_add(1, Relaxed);
    }

    pub fn fallbacks(&self, why: Fallback) -> u64 {
        self.fallbacks[why as usize].load(Relaxed)
    }

    pub fn outcome(&self, outcome: Outcome, len: usize) {
        match outcome {
            Outcome::Hole => self.holes.fetch_add(1, Relaxed),
            Outcome::RawLowSavings => self.raw_low_savings.fetch_add(1, Relaxed),
            Outcome::RawPrecheck => {
                self.precheck_skipped_bytes.fetch_add(len as u64, Relaxed);
                self.precheck_skipped.fetch_add(1, Relaxed)
            }
            Outcome::Compressed | Outcome::RawOff => 0,
        };
    }

    pub fn auto_chose(&self, codec: Codec) {
        self.auto[codec as usize].fetch_add(1, Relaxed);
    }

    /// The whole picture as JSON (`user.densefs.engine`, `densefs iostat`, `densefs bench`).
    pub fn snapshot(&self, states: &[String]) -> Value {
        let mut fallbacks = Map::new();
        for why in Fallback::ALL {
            fallbacks.insert(why.name().into(), self.fallbacks(why).into());
        }
        let mut auto = Map::new();
        for (row, n) in CODECS.iter().zip(&self.auto) {
            let n = n.load(Relaxed);
            if n > 0 {
                auto.insert(row.name.into(), n.into());
            }
        }
        json!({
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "process_cpu_s": process_cpu_seconds(),
            "backends": self.backends.iter().zip(states).map(|(b, s)| b.json(s)).collect::<Vec<_>>(),
            "fallbacks": fallbacks,
            "records": {
                "holes": self.holes.load(Relaxed),
                "raw_low_savings": self.raw_low_savings.load(Relaxed),
                "precheck_skipped": self.precheck_skipped.load(Relaxed),
                "precheck_skipped_bytes": self.precheck_skipped_bytes.load(Relaxed),
            },
            "auto": auto,
        })
    }
}

/// User + system CPU time of this process so far.
pub fn process_cpu_seconds() -> f64 {
    // SAFETY: `rusage` is a plain C struct of integers; all zeros is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes only into `usage`.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

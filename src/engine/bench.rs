//! `densefs bench engine`: compression and decompression throughput, ratio and CPU cost of each
//! backend and algorithm on one file, in-process (no FUSE), through the same engine and policies
//! the file system uses, so GPU and CPU are compared on the same data.

use super::device::{run_all, Device, DeviceOp};
use super::stats::process_cpu_seconds;
use super::{policy, CompressRequest, DecompressRequest, Encoded, Engine, EngineConfig, Job, MinSavings, Offload};
use crate::checksum::ChecksumKind;
use crate::codec::{Codec, Compression};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct BenchOptions {
    /// Backend names: "cpu", a device name, or "auto" (offload=auto with the first device).
    pub backends: Vec<String>,
    pub compressions: Vec<Compression>,
    pub record_size: usize,
    pub cpu_threads: usize,
    pub precheck: bool,
    /// Repeat each measurement and keep the fastest (shared, noisy machines).
    pub repeat: usize,
}

pub struct Measured {
    pub seconds: f64,
    pub cpu_seconds: f64,
}

pub struct BenchRow {
    pub backend: String,
    pub compression: Compression,
    pub logical_bytes: u64,
    pub stored_bytes: u64,
    pub compress: Measured,
    pub decompress: Measured,
    /// Share of records the backend itself compressed (the rest fell back to the CPU).
    pub offloaded: f64,
    pub fallbacks: Value,
}

impl BenchRow {
    pub fn ratio(&self) -> f64 {
        self.logical_bytes as f64 / self.stored_bytes.max(1) as f64
    }

    fn gbps(&self, m: &Measured) -> f64 {
        self.logical_bytes as f64 / m.seconds / 1e9
    }

    fn cpu_per_gb(&self, m: &Measured) -> f64 {
        m.cpu_seconds / (self.logical_bytes as f64 / 1e9)
    }

    pub fn header() -> String {
        format!(
            "{:<8} {:<12} {:>9} {:>9} {:>7} {:>11} {:>11} {:>9}",
            "BACKEND", "ALGORITHM", "COMP GB/s", "DEC GB/s", "RATIO", "COMP CPUs/GB", "DEC CPUs/GB", "OFFLOADED"
        )
    }

    pub fn line(&self) -> String {
        format!(
            "{:<8} {:<12} {:>9.3} {:>9.3} {:>7.2} {:>11.2} {:>11.2} {:>8.0}%",
            self.backend,
            self.compression.to_string(),
            self.gbps(&self.compress),
            self.gbps(&self.decompress),
            self.ratio(),
            self.cpu_per_gb(&self.compress),
            self.cpu_per_gb(&self.decompress),
            self.offloaded * 100.0
        )
    }

    pub fn json(&self) -> Value {
        json!({
            "backend": self.backend,
            "algorithm": self.compression.to_string(),
            "logical_bytes": self.logical_bytes,
            "stored_bytes": self.stored_bytes,
            "ratio": self.ratio(),
            "compress_gbps": self.gbps(&self.compress),
            "decompress_gbps": self.gbps(&self.decompress),
            "compress_cpu_s_per_gb": self.cpu_per_gb(&self.compress),
            "decompress_cpu_s_per_gb": self.cpu_per_gb(&self.decompress),
            "compress_s": self.compress.seconds,
            "decompress_s": self.decompress.seconds,
            "offloaded": self.offloaded,
            "fallbacks": self.fallbacks,
        })
    }
}

fn measure<T>(f: impl FnOnce() -> T) -> (T, Measured) {
    let (c0, t0) = (process_cpu_seconds(), Instant::now());
    let out = f();
    let seconds = t0.elapsed().as_secs_f64();
    (out, Measured { seconds, cpu_seconds: process_cpu_seconds() - c0 })
}

/// Compresses every record through the engine and waits for all of them (results in order),
/// keeping at most `window` records in flight: a device's capacity, so that what is measured is
/// the device and not the engine's fallback to the CPU when the device is full.
fn compress_all(engine: &Engine, records: &[Arc<Vec<u8>>], compression: Compression, offload: Offload, window: usize) -> Vec<Encoded> {
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut jobs = records.iter().enumerate().map(|(i, data)| {
        let tx = tx.clone();
        Job {
            request: CompressRequest {
                data: data.clone(),
                compression: compression.into(),
                min_savings: MinSavings::ZFS,
                checksum: ChecksumKind::Crc32c,
                offload,
            },
            done: Box::new(move |r| {
                let _ = tx.send((i, r));
            }),
        }
    });
    engine.submit(jobs.by_ref().take(window.max(1)).collect());
    let mut out: Vec<Option<Encoded>> = vec![None; records.len()];
    for _ in 0..records.len() {
        let (i, r) = rx.recv().expect("BUG: the engine dropped a job");
        if let Some(next) = jobs.next() {
            engine.submit(vec![next]);
        }
        match r {
            Ok(e) => out[i] = Some(e),
            Err(e) => panic!("BUG: compress job answered {e}"),
        }
    }
    out.into_iter().map(|e| e.expect("BUG: every record answered")).collect()
}

fn request(e: &Encoded) -> DecompressRequest {
    DecompressRequest::of(e, ChecksumKind::Crc32c)
}

/// Decodes on a device: checksums verified on the CPU first (device decoders assume valid
/// input); raw records, holes and what the device does not support decoded on the CPU; the rest
/// shipped, re-offered while the device is full.
fn decompress_on_device(device: &dyn Device, encoded: &[Encoded]) -> Result<Vec<Vec<u8>>, String> {
    let mut out: Vec<Option<Vec<u8>>> = vec![None; encoded.len()];
    let mut shipped = Vec::new();
    let mut ops = Vec::new();
    for (i, e) in encoded.iter().enumerate() {
        let op = DeviceOp::Decompress { codec: e.codec, logical_len: e.logical_len as usize };
        if e.codec == Codec::Off || !device.supports(&op, e.bytes.len()) {
            out[i] = Some(policy::decode_record(&request(e)).map_err(|err| err.to_string())?);
            continue;
        }
        if ChecksumKind::Crc32c.compute(&e.bytes) != e.checksum {
            return Err(format!("record {i}: checksum mismatch"));
        }
        shipped.push(i);
        ops.push((op, Arc::new(e.bytes.clone())));
    }
    for (i, r) in shipped.into_iter().zip(run_all(device, ops, Duration::from_secs(60))) {
        out[i] = Some(r.map_err(|e| format!("record {i}: {e}"))?);
    }
    Ok(out.into_iter().map(|o| o.expect("BUG: every record decoded")).collect())
}

/// Runs every (backend, compression) pair on `data`. `devices` are the accelerators present.
pub fn run(
    options: &BenchOptions,
    data: &[u8],
    devices: &[Arc<dyn Device>],
    mut report: impl FnMut(&BenchRow),
) -> Result<Vec<BenchRow>, String> {
    let records: Vec<Arc<Vec<u8>>> = data.chunks(options.record_size).map(|c| Arc::new(c.to_vec())).collect();
    let mut rows = Vec::new();
    for backend in &options.backends {
        let (offload, device) = if backend == "cpu" {
            (Offload::Cpu, None)
        } else if backend == "auto" {
            // offload=auto: the first device, and the CPU for what it does better or has no room for.
            (Offload::Auto, Some(devices.first().ok_or("no device for auto on this machine")?.clone()))
        } else {
            let device = devices.iter().find(|d| d.name() == backend).ok_or_else(|| format!("no {backend} backend on this machine"))?;
            (Offload::Only(device.name()), Some(device.clone()))
        };
        let mut config = EngineConfig::new(options.cpu_threads);
        config.precheck = options.precheck;
        let engine = Engine::with_devices(config, device.iter().cloned().collect());
        // A device alone is kept full and no fuller; auto gets twice that, so the CPU takes
        // what arrives while the device is full, as in the file system.
        let window = match (&device, offload) {
            (None, _) => usize::MAX,
            (Some(d), Offload::Auto) => 2 * d.capacity(),
            (Some(d), _) => d.capacity(),
        };
        // Warm-up, untimed: the first pass pays for the allocator's fresh pages and cold caches.
        let warmed = compress_all(&engine, &records, Compression::LZ4, Offload::Cpu, usize::MAX);
        engine.decompress_all(warmed.iter().map(request).collect());
        for &compression in &options.compressions {
            let mut best: Option<BenchRow> = None;
            for _ in 0..options.repeat.max(1) {
                let before = engine.snapshot();
                let (encoded, compress) = measure(|| compress_all(&engine, &records, compression, offload, window));
                let after = engine.snapshot();
                let (decoded, decompress) = match &device {
                    None => {
                        let (d, m) = measure(|| engine.decompress_all(encoded.iter().map(request).collect()));
                        (d.into_iter().collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?, m)
                    }
                    Some(dev) => {
                        let (d, m) = measure(|| decompress_on_device(dev.as_ref(), &encoded));
                        (d?, m)
                    }
                };
                for (i, (d, r)) in decoded.iter().zip(&records).enumerate() {
                    if d.as_slice() != r.as_slice() {
                        return Err(format!("{backend} {compression}: record {i} did not round-trip"));
                    }
                }
                // For auto, the share the device took.
                let counted = device.as_ref().map_or("cpu", |d| d.name());
                let on_backend = records_on(&after, counted) - records_on(&before, counted);
                let mut fallbacks = serde_json::Map::new();
                for (k, v) in after["fallbacks"].as_object().into_iter().flatten() {
                    let n = v.as_u64().unwrap_or(0) - before["fallbacks"][k].as_u64().unwrap_or(0);
                    if n > 0 {
                        fallbacks.insert(k.clone(), n.into());
                    }
                }
                let row = BenchRow {
                    backend: backend.clone(),
                    compression,
                    logical_bytes: data.len() as u64,
                    stored_bytes: encoded.iter().map(|e| e.bytes.len() as u64).sum(),
                    compress,
                    decompress,
                    offloaded: on_backend as f64 / records.len().max(1) as f64,
                    fallbacks: Value::Object(fallbacks),
                };
                if best.as_ref().is_none_or(|b| row.compress.seconds + row.decompress.seconds < b.compress.seconds + b.decompress.seconds) {
                    best = Some(row);
                }
            }
            let row = best.expect("BUG: at least one repetition");
            report(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Records compressed by `backend` so far, from an engine snapshot.
fn records_on(snapshot: &Value, backend: &str) -> u64 {
    snapshot["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["name"] == backend)
        .flat_map(|b| b["compress"].as_object().into_iter().flatten().map(|(_, c)| c["records"].as_u64().unwrap_or(0)))
        .sum()
}

//! What an accelerator (GPU, QAT, a computational-storage device, the test double) implements.
//!
//! A device only runs codecs. Everything else — which records it gets, checking what it returns,
//! falling back to the CPU, recovering it after a failure, counting — is the engine's
//! (offload.rs), so adding a device is one file implementing [`Device`] (and a `probe` that finds
//! it), registered by one row of the device table, `engine::DEVICES` (engine/mod.rs).

use crate::codec::{Codec, Compression};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceOp {
    /// Compress the input into one stream of the codec's standard format (readable by the CPU
    /// decoders). The output may be any length; the engine decides whether it is kept.
    Compress(Compression),
    /// Decode a stream that the engine has already checked against its checksum.
    Decompress { codec: Codec, logical_len: usize },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceError(pub String);

impl std::fmt::Display for DeviceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub type DeviceDone = Box<dyn FnOnce(Result<Vec<u8>, DeviceError>) + Send>;

pub struct DeviceJob {
    /// The engine's name for the job (it matches handed-back jobs by it); devices ignore it.
    pub tag: u64,
    pub op: DeviceOp,
    pub input: Arc<Vec<u8>>,
    /// Called once, from any thread, when the job is done — or never, if the device hangs or
    /// drops queued work on reset: the engine's watchdog covers that.
    pub done: DeviceDone,
}

pub trait Device: Send + Sync {
    /// Short name, shown in statistics and accepted by `offload=`.
    fn name(&self) -> &'static str;
    /// Whether the device can run this at all (codec, level, input length).
    fn supports(&self, op: &DeviceOp, len: usize) -> bool;
    /// Whether `offload=auto` should send records of this setting here: the device is faster or
    /// saves CPU that matters (a GPU for gzip, not for lz4, which the CPU does at memory speed).
    fn worth_it(&self, compression: Compression) -> bool;
    /// Queues the jobs it has room for and hands back the rest at once (it is saturated): the
    /// engine runs those on the CPU rather than wait.
    fn submit(&self, jobs: Vec<DeviceJob>) -> Vec<DeviceJob>;
    /// How many jobs it takes before it hands any back. `densefs bench engine` keeps that many
    /// in flight, so it measures the device rather than the saturation fallback.
    fn capacity(&self) -> usize;
    /// Brings the device back after a failure: forget queued work, re-create what it needs.
    fn reset(&self) -> Result<(), DeviceError>;
}

/// Runs `ops` on `device` and waits for every answer (in order), offering again what it hands
/// back while full; an op unanswered within `timeout` of the last answer gets an error. For the
/// GPU's self-test, tests and `densefs bench engine`: the file system never waits like this.
pub fn run_all(device: &dyn Device, ops: Vec<(DeviceOp, Arc<Vec<u8>>)>, timeout: Duration) -> Vec<Result<Vec<u8>, DeviceError>> {
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut jobs: Vec<DeviceJob> = ops
        .into_iter()
        .enumerate()
        .map(|(i, (op, input))| {
            let tx = tx.clone();
            DeviceJob { tag: i as u64, op, input, done: Box::new(move |r| drop(tx.send((i, r)))) }
        })
        .collect();
    let n = jobs.len();
    while !jobs.is_empty() {
        let before = jobs.len();
        jobs = device.submit(jobs);
        if jobs.len() == before {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    let mut out: Vec<Result<Vec<u8>, DeviceError>> =
        (0..n).map(|_| Err(DeviceError(format!("no answer in {} s", timeout.as_secs())))).collect();
    for _ in 0..n {
        match rx.recv_timeout(timeout) {
            Ok((i, r)) => out[i] = r,
            Err(_) => break,
        }
    }
    out
}

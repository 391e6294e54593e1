//! The compression service engine: the one door through which records reach the codecs.
//!
//! The file system hands it batches of [`Job`]s and does not wait record by record: each job
//! carries its own completion callback, run by whichever backend finished it, in any order.
//! Policy that decides what a record becomes (hole, compressed, stored raw) lives in the small
//! pure functions of [`policy`]; backends only run them. Issue-level plan: a GPU backend and
//! offload policies plug in here without the file system changing.

mod cpu;
pub mod policy;

use crate::checksum::ChecksumKind;
use crate::codec::{Codec, CodecError, Compression};
use std::sync::Arc;

pub use cpu::CpuPool;
pub use policy::MinSavings;

/// A record to encode.
pub struct CompressRequest {
    pub data: Arc<Vec<u8>>,
    pub compression: Compression,
    pub min_savings: MinSavings,
    pub checksum: ChecksumKind,
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

pub enum Work {
    Compress(CompressRequest),
    Decompress(DecompressRequest),
}

pub enum Output {
    Compressed(Encoded),
    Decompressed(Vec<u8>),
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

pub type Done = Box<dyn FnOnce(Result<Output, EngineError>) + Send>;

pub struct Job {
    pub work: Work,
    pub done: Done,
}

/// A place where jobs run. Adding a backend (GPU, QAT) means one more implementation of this.
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;
    /// Queues the jobs; each job's callback runs once, when it is done.
    fn submit(&self, jobs: Vec<Job>);
}

/// Runs one job on the calling CPU thread: the reference every backend must agree with.
pub fn run_on_cpu(work: Work) -> Result<Output, EngineError> {
    match work {
        Work::Compress(req) => Ok(Output::Compressed(policy::encode_record(&req))),
        Work::Decompress(req) => policy::decode_record(&req).map(Output::Decompressed),
    }
}

pub struct Engine {
    cpu: CpuPool,
}

impl Engine {
    pub fn new(cpu_threads: usize) -> Engine {
        Engine { cpu: CpuPool::new(cpu_threads) }
    }

    pub fn submit(&self, jobs: Vec<Job>) {
        Backend::submit(&self.cpu, jobs);
    }

    /// Decodes a batch in parallel and waits for all of it (results in request order).
    pub fn decompress_all(&self, requests: Vec<DecompressRequest>) -> Vec<Result<Vec<u8>, EngineError>> {
        let n = requests.len();
        if n == 1 {
            // One record: decoding here is cheaper than a round trip through the pool.
            let req = requests.into_iter().next().expect("BUG: one request");
            return vec![policy::decode_record(&req)];
        }
        let (tx, rx) = crossbeam_channel::bounded(n);
        let jobs = requests
            .into_iter()
            .enumerate()
            .map(|(i, req)| {
                let tx = tx.clone();
                Job {
                    work: Work::Decompress(req),
                    done: Box::new(move |result| {
                        let result = result.map(|out| match out {
                            Output::Decompressed(bytes) => bytes,
                            Output::Compressed(_) => panic!("BUG: decompress job returned a compressed record"),
                        });
                        let _ = tx.send((i, result));
                    }),
                }
            })
            .collect();
        self.submit(jobs);
        let mut results: Vec<Option<Result<Vec<u8>, EngineError>>> = (0..n).map(|_| None).collect();
        for _ in 0..n {
            match rx.recv() {
                Ok((i, result)) => results[i] = Some(result),
                Err(_) => break,
            }
        }
        results.into_iter().map(|r| r.unwrap_or(Err(EngineError::Stopped))).collect()
    }
}

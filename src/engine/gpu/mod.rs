//! The GPU backend: NVIDIA GPUs through nvCOMP 6's batched low-level C API.
//!
//! Everything is loaded at run time (libcuda.so.1 through cudarc, libnvcomp.so.6 through
//! libloading), so one binary builds and runs everywhere; [`GpuDevice::open`] says why there is
//! no GPU when there is none. Formats are the ones CPU decoders read and write: LZ4 raw blocks
//! (CHAR, no bitshuffle), raw Deflate (RFC 1951), Zstd frames (records of at most 128 KiB).
//!
//! Work flows through *lanes*: each lane is a thread with its own CUDA stream and buffers
//! (pinned host memory, device memory, nvCOMP temp space) that gathers queued jobs of one kind
//! into a batch (up to `max_batch` records or `batch_bytes`, waiting at most `linger` for more),
//! uploads it, runs one nvCOMP call for the whole batch and downloads the results. Several lanes
//! keep several batches in flight, so copies of one overlap the compute of another. The queue is
//! bounded: when it is full, `submit` hands jobs back and the engine runs them on the CPU.

pub mod cuda;
pub mod nvcomp;

use super::device::{Device, DeviceError, DeviceJob, DeviceOp};
use crate::codec::{Codec, Compression};
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TrySendError};
use cuda::{CudaError, CudaResult, DeviceBuffer, Gpu, PinnedBuffer, Stream};
use nvcomp::{Format, Nvcomp, Opts};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// nvCOMP's Zstd works on chunks of at most this size (NVIDIA's samples keep them there).
pub const ZSTD_MAX_CHUNK: usize = 128 << 10;
/// Largest record a lane accepts (the engine's offload window ends here by default too).
pub const MAX_CHUNK: usize = 1 << 20;
/// Every buffer offset is aligned to this (above every nvCOMP alignment requirement).
const ALIGN: usize = 256;

/// nvCOMP's Deflate `algorithm` for ZFS's gzip-N: the fastest one that stores records at least as
/// densely as densefs's CPU encoder at level N (within 1%), so a record's size does not depend on
/// where it was compressed. Measured on 32 MiB of the benchmark's FASTQ reads (records of 128 KiB,
/// an H200, bench/results/gpu-h200-2026-11-26): algorithm 1 2.50, 2 3.19 (3 is 2), 4 3.68, 5
/// 3.75; the CPU's gzip-1 3.19, gzip-2 3.20, gzip-6 3.61, gzip-9 3.70. So 5 (2% denser than 4,
/// and slower) is never needed. The GPU test gzip_levels_map_to_the_fastest_algorithm_as_dense_as_the_cpu
/// checks this rule on every level.
pub fn deflate_algorithm(level: i32) -> i32 {
    if level <= 1 {
        2
    } else {
        4
    }
}

/// nvCOMP's Deflate algorithms (0 is entropy coding only, never a gzip-N's); lanes are sized for
/// every one of them.
const DEFLATE_ALGORITHMS: [i32; 5] = [1, 2, 3, 4, 5];

#[derive(Clone, Debug)]
pub struct GpuConfig {
    pub ordinal: i32,
    pub lanes: usize,
    pub batch_bytes: usize,
    pub max_batch: usize,
    pub linger: Duration,
}

impl Default for GpuConfig {
    fn default() -> GpuConfig {
        // nvCOMP compresses each record on its own, slowly (Deflate algorithm 4: about 1 MB/s a
        // record on an H200), so the GPU is busy only with hundreds of records at once: 4 lanes
        // of 64 MiB batches (bench/results/gpu-h200-2026-11-26: gzip-6 0.24 GB/s with 8 MiB
        // batches, 0.64 with 64, 0.69 with 128).
        GpuConfig { ordinal: 0, lanes: 4, batch_bytes: 64 << 20, max_batch: 512, linger: Duration::from_micros(200) }
    }
}

impl GpuConfig {
    /// The defaults, with what the environment sets: `DENSEFS_GPU=N` picks another GPU than the
    /// first; `DENSEFS_GPU_LANES`, `DENSEFS_GPU_BATCH_MIB`, `DENSEFS_GPU_MAX_BATCH` and
    /// `DENSEFS_GPU_LINGER_US` size the lanes (for measuring; bench/gpu/run sweeps them).
    pub fn from_env() -> GpuConfig {
        let number = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<usize>().ok()).filter(|&n| n > 0);
        let mut config = GpuConfig::default();
        if let Some(n) = std::env::var("DENSEFS_GPU").ok().and_then(|v| v.parse().ok()) {
            config.ordinal = n;
        }
        if let Some(n) = number("DENSEFS_GPU_LANES") {
            config.lanes = n;
        }
        if let Some(n) = number("DENSEFS_GPU_BATCH_MIB") {
            config.batch_bytes = n << 20;
        }
        if let Some(n) = number("DENSEFS_GPU_MAX_BATCH") {
            config.max_batch = n;
        }
        if let Some(n) = number("DENSEFS_GPU_LINGER_US") {
            config.linger = Duration::from_micros(n as u64);
        }
        config
    }
}

/// Which nvCOMP call a job needs; jobs of one key share a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    compress: bool,
    codec: Codec,
    /// Deflate algorithm (compression only), else 0.
    algorithm: i32,
}

impl Key {
    fn of(op: &DeviceOp, len: usize) -> Option<Key> {
        let (compress, codec, algorithm) = match *op {
            DeviceOp::Compress(c) => (true, c.codec, if c.codec == Codec::Deflate { deflate_algorithm(c.level) } else { 0 }),
            DeviceOp::Decompress { codec, logical_len } => {
                if logical_len > MAX_CHUNK {
                    return None;
                }
                (false, codec, 0)
            }
        };
        let limit = if codec == Codec::Zstd { ZSTD_MAX_CHUNK } else { MAX_CHUNK };
        let logical = match *op {
            DeviceOp::Compress(_) => len,
            DeviceOp::Decompress { logical_len, .. } => logical_len,
        };
        (codec.row().runs_on("gpu") && logical <= limit && len > 0).then_some(Key { compress, codec, algorithm })
    }

    fn format(self, nv: &Nvcomp) -> &Format {
        match self.codec {
            Codec::Lz4 => &nv.lz4,
            Codec::Deflate => &nv.deflate,
            _ => &nv.zstd,
        }
    }

    fn opts(self) -> Opts {
        if self.compress && self.codec == Codec::Deflate {
            Opts::deflate(self.algorithm)
        } else {
            Opts::ZERO
        }
    }
}

fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

type Queued = (u64, DeviceJob);

struct Shared {
    gpu: Arc<Gpu>,
    nv: Arc<Nvcomp>,
    config: GpuConfig,
    sizes: LaneSizes,
    generation: AtomicU64,
}

pub struct GpuDevice {
    shared: Arc<Shared>,
    queue: Option<Sender<Queued>>,
    lanes: Vec<JoinHandle<()>>,
}

/// The device table's probe (engine/mod.rs `DEVICES`): the GPU if it opens and passes its
/// self-test; `DENSEFS_GPU=N` picks another GPU than the first.
pub fn probe(_: &mut super::EngineConfig) -> Result<super::Probe, String> {
    let config = GpuConfig::from_env();
    Ok(match GpuDevice::open(config) {
        Ok(gpu) => {
            let note = format!("gpu: {}", gpu.describe());
            super::Probe::Found(Arc::new(gpu), Some(note))
        }
        Err(e) => super::Probe::Absent(format!("gpu: {e}")),
    })
}

impl GpuDevice {
    /// Finds the GPU and nvCOMP, starts the lanes and runs a self-test (every format compressed
    /// on the GPU and decoded by the CPU codecs, and the reverse); any failure says why.
    pub fn open(config: GpuConfig) -> Result<GpuDevice, String> {
        if !cuda::driver_present() {
            return Err("libcuda.so.1 not found (no NVIDIA driver on this machine)".into());
        }
        let nv = Arc::new(Nvcomp::load()?);
        let gpu = Gpu::open(config.ordinal).map_err(|e| e.to_string())?;
        // Some size queries (zstd's) need the context current, as the free memory does.
        gpu.bind_thread().map_err(|e| e.to_string())?;
        let sizes = LaneSizes::of(&nv, &config).map_err(|e| e.to_string())?;
        // A GPU shared with other programs: only as many lanes as fit in half its free memory.
        let mut config = config;
        if let Ok((free, _)) = cuda::memory_info() {
            config.lanes = lanes_that_fit(config.lanes, free / 2, sizes.device_bytes());
        }
        let shared = Arc::new(Shared { gpu, nv, config: config.clone(), sizes, generation: AtomicU64::new(0) });
        let (tx, rx) = bounded::<Queued>(config.lanes * config.max_batch);
        let lanes = (0..config.lanes)
            .map(|i| {
                let (rx, shared) = (rx.clone(), shared.clone());
                std::thread::Builder::new()
                    .name(format!("densefs-gpu-{i}"))
                    .spawn(move || lane(shared, rx))
                    .map_err(|e| format!("cannot start a GPU lane: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let device = GpuDevice { shared, queue: Some(tx), lanes };
        device.self_test()?;
        Ok(device)
    }

    /// "NVIDIA H100 80GB HBM3 (driver 13000, nvCOMP 6000 from PATH)"
    pub fn describe(&self) -> String {
        let s = &self.shared;
        format!(
            "{} (CUDA driver {}, nvCOMP {} from {}; {} lanes of {} MiB, {} MiB of GPU memory each)",
            s.gpu.name,
            s.gpu.driver_version,
            s.nv.version,
            s.nv.path.display(),
            s.config.lanes,
            s.config.batch_bytes >> 20,
            s.sizes.device_bytes() >> 20
        )
    }

    /// Runs jobs and waits for their answers (the self-test and tests).
    pub fn run_blocking(&self, ops: Vec<(DeviceOp, Vec<u8>)>) -> Vec<Result<Vec<u8>, DeviceError>> {
        let ops = ops.into_iter().map(|(op, input)| (op, Arc::new(input))).collect();
        super::device::run_all(self, ops, Duration::from_secs(30))
    }

    fn self_test(&self) -> Result<(), String> {
        let sample: Vec<u8> = (0..64 * 1024u32).map(|i| b"ACGTTGCA@+\n"[((i * 2654435761u32) >> 28) as usize % 11]).collect();
        let settings = ["lz4", "gzip-1", "gzip-6", "zstd-3"].map(|s| Compression::parse(s).expect("BUG: a known setting"));
        let ops = settings.iter().map(|&c| (DeviceOp::Compress(c), sample.clone())).collect();
        for (c, r) in settings.iter().zip(self.run_blocking(ops)) {
            let stream = r.map_err(|e| format!("GPU self-test: {c} compression failed: {e}"))?;
            let back =
                c.codec.decompress(&stream, sample.len()).map_err(|e| format!("GPU self-test: the CPU cannot read the GPU's {c}: {e}"))?;
            if back != sample {
                return Err(format!("GPU self-test: the GPU's {c} decodes to different bytes"));
            }
        }
        let mut ops = Vec::new();
        for c in settings {
            let mut out = vec![0u8; sample.len()];
            let n = c.codec.compress(&sample, &mut out, c.level).ok_or("GPU self-test: sample did not compress on the CPU")?;
            out.truncate(n);
            ops.push((DeviceOp::Decompress { codec: c.codec, logical_len: sample.len() }, out));
        }
        for (c, r) in settings.iter().zip(self.run_blocking(ops)) {
            let back = r.map_err(|e| format!("GPU self-test: decoding the CPU's {c} failed: {e}"))?;
            if back != sample {
                return Err(format!("GPU self-test: the GPU decodes the CPU's {c} to different bytes"));
            }
        }
        Ok(())
    }
}

impl Device for GpuDevice {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn supports(&self, op: &DeviceOp, len: usize) -> bool {
        Key::of(op, len).is_some()
    }

    fn worth_it(&self, compression: Compression) -> bool {
        // Measured on an H200 beside 16 cores (bench/results/gpu-h200-2026-11-26): lz4 and gzip-1
        // run on the CPU near memory speed (4.7-4.9 GB/s, 3.3-3.4 CPU s/GB), faster than on the
        // GPU (2.6 GB/s) for a CPU saving of 15% at best; gzip-6 (20 CPU s/GB) and zstd-3 (5.5)
        // cost the CPU 2.5-9 times what the GPU's share of the work does.
        match compression.codec {
            Codec::Deflate => compression.level >= 2,
            Codec::Zstd => true,
            _ => false,
        }
    }

    fn submit(&self, jobs: Vec<DeviceJob>) -> Vec<DeviceJob> {
        let generation = self.shared.generation.load(Relaxed);
        let queue = self.queue.as_ref().expect("BUG: submit after drop");
        let mut refused = Vec::new();
        for job in jobs {
            match queue.try_send((generation, job)) {
                Ok(()) => {}
                Err(TrySendError::Full((_, job)) | TrySendError::Disconnected((_, job))) => refused.push(job),
            }
        }
        refused
    }

    fn capacity(&self) -> usize {
        // The queue's bound (set in `open`): it takes that many whatever the lanes are doing.
        self.queue.as_ref().and_then(Sender::capacity).expect("BUG: a bounded queue, until drop")
    }

    fn reset(&self) -> Result<(), DeviceError> {
        // Queued jobs of the old generation are dropped unanswered (the engine redid them);
        // lanes rebuild their stream and buffers after any error.
        self.shared.generation.fetch_add(1, Relaxed);
        self.shared.gpu.bind_thread().map_err(|e| DeviceError(e.to_string()))?;
        let probe = DeviceBuffer::new(ALIGN).map_err(|e| DeviceError(e.to_string()))?;
        drop(probe);
        Ok(())
    }
}

impl Drop for GpuDevice {
    fn drop(&mut self) {
        self.queue = None;
        for lane in self.lanes.drain(..) {
            let _ = lane.join();
        }
    }
}

/// One lane's CUDA resources, sized for the largest batch.
struct LaneState {
    stream: Stream,
    host_in: PinnedBuffer,
    host_out: PinnedBuffer,
    dev_in: DeviceBuffer,
    dev_out: DeviceBuffer,
    temp: DeviceBuffer,
    /// Six arrays of `max_batch` 8-byte entries: in ptrs, in bytes, out ptrs, out bytes,
    /// actual bytes, statuses.
    host_meta: PinnedBuffer,
    dev_meta: DeviceBuffer,
}

const META_ARRAYS: usize = 6;

impl LaneState {
    fn new(shared: &Shared) -> CudaResult<LaneState> {
        shared.gpu.bind_thread()?;
        let LaneSizes { input, output, temp, meta } = shared.sizes;
        Ok(LaneState {
            stream: Stream::new()?,
            host_in: PinnedBuffer::new(input)?,
            host_out: PinnedBuffer::new(output)?,
            dev_in: DeviceBuffer::new(input)?,
            dev_out: DeviceBuffer::new(output)?,
            temp: DeviceBuffer::new(temp)?,
            host_meta: PinnedBuffer::new(meta)?,
            dev_meta: DeviceBuffer::new(meta)?,
        })
    }
}

/// What one lane allocates (each buffer both page-locked on the host and on the GPU, but the
/// temp space on the GPU only), from nvCOMP's size queries (zstd's needs the GPU's context).
#[derive(Clone, Copy, Debug)]
struct LaneSizes {
    input: usize,
    output: usize,
    temp: usize,
    meta: usize,
}

impl LaneSizes {
    fn of(nv: &Nvcomp, c: &GpuConfig) -> CudaResult<LaneSizes> {
        let mut temp = 0usize;
        let mut worst_out = 0usize;
        let deflate = DEFLATE_ALGORITHMS.map(|algorithm| Key { compress: true, codec: Codec::Deflate, algorithm });
        for key in [
            Key { compress: true, codec: Codec::Lz4, algorithm: 0 },
            Key { compress: true, codec: Codec::Zstd, algorithm: 0 },
            Key { compress: false, codec: Codec::Lz4, algorithm: 0 },
            Key { compress: false, codec: Codec::Deflate, algorithm: 0 },
            Key { compress: false, codec: Codec::Zstd, algorithm: 0 },
        ]
        .into_iter()
        .chain(deflate)
        {
            let f = key.format(nv);
            let chunk = if key.codec == Codec::Zstd { ZSTD_MAX_CHUNK } else { MAX_CHUNK };
            // Temp space grows with chunks × largest chunk (Deflate: ~33× at 128 × 1 MiB, 4.5 GB),
            // and a batch never holds more than batch_bytes of slots: size for the worst such mix.
            let mut len = 4 << 10;
            while len <= chunk {
                let n = c.max_batch.min((c.batch_bytes / len).max(1));
                let mut t = 0usize;
                // SAFETY: a size query: nvCOMP writes one usize into `t` and reads nothing else
                // (no stream: null).
                let s = unsafe {
                    if key.compress {
                        (f.compress_temp_size)(n, len, key.opts(), &mut t, c.batch_bytes, std::ptr::null_mut())
                    } else {
                        (f.decompress_temp_size)(n, len, key.opts(), &mut t, c.batch_bytes, std::ptr::null_mut())
                    }
                };
                nv_check(s, "GetTempSize")?;
                temp = temp.max(t);
                len *= 2;
            }
            if key.compress {
                for len in [4 << 10, 64 << 10, 128 << 10, chunk] {
                    let mut m = 0usize;
                    // SAFETY: nvCOMP writes one usize into `m`.
                    nv_check(unsafe { (f.max_output_chunk_size)(len.min(chunk), key.opts(), &mut m) }, "GetMaxOutputChunkSize")?;
                    worst_out = worst_out.max(m.div_ceil(len.min(chunk)));
                }
            }
        }
        Ok(LaneSizes {
            input: c.batch_bytes + c.max_batch * ALIGN,
            // A batch's slots (count × largest record) add up to at most batch_bytes (see
            // `lane`); each output slot is at most `worst_out` times its input.
            output: worst_out * c.batch_bytes + 2 * c.max_batch * ALIGN,
            temp,
            meta: META_ARRAYS * c.max_batch * 8,
        })
    }

    /// GPU memory one lane takes.
    fn device_bytes(&self) -> usize {
        self.input + self.output + self.temp + self.meta
    }
}

/// Lanes to start: `wanted`, or as many as fit in `budget` bytes of GPU memory, at least one
/// (whose allocation then says what is missing).
fn lanes_that_fit(wanted: usize, budget: usize, per_lane: usize) -> usize {
    (budget / per_lane.max(1)).clamp(1, wanted.max(1))
}

fn nv_check(status: nvcomp::Status, what: &str) -> CudaResult<()> {
    if status == nvcomp::SUCCESS {
        Ok(())
    } else {
        Err(CudaError(format!("{what}: {}", nvcomp::status_name(status))))
    }
}

/// A lane's loop: gather a batch of one key, run it, answer every job.
fn lane(shared: Arc<Shared>, rx: Receiver<Queued>) {
    let mut state: Option<LaneState> = None;
    let mut stash: Option<Queued> = None;
    let c = shared.config.clone();
    loop {
        let first = match stash.take() {
            Some(q) => q,
            None => match rx.recv() {
                Ok(q) => q,
                Err(_) => return,
            },
        };
        if first.0 != shared.generation.load(Relaxed) {
            continue; // dropped by a reset: the engine redid it
        }
        let Some(key) = Key::of(&first.1.op, first.1.input.len()) else {
            (first.1.done)(Err(DeviceError("not supported on the GPU".into())));
            continue;
        };
        // What a batch costs in buffer space: compression gives every record a slot as large as
        // the largest one's; decompression lays records out one after another.
        let cost = |count: usize, largest: usize, sum: usize| if key.compress { count * largest } else { sum };
        let (mut largest, mut sum) = (logical_len(&first.1), logical_len(&first.1));
        let mut batch = vec![first.1];
        let deadline = Instant::now() + c.linger;
        while batch.len() < c.max_batch {
            match rx.recv_deadline(deadline) {
                Ok(q) => {
                    let same = Key::of(&q.1.op, q.1.input.len()) == Some(key) && q.0 == shared.generation.load(Relaxed);
                    let len = logical_len(&q.1);
                    if !same || cost(batch.len() + 1, largest.max(len), sum + len) > c.batch_bytes {
                        stash = Some(q);
                        break;
                    }
                    largest = largest.max(len);
                    sum += len;
                    batch.push(q.1);
                }
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        if state.is_none() {
            match LaneState::new(&shared) {
                Ok(s) => state = Some(s),
                Err(e) => {
                    batch.into_iter().for_each(|j| (j.done)(Err(DeviceError(format!("GPU lane setup: {e}")))));
                    continue;
                }
            }
        }
        let st = state.as_mut().expect("BUG: lane state was just built");
        let inputs: Vec<&[u8]> = batch.iter().map(|j| j.input.as_slice()).collect();
        let lens: Vec<usize> = batch.iter().map(logical_len).collect();
        match run_batch(&shared, st, key, &inputs, &lens) {
            Ok(results) => {
                for (job, r) in batch.into_iter().zip(results) {
                    (job.done)(r.map_err(DeviceError));
                }
            }
            Err(e) => {
                // The stream or context may be broken: rebuild before the next batch.
                state = None;
                batch.into_iter().for_each(|j| (j.done)(Err(DeviceError(e.to_string()))));
            }
        }
    }
}

fn logical_len(job: &DeviceJob) -> usize {
    match job.op {
        DeviceOp::Compress(_) => job.input.len(),
        DeviceOp::Decompress { logical_len, .. } => logical_len,
    }
}

/// One nvCOMP call for the batch. The outer error means the lane failed (all jobs fail); the
/// inner ones are per record (a bad status or a wrong length).
fn run_batch(shared: &Shared, st: &mut LaneState, key: Key, inputs: &[&[u8]], lens: &[usize]) -> CudaResult<Vec<Result<Vec<u8>, String>>> {
    let nv = &shared.nv;
    let f = key.format(nv);
    let opts = key.opts();
    let n = inputs.len();
    let max_batch = shared.config.max_batch;
    let max_len = *lens.iter().max().expect("BUG: empty batch");
    // Input layout.
    let mut in_off = Vec::with_capacity(n);
    let mut at = 0usize;
    for input in inputs {
        in_off.push(at);
        at = align(at + input.len());
    }
    if at > st.host_in.as_slice().len() {
        return Err(CudaError("batch larger than the lane's input buffer".into()));
    }
    let in_total = at;
    {
        let host = st.host_in.as_mut_slice();
        for (input, &off) in inputs.iter().zip(&in_off) {
            host[off..off + input.len()].copy_from_slice(input);
        }
    }
    // Output layout: compression needs every slot as large as the bound for the largest record.
    let mut out_off = Vec::with_capacity(n);
    let mut out_cap = Vec::with_capacity(n);
    if key.compress {
        let mut bound = 0usize;
        // SAFETY: nvCOMP writes one usize into `bound`.
        nv_check(unsafe { (f.max_output_chunk_size)(max_len, opts, &mut bound) }, "GetMaxOutputChunkSize")?;
        let slot = align(bound);
        for i in 0..n {
            out_off.push(i * slot);
            out_cap.push(bound);
        }
    } else {
        let mut at = 0usize;
        for &len in lens {
            out_off.push(at);
            out_cap.push(len);
            at = align(at + len);
        }
    }
    let out_end = out_off.last().copied().unwrap_or(0) + out_cap.last().copied().unwrap_or(0);
    if out_end > st.host_out.as_slice().len() {
        return Err(CudaError("batch larger than the lane's output buffer".into()));
    }
    // Metadata arrays.
    let arr = |k: usize| k * max_batch * 8;
    {
        let meta = st.host_meta.as_mut_slice();
        let mut put = |k: usize, i: usize, v: u64| meta[arr(k) + i * 8..arr(k) + i * 8 + 8].copy_from_slice(&v.to_ne_bytes());
        for i in 0..n {
            put(0, i, st.dev_in.at(in_off[i]));
            put(1, i, inputs[i].len() as u64);
            put(2, i, st.dev_out.at(out_off[i]));
            put(3, i, out_cap[i] as u64);
        }
    }
    let mut temp_needed = 0usize;
    // SAFETY: a size query: nvCOMP writes one usize into `temp_needed`; the stream is live.
    let s = unsafe {
        if key.compress {
            (f.compress_temp_size)(n, max_len, opts, &mut temp_needed, in_total, st.stream.raw as nvcomp::Stream)
        } else {
            (f.decompress_temp_size)(n, max_len, opts, &mut temp_needed, lens.iter().sum(), st.stream.raw as nvcomp::Stream)
        }
    };
    nv_check(s, "GetTempSize")?;
    if temp_needed > st.temp.len {
        return Err(CudaError(format!("nvCOMP wants {temp_needed} bytes of temp space, the lane has {}", st.temp.len)));
    }
    st.host_in.upload(0..in_total, st.dev_in.ptr, &st.stream)?;
    st.host_meta.upload(0..arr(4), st.dev_meta.ptr, &st.stream)?;
    let m = |k: usize| st.dev_meta.at(arr(k));
    let stream = st.stream.raw as nvcomp::Stream;
    // SAFETY: every pointer is device memory of this lane, sized for the batch: the metadata
    // arrays hold max_batch >= n entries each, the input and output slots were checked against
    // the buffers above, and the temp space against what nvCOMP asked for; the stream is live
    // and is synchronized before any of it is read or reused.
    let status = unsafe {
        if key.compress {
            (f.compress)(
                m(0) as *const *const _,
                m(1) as *const usize,
                max_len,
                n,
                st.temp.ptr as *mut _,
                st.temp.len,
                m(2) as *const *mut _,
                m(3) as *mut usize,
                opts,
                m(5) as *mut nvcomp::Status,
                stream,
            )
        } else {
            (f.decompress)(
                m(0) as *const *const _,
                m(1) as *const usize,
                m(3) as *const usize,
                m(4) as *mut usize,
                n,
                st.temp.ptr as *mut _,
                st.temp.len,
                m(2) as *const *mut _,
                opts,
                m(5) as *mut nvcomp::Status,
                stream,
            )
        }
    };
    nv_check(status, if key.compress { "compress" } else { "decompress" })?;
    // Sizes (compressed, or actual decompressed) and statuses back, then the bytes.
    let sizes_array = if key.compress { 3 } else { 4 };
    st.host_meta.download(m(sizes_array), arr(sizes_array)..arr(sizes_array) + n * 8, &st.stream)?;
    st.host_meta.download(m(5), arr(5)..arr(5) + n * 8, &st.stream)?;
    st.stream.synchronize()?;
    let meta = st.host_meta.as_slice();
    let get = |k: usize, i: usize| u64::from_ne_bytes(meta[arr(k) + i * 8..arr(k) + i * 8 + 8].try_into().expect("8 bytes"));
    let mut verdicts: Vec<Result<usize, String>> = Vec::with_capacity(n);
    for i in 0..n {
        // Statuses are 4-byte enums packed in that array: read them as i32s.
        let status = i32::from_ne_bytes(meta[arr(5) + i * 4..arr(5) + i * 4 + 4].try_into().expect("4 bytes"));
        let size = get(sizes_array, i) as usize;
        verdicts.push(if status != nvcomp::SUCCESS {
            Err(nvcomp::status_name(status))
        } else if size > out_cap[i] || (!key.compress && size != lens[i]) {
            Err(format!("wrong output length {size} (expected {})", if key.compress { out_cap[i] } else { lens[i] }))
        } else {
            Ok(size)
        });
    }
    for (i, v) in verdicts.iter().enumerate() {
        if let Ok(size) = v {
            st.host_out.download(st.dev_out.at(out_off[i]), out_off[i]..out_off[i] + size, &st.stream)?;
        }
    }
    st.stream.synchronize()?;
    let out = st.host_out.as_slice();
    Ok(verdicts.into_iter().enumerate().map(|(i, v)| v.map(|size| out[out_off[i]..out_off[i] + size].to_vec())).collect())
}

#[cfg(test)]
mod tests;

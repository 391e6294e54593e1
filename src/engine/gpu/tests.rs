//! GPU round trips. Without a GPU they check that the reason is given; with one (the device
//! run: `DENSEFS_REQUIRE_GPU=1`) every format goes GPU → CPU and CPU → GPU on real data, and
//! through the engine with its policies.

use super::*;
use crate::checksum::ChecksumKind;
use crate::engine::tests::{fastq_like, random};
use crate::engine::{CompressRequest, Engine, EngineConfig, Job, MinSavings, Offload};

fn gpu() -> Option<GpuDevice> {
    match GpuDevice::open(GpuConfig::from_env()) {
        Ok(g) => {
            eprintln!("GPU: {}", g.describe());
            Some(g)
        }
        Err(e) if std::env::var_os("DENSEFS_REQUIRE_GPU").is_some() => panic!("no GPU: {e}"),
        Err(e) => {
            if !cuda::driver_present() {
                assert!(e.contains("libcuda.so.1"), "{e}");
            }
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// FASTQ from DENSEFS_GPU_CORPUS (the benchmark's real reads), else FASTQ-like text.
fn corpus(len: usize) -> Vec<u8> {
    if let Some(data) = std::env::var_os("DENSEFS_GPU_CORPUS").and_then(|p| std::fs::read(p).ok()) {
        return data.into_iter().cycle().take(len).collect();
    }
    Arc::unwrap_or_clone(fastq_like(1, len, 5).remove(0))
}

fn noise(len: usize) -> Vec<u8> {
    random(len, 0x9e37_79b9)
}

const SETTINGS: [&str; 5] = ["lz4", "gzip-1", "gzip-6", "gzip-9", "zstd-3"];

#[test]
fn records_written_by_the_gpu_read_on_the_cpu_and_the_reverse() {
    let Some(gpu) = gpu() else { return };
    for name in SETTINGS {
        let c = Compression::parse(name).unwrap();
        for len in [4 << 10, 64 << 10, 128 << 10, 1 << 20] {
            if c.codec == Codec::Zstd && len > ZSTD_MAX_CHUNK {
                assert!(!gpu.supports(&DeviceOp::Compress(c), len));
                continue;
            }
            for (kind, data) in [("fastq", corpus(len)), ("noise", noise(len))] {
                // GPU → CPU
                let stream = gpu
                    .run_blocking(vec![(DeviceOp::Compress(c), data.clone())])
                    .pop()
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{name} {len} {kind}: {e}"));
                let back =
                    c.codec.decompress(&stream, len).unwrap_or_else(|e| panic!("{name} {len} {kind}: CPU cannot read GPU output: {e}"));
                assert!(back == data, "{name} {len} {kind}: GPU output decodes to other bytes");
                // CPU → GPU
                let mut cpu = vec![0u8; len * 2 + 1024];
                let n = c.codec.compress(&data, &mut cpu, c.level).unwrap();
                cpu.truncate(n);
                let op = DeviceOp::Decompress { codec: c.codec, logical_len: len };
                let back = gpu
                    .run_blocking(vec![(op, cpu)])
                    .pop()
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{name} {len} {kind}: GPU cannot read CPU output: {e}"));
                assert!(back == data, "{name} {len} {kind}: GPU decodes CPU output to other bytes");
            }
        }
    }
}

#[test]
fn large_batches_of_mixed_sizes_round_trip() {
    let Some(gpu) = gpu() else { return };
    let data = corpus(64 << 20);
    for name in ["gzip-6", "lz4", "zstd-3"] {
        let c = Compression::parse(name).unwrap();
        let mut ops = Vec::new();
        let mut at = 0;
        let mut i = 0;
        while at < data.len() {
            let len = [4096, 65536, 131072, 100_000, 7777][i % 5].min(data.len() - at);
            ops.push((DeviceOp::Compress(c), data[at..at + len].to_vec()));
            at += len;
            i += 1;
        }
        let inputs: Vec<Vec<u8>> = ops.iter().map(|(_, d)| d.clone()).collect();
        let out = gpu.run_blocking(ops);
        let mut stored = 0;
        for (i, (r, input)) in out.into_iter().zip(&inputs).enumerate() {
            let stream = r.unwrap_or_else(|e| panic!("{name} record {i}: {e}"));
            stored += stream.len();
            let back = c.codec.decompress(&stream, input.len()).unwrap();
            assert!(back == *input, "{name} record {i}");
        }
        eprintln!("{name}: ratio {:.2} over {} records", data.len() as f64 / stored as f64, inputs.len());
    }
}

#[test]
fn the_engine_offloads_to_the_gpu_with_every_policy() {
    let Some(gpu) = gpu() else { return };
    let engine = Engine::with_devices(EngineConfig::new(4), vec![Arc::new(gpu)]);
    let data = Arc::new(corpus(32 << 20));
    let (tx, rx) = crossbeam_channel::unbounded();
    let records: Vec<Arc<Vec<u8>>> = data.chunks(128 << 10).map(|c| Arc::new(c.to_vec())).collect();
    let jobs = records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let tx = tx.clone();
            Job {
                request: CompressRequest {
                    data: r.clone(),
                    compression: Compression::parse("gzip-6").unwrap().into(),
                    min_savings: MinSavings::ZFS,
                    checksum: ChecksumKind::Crc32c,
                    offload: Offload::Only("gpu"),
                },
                done: Box::new(move |res| tx.send((i, res)).unwrap()),
            }
        })
        .collect();
    engine.submit(jobs);
    for _ in 0..records.len() {
        let (i, res) = rx.recv_timeout(Duration::from_secs(60)).expect("an answer");
        let Ok(e) = res else { panic!("record {i}") };
        let back = e.codec.decompress(&e.bytes, e.logical_len as usize).unwrap();
        assert!(back == *records[i]);
    }
    let on_gpu = engine.stats().backends[1].compress(Codec::Deflate).records.load(Relaxed);
    eprintln!("{}", engine.snapshot());
    assert!(on_gpu > 0, "nothing ran on the GPU");
}

/// Compresses `records` (all of one size) with Deflate `algorithm` on one lane, a full batch at a
/// time; returns the streams and the seconds the batches took.
fn deflate_with(gpu: &GpuDevice, algorithm: i32, records: &[&[u8]]) -> (Vec<Vec<u8>>, f64) {
    let shared = &gpu.shared;
    let mut lane = LaneState::new(shared).expect("a GPU lane");
    let key = Key { compress: true, codec: Codec::Deflate, algorithm };
    let per_batch = shared.config.max_batch.min(shared.config.batch_bytes / records[0].len()).max(1);
    let started = Instant::now();
    let mut out = Vec::new();
    for batch in records.chunks(per_batch) {
        let lens: Vec<usize> = batch.iter().map(|r| r.len()).collect();
        let results = run_batch(shared, &mut lane, key, batch, &lens).unwrap_or_else(|e| panic!("algorithm {algorithm}: {e}"));
        out.extend(results.into_iter().map(|r| r.unwrap_or_else(|e| panic!("algorithm {algorithm}: {e}"))));
    }
    (out, started.elapsed().as_secs_f64())
}

/// gzip-N on the GPU is the fastest nvCOMP Deflate algorithm that stores the corpus at least as
/// densely as densefs's CPU encoder at level N, within 1% (the highest where none does): the
/// chosen one is no more than 1% less dense than the CPU, and no faster one is clearly (1%)
/// denser. Prints every algorithm's ratio and one lane's speed beside the CPU's levels.
#[test]
fn gzip_levels_map_to_the_fastest_algorithm_as_dense_as_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let data = corpus(32 << 20);
    let records: Vec<&[u8]> = data.chunks(128 << 10).collect();
    let mut gpu_ratio = std::collections::BTreeMap::new();
    for algorithm in DEFLATE_ALGORITHMS {
        let (streams, seconds) = deflate_with(&gpu, algorithm, &records);
        for (stream, record) in streams.iter().zip(&records) {
            let back = Codec::Deflate
                .decompress(stream, record.len())
                .unwrap_or_else(|e| panic!("algorithm {algorithm}: CPU cannot read it: {e}"));
            assert!(back == *record, "algorithm {algorithm}: decodes to other bytes");
        }
        let ratio = data.len() as f64 / streams.iter().map(Vec::len).sum::<usize>() as f64;
        eprintln!("GPU deflate algorithm {algorithm}: ratio {ratio:.3}, one lane {:.2} GB/s", data.len() as f64 / seconds / 1e9);
        gpu_ratio.insert(algorithm, ratio);
    }
    for level in 1..=9 {
        let c = Compression::parse(&format!("gzip-{level}")).unwrap();
        let mut out = vec![0u8; (256 << 10) + 1024];
        let stored: usize = records.iter().map(|r| c.codec.compress(r, &mut out, c.level).unwrap_or(r.len())).sum();
        let cpu = data.len() as f64 / stored as f64;
        let chosen = deflate_algorithm(level);
        eprintln!("CPU gzip-{level}: ratio {cpu:.3}; mapped to algorithm {chosen} ({:.3})", gpu_ratio[&chosen]);
        let highest = *DEFLATE_ALGORITHMS.last().unwrap();
        assert!(gpu_ratio[&chosen] >= 0.99 * cpu || chosen == highest, "gzip-{level}: CPU ratio {cpu:.3}, GPU {gpu_ratio:?}");
        for faster in DEFLATE_ALGORITHMS.into_iter().filter(|&a| a < chosen) {
            assert!(gpu_ratio[&faster] < 1.01 * cpu, "gzip-{level}: algorithm {faster} would do (CPU ratio {cpu:.3}, GPU {gpu_ratio:?})");
        }
    }
}

/// What a lane of the default configuration allocates, from nvCOMP's size queries on the GPU
/// (zstd's needs one): the README's figures, about 256 MiB page-locked on the host and at least
/// 2.4 GiB on the GPU (Deflate's scratch alone is 33 times a 64 MiB batch).
#[test]
fn a_default_lane_takes_what_the_readme_says() {
    let Some(gpu) = gpu() else { return };
    const MIB: usize = 1 << 20;
    let sizes = LaneSizes::of(&gpu.shared.nv, &GpuConfig::default()).unwrap();
    eprintln!("one lane: {sizes:?}, {} MiB of GPU memory", sizes.device_bytes() / MIB);
    let host = sizes.input + sizes.output + sizes.meta;
    assert!((240 * MIB..272 * MIB).contains(&host), "{sizes:?}");
    assert!(sizes.device_bytes() >= 2300 * MIB, "{sizes:?}");
}

#[test]
fn lanes_are_cut_to_what_fits_in_the_gpu_memory_given() {
    const GIB: usize = 1 << 30;
    let lane = 2400 << 20;
    assert_eq!(lanes_that_fit(4, 70 * GIB, lane), 4);
    assert_eq!(lanes_that_fit(4, 5 * GIB, lane), 2);
    assert_eq!(lanes_that_fit(4, GIB, lane), 1, "one lane is tried, and its allocation says what is missing");
    assert_eq!(lanes_that_fit(4, 0, lane), 1);
    assert_eq!(lanes_that_fit(2, 70 * GIB, lane), 2);
}

//! Engine policies proven with the fault-injecting device: whatever the device does, every record
//! gets exactly one result, and that result decodes back to the record.

use super::faulty::{FaultSpec, FaultyDevice};
use super::stats::Fallback;
use super::*;
use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;

pub(super) fn fastq_like(records: usize, record_size: usize, seed: u64) -> Vec<Arc<Vec<u8>>> {
    let mut x = seed.max(1);
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..records)
        .map(|_| {
            let mut v = Vec::with_capacity(record_size);
            while v.len() < record_size {
                let n = next();
                v.extend_from_slice(b"@read:");
                v.extend_from_slice((n % 100_000).to_string().as_bytes());
                v.push(b'\n');
                for i in 0..40 {
                    v.push(b"ACGT"[((n >> (i % 60)) & 3) as usize]);
                }
                v.extend_from_slice(b"\n+\n");
                for i in 0..40 {
                    v.push(b'5' + ((n >> (i % 50)) & 7) as u8);
                }
                v.push(b'\n');
            }
            v.truncate(record_size);
            Arc::new(v)
        })
        .collect()
}

pub(super) fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.max(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn request(data: Arc<Vec<u8>>, compression: &str, offload: Offload) -> CompressRequest {
    CompressRequest {
        data,
        compression: crate::codec::Setting::parse(compression).unwrap(),
        min_savings: MinSavings::ZFS,
        checksum: ChecksumKind::Crc32c,
        offload,
    }
}

/// Compresses every record, checks each answer arrives once and decodes back, and returns them.
fn compress_and_check(engine: &Engine, records: &[Arc<Vec<u8>>], compression: &str, offload: Offload) -> Vec<Encoded> {
    compress_spaced_and_check(engine, records, compression, offload, Duration::ZERO)
}

/// As `compress_and_check`, submitting one record every `spacing` (a writer filling records, as
/// the file system submits them) instead of all at once when `spacing` is zero.
fn compress_spaced_and_check(
    engine: &Engine,
    records: &[Arc<Vec<u8>>],
    compression: &str,
    offload: Offload,
    spacing: Duration,
) -> Vec<Encoded> {
    let answers: Arc<Mutex<Vec<Vec<Encoded>>>> = Arc::new(Mutex::new(vec![Vec::new(); records.len()]));
    let count = Arc::new(AtomicUsize::new(0));
    let jobs = records
        .iter()
        .enumerate()
        .map(|(i, data)| {
            let (answers, count) = (answers.clone(), count.clone());
            Job {
                request: request(data.clone(), compression, offload),
                done: Box::new(move |r| {
                    let Ok(e) = r else { panic!("record {i}: no compressed answer") };
                    answers.lock().unwrap()[i].push(e);
                    count.fetch_add(1, Ordering::SeqCst);
                }),
            }
        })
        .collect::<Vec<Job>>();
    if spacing.is_zero() {
        engine.submit(jobs);
    } else {
        for job in jobs {
            engine.submit(vec![job]);
            std::thread::sleep(spacing);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while count.load(Ordering::SeqCst) < records.len() {
        assert!(Instant::now() < deadline, "only {} of {} records answered", count.load(Ordering::SeqCst), records.len());
        std::thread::sleep(Duration::from_millis(2));
    }
    // Late device answers must not produce a second result.
    std::thread::sleep(Duration::from_millis(100));
    let answers = std::mem::take(&mut *answers.lock().unwrap());
    answers
        .into_iter()
        .zip(records)
        .enumerate()
        .map(|(i, (mut got, data))| {
            assert_eq!(got.len(), 1, "record {i} answered {} times", got.len());
            let e = got.pop().unwrap();
            let back = policy::decode_record(&DecompressRequest::of(&e, ChecksumKind::Crc32c))
                .unwrap_or_else(|err| panic!("record {i} does not decode: {err}"));
            assert!(back == **data, "record {i} decodes to different bytes");
            e
        })
        .collect()
}

fn engine_with(spec: &str, tweak: impl FnOnce(&mut EngineConfig)) -> Engine {
    let spec = FaultSpec::parse(spec).unwrap();
    let mut config = EngineConfig::new(2);
    spec.tune(&mut config);
    tweak(&mut config);
    Engine::with_devices(config, vec![Arc::new(FaultyDevice::new(spec))])
}

fn records_on(engine: &Engine, backend: usize) -> u64 {
    let b = &engine.stats().backends[backend];
    [Codec::Lz4, Codec::Deflate, Codec::Zstd].iter().map(|&c| b.compress(c).records.load(Ordering::Relaxed)).sum()
}

fn fallbacks_total(engine: &Engine) -> u64 {
    Fallback::ALL.iter().map(|&f| engine.stats().fallbacks(f)).sum()
}

#[test]
fn a_healthy_device_takes_every_record_and_counters_add_up() {
    let engine = engine_with("capacity=1000", |_| {});
    let records = fastq_like(64, 128 << 10, 1);
    let out = compress_and_check(&engine, &records, "gzip-6", Offload::Only("faulty"));
    assert!(out.iter().all(|e| e.codec == Codec::Deflate));
    assert_eq!(records_on(&engine, 1), 64);
    assert_eq!(records_on(&engine, 0), 0);
    assert_eq!(fallbacks_total(&engine), 0);
    let gz = engine.stats().backends[1].compress(Codec::Deflate);
    assert_eq!(gz.bytes_in.load(Ordering::Relaxed), 64 * (128 << 10));
    assert_eq!(gz.bytes_out.load(Ordering::Relaxed), out.iter().map(|e| e.bytes.len() as u64).sum::<u64>());
}

#[test]
fn a_saturated_device_hands_records_to_the_cpu_instead_of_waiting() {
    let engine = engine_with("capacity=2,latency_us=3000", |_| {});
    let records = fastq_like(100, 64 << 10, 2);
    compress_and_check(&engine, &records, "gzip-1", Offload::Only("faulty"));
    let saturated = engine.stats().fallbacks(Fallback::Saturated);
    assert!(saturated > 0, "nothing fell back");
    // Each record ran once: on the device, or on the CPU after being handed back.
    assert_eq!(records_on(&engine, 1) + records_on(&engine, 0), 100);
    assert_eq!(records_on(&engine, 0), saturated);
}

#[test]
fn offload_auto_shares_records_with_the_cpu_when_the_device_falls_behind() {
    // One record at a time, 30 ms each: far slower than a CPU worker's gzip-1, never full.
    let engine = engine_with("capacity=1000,workers=1,latency_us=30000", |_| {});
    let records = fastq_like(48, 64 << 10, 4);
    // The device shows its speed first (the CPU has not compressed yet).
    compress_and_check(&engine, &records[..2], "gzip-1", Offload::Auto);
    assert_eq!(records_on(&engine, 1), 2);
    compress_spaced_and_check(&engine, &records, "gzip-1", Offload::Auto, Duration::from_millis(1));
    let (cpu, device) = (records_on(&engine, 0), records_on(&engine, 1) - 2);
    assert_eq!(cpu + device, 48);
    assert_eq!(fallbacks_total(&engine), 0, "the CPU's share is no fallback");
    assert!(device >= 1 && cpu >= 24, "device {device}, CPU {cpu}: the CPU should take most");
    // offload=faulty (the device alone) still sends it everything.
    compress_and_check(&engine, &records[..8], "gzip-1", Offload::Only("faulty"));
    assert_eq!(records_on(&engine, 0), cpu);
}

#[test]
fn device_errors_garbage_and_hangs_lose_nothing_and_the_device_comes_back() {
    let engine = engine_with("error=0.04,garbage=0.04,hang=0.04,timeout_ms=60,backoff_ms=2,capacity=64,latency_us=100", |_| {});
    let mut all = 0u64;
    for round in 0..60 {
        let records = fastq_like(12, 32 << 10, 10 + round);
        compress_and_check(&engine, &records, "zstd-3", Offload::Only("faulty"));
        all += 12;
        if engine.stats().fallbacks(Fallback::Timeout) > 0
            && engine.stats().fallbacks(Fallback::Garbage) > 0
            && engine.stats().fallbacks(Fallback::Error) > 0
            && round > 20
        {
            break;
        }
    }
    let s = engine.stats();
    let device = &s.backends[1];
    let errors = device.errors.load(Ordering::Relaxed);
    assert!(s.fallbacks(Fallback::Error) > 0 && s.fallbacks(Fallback::Garbage) > 0 && s.fallbacks(Fallback::Timeout) > 0);
    assert_eq!(errors, s.fallbacks(Fallback::Error) + s.fallbacks(Fallback::Garbage) + s.fallbacks(Fallback::Timeout));
    assert!(device.resets.load(Ordering::Relaxed) > 0, "the device was never re-initialised");
    assert!(records_on(&engine, 1) > 0);
    // Every record was compressed exactly once successfully; the CPU did every fallback.
    assert_eq!(records_on(&engine, 0) + records_on(&engine, 1), all);
    assert_eq!(records_on(&engine, 0), fallbacks_total(&engine));
}

#[test]
fn a_device_that_fails_to_reinitialise_is_retried_with_growing_backoff() {
    let engine = engine_with("error=1,reset_fail=0.7,backoff_ms=50,capacity=8", |c| c.backoff.1 = Duration::from_millis(100));
    for round in 0..5 {
        compress_and_check(&engine, &fastq_like(40, 16 << 10, 30 + round), "gzip-6", Offload::Only("faulty"));
        // The device failed on those (at the latest in round 0, when it was up) and stays down
        // for its back-off: records offered right away go to the CPU without touching it. (A
        // single batch can be queued whole before the failure shows, on a busy machine.)
        compress_and_check(&engine, &fastq_like(8, 16 << 10, 60 + round), "gzip-6", Offload::Only("faulty"));
        std::thread::sleep(Duration::from_millis(30));
    }
    // Re-initialisation is retried (70% of attempts fail) until one succeeds.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while engine.stats().backends[1].resets.load(Ordering::Relaxed) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = engine.stats();
    assert_eq!(records_on(&engine, 1), 0);
    assert_eq!(records_on(&engine, 0), 240);
    assert!(s.fallbacks(Fallback::Unavailable) > 0, "records kept going to a failed device");
    assert!(s.backends[1].resets.load(Ordering::Relaxed) > 0, "no re-initialisation succeeded");
}

#[test]
fn records_outside_the_size_window_and_unsupported_codecs_stay_on_the_cpu() {
    let engine = engine_with("", |c| c.offload_window = (8 << 10, 64 << 10));
    compress_and_check(&engine, &fastq_like(10, 4 << 10, 3), "gzip-6", Offload::Only("faulty"));
    compress_and_check(&engine, &fastq_like(10, 128 << 10, 4), "gzip-6", Offload::Only("faulty"));
    assert_eq!(engine.stats().fallbacks(Fallback::Size), 20);
    compress_and_check(&engine, &fastq_like(10, 32 << 10, 5), "lzjb", Offload::Only("faulty"));
    assert_eq!(engine.stats().fallbacks(Fallback::Unsupported), 10);
    compress_and_check(&engine, &fastq_like(10, 32 << 10, 6), "gzip-6", Offload::Cpu);
    assert_eq!(records_on(&engine, 1), 0);
}

#[test]
fn verification_can_be_turned_off_and_then_garbage_is_not_caught() {
    // Shows what `verify` buys: without it a lying device's output would be stored.
    let engine = engine_with("garbage=1,capacity=64", |c| c.verify = false);
    let records = fastq_like(20, 64 << 10, 7);
    let (tx, rx) = crossbeam_channel::unbounded();
    let jobs = records
        .iter()
        .map(|d| {
            let tx = tx.clone();
            Job { request: request(d.clone(), "gzip-6", Offload::Only("faulty")), done: Box::new(move |r| tx.send(r).unwrap()) }
        })
        .collect();
    engine.submit(jobs);
    let mut bad = 0;
    for _ in 0..20 {
        let Ok(e) = rx.recv_timeout(Duration::from_secs(10)).unwrap() else { panic!() };
        let out = e.codec.decompress(&e.bytes, e.logical_len as usize);
        if e.codec == Codec::Off || out.as_ref().map_or(true, |out| records.iter().all(|r| **r != *out)) {
            bad += 1;
        }
    }
    assert!(bad > 0);
}

#[test]
fn precheck_skips_random_data_and_keeps_every_ratio_on_compressible_data() {
    let engine = Engine::new(2);
    let noise: Vec<Arc<Vec<u8>>> = (0..8).map(|i| Arc::new(random(128 << 10, 100 + i))).collect();
    let out = compress_and_check(&engine, &noise, "gzip-9", Offload::Cpu);
    assert!(out.iter().all(|e| e.codec == Codec::Off));
    assert_eq!(engine.snapshot()["records"]["precheck_skipped"], 8);
    // Data of several kinds: with and without the pre-check, the same bytes are stored.
    let mut mixed: Vec<Vec<u8>> = fastq_like(4, 128 << 10, 9).into_iter().map(|a| (*a).clone()).collect();
    let block = random(4096, 5);
    mixed.push(block.iter().cycle().take(128 << 10).copied().collect()); // random, but repeated
    let mut half = random(64 << 10, 6);
    half.extend(vec![b'x'; 64 << 10]);
    mixed.push(half);
    mixed.push((0..128u32 << 10).map(|i| (i % 251) as u8).collect());
    for setting in ["gzip-6", "zstd-3", "zstd-19"] {
        for d in &mixed {
            let c = crate::codec::Compression::parse(setting).unwrap();
            let with = policy::encode_record(d, c, MinSavings::ZFS, ChecksumKind::Crc32c, true).0;
            let without = policy::encode_record(d, c, MinSavings::ZFS, ChecksumKind::Crc32c, false).0;
            assert_eq!(with, without, "{setting}: the pre-check changed what is stored");
        }
    }
}

#[test]
fn auto_picks_by_data_and_load_and_records_its_choice() {
    use policy::{choose_auto, AutoTarget};
    let text = policy::sample_entropy(&fastq_like(1, 128 << 10, 1)[0]);
    let noise = policy::sample_entropy(&random(128 << 10, 1));
    assert!(text < 6.0 && noise > 7.8, "entropy {text} {noise}");
    let idle = AutoTarget::Cpu { backlog_per_worker: 0.0 };
    assert_eq!(choose_auto(text, MinSavings::ZFS, idle).to_string(), "zstd-3");
    assert_eq!(choose_auto(text, MinSavings::ZFS, AutoTarget::Cpu { backlog_per_worker: 5.0 }).to_string(), "zstd-1");
    assert_eq!(choose_auto(text, MinSavings::ZFS, AutoTarget::Cpu { backlog_per_worker: 100.0 }).to_string(), "gzip-1");
    assert_eq!(choose_auto(text, MinSavings::ZFS, AutoTarget::Accelerator).to_string(), "gzip-6");
    assert_eq!(choose_auto(noise, MinSavings::ZFS, AutoTarget::Accelerator).to_string(), "lz4");
    // Through the engine: each record's descriptor fields name the codec it got.
    let engine = Engine::new(2);
    let out = compress_and_check(&engine, &fastq_like(8, 128 << 10, 2), "auto", Offload::Cpu);
    assert!(out.iter().all(|e| matches!(e.codec, Codec::Zstd | Codec::Deflate)));
    let chosen: u64 = engine.snapshot()["auto"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(chosen, 8);
    // With an accelerator: gzip there.
    let engine = engine_with("capacity=100", |_| {});
    let out = compress_and_check(&engine, &fastq_like(8, 128 << 10, 3), "auto", Offload::Auto);
    assert!(out.iter().all(|e| e.codec == Codec::Deflate));
}

#[test]
fn auto_backs_off_to_gzip_1_because_its_encoder_runs_at_lz4_speed_with_more_ratio() {
    // Why a CPU far behind gets gzip-1 and not lz4: gzip-1 is ISA-L's encoder, measured at
    // lz4's speed on the real FASTQ (bench/results/deflate-encoders.md), and it keeps more.
    // If gzip-1 goes back to a slower encoder, auto's last step must go back to lz4.
    use crate::codec::deflate::{encoder, Encoder};
    use policy::{choose_auto, AutoTarget};
    let far_behind = AutoTarget::Cpu { backlog_per_worker: 1000.0 };
    let data = fastq_like(1, 128 << 10, 7).remove(0);
    let chosen = choose_auto(policy::sample_entropy(&data), MinSavings::ZFS, far_behind);
    assert_eq!(chosen.to_string(), "gzip-1");
    assert!(matches!(encoder(1), Encoder::Isal(_)), "gzip-1 is {}, not ISA-L", encoder(1));
    let mut out = vec![0u8; data.len()];
    let gzip = chosen.codec.compress(&data, &mut out, chosen.level).unwrap();
    let lz4 = Codec::Lz4.compress(&data, &mut out, 0).unwrap();
    assert!(gzip * 5 < lz4 * 4, "gzip-1 {gzip} bytes vs lz4 {lz4}: no longer worth lz4's place");
}

#[test]
fn offload_parses_and_prints() {
    for s in ["auto", "cpu", "gpu"] {
        assert_eq!(Offload::parse(s).unwrap().to_string(), s);
    }
    assert!(Offload::parse("tpu").is_err());
}

#[test]
fn the_device_table_names_each_device_once_and_offload_takes_its_names() {
    for (i, row) in DEVICES.iter().enumerate() {
        assert!(DEVICES[..i].iter().all(|d| d.name != row.name), "{} twice", row.name);
        assert!(!["auto", "cpu"].contains(&row.name));
        assert_eq!(Offload::parse(row.name).unwrap(), Offload::Only(row.name));
    }
    // Test devices are accepted (a test mount names them) but not offered in messages.
    assert_eq!(offload_names(), "auto, cpu or gpu");
    let e = Offload::parse("tpu").unwrap_err();
    assert_eq!(e, "invalid offload 'tpu' (auto, cpu or gpu)");
    let faulty = DEVICES.iter().find(|d| d.name == "faulty").unwrap();
    assert!(faulty.test_only);
    assert_eq!(FaultyDevice::new(FaultSpec::default()).name(), faulty.name);
}

fn stored(engine: &Engine, records: &[Arc<Vec<u8>>], name: &str) -> Vec<DecompressRequest> {
    records
        .iter()
        .map(|r| {
            let e = engine.compress_here(&request(r.clone(), name, Offload::Cpu)).expect("a CPU-only engine compresses here");
            DecompressRequest::of(&e, ChecksumKind::Crc32c)
        })
        .collect()
}

#[test]
fn a_batch_decodes_in_order_and_keeps_each_records_error() {
    let engine = Engine::new(2);
    let records = fastq_like(12, 128 << 10, 11);
    let mut requests = stored(&engine, &records, "zstd-3");
    requests[5].checksum ^= 1;
    let results = engine.decompress_all(requests);
    assert_eq!(results.len(), records.len());
    for (i, (result, data)) in results.iter().zip(&records).enumerate() {
        match result {
            Err(EngineError::ChecksumMismatch) if i == 5 => {}
            Ok(bytes) if i != 5 => assert!(bytes == &**data, "record {i} decodes to different bytes"),
            other => panic!("record {i}: {:?}", other.as_ref().map(|b| b.len())),
        }
    }
}

#[test]
fn a_batch_is_decoded_by_its_caller_while_every_worker_is_busy() {
    // Both workers held: before shared.rs the batch waited for them.
    let engine = Engine::new(2);
    let (release, held) = crossbeam_channel::unbounded::<()>();
    let (started_tx, started) = crossbeam_channel::unbounded::<()>();
    for _ in 0..2 {
        let (held, started_tx) = (held.clone(), started_tx.clone());
        engine
            .inner
            .cpu
            .spawn(Box::new(move || {
                started_tx.send(()).unwrap();
                let _ = held.recv();
            }))
            .unwrap_or_else(|_| panic!("the pool refused a task"));
    }
    for _ in 0..2 {
        started.recv_timeout(Duration::from_secs(10)).expect("both workers busy");
    }
    let records = fastq_like(8, 128 << 10, 12);
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::scope(|s| {
        let requests = stored(&engine, &records, "lz4");
        let engine = &engine;
        s.spawn(move || tx.send(engine.decompress_all(requests)).unwrap());
        let results = rx.recv_timeout(Duration::from_secs(20));
        drop(release); // let the workers go whatever happened, so the scope can end
        let results = results.expect("the batch waited for busy workers");
        for (i, (result, data)) in results.into_iter().zip(&records).enumerate() {
            assert!(result.expect("decodes") == **data, "record {i} decodes to different bytes");
        }
    });
}

/// The threads `slow_decode` ran on.
static DECODED_ON: Mutex<Vec<std::thread::ThreadId>> = Mutex::new(Vec::new());

fn slow_decode(inner: &Inner, req: &DecompressRequest) -> Result<Vec<u8>, EngineError> {
    DECODED_ON.lock().unwrap().push(std::thread::current().id());
    std::thread::sleep(Duration::from_millis(3));
    inner.decode(req)
}

#[test]
fn an_idle_worker_helps_a_lone_batch_and_a_busy_one_is_not_asked() {
    let engine = Engine::new(2);
    let records = fastq_like(64, 128 << 10, 13);
    let results = engine.inner.decode_shared(stored(&engine, &records, "gzip-6"), slow_decode);
    for (i, (result, data)) in results.into_iter().zip(&records).enumerate() {
        assert!(result.expect("decodes") == **data, "record {i} decodes to different bytes");
    }
    let mut threads = std::mem::take(&mut *DECODED_ON.lock().unwrap());
    let mine = threads.iter().filter(|&&t| t == std::thread::current().id()).count();
    threads.sort_unstable_by_key(|t| format!("{t:?}"));
    threads.dedup();
    assert!(mine > 0 && mine < records.len() && threads.len() == 2, "the caller decoded {mine} of 64, on {} threads", threads.len());
    // Everyone counted out again: the next lone batch may ask one helper (two cores). A helper
    // counts itself out after its last record, which the caller may have collected first.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while engine.inner.decoders.join(8, 2) != 1 {
        engine.inner.decoders.leave(); // no helper asked: only the caller was counted in
        assert!(std::time::Instant::now() < deadline, "a helper never counted itself out");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(engine.inner.decoders.join(8, 2), 0, "no helper while every core decodes");
}

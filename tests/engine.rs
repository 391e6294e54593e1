//! The compression service engine through real mounts: offload to the fault-injecting test
//! accelerator under a random write workload, its counters, `densefs iostat`, `densefs get`,
//! `compression=auto`, `offload=` errors and `densefs bench engine`.

mod common;

use common::{compressible, random_bytes, Dirs, Mount, BIN};
use serde_json::Value;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output};

const FAULTY: &str = "DENSEFS_TEST_ACCELERATOR";

fn densefs(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run densefs")
}

fn ok(out: Output) -> String {
    assert!(out.status.success(), "densefs failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn engine_counters(mnt: &Path) -> Value {
    let text = ok(densefs(&["get", "-H", "-p", "-o", "property,value", "all", mnt.to_str().unwrap()]));
    let mut map = serde_json::Map::new();
    for line in text.lines() {
        let (k, v) = line.split_once('\t').unwrap();
        map.insert(k.to_string(), Value::String(v.to_string()));
    }
    Value::Object(map)
}

fn num(v: &Value, key: &str) -> u64 {
    v[key].as_str().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Random writes, overwrites and truncates on several files from several threads, mirrored in
/// memory; returns the expected contents.
fn workload(m: &Mount, files: usize, seed: u64) -> Vec<(String, Vec<u8>)> {
    let handles: Vec<_> = (0..files)
        .map(|f| {
            let path = m.path(&format!("f{f}"));
            std::thread::spawn(move || {
                let mut model: Vec<u8> = Vec::new();
                let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
                let mut x = seed * 1000 + f as u64 + 1;
                let mut rnd = move |n: u64| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % n
                };
                for op in 0..60 {
                    let off = rnd(3 << 20);
                    let len = 1 + rnd(400 << 10) as usize;
                    let data = if op % 7 == 3 { random_bytes(len, off) } else { compressible(len, off + op) };
                    // Every write must succeed, whatever the accelerator does.
                    file.write_all_at(&data, off).unwrap_or_else(|e| panic!("write failed: {e}"));
                    let end = off as usize + len;
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[off as usize..end].copy_from_slice(&data);
                    if op % 20 == 19 {
                        let to = rnd(model.len() as u64 + 1);
                        file.set_len(to).unwrap();
                        model.truncate(to as usize);
                    }
                    if op % 15 == 14 {
                        file.sync_all().unwrap();
                    }
                }
                (path.file_name().unwrap().to_str().unwrap().to_string(), model)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn check_files(m: &Mount, expected: &[(String, Vec<u8>)]) {
    for (name, model) in expected {
        let got = fs::read(m.path(name)).unwrap();
        assert_eq!(got.len(), model.len(), "{name}: size");
        assert!(got == *model, "{name}: contents differ");
    }
}

#[test]
fn a_failing_accelerator_loses_no_record_and_its_counters_add_up() {
    let d = Dirs::new();
    let spec = "error=0.03,garbage=0.03,hang=0.02,timeout_ms=300,backoff_ms=20,capacity=6,latency_us=300,seed=11";
    let m = Mount::with_env(&d.lower, &d.mnt, "compression=gzip-6,offload=faulty", &[(FAULTY, spec)]);
    let expected = workload(&m, 4, 1);
    check_files(&m, &expected);
    // The workload's fsyncs land records with lz4 or uncompressed (gzip-6 follows later).
    let on_cpu = |c: &Value| num(c, "engine.cpu.compress.gzip.records") + num(c, "engine.cpu.compress.lz4.records");
    let fallbacks = |c: &Value| -> u64 {
        ["size", "unsupported", "saturated", "unavailable", "precheck", "error", "timeout", "garbage", "drained"]
            .iter()
            .map(|k| num(c, &format!("engine.fallbacks.{k}")))
            .sum()
    };
    // A fallback is counted when it is decided, its CPU compression when that ends; a record a
    // truncate dropped is not waited for, and its job may still be on the device (hung until
    // the 300 ms timeout) or on the CPU after the files read back.
    let mut c = Value::Null;
    common::wait_up_to("every fallback's CPU compression to end", 60, || {
        c = engine_counters(&m.mnt);
        on_cpu(&c) >= fallbacks(&c) + num(&c, "engine.holes")
    });
    let (on_device, on_cpu, fallbacks) = (num(&c, "engine.faulty.compress.gzip.records"), on_cpu(&c), fallbacks(&c));
    assert!(on_device > 0, "nothing was offloaded: {c}");
    assert!(num(&c, "engine.fallbacks.saturated") > 0, "{c}");
    assert!(num(&c, "engine.faulty.errors") > 0, "no failure was injected: {c}");
    assert_eq!(
        num(&c, "engine.faulty.errors"),
        num(&c, "engine.fallbacks.error") + num(&c, "engine.fallbacks.garbage") + num(&c, "engine.fallbacks.timeout"),
        "{c}"
    );
    // Every record compressed on the CPU is a fallback, or all zeros (nothing to offload).
    assert_eq!(on_cpu, fallbacks + num(&c, "engine.holes"), "{c}");
    assert!(c["offload"].as_str() == Some("faulty"), "{c}");
    m.unmount();
    // Records the accelerator wrote read back on a machine without it.
    let m = Mount::new(&d.lower, &d.mnt, "");
    check_files(&m, &expected);
    let scrub = densefs(&["scrub", m.mnt.to_str().unwrap()]);
    assert!(scrub.status.success(), "scrub: {}", String::from_utf8_lossy(&scrub.stdout));
    m.unmount();
}

#[test]
fn iostat_get_and_auto_show_what_the_engine_does() {
    let d = Dirs::new();
    let m = Mount::with_env(&d.lower, &d.mnt, "compression=auto", &[(FAULTY, "capacity=64")]);
    let data = compressible(8 << 20, 3);
    fs::write(m.path("a"), &data).unwrap();
    fs::write(m.path("noise"), random_bytes(2 << 20, 4)).unwrap();
    assert_eq!(fs::read(m.path("a")).unwrap(), data);
    // compression=auto with a healthy accelerator: gzip there (the header says auto, records gzip),
    // and what the CPU takes while the device is busy gets the CPU's choice (zstd).
    let st = ok(densefs(&["stat", "--json", m.path("a").to_str().unwrap()]));
    let st: Value = serde_json::from_str(&st).unwrap();
    assert!(st.to_string().contains("gzip"), "{st}");
    let c = engine_counters(&m.mnt);
    assert!(num(&c, "engine.auto.gzip") + num(&c, "engine.auto.zstd") >= 64, "{c}");
    assert!(num(&c, "engine.auto.gzip") >= 1, "{c}");
    assert_eq!(num(&c, "engine.faulty.compress.gzip.records"), num(&c, "engine.auto.gzip"), "{c}");
    assert!(num(&c, "engine.auto.lz4") >= 16, "random data gets the cheapest try: {c}");
    assert_eq!(c["engine.backends"].as_str(), Some("cpu(up),faulty(up)"));
    // offload is a property like the others.
    fs::create_dir(m.path("cold")).unwrap();
    ok(densefs(&["set", "offload=cpu", m.path("cold").to_str().unwrap()]));
    let v = ok(densefs(&["get", "-H", "-o", "value,source", "offload", m.path("cold").to_str().unwrap()]));
    assert_eq!(v.trim(), "cpu\tlocal");
    let before = num(&engine_counters(&m.mnt), "engine.faulty.compress.gzip.records");
    fs::write(m.path("cold/b"), compressible(4 << 20, 5)).unwrap();
    let after = engine_counters(&m.mnt);
    assert_eq!(num(&after, "engine.faulty.compress.gzip.records"), before, "offload=cpu still offloaded");
    // iostat: a header, a total line and one line per interval, with numbers.
    let out = ok(densefs(&["iostat", "-w", "0.2", "-c", "3", m.mnt.to_str().unwrap()]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    let total: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(total[0], "total");
    assert!(total[1].parse::<f64>().unwrap() > 0.0, "{out}");
    assert!(total[3].parse::<f64>().unwrap() > 2.0, "ratio: {out}");
    m.unmount();
}

#[test]
fn offload_to_a_missing_device_is_a_clear_mount_error() {
    let d = Dirs::new();
    let out = Command::new(BIN).args(["mount", "-f", "-o", "offload=gpu"]).arg(&d.lower).arg(&d.mnt).env_remove(FAULTY).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("offload=gpu: no gpu backend available"), "{err}");
    let out = Command::new(BIN).args(["mount", "-o", "offload=tpu"]).arg(&d.lower).arg(&d.mnt).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid offload 'tpu'"));
}

#[test]
fn bench_engine_prints_one_line_per_backend_and_algorithm() {
    let d = Dirs::new();
    let file = d.root.path().join("data");
    fs::write(&file, compressible(4 << 20, 9)).unwrap();
    let out = Command::new(BIN)
        .args(["bench", "engine", "--backend", "all", "--compression", "lz4,gzip-6", "--json"])
        .arg(&file)
        .env(FAULTY, "capacity=1000")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let pairs: Vec<(String, String)> =
        rows.iter().map(|r| (r["backend"].as_str().unwrap().to_string(), r["algorithm"].as_str().unwrap().to_string())).collect();
    let expected = [("cpu", "lz4"), ("cpu", "gzip-6"), ("faulty", "lz4"), ("faulty", "gzip-6"), ("auto", "lz4"), ("auto", "gzip-6")];
    assert_eq!(pairs, expected.map(|(a, b)| (a.into(), b.into())));
    for r in rows {
        assert!(r["ratio"].as_f64().unwrap() > 2.0 && r["compress_gbps"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert_eq!(rows[3]["offloaded"].as_f64(), Some(1.0));
    // auto: the device's share of the records, whatever it was.
    assert!((0.0..=1.0).contains(&rows[5]["offloaded"].as_f64().unwrap()), "{}", rows[5]);
    // The CPU and the device store gzip-6 with the same ratio (same codec underneath here).
    assert!((rows[1]["ratio"].as_f64().unwrap() - rows[3]["ratio"].as_f64().unwrap()).abs() < 1e-9);
    let out = Command::new(BIN).args(["bench", "engine", "--backend", "gpu"]).arg(&file).env_remove(FAULTY).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no gpu backend"));
}

/// How `densefs stat --json` counts the file's records, by codec.
fn records_by_codec(file: &Path) -> Value {
    let st: Value = serde_json::from_str(&ok(densefs(&["stat", "--json", file.to_str().unwrap()]))).unwrap();
    st[0]["stats"]["records"].clone()
}

fn used(file: &Path) -> u64 {
    let st: Value = serde_json::from_str(&ok(densefs(&["stat", "--json", file.to_str().unwrap()]))).unwrap();
    st[0]["stats"]["used"].as_u64().unwrap()
}

/// Writes 1 MiB and fsyncs it, then changes 100 bytes in each of its 8 records with an fsync after
/// each (a database's pattern); returns the contents.
fn write_with_small_fsyncs(file: &fs::File) -> Vec<u8> {
    let mut data = compressible(1 << 20, 11);
    file.write_all_at(&data, 0).unwrap();
    file.sync_all().unwrap();
    for record in 0..8 {
        let at = record * 131072 + 500;
        data[at..at + 100].fill(b'x');
        file.write_all_at(&data[at..at + 100], at as u64).unwrap();
        file.sync_data().unwrap();
    }
    data
}

#[test]
fn an_fsync_waits_for_no_slow_codec_and_the_file_gets_its_codec_back_when_quiet_or_closed() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=gzip-6");
    let gzip_6: Value = serde_json::json!({ "gzip-6": 8 });
    // Kept open: each fsync landed its one changed record uncompressed (ZFS's intent log keeps
    // small sync writes so); the writeback tick re-encodes them with gzip-6 once a tick passed
    // without another fsync of them.
    let open = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.path("open")).unwrap();
    let data = write_with_small_fsyncs(&open);
    // On a slow machine the tick may already have re-encoded the records fsynced first (those a
    // tick passed over without another fsync); the last one's fsync was just now.
    let records = records_by_codec(&m.path("open"));
    let (raw, gzip) = (records["raw"].as_u64().unwrap_or(0), records["gzip-6"].as_u64().unwrap_or(0));
    assert!(raw > 0 && raw + gzip == 8, "the fsyncs landed uncompressed: {records}");
    assert_eq!(fs::read(m.path("open")).unwrap(), data);
    common::wait_until("the writeback tick to re-encode the fsynced records", || records_by_codec(&m.path("open")) == gzip_6);
    assert_eq!(fs::read(m.path("open")).unwrap(), data);
    drop(open);
    // An fsync of more (all 8 records changed, 1 MiB) lands them with lz4, on every core.
    // Closed right after: the last close re-encodes them, and frees their lz4 copies.
    let closed = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.path("closed")).unwrap();
    let mut data = write_with_small_fsyncs(&closed);
    for record in 0..8 {
        let at = record * 131072 + 9000;
        data[at..at + 100].fill(b'y');
        closed.write_all_at(&data[at..at + 100], at as u64).unwrap();
    }
    closed.sync_data().unwrap();
    assert_eq!(records_by_codec(&m.path("closed")), serde_json::json!({ "lz4": 8 }));
    drop(closed);
    fs::write(m.path("copy"), &data).unwrap();
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(records_by_codec(&m.path("closed")), gzip_6);
    assert_eq!(fs::read(m.path("closed")).unwrap(), data);
    // The same bytes written without fsyncs take as much: the lz4 and raw copies were freed.
    // (Up to two blocks more: the lower file system's own index of a file whose copies lie
    // apart, as the rewritten ones do, where the copy's lie packed.)
    let (closed, copy) = (used(&m.path("closed")), used(&m.path("copy")));
    assert!(closed >= copy && closed <= copy + 8192, "{closed} bytes used against {copy} written without fsyncs");
    m.unmount();
}

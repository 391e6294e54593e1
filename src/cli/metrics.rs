//! Prometheus metrics: the daemon's counters (the engine's snapshot, `user.densefs.engine`) in
//! Prometheus's text format, served by the daemon at `http://ADDR:PORT/metrics` with
//! `-o metrics=ADDR:PORT`, and printed by `densefs metrics MOUNT` (for node exporter's textfile
//! collector). One renderer for both, so a scrape and the command say the same.

use super::client;
use crate::control::Control;
use serde_json::Value;
use std::fmt::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;

/// `densefs metrics MOUNT`
pub fn run(mount: &Path) -> Result<(), String> {
    client::require_densefs(mount)?;
    let snapshot = client::report(mount, Control::Engine)?;
    print!("{}", render(&snapshot));
    Ok(())
}

/// Where `-o metrics=ADDR:PORT` serves: a loopback address unless `public` (the counters say
/// what the machine is doing; only the administrator opens them to the network).
pub fn listen_address(spec: &str, public: bool) -> Result<SocketAddr, String> {
    let addr = spec
        .to_socket_addrs()
        .map_err(|e| format!("metrics={spec}: not an ADDRESS:PORT ({e})"))?
        .next()
        .ok_or_else(|| format!("metrics={spec}: the address resolves to nothing"))?;
    if !addr.ip().is_loopback() && !public {
        return Err(format!("metrics={spec}: not a loopback address; add metrics_public to serve metrics to the network"));
    }
    Ok(addr)
}

/// Serves `/metrics` on `addr` until the process ends: each request renders `snapshot()` anew.
pub fn serve(addr: SocketAddr, snapshot: impl Fn() -> Value + Send + 'static) -> Result<(), String> {
    let server = tiny_http::Server::http(addr).map_err(|e| format!("metrics: cannot listen on {addr}: {e}"))?;
    std::thread::Builder::new()
        .name("densefs-metrics".into())
        .spawn(move || {
            for request in server.incoming_requests() {
                let response = if request.url() == "/metrics" || request.url().starts_with("/metrics?") {
                    let body = render(&snapshot());
                    let header =
                        tiny_http::Header::from_bytes("Content-Type", "text/plain; version=0.0.4; charset=utf-8").expect("BUG: header");
                    tiny_http::Response::from_string(body).with_header(header)
                } else {
                    tiny_http::Response::from_string("densefs: metrics are at /metrics\n").with_status_code(404)
                };
                let _ = request.respond(response);
            }
        })
        .map_err(|e| format!("metrics: cannot start a thread: {e}"))?;
    Ok(())
}

/// One metric family: its HELP and TYPE lines, then its samples.
struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn new<'a>(out: &'a mut String, name: &str, kind: &str, help: &str) -> Family<'a> {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        Family { out }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
        let labels = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
        let _ = writeln!(self.out, "{name}{labels} {value}");
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// The engine's snapshot in Prometheus's text format (version 0.0.4).
pub fn render(s: &Value) -> String {
    let mut out = String::new();
    let rate_wait_seconds = Value::from(num(&s["background"]["rate_waits_ms"]) / 1e3);
    let backends = s["backends"].as_array().cloned().unwrap_or_default();
    // Per codec, summed over the backends: what was written (compressed), stored, and read.
    let codec_sum = |op: &str, field: &str| -> Vec<(String, f64)> {
        let mut sums: std::collections::BTreeMap<String, f64> = Default::default();
        for b in &backends {
            for (codec, c) in b[op].as_object().into_iter().flatten() {
                *sums.entry(codec.clone()).or_default() += num(&c[field]);
            }
        }
        sums.into_iter().collect()
    };
    for (name, op, field, help) in [
        ("densefs_written_bytes_total", "compress", "bytes_in", "Bytes of records handed to a codec to be stored, by codec."),
        ("densefs_stored_bytes_total", "compress", "bytes_out", "Bytes those records became, by codec (what lands on the lower)."),
        ("densefs_read_bytes_total", "decompress", "bytes_out", "Bytes decoded from stored records for readers, by codec."),
    ] {
        let mut f = Family::new(&mut out, name, "counter", help);
        for (codec, v) in codec_sum(op, field) {
            f.sample(name, &[("codec", &codec)], v);
        }
    }
    let name = "densefs_records_total";
    let mut f = Family::new(&mut out, name, "counter", "Records compressed or decompressed, by backend, operation and codec.");
    for b in &backends {
        let backend = b["name"].as_str().unwrap_or("?");
        for op in ["compress", "decompress"] {
            for (codec, c) in b[op].as_object().into_iter().flatten() {
                f.sample(name, &[("backend", backend), ("op", op), ("codec", codec)], num(&c["records"]));
            }
        }
    }
    for (name, field, kind, help) in [
        ("densefs_backend_busy_seconds_total", "busy_s", "counter", "Time each backend spent compressing and decompressing."),
        ("densefs_backend_errors_total", "errors", "counter", "Errors of each backend (records then go to the CPU)."),
        ("densefs_backend_resets_total", "resets", "counter", "Times an accelerator backend was reset after errors."),
    ] {
        let mut f = Family::new(&mut out, name, kind, help);
        for b in &backends {
            f.sample(name, &[("backend", b["name"].as_str().unwrap_or("?"))], num(&b[field]));
        }
    }
    let name = "densefs_backend_up";
    let mut f = Family::new(&mut out, name, "gauge", "1 where the backend takes records, 0 where it is down or disabled.");
    for b in &backends {
        f.sample(name, &[("backend", b["name"].as_str().unwrap_or("?"))], if b["state"] == "up" { 1.0 } else { 0.0 });
    }
    let name = "densefs_offload_fallbacks_total";
    let mut f =
        Family::new(&mut out, name, "counter", "Records an accelerator could have taken that the CPU compressed instead, by reason.");
    for (reason, n) in s["fallbacks"].as_object().into_iter().flatten() {
        f.sample(name, &[("reason", reason)], num(n));
    }
    let name = "densefs_record_outcomes_total";
    let mut f = Family::new(
        &mut out,
        name,
        "counter",
        "Records not stored compressed, by why: holes (all zeros), raw (too little saved), precheck (looked incompressible).",
    );
    for (outcome, key) in [("hole", "holes"), ("raw", "raw_low_savings"), ("precheck", "precheck_skipped")] {
        f.sample(name, &[("outcome", outcome)], num(&s["records"][key]));
    }
    let name = "densefs_auto_choices_total";
    let mut f = Family::new(&mut out, name, "counter", "Records compression=auto gave each codec.");
    for (codec, n) in s["auto"].as_object().into_iter().flatten() {
        f.sample(name, &[("codec", codec)], num(n));
    }
    for (name, value, kind, help) in [
        (
            "densefs_engine_queued_tasks",
            &s["cpu_queued"],
            "gauge",
            "Compression and decompression tasks waiting for a CPU worker (the engine's queue depth).",
        ),
        (
            "densefs_memory_used_bytes",
            &s["memory"]["used"],
            "gauge",
            "File data held in memory: written and not yet stored, being compressed, or cached decoded.",
        ),
        ("densefs_memory_limit_bytes", &s["memory"]["limit"], "gauge", "The mount's cache_size."),
        ("densefs_inodes", &s["inodes"]["known"], "gauge", "Inodes the daemon knows (the kernel holds them)."),
        ("densefs_descriptors", &s["inodes"]["descriptors"], "gauge", "Lower descriptors the daemon holds open."),
        ("densefs_open_files", &s["inodes"]["open_files"], "gauge", "Files open through the mount (handles whose RELEASE is not done)."),
        ("densefs_process_cpu_seconds_total", &s["process_cpu_s"], "counter", "CPU time of the daemon, all threads."),
        ("densefs_background_waiting_files", &s["background"]["waiting_files"], "gauge", "Files waiting for background compression."),
        (
            "densefs_background_waiting_bytes",
            &s["background"]["waiting_bytes"],
            "gauge",
            "Logical bytes of the files waiting for background compression.",
        ),
        ("densefs_background_files_total", &s["background"]["files_done"], "counter", "Files background compression has re-encoded."),
        (
            "densefs_background_in_bytes_total",
            &s["background"]["bytes_in"],
            "counter",
            "Logical bytes of the records background compression re-encoded.",
        ),
        (
            "densefs_background_out_bytes_total",
            &s["background"]["bytes_out"],
            "counter",
            "Bytes those records became with the background codec.",
        ),
        (
            "densefs_background_postponed_total",
            &s["background"]["postponed"],
            "counter",
            "Background passes put off because the file was open (or opened during the pass).",
        ),
        (
            "densefs_background_failed_total",
            &s["background"]["failed"],
            "counter",
            "Background passes that failed (logged; tried again later).",
        ),
        (
            "densefs_background_rate_wait_seconds_total",
            &rate_wait_seconds,
            "counter",
            "Time background compression's threads waited to keep to background_rate.",
        ),
        (
            "densefs_shut_down",
            &s["shut_down"],
            "gauge",
            "1 once the mount was shut down (FS_IOC_SHUTDOWN): every request fails until it is mounted again.",
        ),
    ] {
        Family::new(&mut out, name, kind, help).sample(name, &[], num(value));
    }
    // The mount's statistics (`densefs get`'s, from its counters): absent until they are known.
    let usage = &s["usage"];
    for (name, key, help) in [
        ("densefs_used_bytes", "used", "Bytes the mount's files take on the lower file system (densefs get used)."),
        ("densefs_logical_used_bytes", "logicalused", "Bytes of data the mount's files hold, holes excluded (logicalused)."),
        ("densefs_logical_size_bytes", "written", "The mount's file sizes together, as ls -l shows them (written)."),
        ("densefs_files", "files", "Regular files in the mount (a hard-linked file once)."),
        ("densefs_directories", "directories", "Directories in the mount, its root included."),
    ] {
        let mut f = Family::new(&mut out, name, "gauge", help);
        if !usage.is_null() {
            f.sample(name, &[], num(&usage[key]));
        }
    }
    // Each dataset's (`densefs get` on it), while its counters are known: from its first
    // report on, until a change they cannot follow (README: Properties and statistics).
    for (name, key, help) in [
        ("densefs_dataset_used_bytes", "used", "Bytes a dataset's files take on the lower file system, by dataset path."),
        ("densefs_dataset_logical_used_bytes", "logicalused", "Bytes of data a dataset's files hold, holes excluded, by dataset path."),
        ("densefs_dataset_logical_size_bytes", "written", "A dataset's file sizes together, by dataset path."),
        ("densefs_dataset_files", "files", "Regular files in a dataset, by dataset path."),
    ] {
        let mut f = Family::new(&mut out, name, "gauge", help);
        for d in s["datasets"].as_array().into_iter().flatten() {
            f.sample(name, &[("dataset", d["path"].as_str().unwrap_or(""))], num(&d[key]));
        }
    }
    let name = "densefs_stored_records";
    let mut f = Family::new(&mut out, name, "gauge", "Records the mount's files hold, by how each is stored (a codec, raw or hole).");
    for (kind, n) in usage["records"].as_object().into_iter().flatten() {
        f.sample(name, &[("kind", kind)], num(n));
    }
    let name = "densefs_fuse_requests_total";
    let mut f = Family::new(&mut out, name, "counter", "FUSE requests the kernel sent the daemon, by operation.");
    let requests = s["requests"].as_object().cloned().unwrap_or_default();
    for (op, r) in &requests {
        f.sample(name, &[("op", op)], num(&r["count"]));
    }
    let name = "densefs_fuse_request_duration_seconds";
    let _ = writeln!(out, "# HELP {name} Time the daemon took to answer FUSE requests, by operation.\n# TYPE {name} histogram");
    for (op, r) in &requests {
        let bounds = r["latency_le"].as_array().cloned().unwrap_or_default();
        let counts = r["latency_counts"].as_array().cloned().unwrap_or_default();
        for (le, n) in bounds.iter().zip(&counts) {
            let _ = writeln!(out, "{name}_bucket{{op=\"{op}\",le=\"{}\"}} {}", num(le), num(n));
        }
        // Requests still being answered are in the count of arrivals, not yet here.
        let answered = num(&r["answered"]);
        let _ = writeln!(out, "{name}_bucket{{op=\"{op}\",le=\"+Inf\"}} {answered}");
        let _ = writeln!(out, "{name}_sum{{op=\"{op}\"}} {}", num(&r["seconds"]));
        let _ = writeln!(out, "{name}_count{{op=\"{op}\"}} {answered}");
    }
    out
}

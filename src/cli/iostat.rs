//! `densefs iostat`: the engine's counters as a live view, one line per interval, like
//! `zpool iostat` (the first line covers the time since the mount).

use super::client;
use crate::control::Control;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

/// Totals of one engine snapshot.
#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub struct Totals {
    pub uptime_s: f64,
    pub cpu_s: f64,
    /// Logical bytes compressed, and what was stored for them.
    pub written: f64,
    pub stored: f64,
    /// Of `written`, what accelerators compressed.
    pub offloaded: f64,
    /// Logical bytes decoded.
    pub read: f64,
    pub fallbacks: f64,
    pub errors: f64,
    /// Of `written` and `stored`, what background compression re-encoded and produced.
    pub background_in: f64,
    pub background_out: f64,
}

fn sum_ops(ops: &Value, key: &str) -> f64 {
    ops.as_object().into_iter().flatten().map(|(_, c)| c[key].as_f64().unwrap_or(0.0)).sum()
}

pub fn totals(snapshot: &Value) -> Totals {
    let mut t = Totals {
        uptime_s: snapshot["uptime_s"].as_f64().unwrap_or(0.0),
        cpu_s: snapshot["process_cpu_s"].as_f64().unwrap_or(0.0),
        fallbacks: snapshot["fallbacks"].as_object().into_iter().flatten().map(|(_, v)| v.as_f64().unwrap_or(0.0)).sum(),
        ..Totals::default()
    };
    t.background_in = snapshot["background"]["bytes_in"].as_f64().unwrap_or(0.0);
    t.background_out = snapshot["background"]["bytes_out"].as_f64().unwrap_or(0.0);
    for b in snapshot["backends"].as_array().into_iter().flatten() {
        let written = sum_ops(&b["compress"], "bytes_in");
        t.written += written;
        t.stored += sum_ops(&b["compress"], "bytes_out");
        t.read += sum_ops(&b["decompress"], "bytes_out");
        t.errors += b["errors"].as_f64().unwrap_or(0.0);
        if b["name"] != "cpu" {
            t.offloaded += written;
        }
    }
    // The codecs count the background's work too: written and stored are the users' writes.
    t.written = (t.written - t.background_in).max(0.0);
    t.stored = (t.stored - t.background_out).max(0.0);
    t
}

pub fn header() -> String {
    format!(
        "{:<8} {:>10} {:>10} {:>6} {:>10} {:>6} {:>8} {:>9} {:>7} {:>9} {:>9}\n{:<8} {:>10} {:>10} {:>6} {:>10} {:>6} {:>8} {:>9} {:>7} {:>9} {:>9}",
        "",
        "write",
        "stored",
        "",
        "read",
        "cpu",
        "offload",
        "fallback",
        "device",
        "bg in",
        "bg out",
        "time",
        "MB/s",
        "MB/s",
        "ratio",
        "MB/s",
        "%",
        "%",
        "/s",
        "errors",
        "MB/s",
        "MB/s"
    )
}

/// One line for the interval between two snapshots' totals.
pub fn line(label: &str, before: &Totals, after: &Totals) -> String {
    let dt = (after.uptime_s - before.uptime_s).max(1e-6);
    let written = after.written - before.written;
    let stored = after.stored - before.stored;
    let ratio = if stored > 0.0 { format!("{:.2}", written / stored) } else { "-".into() };
    let offload = if written > 0.0 { format!("{:.0}", 100.0 * (after.offloaded - before.offloaded) / written) } else { "-".into() };
    format!(
        "{:<8} {:>10.1} {:>10.1} {:>6} {:>10.1} {:>6.0} {:>8} {:>9.1} {:>7} {:>9.1} {:>9.1}",
        label,
        written / dt / 1e6,
        stored / dt / 1e6,
        ratio,
        (after.read - before.read) / dt / 1e6,
        100.0 * (after.cpu_s - before.cpu_s) / dt,
        offload,
        (after.fallbacks - before.fallbacks) / dt,
        (after.errors - before.errors) as u64,
        (after.background_in - before.background_in) / dt / 1e6,
        (after.background_out - before.background_out) / dt / 1e6,
    )
}

/// Per backend and algorithm, for -v: records and bytes in the interval.
fn detail(before: &Value, after: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for b in after["backends"].as_array().into_iter().flatten() {
        let name = b["name"].as_str().unwrap_or("?");
        let prev = before["backends"].as_array().into_iter().flatten().find(|p| p["name"] == b["name"]).cloned().unwrap_or(Value::Null);
        for op in ["compress", "decompress"] {
            for (alg, c) in b[op].as_object().into_iter().flatten() {
                let p = &prev[op][alg];
                let d = |k: &str| c[k].as_f64().unwrap_or(0.0) - p[k].as_f64().unwrap_or(0.0);
                if d("records") > 0.0 {
                    out.push(format!(
                        "  {name:<7} {op:<10} {alg:<6} {:>8} records {:>10.1} MB in {:>10.1} MB out  state {}",
                        d("records"),
                        d("bytes_in") / 1e6,
                        d("bytes_out") / 1e6,
                        b["state"].as_str().unwrap_or("?")
                    ));
                }
            }
        }
    }
    out
}

pub fn run(mount: &Path, interval: f64, count: Option<u64>, verbose: bool) -> Result<(), String> {
    let sample = || client::report(mount, Control::Engine);
    let mut prev = sample()?;
    println!("{}", header());
    println!("{}", line("total", &Totals::default(), &totals(&prev)));
    let mut printed = 1;
    while count.is_none_or(|c| printed < c) {
        std::thread::sleep(Duration::from_secs_f64(interval));
        let now = sample()?;
        let label = chrono_like_now();
        println!("{}", line(&label, &totals(&prev), &totals(&now)));
        if verbose {
            detail(&prev, &now).iter().for_each(|l| println!("{l}"));
        }
        prev = now;
        printed += 1;
    }
    Ok(())
}

/// HH:MM:SS of the local clock.
fn chrono_like_now() -> String {
    // SAFETY: time may be given no place to store its answer (null).
    let t = unsafe { libc::time(std::ptr::null_mut()) };
    // SAFETY: a zeroed tm is a valid value of that plain C struct (tm_zone: null).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: localtime_r reads `t` and writes only `tm`.
    unsafe { libc::localtime_r(&t, &mut tm) };
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_interval_line_shows_rates_ratio_and_offload_share() {
        let snap = |t: f64, cpu_in: u64, dev_in: u64, cpu_s: f64| {
            json!({
                "uptime_s": t, "process_cpu_s": cpu_s, "fallbacks": {"saturated": 3},
                "backends": [
                    {"name": "cpu", "errors": 0, "compress": {"lz4": {"bytes_in": cpu_in, "bytes_out": cpu_in / 4}}, "decompress": {}},
                    {"name": "gpu", "errors": 1, "compress": {"gzip": {"bytes_in": dev_in, "bytes_out": dev_in / 4}}, "decompress": {}},
                ]
            })
        };
        let a = totals(&snap(10.0, 0, 0, 1.0));
        let b = totals(&snap(12.0, 100_000_000, 300_000_000, 2.0));
        let l = line("t", &a, &b);
        let cells: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(cells, ["t", "200.0", "50.0", "4.00", "0.0", "50", "75", "0.0", "0", "0.0", "0.0"]);
        // Background compression's work shows apart from the users' writes.
        let mut c = snap(12.0, 100_000_000, 300_000_000, 2.0);
        c["background"] = json!({"bytes_in": 40_000_000, "bytes_out": 4_000_000});
        let cells: Vec<String> = line("t", &a, &totals(&c)).split_whitespace().map(String::from).collect();
        assert_eq!(cells[1..3], ["180.0", "48.0"]);
        assert_eq!(cells[9..], ["20.0", "2.0"]);
    }
}

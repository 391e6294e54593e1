//! Prometheus metrics (`-o metrics=ADDR:PORT`, `densefs metrics MOUNT`): the text passes
//! promtool's check, a real Prometheus server (Debian's `prometheus`, installed if missing,
//! started here on loopback ports) scrapes a mount while a copy runs and its written-bytes
//! counter rises by exactly the bytes copied, a non-loopback address is refused unless asked
//! for, and every metric the Grafana dashboard (contrib/grafana/densefs.json) queries is one a
//! scrape has. Root only, as the other mount tests.

mod common;

use common::{compressible, free_port, http_get, Dirs, Mount, BIN};
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// Whether the `prometheus` package's programs are here, installing it (Debian) if not.
fn have_prometheus() -> bool {
    let have = || Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success());
    if !have() {
        println!("installing prometheus");
        let _ = Command::new("sh")
            .args([
                "-c",
                "export DEBIAN_FRONTEND=noninteractive; (apt-get install -y -qq --no-install-recommends prometheus || (apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus)) >/dev/null 2>&1",
            ])
            .status();
    }
    have()
}

fn metrics_text(mnt: &Path) -> String {
    let out = Command::new(BIN).arg("metrics").arg(mnt).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Writes `data` with one write(2) per 128 KiB record, so that the written-bytes counter rises
/// by exactly its length: the kernel cuts a larger write at the user buffer's pages (1 MiB less
/// malloc's 16 bytes), and a record left part-filled between two pieces for a whole writeback
/// interval (a loaded machine) is compressed twice (CI: 131056 bytes more than the file).
fn write_by_records(path: &Path, data: &[u8]) {
    let mut f = std::fs::File::create(path).unwrap();
    for record in data.chunks(128 << 10) {
        f.write_all(record).unwrap();
    }
}

/// The value of `family{labels}` in a text exposition, summed over its samples.
fn sum_of(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn the_text_passes_promtool_and_the_endpoint_serves_the_same() {
    if !have_prometheus() {
        eprintln!("skipped: no promtool (the prometheus package) and none could be installed");
        return;
    }
    let d = Dirs::new();
    let port = free_port();
    let m = Mount::new(&d.lower, &d.mnt, &format!("compression=lz4,metrics=127.0.0.1:{port}"));
    let data = compressible(3 << 20, 7);
    write_by_records(&m.path("f"), &data);
    assert_eq!(std::fs::read(m.path("f")).unwrap(), data);
    let text = metrics_text(&m.mnt);
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(out.status.success(), "promtool: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(sum_of(&text, "densefs_written_bytes_total"), data.len() as f64, "{text}");
    assert!(sum_of(&text, "densefs_fuse_request_duration_seconds_count") > 0.0);
    let (status, body) = http_get(port, "/metrics").unwrap();
    assert_eq!(status, 200);
    let families = |t: &str| t.lines().filter(|l| l.starts_with("# TYPE")).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(families(&body), families(&text), "the endpoint and densefs metrics name the same families");
    assert_eq!(sum_of(&body, "densefs_written_bytes_total"), data.len() as f64);
    assert_eq!(http_get(port, "/").unwrap().0, 404);
}

#[test]
fn a_dataset_s_statistics_are_exported_while_its_counters_are_known() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    std::fs::create_dir(m.path("data")).unwrap();
    let out = Command::new(BIN).args(["set", "compression=gzip-1"]).arg(m.path("data")).output().unwrap();
    assert!(out.status.success());
    std::fs::write(m.path("data/f"), compressible(1 << 20, 2)).unwrap();
    let sample = |text: &str| sum_of(text, "densefs_dataset_used_bytes{dataset=\"/data\"}");
    assert!(!metrics_text(&m.mnt).contains("dataset=\"/data\""), "no counters before a first report walks it");
    let get = |prop: &str| {
        let out = Command::new(BIN).args(["get", "-H", "-p", "-o", "value", prop]).arg(m.path("data")).output().unwrap();
        String::from_utf8(out.stdout).unwrap().trim().parse::<f64>().unwrap()
    };
    // A walk is kept as counters only with no file open (it may meet one half written).
    common::wait_up_to("every file closed", 300, || common::engine_snapshot(&m.mnt)["inodes"]["open_files"] == 0);
    let used = get("used");
    assert!(used > 0.0);
    let text = metrics_text(&m.mnt);
    assert_eq!(sample(&text), used, "{text}");
    assert_eq!(sum_of(&text, "densefs_dataset_files{dataset=\"/data\"}"), 1.0);
    // The counters follow a second file (its RELEASE may come after close(2): wait for it).
    std::fs::write(m.path("data/g"), compressible(1 << 20, 3)).unwrap();
    common::wait_up_to("the second file counted", 300, || sum_of(&metrics_text(&m.mnt), "densefs_dataset_files{dataset=\"/data\"}") == 2.0);
    common::wait_up_to("every file closed", 300, || common::engine_snapshot(&m.mnt)["inodes"]["open_files"] == 0);
    assert_eq!(sample(&metrics_text(&m.mnt)), get("used"));
    m.unmount();
}

#[test]
fn a_non_loopback_address_is_refused_unless_asked_for() {
    let d = Dirs::new();
    std::fs::create_dir_all(&d.lower).unwrap();
    std::fs::create_dir_all(&d.mnt).unwrap();
    let port = free_port();
    let out = Command::new(BIN).args(["mount", "-o", &format!("metrics=0.0.0.0:{port}")]).args([&d.lower, &d.mnt]).output().unwrap();
    assert!(!out.status.success(), "mounted with metrics on every address");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a loopback address") && err.contains("metrics_public"), "{err}");
    let m = Mount::new(&d.lower, &d.mnt, &format!("metrics=0.0.0.0:{port},metrics_public"));
    assert_eq!(http_get(port, "/metrics").unwrap().0, 200);
    m.unmount();
}

/// A Prometheus server on loopback scraping `target` every second; killed when dropped.
struct Prometheus {
    child: Child,
    port: u16,
    _dir: Dirs,
}

impl Prometheus {
    fn start(target: u16) -> Prometheus {
        let dir = Dirs::new();
        std::fs::create_dir_all(&dir.lower).unwrap();
        let config = dir.lower.join("prometheus.yml");
        std::fs::write(
            &config,
            format!("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: densefs\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"),
        )
        .unwrap();
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.lower.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus");
        let p = Prometheus { child, port, _dir: dir };
        common::wait_until("prometheus ready", || http_get(port, "/-/ready").is_ok_and(|(s, _)| s == 200));
        p
    }

    /// The value of an instant query that yields one number.
    fn query(&self, promql: &str) -> Option<f64> {
        let q: String =
            promql.bytes().map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") }).collect();
        let (_, body) = http_get(self.port, &format!("/api/v1/query?query={q}")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn prometheus_scrapes_a_mount_while_a_copy_runs() {
    if !have_prometheus() {
        eprintln!("skipped: no prometheus and none could be installed");
        return;
    }
    let d = Dirs::new();
    let port = free_port();
    let m = Mount::new(&d.lower, &d.mnt, &format!("compression=zstd-3,metrics=127.0.0.1:{port}"));
    let prometheus = Prometheus::start(port);
    common::wait_until("a first scrape", || prometheus.query("up{job=\"densefs\"}") == Some(1.0));
    let before = prometheus.query("sum(densefs_written_bytes_total)").unwrap_or(0.0);
    // A copy of 24 MiB in two halves: Prometheus sees the first half before the second is
    // written (a scrape while the copy runs), then the whole.
    let rises_by = |bytes: usize| prometheus.query("sum(densefs_written_bytes_total)").is_some_and(|v| v - before == bytes as f64);
    let mut copied = 0;
    for i in 0..12u64 {
        let data = compressible(2 << 20, i);
        write_by_records(&m.path(&format!("part{i}")), &data);
        copied += data.len();
        if i == 5 {
            common::wait_until("a scrape of the first half", || rises_by(copied));
        }
    }
    common::wait_until("the written-bytes counter to rise by the bytes copied", || rises_by(copied));
    assert!(prometheus.query("sum(densefs_fuse_request_duration_seconds_count{op=\"write\"})").is_some_and(|n| n > 0.0));
    drop(prometheus);
    m.unmount();
}

#[test]
fn every_metric_the_grafana_dashboard_queries_is_exported() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/contrib/grafana/densefs.json")).unwrap())
            .unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            exprs.push(target["expr"].as_str().unwrap().to_string());
        }
    }
    exprs.extend(dashboard["templating"]["list"].as_array().unwrap().iter().filter_map(|v| v["definition"].as_str().map(str::to_string)));
    assert!(exprs.len() >= 10, "{} expressions", exprs.len());
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    std::fs::write(m.path("f"), compressible(1 << 20, 1)).unwrap();
    assert_eq!(std::fs::read(m.path("f")).unwrap().len(), 1 << 20);
    // The mount's statistics are exported once its counters are known (a walk in the
    // background at mount, where no clean run saved them): the file's bytes are among them.
    common::wait_up_to("densefs_used_bytes", 300, || sum_of(&metrics_text(&m.mnt), "densefs_used_bytes") > 0.0);
    let text = metrics_text(&m.mnt);
    assert!(sum_of(&text, "densefs_logical_used_bytes") >= (1 << 20) as f64, "{text}");
    assert_eq!(sum_of(&text, "densefs_files"), 1.0);
    let exported: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .chain(text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()))
        .collect();
    for expr in &exprs {
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("densefs_") {
            let name: String = rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            assert!(exported.contains(name.as_str()), "the dashboard queries {name}, which no scrape has ({expr})");
            rest = &rest[at + name.len()..];
        }
    }
}

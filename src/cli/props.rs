//! `densefs set/inherit/get/list`: a mount's properties (set on directories, inherited below)
//! and what compression did, like `zfs set/inherit/get/list`.

use super::client::{self, os_error, require_densefs};
use super::mountinfo::{densefs_mounts, mountpoint_of};
use super::output::{full_path, print_table, ratio, size};
use crate::control::Control;
use crate::core::props::{LocalProps, SETTABLE};
use crate::engine::Offload;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The read-only properties `densefs get` shows besides the settable ones (`SETTABLE`), with
/// what each is: `densefs get --help` and densefs-properties(7) list them from here, and `set`
/// and `inherit` name them as read-only.
pub const READ_ONLY: [(&str, &str); 7] = [
    ("compressratio", "logicalused / used: how many times smaller than its data a file or tree is stored (1.00x when nothing is stored)."),
    ("used", "Bytes the files occupy on the lower file system (their allocated blocks, as du counts them)."),
    ("logicalused", "Bytes of data stored, before compression, holes excluded (ZFS's logicalused)."),
    ("written", "The files' sizes as ls -l shows them, holes included."),
    ("records_ALG", "Records by how they are stored: one property per setting in use (records_lz4, records_gzip-6, ...), and records_raw and records_hole."),
    ("records_raw_low_savings", "Records kept raw because compressing them saved less than min_savings."),
    (
        "engine.*",
        "With all: the mount's engine counters (the whole mount, whichever path is asked about): engine.BACKEND.OP.ALG.records, .bytes_in and .bytes_out (OP: compress or decompress), engine.BACKEND.busy, .errors and .resets, engine.fallbacks.REASON, engine.precheck_skipped, engine.auto.ALG.",
    ),
];

/// Whether `name` is one of the read-only properties (`records_gzip-6` and `engine.cpu.busy` too).
pub fn is_read_only(name: &str) -> bool {
    READ_ONLY.iter().any(|(p, _)| match p.strip_suffix('*').or_else(|| p.strip_suffix("ALG")) {
        Some(prefix) => name.starts_with(prefix),
        None => name == *p,
    })
}

fn read_only(name: &str) -> String {
    format!("'{name}' is a read-only property (computed from the files; densefs get shows it); settable: {}", SETTABLE.join(", "))
}

/// `densefs set PROP=VALUE... DIR`
pub fn set(assignments: &[String], dir: &Path) -> Result<(), String> {
    require_densefs(dir)?;
    for a in assignments {
        let (name, value) = a.split_once('=').ok_or_else(|| format!("'{a}': expected PROPERTY=VALUE"))?;
        if is_read_only(name) {
            return Err(read_only(name));
        }
        // Check here too, for a message better than EINVAL.
        LocalProps::default().set(name, value)?;
        let property = Control::property(name).ok_or_else(|| format!("'{name}' is not a settable property"))?;
        if !dir.is_dir() {
            return Err(format!("{}: properties are set on directories", dir.display()));
        }
        client::send(dir, property, value).map_err(|e| match (e.raw_os_error(), Offload::parse(value)) {
            // The daemon refuses a device it found none of at mount time, as mount does.
            (Some(libc::ENODEV), Ok(Offload::Only(device))) => {
                crate::engine::no_device(device, "this mount's daemon found none at mount time; its log says why")
            }
            _ => os_error(dir, &format!("cannot set {name}"), e),
        })?;
    }
    Ok(())
}

/// `densefs inherit PROP DIR`
pub fn inherit(name: &str, dir: &Path) -> Result<(), String> {
    if is_read_only(name) {
        return Err(format!("{} and cannot be inherited", read_only(name)));
    }
    let Some(property) = Control::property(name) else {
        return Err(format!("'{name}' cannot be inherited (settable: {})", SETTABLE.join(", ")));
    };
    require_densefs(dir)?;
    match client::remove(dir, property) {
        Err(e) if e.raw_os_error() != Some(libc::ENODATA) => Err(os_error(dir, &format!("cannot inherit {name}"), e)),
        _ => Ok(()),
    }
}

/// `densefs get [-Hp] [-o COLUMNS] [--json] PROPERTIES PATH...`
pub fn get(scripted: bool, parsable: bool, columns: &[String], json: bool, properties: &str, paths: &[PathBuf]) -> Result<(), String> {
    for c in columns {
        if !["name", "property", "value", "source"].contains(&c.as_str()) {
            return Err(format!("unknown column '{c}' (name, property, value, source)"));
        }
    }
    let wanted: Vec<&str> = properties.split(',').collect();
    let mut table = Vec::new();
    let mut reports = Vec::new();
    // Only settable properties asked for: no need for the daemon to walk the tree.
    let settable_only = wanted.iter().all(|w| SETTABLE.contains(w));
    for path in paths {
        let report = client::report(path, if settable_only { Control::PROPERTIES } else { Control::REPORT })?;
        let mut rows = property_rows(path, &report, parsable);
        if settable_only {
            rows.retain(|r| SETTABLE.contains(&r.property.as_str()));
        }
        if wanted.iter().any(|w| *w == "all" || w.starts_with("engine.")) {
            let snapshot = client::report(path, Control::Engine)?;
            for (property, value) in engine_rows(&snapshot, parsable) {
                rows.push(Row { name: path.display().to_string(), property, value, source: "-".into() });
            }
        }
        for w in &wanted {
            if *w != "all" && !rows.iter().any(|r| r.property == *w) && !w.starts_with("records_") && !w.starts_with("engine.") {
                return Err(format!("unknown property '{w}'"));
            }
        }
        for r in rows.into_iter().filter(|r| wanted.contains(&"all") || wanted.contains(&r.property.as_str())) {
            let cells = columns
                .iter()
                .map(|c| match c.as_str() {
                    "name" => r.name.clone(),
                    "property" => r.property.clone(),
                    "value" => r.value.clone(),
                    _ => r.source.clone(),
                })
                .collect::<Vec<_>>();
            reports.push(serde_json::json!({"name": r.name, "property": r.property, "value": r.value, "source": r.source}));
            table.push(cells);
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&reports).expect("BUG: JSON"));
    } else {
        let header: Vec<String> = columns.iter().map(|c| c.to_uppercase()).collect();
        print_table(&header.iter().map(String::as_str).collect::<Vec<_>>(), &table, scripted);
    }
    Ok(())
}

/// `densefs list [-rHp] [--json] [PATH...]` (default: every densefs mount)
pub fn list(recursive: bool, scripted: bool, parsable: bool, json: bool, paths: Vec<PathBuf>) -> Result<(), String> {
    let paths = if paths.is_empty() { densefs_mounts() } else { paths };
    let mut rows = Vec::new();
    let mut out = Vec::new();
    // Like ls: a mount that cannot be asked (a daemon killed under it) is named on stderr, the
    // others are still listed, and the exit status says something was missing.
    let mut unanswered = 0;
    for path in &paths {
        let report = match client::report(path, if recursive { Control::DATASETS } else { Control::REPORT }) {
            Ok(report) => report,
            Err(e) => {
                eprintln!("densefs: {e}");
                unanswered += 1;
                continue;
            }
        };
        // Datasets are named below PATH as PATH was given (relative stays relative), as find does.
        let base = report["path"].as_str().unwrap_or("/").to_string();
        let compression_of = |p: &Path| -> String {
            client::report(p, Control::PROPERTIES)
                .ok()
                .and_then(|r| r["properties"]["compression"]["value"].as_str().map(String::from))
                .unwrap_or("-".into())
        };
        let mut entries = vec![(path.clone(), report["stats"].clone(), compression_of(path))];
        let mut datasets: Vec<&serde_json::Value> = report["datasets"].as_array().into_iter().flatten().collect();
        datasets.sort_by_key(|d| d["path"].as_str().unwrap_or("").to_string());
        for d in datasets {
            let rel = d["path"].as_str().unwrap_or("/");
            let below = Path::new(rel).strip_prefix(&base).unwrap_or(Path::new(rel.trim_start_matches('/')));
            if below.as_os_str().is_empty() {
                continue; // PATH itself, a dataset: listed first already
            }
            let full = path.join(below);
            let c = compression_of(&full);
            entries.push((full, d["stats"].clone(), c));
        }
        for (name, stats, compression) in entries {
            let size = |k: &str| size(stats[k].as_u64().unwrap_or(0), parsable);
            let r = ratio(&stats);
            rows.push(vec![
                name.display().to_string(),
                size("used"),
                size("logicalused"),
                if parsable { format!("{r:.2}") } else { format!("{r:.2}x") },
                compression.clone(),
            ]);
            out.push(serde_json::json!({"name": name, "used": stats["used"], "logicalused": stats["logicalused"], "compressratio": r, "compression": compression}));
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&out).expect("BUG: JSON"));
    } else {
        print_table(&["NAME", "USED", "LOGICAL", "RATIO", "COMPRESSION"], &rows, scripted);
    }
    match unanswered {
        0 => Ok(()),
        n => Err(format!("{n} of {} paths could not be listed", paths.len())),
    }
}

pub struct Row {
    pub name: String,
    pub property: String,
    pub value: String,
    pub source: String,
}

/// The (property, value, source) rows `densefs get` shows for one path.
pub fn property_rows(path: &Path, report: &Value, parsable: bool) -> Vec<Row> {
    let mount = mountpoint_of(path);
    let name = path.display().to_string();
    let mut rows = Vec::new();
    let mut push = |property: &str, value: String, source: String| {
        rows.push(Row { name: name.clone(), property: property.to_string(), value, source })
    };
    if let Some(props) = report["properties"].as_object() {
        for p in SETTABLE {
            if let Some(entry) = props.get(p) {
                let source = entry["source"].as_str().unwrap_or("-");
                let source = match source.strip_prefix("inherited from ") {
                    Some(rel) => format!("inherited from {}", full_path(&mount, rel)),
                    None => source.to_string(),
                };
                push(p, entry["value"].as_str().unwrap_or("-").to_string(), source);
            }
        }
    }
    let stats = &report["stats"];
    let size = |key: &str| size(stats[key].as_u64().unwrap_or(0), parsable);
    let r = ratio(stats);
    push("compressratio", if parsable { format!("{r:.2}") } else { format!("{r:.2}x") }, "-".into());
    push("used", size("used"), "-".into());
    push("logicalused", size("logicalused"), "-".into());
    push("written", size("written"), "-".into());
    if let Some(records) = stats["records"].as_object() {
        for (alg, n) in records {
            push(&format!("records_{alg}"), n.to_string(), "-".into());
        }
    }
    push("records_raw_low_savings", stats["raw_low_savings"].as_u64().unwrap_or(0).to_string(), "-".into());
    rows
}

/// The engine's counters as read-only `engine.*` properties of a mount (they cover the whole
/// mount, whichever path is asked about).
pub fn engine_rows(snapshot: &Value, parsable: bool) -> Vec<(String, String)> {
    let size = |n: u64| size(n, parsable);
    let mut rows = Vec::new();
    let states: Vec<String> = snapshot["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| format!("{}({})", b["name"].as_str().unwrap_or("?"), b["state"].as_str().unwrap_or("?")))
        .collect();
    rows.push(("engine.backends".to_string(), states.join(",")));
    for b in snapshot["backends"].as_array().into_iter().flatten() {
        let name = b["name"].as_str().unwrap_or("?");
        for op in ["compress", "decompress"] {
            for (alg, c) in b[op].as_object().into_iter().flatten() {
                let n = |k: &str| c[k].as_u64().unwrap_or(0);
                let prefix = format!("engine.{name}.{op}.{alg}");
                rows.push((format!("{prefix}.records"), n("records").to_string()));
                rows.push((format!("{prefix}.bytes_in"), size(n("bytes_in"))));
                rows.push((format!("{prefix}.bytes_out"), size(n("bytes_out"))));
            }
        }
        rows.push((format!("engine.{name}.busy"), format!("{:.1}s", b["busy_s"].as_f64().unwrap_or(0.0))));
        if name != "cpu" {
            rows.push((format!("engine.{name}.errors"), b["errors"].as_u64().unwrap_or(0).to_string()));
            rows.push((format!("engine.{name}.resets"), b["resets"].as_u64().unwrap_or(0).to_string()));
        }
    }
    for (why, n) in snapshot["fallbacks"].as_object().into_iter().flatten() {
        rows.push((format!("engine.fallbacks.{why}"), n.as_u64().unwrap_or(0).to_string()));
    }
    for (what, n) in snapshot["records"].as_object().into_iter().flatten() {
        let n = n.as_u64().unwrap_or(0);
        rows.push((format!("engine.{what}"), if what.ends_with("bytes") { size(n) } else { n.to_string() }));
    }
    for (alg, n) in snapshot["auto"].as_object().into_iter().flatten() {
        rows.push((format!("engine.auto.{alg}"), n.as_u64().unwrap_or(0).to_string()));
    }
    // Background compression: what waits, and what it did since the mount.
    let bg = &snapshot["background"];
    if bg["enabled"].as_bool() == Some(true) {
        let n = |k: &str| bg[k].as_u64().unwrap_or(0);
        rows.push(("engine.background.waiting_files".into(), n("waiting_files").to_string()));
        rows.push(("engine.background.waiting_bytes".into(), size(n("waiting_bytes"))));
        rows.push(("engine.background.files_done".into(), n("files_done").to_string()));
        rows.push(("engine.background.bytes_in".into(), size(n("bytes_in"))));
        rows.push(("engine.background.bytes_out".into(), size(n("bytes_out"))));
        rows.push(("engine.background.used_before".into(), size(n("stored_before"))));
        rows.push(("engine.background.used_after".into(), size(n("stored_after"))));
        rows.push(("engine.background.postponed".into(), n("postponed").to_string()));
        rows.push(("engine.background.failed".into(), n("failed").to_string()));
    }
    // Requests the kernel sent the daemon since the mount, by kind (FUSE opcode), and the
    // time the daemon took to answer them in all.
    for (kind, r) in snapshot["requests"].as_object().into_iter().flatten() {
        rows.push((format!("engine.requests.{kind}"), r["count"].as_u64().unwrap_or(0).to_string()));
        rows.push((format!("engine.requests.{kind}.time"), format!("{:.3}s", r["seconds"].as_f64().unwrap_or(0.0))));
    }
    rows
}

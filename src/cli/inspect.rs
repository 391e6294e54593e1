//! `densefs stat` and `densefs scrub`: how files are stored, and a check of every record.

use super::client::report;
use super::mountinfo::mountpoint_of;
use super::output::{counted, full_path};
use crate::control::Control;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `densefs stat [--json] FILE...`
pub fn stat(json: bool, files: &[PathBuf]) -> Result<(), String> {
    let mut all = Vec::new();
    for file in files {
        let report = report(file, Control::REPORT)?;
        if report["kind"] != "file" {
            return Err(format!("{}: not a regular file (use densefs get for directories)", file.display()));
        }
        if json {
            all.push(report);
            continue;
        }
        let stats = &report["stats"];
        let n = |k: &str| stats[k].as_u64().unwrap_or(0);
        println!("  File: {}", file.display());
        // The ratio as ZFS's compressratio of a file: its data over the bytes that data became,
        // without the lower's allocation unit or the container's header and tables (those are
        // in "on disk"): 1.00x for a plain file or one stored raw, however small.
        let ratio = if n("stored") == 0 { 1.0 } else { n("logicalused") as f64 / n("stored") as f64 };
        println!(
            "  Size: {} logical ({} stored data, compressed to {}), {} on disk, ratio {ratio:.2}x",
            n("written"),
            n("logicalused"),
            n("stored"),
            n("used")
        );
        match report["properties"]["compression"]["value"].as_str() {
            Some(c) => println!(
                "  Stored as: container (format {}, lower file {} bytes long), compression {c}, record size {}",
                report["format_version"],
                report["lower_length"],
                report["properties"]["recordsize"]["value"].as_str().unwrap_or("-")
            ),
            None => println!("  Stored as: plain file (written before densefs, or left as it was)"),
        }
        let records: Vec<String> = stats["records"].as_object().into_iter().flatten().map(|(k, v)| format!("{k} {v}")).collect();
        if !records.is_empty() {
            println!("  Records: {} (raw because too little was saved: {})", records.join(", "), n("raw_low_savings"));
        }
        for p in report["problems"].as_array().into_iter().flatten() {
            println!("  Problem: record {}: {}", p["record"], p["problem"].as_str().unwrap_or(""));
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&all).expect("BUG: JSON"));
    }
    Ok(())
}

/// `densefs scrub [--json] PATH`: exits 1 if anything is damaged.
pub fn scrub(json: bool, path: &Path) -> ExitCode {
    let report = match report(path, Control::SCRUB) {
        Ok(r) => r,
        Err(e) => return super::finish(Err(e)),
    };
    let count = report["problem_count"].as_u64().unwrap_or(0);
    if json {
        println!("{}", serde_json::to_string_pretty(&report).expect("BUG: JSON"));
    } else {
        let mount = mountpoint_of(path);
        for p in report["problems"].as_array().into_iter().flatten() {
            let rel = p["path"].as_str().unwrap_or("?");
            let shown = full_path(&mount, rel);
            let record = match p["record"].as_u64() {
                Some(r) => format!("record {r}"),
                None => "file".to_string(),
            };
            println!("{shown}: {record}: {}", p["problem"].as_str().unwrap_or(""));
        }
        let listed = report["problems"].as_array().map_or(0, Vec::len) as u64;
        if count > listed {
            println!("... and {} more", count - listed);
        }
        let n = |k: &str| report[k].as_u64().unwrap_or(0);
        println!(
            "scrubbed {} ({} compressed) in {}: {}",
            counted(n("files"), "file", "files"),
            n("containers"),
            counted(n("directories"), "directory", "directories"),
            if count == 0 { "no problems".to_string() } else { counted(count, "problem", "problems") }
        );
    }
    if count == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

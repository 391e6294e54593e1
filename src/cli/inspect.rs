//! `densefs stat` and `densefs scrub`: how files are stored, and a check of every record.

use super::client::report;
use super::mountinfo::mountpoint_of;
use super::output::{full_path, ratio};
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
        println!("  Size: {} logical ({} stored data), {} on disk, ratio {:.2}x", n("written"), n("logicalused"), n("used"), ratio(stats));
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
        println!(
            "scrubbed {} files ({} compressed) in {} directories: {}",
            report["files"],
            report["containers"],
            report["directories"],
            if count == 0 { "no problems".to_string() } else { format!("{count} problems") }
        );
    }
    if count == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

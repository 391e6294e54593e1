//! `densefs recompress`: rewrite files with their directory's current properties or given
//! settings, one request to the daemon per file, with a progress bar.

use super::client::{self, report};
use super::output::human;
use crate::control::Control;
use crate::core::props::LocalProps;
use std::path::{Path, PathBuf};

/// `densefs recompress [-rq] [-o SETTINGS] PATH...`
pub fn run(recursive: bool, spec: String, quiet: bool, paths: &[PathBuf]) -> Result<(), String> {
    for item in spec.split(',').filter(|s| !s.is_empty()) {
        let (name, value) = item.split_once('=').ok_or_else(|| format!("'{item}': expected PROPERTY=VALUE"))?;
        LocalProps::default().set(name, value)?;
    }
    let mut files = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for p in paths {
        for (file, len) in files_below(p, recursive)? {
            // A hard-linked file is rewritten once.
            let id = std::fs::metadata(&file).map(|m| (std::os::unix::fs::MetadataExt::dev(&m), std::os::unix::fs::MetadataExt::ino(&m)));
            if id.map_or(true, |id| seen.insert(id)) {
                files.push((file, len));
            }
        }
    }
    let before: Vec<serde_json::Value> = paths.iter().map(|p| report(p, Control::REPORT)).collect::<Result<_, _>>()?;
    let total: u64 = files.iter().map(|(_, len)| len).sum();
    let bar = if quiet { indicatif::ProgressBar::hidden() } else { indicatif::ProgressBar::new(total) };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {wide_msg}")
            .expect("BUG: progress template"),
    );
    let mut failed = 0;
    for (file, len) in &files {
        bar.set_message(file.display().to_string());
        if let Err(e) = recompress_file(file, &spec) {
            bar.suspend(|| eprintln!("densefs: {}: {e}", file.display()));
            failed += 1;
        }
        bar.inc(*len);
    }
    bar.finish_and_clear();
    let after: Vec<serde_json::Value> = paths.iter().map(|p| report(p, Control::REPORT)).collect::<Result<_, _>>()?;
    let sum = |reports: &[serde_json::Value], key: &str| reports.iter().map(|r| r["stats"][key].as_u64().unwrap_or(0)).sum::<u64>();
    let (used_before, used_after) = (sum(&before, "used"), sum(&after, "used"));
    let logical = sum(&after, "logicalused");
    let ratio = |used: u64| if used == 0 { 1.0 } else { logical as f64 / used as f64 };
    println!(
        "recompressed {} of {} files ({} logical): used {} -> {}, {} {} (ratio {:.2}x -> {:.2}x)",
        files.len() - failed,
        files.len(),
        human(total),
        human(used_before),
        human(used_after),
        if used_after <= used_before { "saved" } else { "grew by" },
        human(used_before.abs_diff(used_after)),
        ratio(used_before),
        ratio(used_after)
    );
    if failed > 0 {
        Err(format!("{failed} files were left as they were"))
    } else {
        Ok(())
    }
}

/// Every regular file at or below `path` (recursing only with `recursive`), symlinks not followed.
pub fn files_below(path: &Path, recursive: bool) -> Result<Vec<(PathBuf, u64)>, String> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.is_file() {
        return Ok(vec![(path.to_path_buf(), meta.len())]);
    }
    if !meta.is_dir() {
        return Err(format!("{}: not a regular file or directory", path.display()));
    }
    if !recursive {
        return Err(format!("{}: is a directory (use -r)", path.display()));
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
            let kind = entry.file_type().map_err(|e| e.to_string())?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
                out.push((entry.path(), len));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Asks the daemon to rewrite one file (`spec`: "" or "compression=…,recordsize=…").
pub fn recompress_file(file: &Path, spec: &str) -> Result<(), String> {
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let spec = if name.contains(',') {
        spec.to_string()
    } else if spec.is_empty() {
        format!("name={name}")
    } else {
        format!("{spec},name={name}")
    };
    let Err(e) = client::send(file, Control::Recompress, &spec) else {
        return Ok(());
    };
    Err(match e.raw_os_error() {
        Some(libc::EBUSY) => "open elsewhere; close it and run again to change its record size or convert it".to_string(),
        Some(libc::EMLINK) => "hard-linked; left as it is".to_string(),
        Some(libc::ENOTSUP) => "not on a densefs mount".to_string(),
        _ => e.to_string(),
    })
}

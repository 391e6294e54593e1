//! `densefs bench engine`: the compression engine measured in-process, without FUSE.

use super::mount_options::parse_size;
use std::path::Path;

/// `densefs bench engine`: see `crate::engine::bench`.
#[allow(clippy::too_many_arguments)]
pub fn engine(
    backend: &str,
    compression: &[String],
    recordsize: &str,
    threads: Option<usize>,
    repeat: usize,
    precheck: bool,
    size: Option<&str>,
    json: bool,
    file: &Path,
) -> Result<(), String> {
    use crate::engine::bench::{self, BenchOptions, BenchRow};
    let compressions = compression
        .iter()
        .map(|c| crate::codec::Compression::parse(c).map_err(|e| if c == "auto" { "auto is not a codec to measure".into() } else { e }))
        .collect::<Result<Vec<_>, _>>()?;
    let record_size = crate::core::props::parse_recordsize(recordsize)?.record_size() as usize;
    let cpu_threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let (devices, notes) = crate::engine::detect_devices(&mut crate::engine::EngineConfig::new(cpu_threads))?;
    let backends: Vec<String> = match backend {
        "all" => {
            for n in &notes {
                eprintln!("note: {n}");
            }
            let auto = (!devices.is_empty()).then(|| "auto".to_string());
            std::iter::once("cpu".to_string()).chain(devices.iter().map(|d| d.name().to_string())).chain(auto).collect()
        }
        "cpu" => vec!["cpu".into()],
        "auto" if !devices.is_empty() => vec!["auto".into()],
        name if devices.iter().any(|d| d.name() == name) => vec![name.into()],
        name => return Err(format!("no {name} backend on this machine ({})", notes.join("; "))),
    };
    let mut data = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    if data.is_empty() {
        return Err(format!("{}: empty file", file.display()));
    }
    if let Some(size) = size {
        let want = parse_size(size).ok_or_else(|| format!("invalid size '{size}' (e.g. 512M, 1G)"))? as usize;
        // Whole records of the file, repeated: no record straddles the seam.
        let whole = data.len() / record_size * record_size;
        let unit = if whole == 0 { data.clone() } else { data[..whole].to_vec() };
        data = unit.iter().cycle().take(want.max(1)).copied().collect();
    }
    let options = BenchOptions { backends, compressions, record_size, cpu_threads, precheck, repeat };
    if !json {
        println!("# {} ({} bytes), records of {}, {} CPU threads", file.display(), data.len(), recordsize, cpu_threads);
        println!("{}", BenchRow::header());
    }
    let rows = bench::run(&options, &data, &devices, |row| {
        // With --json the rows also go to stderr as they come, so a run cut short still says
        // what it measured.
        if json {
            eprintln!("{}", row.line());
        } else {
            println!("{}", row.line());
        }
    })?;
    if json {
        let out = serde_json::json!({
            "file": file.display().to_string(),
            "bytes": data.len(),
            "record_size": record_size,
            "cpu_threads": cpu_threads,
            "rows": rows.iter().map(BenchRow::json).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("BUG: JSON"));
    }
    Ok(())
}

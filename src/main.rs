//! The `densefs` command line (also run as `mount.densefs` and `mount.fuse.densefs` by mount(8)).

use clap::{CommandFactory, Parser, Subcommand};
use densefs::cli::props::{self as admin, human, print_table, property_rows, ratio};
use densefs::control::Control;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "densefs", version, about = "A transparent, compressing overlay file system", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount LOWER on MOUNTPOINT: files written through MOUNTPOINT are stored compressed in LOWER.
    ///
    /// Options (-o, comma-separated, repeatable):
    ///   compression=ALG   off | on | lz4 | gzip | gzip-1..9 | zstd | zstd-1..19 | zstd-fast-1..10 | lzjb | zle
    ///                     | auto (picked per record from the data and the load) (default lz4)
    ///   recordsize=SIZE   power of two from 4K to 1M (default 128K)
    ///   checksum=KIND     crc32c | xxh3 (default crc32c)
    ///   min_savings=PCT   keep a compressed record only if it saves this much (default 12.5%)
    ///   offload=WHERE     auto | cpu | gpu: where records are compressed (default auto: an
    ///                     accelerator when present and worth it, the CPU alongside)
    ///   offload_min=SIZE, offload_max=SIZE   records outside go to the CPU (default 4K, 1M)
    ///   precheck=on|off   skip slow codecs on data that looks incompressible (default on)
    ///   verify=on|off     decode accelerator output on the CPU before storing it (default on)
    ///   cache_size=SIZE   file data all open files may hold in memory: written and not yet
    ///                     stored, being compressed, or cached decoded (default 256M)
    ///   threads=N         FUSE request threads
    ///   allow_other, ro, nosuid, nodev, noexec, noatime, ...  as for any mount
    /// These are the root directory's defaults; `densefs set` overrides them below a directory.
    /// Settings apply to files created from then on; existing files keep theirs.
    #[command(verbatim_doc_comment)]
    Mount {
        /// Stay in the foreground (logs to stderr).
        #[arg(short, long)]
        foreground: bool,
        /// Mount options.
        #[arg(short = 'o', value_name = "OPTIONS")]
        options: Vec<String>,
        /// Write the daemon's log here instead of syslog.
        #[arg(long, value_name = "FILE")]
        log: Option<PathBuf>,
        lower: PathBuf,
        mountpoint: PathBuf,
    },
    /// Unmount a densefs mount, waiting until everything is written back.
    Umount { mountpoint: PathBuf },
    /// Set properties on a directory: files created below it (until a deeper directory sets its
    /// own) use them. Properties: compression, recordsize, min_savings, checksum, offload.
    Set {
        /// PROPERTY=VALUE, e.g. compression=gzip-9
        #[arg(required = true, num_args = 1..)]
        assignments: Vec<String>,
        directory: PathBuf,
    },
    /// Remove a directory's own value of a property, so it inherits its parent's again.
    Inherit { property: String, directory: PathBuf },
    /// Show properties and what compression did, like `zfs get`.
    ///
    /// Properties: compression, recordsize, min_savings, checksum, offload (with SOURCE local, default or
    /// inherited from PATH), and read-only: compressratio (logicalused / used), used (bytes on
    /// the lower file system), logicalused (data stored, holes excluded), written (sizes as
    /// `ls -l` shows them), records_ALG (records by how they are stored; raw and hole too) and
    /// records_raw_low_savings (kept raw because compressing saved less than min_savings).
    /// For a directory, statistics cover everything below it. `all` also lists the mount's engine
    /// counters: engine.BACKEND.compress|decompress.ALG.records|bytes_in|bytes_out,
    /// engine.BACKEND.busy|errors|resets, engine.fallbacks.REASON, engine.precheck_skipped,
    /// engine.auto.ALG.
    Get {
        /// Scripted: no header, tab-separated.
        #[arg(short = 'H')]
        scripted: bool,
        /// Exact numbers (bytes, plain ratios).
        #[arg(short = 'p')]
        parsable: bool,
        /// Columns: name,property,value,source.
        #[arg(short = 'o', value_delimiter = ',', default_value = "name,property,value,source")]
        columns: Vec<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// all, or PROPERTY[,PROPERTY...]
        properties: String,
        #[arg(required = true, num_args = 1..)]
        paths: Vec<PathBuf>,
    },
    /// List datasets (directories with their own properties) with space used, like `zfs list`.
    List {
        /// Also every dataset below PATH.
        #[arg(short = 'r')]
        recursive: bool,
        #[arg(short = 'H')]
        scripted: bool,
        #[arg(short = 'p')]
        parsable: bool,
        #[arg(long)]
        json: bool,
        /// Default: every densefs mount.
        paths: Vec<PathBuf>,
    },
    /// Show how one file is stored: sizes, ratio, records by algorithm.
    Stat {
        #[arg(long)]
        json: bool,
        #[arg(required = true, num_args = 1..)]
        files: Vec<PathBuf>,
    },
    /// Read every record below PATH, verify its checksum and decoding, and list what is damaged.
    /// Exits 1 if anything is.
    Scrub {
        #[arg(long)]
        json: bool,
        path: PathBuf,
    },
    /// Rewrite existing files with the current properties of their directory, or with -o: also
    /// plain files that were in the lower directory before densefs. Online: files stay readable
    /// (and writable, unless their record size changes or a plain file is converted).
    Recompress {
        /// Everything below directories.
        #[arg(short = 'r')]
        recursive: bool,
        /// Settings to use instead of the directory's, e.g. compression=gzip-9,recordsize=1M
        #[arg(short = 'o', value_name = "SETTINGS")]
        settings: Option<String>,
        /// No progress bar.
        #[arg(short = 'q', long)]
        quiet: bool,
        #[arg(required = true, num_args = 1..)]
        paths: Vec<PathBuf>,
    },
    /// Live view of the compression engine of a mount, one line per interval (like zpool iostat):
    /// logical MB/s written, MB/s stored, ratio, MB/s read, the daemon's CPU %, the share of
    /// bytes an accelerator compressed, fallbacks to the CPU per second, device errors. The first
    /// line covers the time since the mount.
    Iostat {
        /// Seconds between lines.
        #[arg(short = 'w', long = "wait", default_value_t = 1.0, value_name = "SECONDS")]
        interval: f64,
        /// Stop after this many lines.
        #[arg(short = 'c', long)]
        count: Option<u64>,
        /// Also one line per backend and algorithm.
        #[arg(short = 'v')]
        verbose: bool,
        mountpoint: PathBuf,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchWhat,
    },
    /// Print shell completions (bash, zsh, fish, elvish, powershell) to stdout.
    Completions { shell: clap_complete::Shell },
}

#[derive(Subcommand)]
enum BenchWhat {
    /// Compression and decompression GB/s, ratio and CPU seconds per GB of each backend and
    /// algorithm on FILE, in-process (no FUSE), through the engine's policies. One line per
    /// (backend, algorithm); OFFLOADED is the share of records the backend itself compressed.
    Engine {
        /// cpu, gpu or all (every backend this machine has).
        #[arg(long, default_value = "all")]
        backend: String,
        #[arg(long, value_delimiter = ',', default_value = "lz4,gzip-1,gzip-6,gzip-9,zstd-3")]
        compression: Vec<String>,
        #[arg(long, default_value = "128K")]
        recordsize: String,
        /// CPU worker threads (default: every core).
        #[arg(long)]
        threads: Option<usize>,
        /// Run each measurement this many times and keep the fastest.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
        /// Compress everything, even data that looks incompressible.
        #[arg(long)]
        no_precheck: bool,
        /// Repeat FILE's records until this much data (e.g. 1G), to fill a GPU with a small
        /// sample; records are compressed independently, so the ratio does not change.
        #[arg(long)]
        size: Option<String>,
        #[arg(long)]
        json: bool,
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    // Output piped into `head` ends the command quietly, as for any Unix tool, instead of a
    // panic in println!; `mount` sets SIGPIPE back to ignored for its daemon.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let argv0 = std::env::args_os().next().map(PathBuf::from);
    if argv0.as_deref().and_then(Path::file_name).is_some_and(|n| n == "mount.densefs" || n == "mount.fuse.densefs") {
        return finish(mount_helper(std::env::args().skip(1).collect()));
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Mount { foreground, options, log, lower, mountpoint } => {
            densefs::cli::mount::mount_or_remount(&lower, &mountpoint, &options.join(","), foreground, log)
        }
        Command::Umount { mountpoint } => densefs::cli::mount::umount(&mountpoint),
        Command::Set { assignments, directory } => admin::set(&assignments, &directory),
        Command::Inherit { property, directory } => admin::inherit(&property, &directory),
        Command::Get { scripted, parsable, columns, json, properties, paths } => {
            get(scripted, parsable, &columns, json, &properties, &paths)
        }
        Command::List { recursive, scripted, parsable, json, paths } => list(recursive, scripted, parsable, json, paths),
        Command::Stat { json, files } => stat(json, &files),
        Command::Scrub { json, path } => return scrub(json, &path),
        Command::Recompress { recursive, settings, quiet, paths } => recompress(recursive, settings.unwrap_or_default(), quiet, &paths),
        Command::Iostat { interval, count, verbose, mountpoint } => {
            if interval.is_finite() && interval > 0.0 {
                densefs::cli::iostat::run(&mountpoint, interval, count, verbose)
            } else {
                Err(format!("invalid interval {interval}"))
            }
        }
        Command::Bench { what: BenchWhat::Engine { backend, compression, recordsize, threads, repeat, no_precheck, size, json, file } } => {
            bench_engine(&backend, &compression, &recordsize, threads, repeat, !no_precheck, size.as_deref(), json, &file)
        }
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "densefs", &mut std::io::stdout());
            Ok(())
        }
    };
    finish(result)
}

fn finish(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("densefs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// mount(8) runs `mount.densefs LOWER MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]` (and, for a
/// mount it finds as type fuse.densefs, as for `mount -o remount`, `mount.fuse.densefs`).
fn mount_helper(args: Vec<String>) -> Result<(), String> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => options.push(it.next().ok_or("-o needs options")?),
            "-t" | "-N" => {
                it.next();
            }
            "-s" | "-f" | "-n" | "-v" => {}
            _ if a.starts_with('-') => return Err(format!("mount.densefs: unknown flag {a}")),
            _ => positional.push(a),
        }
    }
    if let ([mountpoint], true) = (positional.as_slice(), densefs::cli::mount::is_remount(&options.join(","))) {
        return densefs::cli::mount::remount(Path::new(mountpoint), &options.join(","));
    }
    let [lower, mountpoint] = positional.as_slice() else {
        return Err("usage: mount.densefs LOWER MOUNTPOINT [-o OPTIONS]".into());
    };
    densefs::cli::mount::mount_or_remount(Path::new(lower), Path::new(mountpoint), &options.join(","), false, None)
}

fn get(scripted: bool, parsable: bool, columns: &[String], json: bool, properties: &str, paths: &[PathBuf]) -> Result<(), String> {
    for c in columns {
        if !["name", "property", "value", "source"].contains(&c.as_str()) {
            return Err(format!("unknown column '{c}' (name, property, value, source)"));
        }
    }
    let wanted: Vec<&str> = properties.split(',').collect();
    let mut table = Vec::new();
    let mut reports = Vec::new();
    // Only settable properties asked for: no need for the daemon to walk the tree.
    let settable_only = wanted.iter().all(|w| densefs::core::props::SETTABLE.contains(w));
    for path in paths {
        let report = admin::report(path, if settable_only { Control::PROPERTIES } else { Control::REPORT })?;
        let mut rows = property_rows(path, &report, parsable);
        if settable_only {
            rows.retain(|r| densefs::core::props::SETTABLE.contains(&r.property.as_str()));
        }
        if wanted.iter().any(|w| *w == "all" || w.starts_with("engine.")) {
            let snapshot = admin::report(path, Control::Engine)?;
            for (property, value) in admin::engine_rows(&snapshot, parsable) {
                rows.push(admin::Row { name: path.display().to_string(), property, value, source: "-".into() });
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

#[allow(clippy::too_many_arguments)]
fn bench_engine(backend: &str, compression: &[String], recordsize: &str, threads: Option<usize>, repeat: usize, precheck: bool, size: Option<&str>, json: bool, file: &Path) -> Result<(), String> {
    use densefs::engine::bench::{self, BenchOptions, BenchRow};
    let compressions = compression
        .iter()
        .map(|c| densefs::codec::Compression::parse(c).and_then(|c| if c.codec == densefs::codec::Codec::Auto { Err("auto is not a codec to measure".into()) } else { Ok(c) }))
        .collect::<Result<Vec<_>, _>>()?;
    let record_size = densefs::core::props::parse_recordsize(recordsize)?.record_size() as usize;
    let cpu_threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let (devices, notes) = densefs::engine::detect_devices(&mut densefs::engine::EngineConfig::new(cpu_threads))?;
    let backends: Vec<String> = match backend {
        "all" => {
            for n in &notes {
                eprintln!("note: {n}");
            }
            std::iter::once("cpu".to_string()).chain(devices.iter().map(|d| d.name().to_string())).collect()
        }
        "cpu" => vec!["cpu".into()],
        name if devices.iter().any(|d| d.name() == name) => vec![name.into()],
        name => return Err(format!("no {name} backend on this machine ({})", notes.join("; "))),
    };
    let mut data = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    if data.is_empty() {
        return Err(format!("{}: empty file", file.display()));
    }
    if let Some(size) = size {
        let want = densefs::cli::mount::parse_size(size).ok_or_else(|| format!("invalid size '{size}' (e.g. 512M, 1G)"))? as usize;
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
        if !json {
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

fn densefs_mounts() -> Vec<PathBuf> {
    let mut points: Vec<PathBuf> = densefs::cli::mount::mountinfo().into_iter().filter(|m| m.is_densefs()).map(|m| m.point).collect();
    points.dedup();
    points
}

fn list(recursive: bool, scripted: bool, parsable: bool, json: bool, paths: Vec<PathBuf>) -> Result<(), String> {
    let paths = if paths.is_empty() { densefs_mounts() } else { paths };
    let mut rows = Vec::new();
    let mut out = Vec::new();
    for path in &paths {
        let report = admin::report(path, if recursive { Control::DATASETS } else { Control::REPORT })?;
        let mount = admin::mountpoint_of(path);
        let compression_of = |p: &Path| -> String {
            admin::report(p, Control::PROPERTIES).ok().and_then(|r| r["properties"]["compression"]["value"].as_str().map(String::from)).unwrap_or("-".into())
        };
        let mut entries = vec![(path.clone(), report["stats"].clone(), compression_of(path))];
        let mut datasets: Vec<&serde_json::Value> = report["datasets"].as_array().into_iter().flatten().collect();
        datasets.sort_by_key(|d| d["path"].as_str().unwrap_or("").to_string());
        for d in datasets {
            let rel = d["path"].as_str().unwrap_or("/");
            let full = match &mount {
                Some(m) => m.join(rel.trim_start_matches('/')),
                None => PathBuf::from(rel),
            };
            let c = compression_of(&full);
            entries.push((full, d["stats"].clone(), c));
        }
        for (name, stats, compression) in entries {
            let size = |k: &str| {
                let n = stats[k].as_u64().unwrap_or(0);
                if parsable { n.to_string() } else { human(n) }
            };
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
    Ok(())
}

fn stat(json: bool, files: &[PathBuf]) -> Result<(), String> {
    let mut all = Vec::new();
    for file in files {
        let report = admin::report(file, Control::REPORT)?;
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
            Some(c) => println!("  Stored as: container, compression {c}, record size {}", report["properties"]["recordsize"]["value"].as_str().unwrap_or("-")),
            None => println!("  Stored as: plain file (written before densefs, or left as it was)"),
        }
        let records: Vec<String> =
            stats["records"].as_object().into_iter().flatten().map(|(k, v)| format!("{k} {v}")).collect();
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

fn scrub(json: bool, path: &Path) -> ExitCode {
    let report = match admin::report(path, Control::SCRUB) {
        Ok(r) => r,
        Err(e) => return finish(Err(e)),
    };
    let count = report["problem_count"].as_u64().unwrap_or(0);
    if json {
        println!("{}", serde_json::to_string_pretty(&report).expect("BUG: JSON"));
    } else {
        let mount = admin::mountpoint_of(path);
        for p in report["problems"].as_array().into_iter().flatten() {
            let rel = p["path"].as_str().unwrap_or("?");
            let shown = match &mount {
                Some(m) if rel == "/" => m.display().to_string(),
                Some(m) => m.join(rel.trim_start_matches('/')).display().to_string(),
                None => rel.to_string(),
            };
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
    if count == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn recompress(recursive: bool, spec: String, quiet: bool, paths: &[PathBuf]) -> Result<(), String> {
    for item in spec.split(',').filter(|s| !s.is_empty()) {
        let (name, value) = item.split_once('=').ok_or_else(|| format!("'{item}': expected PROPERTY=VALUE"))?;
        densefs::core::props::LocalProps::default().set(name, value)?;
    }
    let mut files = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for p in paths {
        for (file, len) in admin::files_below(p, recursive)? {
            // A hard-linked file is rewritten once.
            let id = std::fs::metadata(&file).map(|m| (std::os::unix::fs::MetadataExt::dev(&m), std::os::unix::fs::MetadataExt::ino(&m)));
            if id.map_or(true, |id| seen.insert(id)) {
                files.push((file, len));
            }
        }
    }
    let before: Vec<serde_json::Value> = paths.iter().map(|p| admin::report(p, Control::REPORT)).collect::<Result<_, _>>()?;
    let total: u64 = files.iter().map(|(_, len)| len).sum();
    let bar = if quiet { indicatif::ProgressBar::hidden() } else { indicatif::ProgressBar::new(total) };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {wide_msg}")
            .expect("BUG: progress template"),
    );
    let mut failed = 0;
    for (file, len) in &files {
        bar.set_message(file.display().to_string());
        if let Err(e) = admin::recompress_file(file, &spec) {
            bar.suspend(|| eprintln!("densefs: {}: {e}", file.display()));
            failed += 1;
        }
        bar.inc(*len);
    }
    bar.finish_and_clear();
    let after: Vec<serde_json::Value> = paths.iter().map(|p| admin::report(p, Control::REPORT)).collect::<Result<_, _>>()?;
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
    if failed > 0 { Err(format!("{failed} files were left as they were")) } else { Ok(()) }
}

//! The `densefs` command line: the clap tree and one dispatch; each command group is a file.
//! Commands talk to the daemon through the control interface (`crate::control`, `client.rs`).
//!
//! - `mount.rs`: mount, umount, remount, mount(8)'s helper; `mount_options.rs` parses `-o`;
//!   `daemon.rs` daemonizes and serves; `owner.rs` keeps other machines' daemons off a lower;
//!   `logging.rs` where the daemon logs;
//! - `props.rs`: set, inherit, get, list; `inspect.rs`: stat, scrub; `recompress.rs`;
//!   `iostat.rs`; `metrics.rs`: Prometheus metrics; `bench.rs`; `completions.rs`, `man.rs`:
//!   shell completions and manual pages;
//! - `mountinfo.rs`: the one parser of /proc/self/mountinfo; `client.rs`: requests to the
//!   daemon; `output.rs`: sizes, ratios, tables.

pub mod bench;
pub mod client;
pub mod completions;
pub mod daemon;
pub mod handover;
pub mod inspect;
pub mod iostat;
pub mod logging;
pub mod man;
pub mod metrics;
pub mod mount;
pub mod mount_options;
pub mod mountinfo;
pub mod output;
pub mod owner;
pub mod props;
pub mod recompress;
pub mod unmount;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "densefs", version, about = "A transparent, compressing overlay file system", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount LOWER on MOUNTPOINT: files written through MOUNTPOINT are stored compressed in LOWER.
    ///
    /// Options (-o, comma-separated, repeatable; man densefs-properties has them all):
    /// {mount_options}
    ///
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
        /// The directory that stores the files (compressed): any directory, empty or not; files
        /// already in it are served as they are.
        lower: PathBuf,
        /// The directory to mount on: programs read and write LOWER's files through it.
        mountpoint: PathBuf,
    },
    /// Unmount a densefs mount, waiting until everything is written back. Refused while files
    /// closed on a full, read-only or failing lower are held in memory only (the daemon retries
    /// them every few seconds): unmounting would lose them.
    Umount {
        /// Unmount even so: files held in memory are lost.
        #[arg(long)]
        force: bool,
        mountpoint: PathBuf,
    },
    /// Set properties on a directory: files created below it (until a deeper directory sets its
    /// own) use them. Properties: {properties}.
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
    /// Properties: {properties} (with SOURCE local, default or
    /// inherited from PATH), and read-only: {read_only}.
    /// For a directory, statistics cover everything below it. man densefs-properties says
    /// what each one is.
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
    /// Print the mount's counters in Prometheus's text format (what -o metrics=ADDR:PORT serves
    /// at /metrics), e.g. for node exporter's textfile collector.
    Metrics { mountpoint: PathBuf },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchWhat,
    },
    /// Print shell completions (bash, zsh, fish, elvish, powershell) to stdout.
    Completions { shell: clap_complete::Shell },
    /// Write the manual pages (densefs.8, densefs-COMMAND.8, densefs-properties.7) into DIR.
    #[command(hide = true)]
    Man {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum BenchWhat {
    /// Compression and decompression GB/s, ratio and CPU seconds per GB of each backend and
    /// algorithm on FILE, in-process (no FUSE), through the engine's policies. One line per
    /// (backend, algorithm); OFFLOADED is the share of records the backend itself compressed.
    Engine {
        /// cpu, gpu, auto (offload=auto: the GPU, and the CPU cores for their share)
        /// or all (cpu, every device this machine has, and auto).
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

/// The clap tree, its help filled in from the tables (codecs, checksums, devices, properties
/// and their defaults), so a new row shows up in `--help` without editing it.
pub fn command() -> clap::Command {
    let mut cmd = Cli::command();
    let subcommands: Vec<String> = cmd.get_subcommands().map(|c| c.get_name().to_string()).collect();
    for name in subcommands {
        cmd = cmd.mut_subcommand(name, |sub| {
            let about = sub.get_about().map(|a| fill_help(&a.to_string()));
            let long_about = sub.get_long_about().map(|a| fill_help(&a.to_string()));
            let sub = match about {
                Some(a) => sub.about(a),
                None => sub,
            };
            match long_about {
                Some(a) => sub.long_about(a),
                None => sub,
            }
        });
    }
    cmd
}

/// Parses this process's arguments (exits with clap's message on a bad command line).
pub fn parse() -> Cli {
    let matches = command().get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Replaces `{codecs}`, `{checksums}`, `{offload}`, `{properties}`, `{read_only}`,
/// `{mount_options}` (every property and mount option, one entry each) and
/// `{default:PROPERTY}`.
pub(crate) fn fill_help(text: &str) -> String {
    let defaults = crate::core::props::PropertyValues::default();
    // Made only where asked for: it fills in each entry's own text with this function.
    let options = if text.contains("{mount_options}") { mount_options_help() } else { String::new() };
    let mut text = text
        .replace("{mount_options}", &options)
        .replace("{read_only}", &props::READ_ONLY.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(", "))
        .replace("{codecs}", &crate::codec::codec_names())
        .replace("{checksums}", &crate::checksum::ChecksumKind::names())
        .replace("{offload}", &crate::engine::offload_names())
        .replace("{properties}", &crate::core::props::SETTABLE.join(", "));
    for p in &crate::core::props::PROPERTIES {
        text = text.replace(&format!("{{default:{}}}", p.name), &(p.show)(&defaults));
    }
    text
}

/// The options part of `densefs mount --help`, from the tables: each property (with its
/// default) and each other mount option, a line with its names and value, then what it does.
fn mount_options_help() -> String {
    let defaults = crate::core::props::PropertyValues::default();
    let mut entries: Vec<(String, String)> = crate::core::props::PROPERTIES
        .iter()
        .map(|p| (format!("{}={}", p.name, p.value), format!("{} (default {})", fill_help(p.about), (p.show)(&defaults))))
        .collect();
    for o in &mount_options::MOUNT_OPTIONS {
        let value = if o.value.is_empty() { String::new() } else { format!("={}", o.value) };
        entries.push((o.names.iter().map(|n| format!("{n}{value}")).collect::<Vec<_>>().join(", "), o.about.to_string()));
    }
    let mut out = Vec::new();
    for (names, about) in entries {
        out.push(format!("  {names}"));
        let mut line = String::from("     ");
        for word in about.split(' ') {
            if line.len() + word.len() >= 80 && !line.trim().is_empty() {
                out.push(std::mem::replace(&mut line, String::from("     ")));
            }
            line.push(' ');
            line.push_str(word);
        }
        out.push(line);
    }
    out.join("\n")
}

/// Runs one parsed command line.
pub fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Mount { foreground, options, log, lower, mountpoint } => {
            mount::mount_or_remount(&lower, &mountpoint, &options.join(","), foreground, log)
        }
        Command::Umount { force, mountpoint } => unmount::umount(&mountpoint, force),
        Command::Set { assignments, directory } => props::set(&assignments, &directory),
        Command::Inherit { property, directory } => props::inherit(&property, &directory),
        Command::Get { scripted, parsable, columns, json, properties, paths } => {
            props::get(scripted, parsable, &columns, json, &properties, &paths)
        }
        Command::List { recursive, scripted, parsable, json, paths } => props::list(recursive, scripted, parsable, json, paths),
        Command::Stat { json, files } => inspect::stat(json, &files),
        Command::Scrub { json, path } => return inspect::scrub(json, &path),
        Command::Recompress { recursive, settings, quiet, paths } => {
            recompress::run(recursive, settings.unwrap_or_default(), quiet, &paths)
        }
        Command::Metrics { mountpoint } => metrics::run(&mountpoint),
        Command::Iostat { interval, count, verbose, mountpoint } => {
            if interval.is_finite() && interval > 0.0 {
                iostat::run(&mountpoint, interval, count, verbose)
            } else {
                Err(format!("invalid interval {interval}"))
            }
        }
        Command::Bench { what: BenchWhat::Engine { backend, compression, recordsize, threads, repeat, no_precheck, size, json, file } } => {
            bench::engine(&backend, &compression, &recordsize, threads, repeat, !no_precheck, size.as_deref(), json, &file)
        }
        Command::Completions { shell } => completions::write(shell, &mut command(), &mut std::io::stdout()).or_else(|e| {
            // Piped into a reader that stopped early: not an error.
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                Ok(())
            } else {
                Err(format!("cannot write the completions: {e}"))
            }
        }),
        Command::Man { out } => man::write_pages(&out),
    };
    finish(result)
}

/// The exit status of a command, its error printed as `densefs: ...`.
pub fn finish(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("densefs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Are we root (the kernel mount, lazy unmounts, root's log directory)?
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_lists_come_from_the_tables() {
        let mut cmd = command();
        let mount = cmd.find_subcommand_mut("mount").unwrap().render_long_help().to_string();
        assert!(!mount.contains('{'), "a placeholder is left: {mount}");
        // Lists wrap over lines.
        let mount = mount.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(mount.contains(&crate::codec::codec_names()), "{mount}");
        assert!(mount.contains("(default lz4)") && mount.contains("(default 128K)") && mount.contains("(default crc32c)"), "{mount}");
        assert!(mount.contains(&crate::engine::offload_names()), "{mount}");
        for sub in ["set", "get"] {
            let help = cmd.find_subcommand_mut(sub).unwrap().render_long_help().to_string();
            assert!(help.contains(&crate::core::props::SETTABLE.join(", ")), "{help}");
        }
    }
}

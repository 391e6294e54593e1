//! The `densefs` command line.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
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
    ///   compression=ALG   off | on | lz4 | gzip | gzip-1..9 | zstd | zstd-1..19 | zstd-fast-1..10 | lzjb | zle (default lz4)
    ///   recordsize=SIZE   power of two from 4K to 1M (default 128K)
    ///   checksum=KIND     crc32c | xxh3 (default crc32c)
    ///   min_savings=PCT   keep a compressed record only if it saves this much (default 12.5%)
    ///   threads=N         FUSE request threads
    ///   allow_other, ro, nosuid, nodev, noexec, noatime, ...  as for any mount
    /// Settings apply to files created from now on; existing files keep theirs.
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Mount { foreground, options, log, lower, mountpoint } => {
            densefs::mount::parse_mount_options(&options.join(","))
                .and_then(|config| densefs::mount::mount(&lower, &mountpoint, config, foreground, log))
        }
        Command::Umount { mountpoint } => densefs::mount::umount(&mountpoint),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("densefs: {e}");
            ExitCode::FAILURE
        }
    }
}

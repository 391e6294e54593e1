//! The `densefs` command line (also run as `mount.densefs` and `mount.fuse.densefs` by mount(8)):
//! parses and hands over to `densefs::cli`.

use densefs::cli;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    // Output piped into `head` ends the command quietly, as for any Unix tool, instead of a
    // panic in println!; `mount` sets SIGPIPE back to ignored for its daemon.
    // SAFETY: restoring a signal's default disposition installs no handler code.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let argv0 = std::env::args_os().next().map(PathBuf::from);
    if argv0.as_deref().and_then(Path::file_name).is_some_and(|n| n == "mount.densefs" || n == "mount.fuse.densefs") {
        return cli::finish(cli::mount::mount_helper(std::env::args().skip(1).collect()));
    }
    cli::run(cli::parse())
}

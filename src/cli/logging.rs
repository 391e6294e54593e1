//! Logs: stderr in the foreground; in the background, a log file if asked for, else syslog, else
//! (no /dev/log) a file of our own.

use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use tracing_subscriber::EnvFilter;

struct Syslog;

impl Write for Syslog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            if let Ok(c) = std::ffi::CString::new(line.replace('%', "%%")) {
                // SAFETY: a NUL-terminated message with every % doubled, so syslog reads no
                // arguments.
                unsafe { libc::syslog(libc::LOG_DAEMON | libc::LOG_NOTICE, c.as_ptr()) };
            }
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn init(log_file: Option<&Path>, daemon: bool) {
    let filter = EnvFilter::try_from_env("DENSEFS_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match (log_file, daemon) {
        (Some(path), _) => match std::fs::OpenOptions::new().create(true).append(true).open(path) {
            Ok(file) => builder.with_ansi(false).with_writer(std::sync::Mutex::new(file)).try_init(),
            Err(e) => {
                eprintln!("densefs: cannot open log file {}: {e}", path.display());
                builder.with_writer(std::io::stderr).try_init()
            }
        },
        (None, true) => {
            // SAFETY: the identity is a static string, as openlog keeps the pointer.
            unsafe { libc::openlog(c"densefs".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
            builder.with_ansi(false).without_time().with_writer(|| Syslog).try_init()
        }
        (None, false) => builder.with_writer(std::io::stderr).try_init(),
    };
}

/// Can syslog(3) reach a daemon on /dev/log (datagram or stream, as glibc tries)?
pub(super) fn syslog_available() -> bool {
    let dgram = std::os::unix::net::UnixDatagram::unbound().and_then(|s| s.connect("/dev/log"));
    dgram.is_ok() || std::os::unix::net::UnixStream::connect("/dev/log").is_ok()
}

/// Where a daemon logs without syslog: `/var/log/densefs/MOUNTPOINT.log` for root,
/// `$XDG_STATE_HOME/densefs/` (`~/.local/state/densefs/`) for others, else the temporary
/// directory; the mount point's path names the file (`/srv/data` -> `srv-data.log`).
pub(super) fn fallback_log(mountpoint: &Path) -> Option<PathBuf> {
    let name = mountpoint.to_string_lossy().trim_matches('/').replace('/', "-");
    let name = format!("{}.log", if name.is_empty() { "root" } else { &name });
    let mut dirs = Vec::new();
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid == 0 {
        dirs.push(PathBuf::from("/var/log/densefs"));
    } else if let Some(state) = std::env::var_os("XDG_STATE_HOME").filter(|s| !s.is_empty()) {
        dirs.push(PathBuf::from(state).join("densefs"));
    } else if let Some(home) = std::env::var_os("HOME").filter(|s| !s.is_empty()) {
        dirs.push(PathBuf::from(home).join(".local/state/densefs"));
    }
    dirs.push(std::env::temp_dir().join(format!("densefs-{euid}")));
    dirs.into_iter().map(|d| d.join(&name)).find(|path| {
        let dir = path.parent().expect("BUG: a log path has a directory");
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).is_ok()
            && std::fs::OpenOptions::new().create(true).append(true).open(path).is_ok()
    })
}

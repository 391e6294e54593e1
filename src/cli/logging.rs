//! Logs: stderr in the foreground; in the background, a log file if asked for, else syslog.

use std::io::Write;
use std::path::Path;
use tracing_subscriber::EnvFilter;

struct Syslog;

impl Write for Syslog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            if let Ok(c) = std::ffi::CString::new(line.replace('%', "%%")) {
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
            unsafe { libc::openlog(c"densefs".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
            builder.with_ansi(false).without_time().with_writer(|| Syslog).try_init()
        }
        (None, false) => builder.with_writer(std::io::stderr).try_init(),
    };
}

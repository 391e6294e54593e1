//! Unmounting: `densefs umount` (which waits for the daemon to write everything back), lazy
//! detaching, and naming the processes that keep a mount busy.

use super::handover::wait_released;
use super::mount::cpath;
use super::mountinfo::mount_source;
use super::{client, is_root};
use crate::control::Control;
use std::path::{Path, PathBuf};

/// Lazy unmount: the mount point goes now, the daemon ends once nothing uses the mount.
pub(super) fn detach(mountpoint: &Path) -> Result<(), String> {
    // SAFETY: umount2 reads a NUL-terminated path that lives until the call returns.
    if is_root() && unsafe { libc::umount2(cpath(mountpoint).as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    run_fusermount(&["-u", "-z"], mountpoint)
}

fn run_fusermount(args: &[&str], mountpoint: &Path) -> Result<(), String> {
    let out = std::process::Command::new("fusermount3")
        .args(args)
        .arg(mountpoint)
        .output()
        .map_err(|e| format!("cannot run fusermount3 (install the fuse3 package): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Every process of this pid namespace but this one: its pid and its /proc directory.
pub(super) fn other_processes() -> impl Iterator<Item = (u32, PathBuf)> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| Some((entry.file_name().to_str()?.parse::<u32>().ok()?, entry.path())))
        .filter(move |(pid, _)| *pid != me)
}

/// The processes using files below `mountpoint`, as fuser -m and lsof name them: "pid 123
/// (bash: cwd)", from each process's cwd, root, executable, open descriptors and mapped files.
pub fn holders(mountpoint: &Path) -> Vec<String> {
    let below = |p: &Path| p.starts_with(mountpoint);
    let mut out = Vec::new();
    for (pid, proc) in other_processes() {
        let mut uses = Vec::new();
        for link in ["cwd", "root", "exe"] {
            if std::fs::read_link(proc.join(link)).is_ok_and(|t| below(&t)) {
                uses.push(link.to_string());
            }
        }
        let open = std::fs::read_dir(proc.join("fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .filter(|t| below(t))
            .count();
        if open > 0 {
            uses.push(super::output::counted(open as u64, "open file", "open files"));
        }
        let maps = std::fs::read_to_string(proc.join("maps")).unwrap_or_default();
        if maps.lines().filter_map(|l| l.split_whitespace().nth(5)).any(|f| below(Path::new(f))) {
            uses.push("mapped file".to_string());
        }
        if !uses.is_empty() {
            let comm = std::fs::read_to_string(proc.join("comm")).unwrap_or_default();
            out.push(format!("pid {pid} ({}: {})", comm.trim(), uses.join(", ")));
        }
    }
    out
}

/// Unmounts, then waits for the daemon to finish writing back and makes the lower durable.
pub fn umount(mountpoint: &Path, force: bool) -> Result<(), String> {
    let mountpoint = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let source = mount_source(&mountpoint).ok_or_else(|| format!("{} is not a densefs mount", mountpoint.display()))?;
    // The daemon retries them first (a lower with room again takes them now). A daemon that
    // cannot be asked (gone, hung) has nothing to say here: unmount as before.
    let held = client::report(&mountpoint, Control::Unwritten).ok().and_then(|v| v["unwritten_files"].as_u64()).unwrap_or(0);
    if held > 0 && !force {
        return Err(format!(
            "{held} closed file(s) on {} could not be written to {} (full, read-only or failing; see the log) and are \
             held in memory only: unmounting now would lose them. Free space or repair the lower (the daemon retries \
             every few seconds), or unmount anyway with `densefs umount --force`",
            mountpoint.display(),
            source.display()
        ));
    }
    run_fusermount(&["-u"], &mountpoint).or_else(|e| {
        // SAFETY: umount reads a NUL-terminated path that lives until the call returns.
        if is_root() && unsafe { libc::umount(cpath(&mountpoint).as_ptr()) } == 0 {
            Ok(())
        } else {
            let users = holders(&mountpoint);
            if users.is_empty() {
                Err(format!("cannot unmount {}: {e}", mountpoint.display()))
            } else {
                Err(format!("cannot unmount {}: {e}; in use by {}", mountpoint.display(), users.join(", ")))
            }
        }
    })?;
    // The daemon holds the lower directory's lock until it has written everything back.
    wait_released(&source)
}

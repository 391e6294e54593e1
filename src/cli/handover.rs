//! From one daemon to the next on one lower directory. A daemon holds the lower's lock (a flock
//! on the directory) until it has written everything back and synced the lower file system, and
//! that can outlast umount(2) by many seconds: FUSE's umount returns at once, and the last syncfs
//! waits for all of the lower file system's dirty data, not only densefs's. So a new mount waits
//! for a daemon that no longer serves the lower (saying so), and `densefs umount` returns only
//! once the daemon is done, as unmounting ext4 does. (umount(8) cannot be made to wait: for a
//! mount without an entry in /run/mount/utab, libmount takes the type from statfs, plain `fuse`,
//! and looks for umount.fuse, which is not densefs's to own.)

use super::mountinfo::{mountinfo, parse_mountinfo_line};
use super::owner::densefs_running;
use super::unmount::other_processes;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long an unmounted daemon may take to write back before a mount or an unmount gives up
/// on it (it is not stopped: it goes on, and a later mount finds the lower free).
pub const WRITEBACK_WAIT: Duration = Duration::from_secs(120);
/// How long a mount waits on a lock whose holder cannot be seen (another pid namespace).
const UNSEEN_HOLDER_WAIT: Duration = Duration::from_secs(10);
/// After this long a wait is announced, so that a person knows why the command pauses.
const ANNOUNCE_AFTER: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_millis(20);
/// Looking for the holder reads every process's descriptors: not at every poll.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// Takes the per-lower-directory lock that keeps two daemons off one lower tree.
pub fn lock_lower(lower: &Path, wait: bool) -> std::io::Result<File> {
    let dir = File::open(lower)?;
    let how = if wait { libc::LOCK_EX } else { libc::LOCK_EX | libc::LOCK_NB };
    // SAFETY: flock on a descriptor `dir` owns and keeps open across the call.
    if unsafe { libc::flock(dir.as_raw_fd(), how) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(dir)
}

/// Is some densefs mount (in this mount namespace) serving `lower` right now?
pub fn is_served(lower: &Path) -> bool {
    mountinfo().iter().any(|m| m.is_densefs() && m.source == lower)
}

/// A densefs process (of this pid namespace, not this one) that holds `lower` open but serves no
/// mount of it in its own mount namespace: a daemon that was unmounted and is still writing back,
/// or one unmounted lazily whose files are still open.
pub fn ending_daemon(lower: &Path) -> Option<u32> {
    let target = std::fs::metadata(lower).ok()?;
    for (pid, proc) in other_processes() {
        if !densefs_running(pid) {
            continue;
        }
        let holds = std::fs::read_dir(proc.join("fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| m.dev() == target.dev() && m.ino() == target.ino()));
        if !holds {
            continue;
        }
        let mounts = std::fs::read_to_string(proc.join("mountinfo")).unwrap_or_default();
        if !mounts.lines().filter_map(parse_mountinfo_line).any(|m| m.is_densefs() && m.source == lower) {
            return Some(pid);
        }
    }
    None
}

/// Takes `lower` for a new daemon: at once if it is free; refused at once if a mount serves it;
/// after waiting (up to WRITEBACK_WAIT) for a daemon that was unmounted to finish writing back.
pub fn take_for_mount(lower: &Path) -> Result<File, String> {
    let start = Instant::now();
    let mut last_look: Option<Instant> = None;
    let mut ending = None;
    let mut announced = false;
    loop {
        if let Ok(lock) = lock_lower(lower, false) {
            return Ok(lock);
        }
        if is_served(lower) {
            return Err(format!("{} is already served by another densefs daemon", lower.display()));
        }
        if last_look.is_none_or(|t| t.elapsed() >= LOOK_EVERY) {
            ending = ending_daemon(lower);
            last_look = Some(Instant::now());
        }
        let limit = if ending.is_some() { WRITEBACK_WAIT } else { UNSEEN_HOLDER_WAIT };
        if start.elapsed() >= limit {
            return Err(match ending {
                Some(pid) => format!(
                    "{} is still held by densefs (pid {pid}), which serves no mount of it any more: it is still writing \
                     back after {} s, or it was unmounted lazily and files on it are still open (`ls -l /proc/{pid}/fd`). \
                     Mount again once it has ended",
                    lower.display(),
                    limit.as_secs()
                ),
                None => format!("{} is already served by another densefs daemon", lower.display()),
            });
        }
        if let (Some(pid), false) = (ending, announced) {
            if start.elapsed() >= ANNOUNCE_AFTER {
                eprintln!("densefs: waiting for the daemon that served {} (pid {pid}) to finish writing back", lower.display());
                announced = true;
            }
        }
        std::thread::sleep(POLL);
    }
}

/// After an unmount: waits until the daemon that served `lower` has let go of it (everything
/// written back and synced).
pub fn wait_released(lower: &Path) -> Result<(), String> {
    let start = Instant::now();
    let mut announced = false;
    while start.elapsed() < WRITEBACK_WAIT {
        if lock_lower(lower, false).is_ok() {
            return Ok(());
        }
        if !announced && start.elapsed() >= ANNOUNCE_AFTER {
            eprintln!("densefs: waiting for the daemon to finish writing back to {}", lower.display());
            announced = true;
        }
        std::thread::sleep(POLL);
    }
    Err(format!(
        "the daemon for {} did not finish writing back within {} s (it goes on: see its log)",
        lower.display(),
        WRITEBACK_WAIT.as_secs()
    ))
}

//! `densefs mount` and mount(8)'s `mount.densefs`: the checks before a mount, and remounts (what
//! the kernel can change on a live mount). The options are parsed in mount_options.rs; taking
//! the lower from an earlier daemon is handover.rs, unmounting unmount.rs; the daemon itself
//! (daemonizing, serving, signals) is daemon.rs.

use super::client;
use super::daemon;
use super::handover::take_for_mount;
use super::logging::{fallback_log, syslog_available};
use super::mount_options::{parse_mount_options, MountConfig};
use super::mountinfo::densefs_mount_at;
use super::owner::{Lease, Owner, TAKEOVER_AFTER};
use super::unmount::detach;
use crate::control::Control;
use crate::core::lower;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(super) fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("paths from the command line have no NUL")
}

/// Whether the file system `path` is on is mounted read-only (statvfs's ST_RDONLY).
fn on_read_only_fs(path: &Path) -> bool {
    File::open(path).and_then(|dir| lower::fstatvfs(dir.as_raw_fd())).is_ok_and(|sv| sv.f_flag & libc::ST_RDONLY != 0)
}

/// A mount point left behind by a killed daemon answers ENOTCONN: detach it.
fn clear_dead_mount(mountpoint: &Path) {
    if let Err(e) = std::fs::metadata(mountpoint) {
        if super::client::daemon_gone(&e) {
            let _ = detach(mountpoint);
        }
    }
}

/// `densefs mount` and mount.densefs: a new mount, or with `remount` among the options a change
/// to a live one.
pub fn mount_or_remount(lower: &Path, mountpoint: &Path, options: &str, foreground: bool, log: Option<PathBuf>) -> Result<(), String> {
    if is_remount(options) {
        return remount(mountpoint, options);
    }
    mount(lower, mountpoint, parse_mount_options(options)?, foreground, log)
}

pub fn mount(lower: &Path, mountpoint: &Path, mut config: MountConfig, foreground: bool, mut log: Option<PathBuf>) -> Result<(), String> {
    // The daemon must outlive whatever read its output: a write to a closed pipe is an error, not
    // a death (the command line resets SIGPIPE to its default for the other commands).
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler code.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let lower = std::fs::canonicalize(lower).map_err(|e| format!("lower directory {}: {e}", lower.display()))?;
    if !lower.is_dir() {
        return Err(format!("lower path {} is not a directory", lower.display()));
    }
    clear_dead_mount(mountpoint);
    let mountpoint = std::fs::canonicalize(mountpoint).map_err(|e| format!("mount point {}: {e}", mountpoint.display()))?;
    if !mountpoint.is_dir() {
        return Err(format!("mount point {} is not a directory", mountpoint.display()));
    }
    if let Some(existing) = densefs_mount_at(&mountpoint) {
        return Err(format!(
            "{} already holds a densefs mount (of {}): unmount it first (densefs umount {0})",
            mountpoint.display(),
            existing.source.display()
        ));
    }
    if !config.read_only() && on_read_only_fs(&lower) {
        // A snapshot or a read-only export: writes fail at once with EROFS (in the kernel, no
        // round trip), and mount(8) and findmnt show `ro` instead of a `rw` that refuses writes.
        eprintln!("densefs: {} is on a read-only file system: mounting read-only", lower.display());
        config.fuse_options.push(fuser::MountOption::RO);
    }
    if lower != mountpoint && (lower.starts_with(&mountpoint) || mountpoint.starts_with(&lower)) {
        // Mounting over the lower directory itself works (the daemon holds it open first);
        // one inside the other would recurse.
        return Err("the lower directory and the mount point must not contain each other".into());
    }
    // A daemon that was just unmounted may still be writing back: it is waited for.
    let lock = take_for_mount(&lower)?;
    // Other machines do not see the flock: a shared lower also gets an owner record (owner.rs).
    let lease = if !config.read_only() && config.multihost.applies_to(&lower) {
        let waiting = |o: &Owner| {
            eprintln!(
                "densefs: {} holds an owner record of host {} (pid {}): watching its heartbeat for {} s",
                lower.display(),
                o.host,
                o.pid,
                TAKEOVER_AFTER.as_secs()
            )
        };
        Some(Arc::new(Lease::acquire(&lower, &mountpoint, TAKEOVER_AFTER, waiting).map_err(|r| r.message(&lower))?))
    } else {
        None
    };
    if !foreground && log.is_none() && !syslog_available() {
        log = fallback_log(&mountpoint);
        match &log {
            Some(path) => eprintln!("densefs: no syslog (/dev/log): the daemon logs to {}", path.display()),
            None => eprintln!("densefs: no syslog (/dev/log) and no writable log directory: the daemon will not log (use --log FILE)"),
        }
    }
    let served = if foreground {
        daemon::serve(&lower, &mountpoint, &config, lock, lease.clone(), None, log)
    } else {
        daemon::start(&lower, &mountpoint, &config, lock, lease.clone(), log)
    };
    if let (Err(_), Some(lease)) = (&served, &lease) {
        // The daemon never served (or, in the foreground, has ended): the lower is free again.
        lease.release();
    }
    served
}

/// mount(8) runs `mount.densefs LOWER MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]` (and, for a
/// mount it finds as type fuse.densefs, as for `mount -o remount`, `mount.fuse.densefs`).
pub fn mount_helper(args: Vec<String>) -> Result<(), String> {
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
    if let ([mountpoint], true) = (positional.as_slice(), is_remount(&options.join(","))) {
        return remount(Path::new(mountpoint), &options.join(","));
    }
    let [lower, mountpoint] = positional.as_slice() else {
        return Err("usage: mount.densefs LOWER MOUNTPOINT [-o OPTIONS]".into());
    };
    mount_or_remount(Path::new(lower), Path::new(mountpoint), &options.join(","), false, None)
}

/// Is `remount` among the options (`mount -o remount,ro`)?
pub fn is_remount(options: &str) -> bool {
    options.split(',').any(|o| o.trim() == "remount")
}

/// `mount -o remount,...`: changes what the kernel can change on a live mount (ro/rw, nosuid,
/// nodev, noexec, atime flags, sync, dirsync). densefs's own options are fixed at mount time;
/// given with their current value (as mount(8) does from an fstab line) they are accepted.
pub fn remount(mountpoint: &Path, options: &str) -> Result<(), String> {
    let mountpoint = std::fs::canonicalize(mountpoint).map_err(|e| format!("mount point {}: {e}", mountpoint.display()))?;
    let entry = densefs_mount_at(&mountpoint).ok_or_else(|| format!("{} is not a densefs mount", mountpoint.display()))?;
    let flag = |name: &str| -> Option<(libc::c_ulong, bool)> {
        Some(match name {
            "ro" => (libc::MS_RDONLY, true),
            "rw" => (libc::MS_RDONLY, false),
            "nosuid" => (libc::MS_NOSUID, true),
            "suid" => (libc::MS_NOSUID, false),
            "nodev" => (libc::MS_NODEV, true),
            "dev" => (libc::MS_NODEV, false),
            "noexec" => (libc::MS_NOEXEC, true),
            "exec" => (libc::MS_NOEXEC, false),
            "noatime" => (libc::MS_NOATIME, true),
            "atime" => (libc::MS_NOATIME, false),
            "nodiratime" => (libc::MS_NODIRATIME, true),
            "diratime" => (libc::MS_NODIRATIME, false),
            "relatime" => (libc::MS_RELATIME, true),
            "norelatime" => (libc::MS_RELATIME, false),
            "strictatime" => (libc::MS_STRICTATIME, true),
            "sync" => (libc::MS_SYNCHRONOUS, true),
            "async" => (libc::MS_SYNCHRONOUS, false),
            "dirsync" => (libc::MS_DIRSYNC, true),
            _ => return None,
        })
    };
    // Start from the mount's flags as they are: MS_REMOUNT sets all of them.
    let mut flags: libc::c_ulong = 0;
    for o in entry.mount_options.split(',').chain(entry.super_options.split(',')) {
        if let Some((bit, true)) = flag(o) {
            flags |= bit;
        }
    }
    let mut fixed = Vec::new();
    for item in options.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, value) = item.split_once('=').unwrap_or((item, ""));
        if let Some((bit, on)) = flag(item) {
            if on {
                flags |= bit
            } else {
                flags &= !bit
            }
            if bit == libc::MS_STRICTATIME {
                flags &= !(libc::MS_RELATIME | libc::MS_NOATIME);
            }
            continue;
        }
        match key {
            "remount" | "defaults" | "auto" | "noauto" | "nofail" | "_netdev" | "user" | "users" | "default_permissions" => {}
            // What the kernel shows of a FUSE mount, passed back by mount(8) (merged from mountinfo).
            "user_id" | "group_id" | "rootmode" | "max_read" | "blksize" | "fd" | "fsname" | "subtype" => {}
            "allow_other" | "allow_root" if entry.super_options.split(',').any(|o| o == "allow_other") => {}
            "compression" | "compress" | "recordsize" | "checksum" | "min_savings" | "offload" => {
                parse_mount_options(item)?;
                let name = if key == "compress" { "compression" } else { key };
                let live = client::report(&mountpoint, Control::PROPERTIES)
                    .ok()
                    .and_then(|r| r["properties"][name]["value"].as_str().map(String::from));
                let same = live.as_deref().is_some_and(|v| parse_mount_options(&format!("{name}={v}")) == parse_mount_options(item));
                if !same {
                    return Err(format!(
                        "{key}={value}: {name} cannot change on a live mount (it is {}); `densefs set {name}={value} {}` \
                         applies it to files created from now on, or unmount and mount again",
                        live.as_deref().unwrap_or("unknown"),
                        mountpoint.display()
                    ));
                }
            }
            _ => {
                parse_mount_options(item)?;
                fixed.push(item.to_string());
            }
        }
    }
    // The daemon applies the access-time mode it was mounted with (core/atime.rs): the flags
    // shown may not say another.
    let mode = |flags: libc::c_ulong| match flags {
        f if f & libc::MS_NOATIME != 0 => "noatime",
        f if f & libc::MS_RELATIME != 0 => "relatime",
        _ => "strictatime",
    };
    let mut shown: libc::c_ulong = 0;
    for o in entry.mount_options.split(',') {
        if let Some((bit, true)) = flag(o) {
            shown |= bit;
        }
    }
    if mode(flags) != mode(shown) {
        return Err(format!(
            "{}: the access-time mode cannot change on a live mount (it is {}); unmount and mount again",
            mode(flags),
            mode(shown)
        ));
    }
    if !fixed.is_empty() {
        eprintln!(
            "densefs: {}: cannot change on a live mount, left as they were (unmount and mount again to change them)",
            fixed.join(",")
        );
    }
    // SAFETY: the paths are NUL-terminated and live until the call returns; a remount reads no
    // type or data (null).
    let r = unsafe {
        libc::mount(
            cpath(&entry.source).as_ptr(),
            cpath(&mountpoint).as_ptr(),
            std::ptr::null(),
            flags | libc::MS_REMOUNT,
            std::ptr::null(),
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EBUSY) if flags & libc::MS_RDONLY != 0 => {
                format!("cannot remount {} read-only: files are open for writing on it", mountpoint.display())
            }
            Some(libc::EPERM) => format!("cannot remount {}: only root can ({e})", mountpoint.display()),
            _ => format!("cannot remount {}: {e}", mountpoint.display()),
        });
    }
    Ok(())
}

//! Extended attributes, passed through to the lower inode, symlinks included. Every call goes
//! through the inode's own descriptor (O_PATH, or read-only) as `/proc/self/fd/N` with the *following* xattr
//! calls: following that magic link lands on the inode the descriptor holds (opened with
//! O_NOFOLLOW, so for a symlink the link itself) and goes no further, so a symlink's target is
//! never reached, and no name is resolved again (no rename race can swap the inode). The lower
//! file system decides what a symlink may carry: Linux allows trusted.* and security.* and
//! refuses user.* (EPERM to set, ENODATA to read), and that answer is passed through.
//!
//! The `user.densefs.` namespace is densefs's own and never reaches the lower inode: it is how
//! the `densefs` command talks to the daemon. On a symlink these names answer as user.* does on
//! Linux symlinks (ENODATA to read, EPERM to set or remove) and never reach the lower inode
//! (the kernel refuses them before they get here; this is the daemon's own guard).
//! The requests are the table in `crate::control` (reports, engine counters, recompress, the
//! properties); the dispatch below matches on its [`Control`] values, never on spelled names.

use super::fileattr::Change;
use super::inodes::Node;
use super::lower::{self, cstr};
use super::props::{PROPS_XATTR, XATTR_PREFIX};
use super::{DenseFs, FsError, FsResult};
use crate::control::{own_key, Control};
use std::ffi::{CString, OsStr};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A report computed for a size probe is served to the read that follows it.
const REPORT_REUSE: Duration = Duration::from_secs(10);

/// Asked by the kernel before a file's first write and chmod/chown (to drop it): answered from
/// `Inode::no_capability` when the lower is known to have none.
const CAPABILITY: &str = "security.capability";

/// Asked of every entry by `ls -l` (libselinux's lgetfilecon, for the `.` after the mode).
/// Without SELinux on this host, a file that has no label answers EOPNOTSUPP instead of
/// ENODATA: `ls` then stops asking for the rest of the mount (coreutils keeps the last device
/// that said so), which halves the requests a cold `ls -l` makes. A label that is there is
/// still read, and set or removed, as any other attribute.
const SELINUX_LABEL: &str = "security.selinux";

fn selinux_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::path::Path::new("/sys/fs/selinux/enforce").exists())
}

impl DenseFs {
    /// What the xattr calls take for `nodeid`: its descriptor kept open (in the node) while
    /// the call runs, and its /proc path unless that descriptor is open for reading.
    fn xattr_target(&self, nodeid: u64) -> FsResult<XattrTarget> {
        let node = self.inode(nodeid)?;
        let path = if node.readable_fd().is_some() { None } else { Some(lower::proc_path(node.raw_fd())) };
        Ok(XattrTarget { node, path })
    }

    fn is_symlink(&self, nodeid: u64) -> FsResult<bool> {
        Ok(self.inode(nodeid)?.kind == libc::S_IFLNK)
    }

    fn own_getxattr(&self, nodeid: u64, key: &str, probe: bool) -> FsResult<Vec<u8>> {
        let what = match Control::parse(key) {
            Some(Control::Report(kind)) => kind,
            // Live counters: cheap, never cached, the same on every path of the mount.
            Some(Control::Engine) => return Ok(self.engine_report().into_bytes()),
            Some(Control::Unwritten) => return Ok(serde_json::json!({"unwritten_files": self.retry_unwritten()}).to_string().into_bytes()),
            Some(Control::Property(name)) => return self.property_value(nodeid, name).map(String::into_bytes),
            // Write-only (recompress), the lower tree's own store (`props`), unknown names.
            Some(Control::Recompress) | None => return Err(FsError::errno(libc::ENODATA)),
        };
        let mut cache = self.last_report.lock();
        if let Some((id, k, at, value)) = cache.as_ref() {
            if *id == nodeid && k == key && at.elapsed() < REPORT_REUSE {
                let value = value.clone();
                if !probe {
                    *cache = None;
                }
                return Ok(value);
            }
        }
        drop(cache);
        let value = self.report(nodeid, what)?.into_bytes();
        if value.len() > 65536 {
            return Err(FsError::new(libc::E2BIG, "report larger than an xattr value"));
        }
        if probe {
            *self.last_report.lock() = Some((nodeid, key.to_string(), Instant::now(), value.clone()));
        }
        Ok(value)
    }

    /// Reads a whole value (sized by asking the lower first). `probe`: the caller only wants the
    /// size and will ask again.
    pub fn getxattr(&self, nodeid: u64, name: &OsStr, probe: bool) -> FsResult<Vec<u8>> {
        if let Some(key) = own_key(name) {
            if self.is_symlink(nodeid)? {
                return Err(FsError::errno(libc::ENODATA));
            }
            return self.own_getxattr(nodeid, key, probe);
        }
        // The inode whose `no_capability` answers for the lower, when the name is the capability.
        let capability = if name == CAPABILITY { Some(self.inode(nodeid)?) } else { None };
        let absent_label_unsupported = name == SELINUX_LABEL && !selinux_enabled();
        if capability.as_ref().is_some_and(|i| i.no_capability.load(Ordering::Relaxed)) {
            return Err(FsError::errno(libc::ENODATA));
        }
        let target = self.xattr_target(nodeid)?;
        let name = cstr(name)?;
        loop {
            let len = match lower::getxattr_on(target.on(), &name, &mut []) {
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {
                    if let Some(inode) = &capability {
                        inode.no_capability.store(true, Ordering::Relaxed);
                    }
                    if absent_label_unsupported {
                        return Err(FsError::errno(libc::EOPNOTSUPP));
                    }
                    return Err(e.into());
                }
                len => len?,
            };
            let mut buf = vec![0u8; len];
            match lower::getxattr_on(target.on(), &name, &mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(buf);
                }
                Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue, // grew meanwhile
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The NUL-separated list of names.
    pub fn listxattr(&self, nodeid: u64) -> FsResult<Vec<u8>> {
        let target = self.xattr_target(nodeid)?;
        loop {
            let len = lower::listxattr_on(target.on(), &mut [])?;
            let mut buf = vec![0u8; len];
            match lower::listxattr_on(target.on(), &mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(hide_own_names(&buf));
                }
                Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// `kill_sgid`: the kernel found the caller of an ACL change neither in the file's group
    /// nor holding CAP_FSETID (FUSE_SETXATTR_ACL_KILL_SGID): as chmod would, the change takes
    /// setgid, which the daemon's own setxattr, as root, keeps.
    pub fn setxattr(&self, nodeid: u64, name: &OsStr, value: &[u8], flags: i32, kill_sgid: bool) -> FsResult<()> {
        if let Some(key) = own_key(name) {
            if self.is_symlink(nodeid)? {
                return Err(FsError::new(libc::EPERM, "densefs's own attributes do not apply to symlinks"));
            }
            let value = std::str::from_utf8(value).map_err(|_| FsError::new(libc::EINVAL, "property values are text"))?;
            return match Control::parse(key) {
                Some(Control::Recompress) => self.recompress(nodeid, value),
                Some(Control::Property(name)) => self.set_property(nodeid, name, Some(value.trim())),
                // Nothing settable: refused there as an unknown property (ENOTDIR on a file, else EINVAL).
                _ => self.set_property(nodeid, key, Some(value.trim())),
            };
        }
        let inode = self.inode(nodeid)?;
        self.check_protection(&inode, Change::Metadata)?;
        inode.no_capability.store(false, Ordering::Relaxed);
        let target = self.xattr_target(nodeid)?;
        let name = cstr(name)?;
        lower::setxattr_on(target.on(), &name, value, flags)?;
        if kill_sgid {
            let mode = lower::stat_fd(target.node.raw_fd())?.st_mode & 0o7777;
            if mode & libc::S_ISGID != 0 {
                lower::chmod(&lower::proc_path(target.node.raw_fd()), mode & !libc::S_ISGID)?;
            }
        }
        Ok(())
    }

    pub fn removexattr(&self, nodeid: u64, name: &OsStr) -> FsResult<()> {
        if let Some(key) = own_key(name) {
            if self.is_symlink(nodeid)? {
                return Err(FsError::new(libc::EPERM, "densefs's own attributes do not apply to symlinks"));
            }
            return match Control::parse(key) {
                Some(Control::Property(name)) => self.set_property(nodeid, name, None),
                // Nothing to inherit: refused there as an unknown property.
                _ => self.set_property(nodeid, key, None),
            };
        }
        self.check_protection(&*self.inode(nodeid)?, Change::Metadata)?;
        let target = self.xattr_target(nodeid)?;
        let name = cstr(name)?;
        lower::removexattr_on(target.on(), &name)?;
        Ok(())
    }
}

/// An inode held for an xattr call, and the /proc path to use when its descriptor is O_PATH.
struct XattrTarget {
    node: Node,
    path: Option<CString>,
}

impl XattrTarget {
    fn on(&self) -> lower::XattrOn<'_> {
        match (&self.path, self.node.readable_fd()) {
            (None, Some(fd)) => lower::XattrOn::Fd(fd),
            (Some(path), _) => lower::XattrOn::Path(path),
            (None, None) => unreachable!("BUG: a target without a path has a readable descriptor"),
        }
    }
}

/// Drops densefs's own names from a NUL-separated xattr name list.
fn hide_own_names(list: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(list.len());
    for name in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        if !name.starts_with(XATTR_PREFIX.as_bytes()) && name != PROPS_XATTR.as_bytes() {
            out.extend_from_slice(name);
            out.push(0);
        }
    }
    out
}

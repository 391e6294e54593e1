//! The one reader of /proc/self/mountinfo: which mounts exist, which are densefs, and where a
//! path's densefs mount is. Fields are unescaped (the kernel writes space, tab, newline and
//! backslash as octal `\NNN`), so paths with spaces match.

use std::path::{Path, PathBuf};

/// One line of /proc/self/mountinfo, its fields unescaped.
#[derive(Debug, Clone, PartialEq)]
pub struct MountEntry {
    /// The file system's device number, `MAJOR:MINOR` (a FUSE mount's is also its bdi's name).
    pub device: String,
    pub point: PathBuf,
    /// Per-mount options (`rw,nosuid,nodev,relatime`).
    pub mount_options: String,
    pub fstype: String,
    pub source: PathBuf,
    /// Per-superblock options (`rw,user_id=0,...`).
    pub super_options: String,
}

impl MountEntry {
    /// A densefs mount: `fuse.densefs`, or plain `fuse` whose source is a directory (root mounts
    /// made by densefs before it mounted with its own type, through fuser).
    pub fn is_densefs(&self) -> bool {
        self.fstype == "fuse.densefs" || (self.fstype == "fuse" && self.source.is_dir())
    }
}

/// Parses one mountinfo line: `ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER`.
pub fn parse_mountinfo_line(line: &str) -> Option<MountEntry> {
    let fields: Vec<&str> = line.split(' ').collect();
    let sep = fields.iter().position(|f| *f == "-")?;
    Some(MountEntry {
        device: fields.get(2)?.to_string(),
        point: PathBuf::from(unescape(fields.get(4)?)),
        mount_options: fields.get(5)?.to_string(),
        fstype: unescape(fields.get(sep + 1)?).to_string_lossy().into_owned(),
        source: PathBuf::from(unescape(fields.get(sep + 2)?)),
        super_options: fields.get(sep + 3).map_or(String::new(), |s| s.to_string()),
    })
}

/// This process's mounts, in mount order (a later entry on the same point is on top).
pub fn mountinfo() -> Vec<MountEntry> {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default().lines().filter_map(parse_mountinfo_line).collect()
}

/// The densefs mount whose mount point is `mountpoint` (the top one, if several are stacked).
pub fn densefs_mount_at(mountpoint: &Path) -> Option<MountEntry> {
    mountinfo().into_iter().rev().find(|m| m.point == mountpoint).filter(MountEntry::is_densefs)
}

/// The lower directory a densefs mount point serves (its mount source).
pub fn mount_source(mountpoint: &Path) -> Option<PathBuf> {
    densefs_mount_at(mountpoint).map(|m| m.source)
}

/// The mount point of the densefs mount holding `path`, if any.
pub fn mountpoint_of(path: &Path) -> Option<PathBuf> {
    let path = std::fs::canonicalize(path).ok()?;
    let mounts = mountinfo();
    // The deepest mount point above the path; densefs only if the top mount there is.
    let point = mounts.iter().filter(|m| path.starts_with(&m.point)).map(|m| &m.point).max_by_key(|p| p.as_os_str().len())?;
    mounts.iter().rev().find(|m| &m.point == point).filter(|m| m.is_densefs()).map(|m| m.point.clone())
}

/// Every densefs mount point, in mount order.
pub fn densefs_mounts() -> Vec<PathBuf> {
    let mut points: Vec<PathBuf> = mountinfo().into_iter().filter(|m| m.is_densefs()).map(|m| m.point).collect();
    points.dedup();
    points
}

/// Decodes the kernel's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` backslash).
fn unescape(field: &str) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes.get(i + 1..i + 4).filter(|c| c.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], code) {
            (b'\\', Some(c)) => {
                let n = c.iter().fold(0u32, |n, b| n * 8 + u32::from(b - b'0'));
                out.push(n as u8);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    std::ffi::OsString::from_vec(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(r"/mnt/with\040space"), "/mnt/with space");
        assert_eq!(unescape(r"a\011b\012c\134d\"), "a\tb\nc\\d\\");
        assert_eq!(unescape(r"\303\251t\303\251"), "été");
        let e =
            parse_mountinfo_line(r"42 27 0:39 / /tmp/a\040b rw,nosuid,nodev,relatime shared:1 - fuse.densefs /tmp/low\040er rw,user_id=0")
                .unwrap();
        assert_eq!(e.point, Path::new("/tmp/a b"));
        assert_eq!(e.device, "0:39");
        assert_eq!(e.source, Path::new("/tmp/low er"));
        assert_eq!(
            (e.fstype.as_str(), e.mount_options.as_str(), e.super_options.as_str()),
            ("fuse.densefs", "rw,nosuid,nodev,relatime", "rw,user_id=0")
        );
    }
}

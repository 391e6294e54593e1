//! Properties, ZFS style: set on a directory, inherited by everything created below it until a
//! deeper directory overrides them; the mount options are the root's defaults.
//!
//! A directory's local properties live in one xattr of the lower directory, `user.densefs.props`
//! (`name=value` lines); where the lower file system has no user xattrs, in a file
//! `.densefs.props` in that directory instead. Both are invisible through the mount.

use super::error::{check, FsError, FsResult};
use super::lower::{self, cstr};
use crate::checksum::ChecksumKind;
use crate::codec::Compression;
use crate::engine::{MinSavings, Offload};
use crate::format::Layout;
use std::ffi::OsStr;
use std::io::Write;
use std::os::fd::{FromRawFd, RawFd};

/// Names through which the CLI talks to the daemon (xattrs on mount paths).
pub const XATTR_PREFIX: &str = "user.densefs.";
pub const PROPS_XATTR: &str = "user.densefs.props";
pub const PROPS_FILE: &str = ".densefs.props";
pub const SETTABLE: [&str; 5] = ["compression", "recordsize", "min_savings", "checksum", "offload"];

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalProps {
    pub compression: Option<Compression>,
    pub recordsize: Option<Layout>,
    pub min_savings: Option<MinSavings>,
    pub checksum: Option<ChecksumKind>,
    pub offload: Option<Offload>,
}

pub fn format_recordsize(layout: Layout) -> String {
    let rs = layout.record_size();
    if rs >= 1 << 20 { format!("{}M", rs >> 20) } else { format!("{}K", rs >> 10) }
}

/// Parses "128K", "1M" or "131072".
pub fn parse_recordsize(text: &str) -> Result<Layout, String> {
    let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let mult: u64 = match unit {
        "" => 1,
        "k" | "K" => 1 << 10,
        "m" | "M" => 1 << 20,
        _ => 0,
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .and_then(Layout::new)
        .ok_or_else(|| format!("invalid recordsize '{text}' (a power of two from 4K to 1M, e.g. 128K)"))
}

impl LocalProps {
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        match name {
            "compression" => self.compression = Some(Compression::parse(value)?),
            "recordsize" => self.recordsize = Some(parse_recordsize(value)?),
            "min_savings" => self.min_savings = Some(MinSavings::parse(value)?),
            "checksum" => self.checksum = Some(ChecksumKind::parse(value)?),
            "offload" => self.offload = Some(Offload::parse(value)?),
            _ => return Err(format!("unknown property '{name}' (settable: {})", SETTABLE.join(", "))),
        }
        Ok(())
    }

    pub fn unset(&mut self, name: &str) -> Result<(), String> {
        match name {
            "compression" => self.compression = None,
            "recordsize" => self.recordsize = None,
            "min_savings" => self.min_savings = None,
            "checksum" => self.checksum = None,
            "offload" => self.offload = None,
            _ => return Err(format!("unknown property '{name}' (settable: {})", SETTABLE.join(", "))),
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<String> {
        match name {
            "compression" => self.compression.map(|c| c.to_string()),
            "recordsize" => self.recordsize.map(format_recordsize),
            "min_savings" => self.min_savings.map(|m| m.to_string()),
            "checksum" => self.checksum.map(|c| c.name().to_string()),
            "offload" => self.offload.map(|o| o.to_string()),
            _ => None,
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == LocalProps::default()
    }

    /// `name=value` lines; unknown or invalid lines are reported, not silently dropped.
    pub fn parse(text: &str) -> Result<LocalProps, String> {
        let mut props = LocalProps::default();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let (name, value) = line.split_once('=').ok_or_else(|| format!("bad property line '{line}'"))?;
            props.set(name.trim(), value.trim())?;
        }
        Ok(props)
    }

    pub fn encode(&self) -> String {
        SETTABLE.iter().filter_map(|n| self.get(n).map(|v| format!("{n}={v}\n"))).collect()
    }
}

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// Reads a directory's local properties (`dir` is an O_PATH descriptor of it).
pub fn read_local(dir: RawFd) -> FsResult<LocalProps> {
    let path = lower::proc_path(dir);
    let name = cstr(OsStr::new(PROPS_XATTR))?;
    let mut buf = vec![0u8; 4096];
    let n = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
    let text = if n >= 0 {
        buf.truncate(n as usize);
        String::from_utf8_lossy(&buf).into_owned()
    } else {
        let e = std::io::Error::last_os_error();
        if !matches!(errno_of(&e), libc::ENODATA | libc::ENOTSUP) {
            return Err(e.into());
        }
        let file = cstr(OsStr::new(PROPS_FILE))?;
        let fd = unsafe { libc::openat(dir, file.as_ptr(), libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return if errno_of(&e) == libc::ENOENT { Ok(LocalProps::default()) } else { Err(e.into()) };
        }
        let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
        let mut s = String::new();
        std::io::Read::read_to_string(&mut f, &mut s)?;
        s
    };
    LocalProps::parse(&text).map_err(|e| FsError::new(libc::EIO, format!("stored properties: {e}")))
}

/// Stores a directory's local properties: in the xattr, or the file where xattrs are refused.
pub fn write_local(dir: RawFd, props: &LocalProps) -> FsResult<()> {
    let path = lower::proc_path(dir);
    let name = cstr(OsStr::new(PROPS_XATTR))?;
    let file = cstr(OsStr::new(PROPS_FILE))?;
    let text = props.encode();
    let r = if props.is_empty() {
        unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) }
    } else {
        unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), text.as_ptr() as *const libc::c_void, text.len(), 0) }
    };
    if r == 0 || (props.is_empty() && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENODATA)) {
        // A stale fallback file must not shadow what the xattr now says.
        unsafe { libc::unlinkat(dir, file.as_ptr(), 0) };
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if !matches!(errno_of(&e), libc::ENOTSUP | libc::ENODATA) {
        return Err(e.into());
    }
    if props.is_empty() {
        let r = unsafe { libc::unlinkat(dir, file.as_ptr(), 0) };
        if r != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT) {
            return Err(std::io::Error::last_os_error().into());
        }
        return Ok(());
    }
    // Write a temporary file and rename it over, so a crash leaves the old or the new set.
    let tmp = cstr(OsStr::new(".densefs.props.tmp"))?;
    let fd = check(unsafe {
        libc::openat(dir, tmp.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0o644)
    })?;
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    check(unsafe { libc::renameat(dir, tmp.as_ptr(), dir, file.as_ptr()) })?;
    Ok(())
}

/// Is this a name densefs keeps for itself in the lower tree (`.densefs.*`)?
pub fn is_reserved_name(name: &OsStr) -> bool {
    std::os::unix::ffi::OsStrExt::as_bytes(name).starts_with(b".densefs.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_round_trip_and_bad_values_are_refused() {
        let mut p = LocalProps::default();
        p.set("compression", "gzip").unwrap();
        p.set("recordsize", "1M").unwrap();
        p.set("min_savings", "20%").unwrap();
        assert_eq!(p.encode(), "compression=gzip-6\nrecordsize=1M\nmin_savings=20%\n");
        assert_eq!(LocalProps::parse(&p.encode()).unwrap(), p);
        assert!(p.set("compression", "gzip-11").is_err());
        assert!(p.set("recordsize", "3K").is_err());
        assert!(p.set("colour", "red").is_err());
        p.unset("compression").unwrap();
        assert_eq!(p.get("compression"), None);
        assert!(LocalProps::parse("compression").is_err());
        assert_eq!(parse_recordsize("131072").unwrap().record_size(), 131072);
    }

    #[test]
    fn properties_fall_back_to_a_file_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let fd = lower::open_root(dir.path()).unwrap();
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        let mut p = LocalProps::default();
        p.set("compression", "zstd-9").unwrap();
        write_local(raw, &p).unwrap();
        assert_eq!(read_local(raw).unwrap(), p);
        write_local(raw, &LocalProps::default()).unwrap();
        assert!(read_local(raw).unwrap().is_empty());
        // The fallback file alone is read too.
        std::fs::write(dir.path().join(PROPS_FILE), "recordsize=4K\n").unwrap();
        assert_eq!(read_local(raw).unwrap().recordsize.map(|l| l.record_size()), Some(4096));
    }
}

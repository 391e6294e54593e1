//! Properties, ZFS style: set on a directory, inherited by everything created below it until a
//! deeper directory overrides them; the mount options are the root's defaults.
//!
//! A directory's local properties live in one xattr of the lower directory, `user.densefs.props`
//! (`name=value` lines); where the lower file system has no user xattrs, in a file
//! `.densefs.props` in that directory instead. Both are invisible through the mount.

use super::error::{FsError, FsResult};
use super::lower::{self, cstr};
use crate::checksum::ChecksumKind;
use crate::codec::{Compression, Setting};
use crate::engine::{MinSavings, Offload};
use crate::format::Layout;
use std::ffi::OsStr;
use std::io::Write;
use std::os::fd::RawFd;

/// Names through which the CLI talks to the daemon (xattrs on mount paths).
pub const XATTR_PREFIX: &str = "user.densefs.";
pub const PROPS_XATTR: &str = "user.densefs.props";
pub const PROPS_FILE: &str = ".densefs.props";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalProps {
    pub compression: Option<Setting>,
    pub recordsize: Option<Layout>,
    pub min_savings: Option<MinSavings>,
    pub checksum: Option<ChecksumKind>,
    pub offload: Option<Offload>,
    pub background_compression: Option<Compression>,
}

/// The value of every property: the mount's (its options, the root's defaults) or what is in
/// effect in a directory, which files created there get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PropertyValues {
    pub compression: Setting,
    pub layout: Layout,
    pub checksum: ChecksumKind,
    pub min_savings: MinSavings,
    pub offload: Offload,
    /// What a closed, quiet file's records are re-encoded with in the background (`off`: never).
    pub background_compression: Compression,
}

impl Default for PropertyValues {
    /// The defaults of a mount without options.
    fn default() -> PropertyValues {
        PropertyValues {
            compression: Setting::LZ4,
            layout: Layout::new(128 * 1024).expect("BUG: 128K is a valid record size"),
            checksum: ChecksumKind::Crc32c,
            min_savings: MinSavings::ZFS,
            offload: Offload::Auto,
            background_compression: Compression::OFF,
        }
    }
}

impl PropertyValues {
    pub fn record_policy(&self) -> crate::core::RecordPolicy {
        crate::core::RecordPolicy { min_savings: self.min_savings, offload: self.offload }
    }
}

/// One property: how its text is read and written, where a directory keeps it
/// ([`LocalProps`]) and what it sets in the [`PropertyValues`] files are created with.
///
/// `set`/`get`/`inherit`, the `user.densefs.NAME` xattrs, the stored `name=value` lines, mount
/// options, `effective()` (inheritance) and `recompress` all go through these rows; values pass
/// between them typed, never through their text.
pub struct Property {
    pub name: &'static str,
    /// What its value looks like, for help and manual pages (`ALG`, `SIZE`).
    pub value: &'static str,
    /// What it does, for `densefs mount --help` and densefs-properties(7): may name the tables'
    /// lists as `{codecs}`, `{checksums}` and `{offload}` (`cli::fill_help` fills them in).
    pub about: &'static str,
    /// Parses a value into a directory's local properties.
    pub parse: fn(&str, &mut LocalProps) -> Result<(), String>,
    /// Removes the directory's own value (it inherits again).
    pub clear: fn(&mut LocalProps),
    /// The directory's own value, as text.
    pub local: fn(&LocalProps) -> Option<String>,
    /// The value in effect, as text.
    pub show: fn(&PropertyValues) -> String,
    /// Copies the directory's own value, if it has one, into `values`; false if it has none.
    pub apply: fn(&LocalProps, &mut PropertyValues) -> bool,
}

impl Property {
    /// Parses a value straight into `values` (mount options, recompress).
    pub fn parse_into(&self, text: &str, values: &mut PropertyValues) -> Result<(), String> {
        let mut local = LocalProps::default();
        (self.parse)(text, &mut local)?;
        (self.apply)(&local, values);
        Ok(())
    }
}

/// A row of [`PROPERTIES`]: the property's name, its value's shape and what it does (help and
/// manual pages), its field in [`LocalProps`] and in
/// [`PropertyValues`], the parser and the printer of its values.
macro_rules! property {
    ($name:literal, $value:literal, $about:literal, $local:ident, $option:ident, $parse:expr, $show:expr) => {
        Property {
            name: $name,
            value: $value,
            about: $about,
            parse: |text, local| {
                local.$local = Some($parse(text)?);
                Ok(())
            },
            clear: |local| local.$local = None,
            local: |local| local.$local.as_ref().map($show),
            show: |options| $show(&options.$option),
            apply: |local, options| match local.$local {
                Some(v) => {
                    options.$option = v;
                    true
                }
                None => false,
            },
        }
    };
}

/// The property table; rows print in this order (`densefs get`, stored lines).
///
/// Adding a property, all in this file: a field in [`LocalProps`] and in [`PropertyValues`] (with
/// its default), and a row here with its parser and printer; then whatever reads the value uses
/// it. The CLI and its help, the xattrs, storage, mount options, inheritance and recompress need
/// no change.
pub const PROPERTIES: [Property; 6] = [
    property!(
        "compression",
        "ALG",
        "How new records are compressed: {codecs}, or auto (picked per record from the data and the load).",
        compression,
        compression,
        Setting::parse,
        |c: &Setting| c.to_string()
    ),
    property!(
        "recordsize",
        "SIZE",
        "The size of the records a new file is cut into, each compressed and checksummed on its own: a power of two from 4K to 1M.",
        recordsize,
        layout,
        parse_recordsize,
        |l: &Layout| format_recordsize(*l)
    ),
    property!(
        "min_savings",
        "PCT",
        "Keep a compressed record only if it saves this much (e.g. 12.5%, ZFS's rule); otherwise it is stored raw.",
        min_savings,
        min_savings,
        MinSavings::parse,
        |m: &MinSavings| m.to_string()
    ),
    property!(
        "checksum",
        "KIND",
        "The checksum of each stored record: {checksums}.",
        checksum,
        checksum,
        ChecksumKind::parse,
        |c: &ChecksumKind| c.name().to_string()
    ),
    property!(
        "offload",
        "WHERE",
        "Where records are compressed: {offload}. auto sends them to an accelerator when one is present and worth it, the CPU alongside; a device name sends every record it can take there, and is refused where this machine has no such device.",
        offload,
        offload,
        Offload::parse,
        |o: &Offload| o.to_string()
    ),
    property!(
        "background_compression",
        "ALG",
        "What a file's records are re-encoded with once it has been closed and left alone (background_delay), by threads that get only CPU nothing else wants: any fixed codec (e.g. zstd-19, gzip-9), or off (the default). New writes keep using compression, so the file is written at its speed and ends at this codec's density.",
        background_compression,
        background_compression,
        parse_background,
        |c: &Compression| c.to_string()
    ),
];

/// A fixed codec (`auto` names none: the background has time for the densest) or `off`.
fn parse_background(text: &str) -> Result<Compression, String> {
    if text == "auto" {
        return Err("background_compression takes a fixed codec (e.g. zstd-19) or off, not auto".into());
    }
    Compression::parse(text)
}

/// The names of [`PROPERTIES`], in order.
pub const SETTABLE: [&str; PROPERTIES.len()] = {
    let mut names = [""; PROPERTIES.len()];
    let mut i = 0;
    while i < PROPERTIES.len() {
        names[i] = PROPERTIES[i].name;
        i += 1;
    }
    names
};

/// The row of a property, or an error naming the settable ones.
pub fn property(name: &str) -> Result<&'static Property, String> {
    PROPERTIES.iter().find(|p| p.name == name).ok_or_else(|| format!("unknown property '{name}' (settable: {})", SETTABLE.join(", ")))
}

pub fn format_recordsize(layout: Layout) -> String {
    let rs = layout.record_size();
    if rs >= 1 << 20 {
        format!("{}M", rs >> 20)
    } else {
        format!("{}K", rs >> 10)
    }
}

/// "64K", "16M", "1G" (or `KiB`, `MiB`, `GiB`, lower case `k`, `m`, `g`) or a plain number of
/// bytes: the one grammar for sizes, in properties and mount options alike.
pub fn parse_size(text: &str) -> Option<u64> {
    let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let n: u64 = digits.parse().ok()?;
    let mult = match unit {
        "" => 1,
        "k" | "K" | "KiB" => 1 << 10,
        "m" | "M" | "MiB" => 1 << 20,
        "g" | "G" | "GiB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Parses "128K", "1M" or "131072" (any size [`parse_size`] reads).
pub fn parse_recordsize(text: &str) -> Result<Layout, String> {
    parse_size(text).and_then(Layout::new).ok_or_else(|| format!("invalid recordsize '{text}' (a power of two from 4K to 1M, e.g. 128K)"))
}

impl LocalProps {
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        (property(name)?.parse)(value, self)
    }

    pub fn unset(&mut self, name: &str) -> Result<(), String> {
        (property(name)?.clear)(self);
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<String> {
        property(name).ok().and_then(|p| (p.local)(self))
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
        PROPERTIES.iter().filter_map(|p| (p.local)(self).map(|v| format!("{}={v}\n", p.name))).collect()
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
    let text = match lower::getxattr(&path, &name, &mut buf) {
        Ok(n) => {
            buf.truncate(n);
            String::from_utf8_lossy(&buf).into_owned()
        }
        Err(e) => {
            if !matches!(errno_of(&e), libc::ENODATA | libc::ENOTSUP) {
                return Err(e.into());
            }
            let file = cstr(OsStr::new(PROPS_FILE))?;
            let mut f = match lower::openat(dir, &file, libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0) {
                Ok(f) => f,
                Err(e) => return if errno_of(&e) == libc::ENOENT { Ok(LocalProps::default()) } else { Err(e.into()) },
            };
            let mut s = String::new();
            std::io::Read::read_to_string(&mut f, &mut s)?;
            s
        }
    };
    LocalProps::parse(&text).map_err(|e| FsError::new(libc::EIO, format!("stored properties: {e}")))
}

/// Stores a directory's local properties: in the xattr, or the file where xattrs are refused.
pub fn write_local(dir: RawFd, props: &LocalProps) -> FsResult<()> {
    let path = lower::proc_path(dir);
    let name = cstr(OsStr::new(PROPS_XATTR))?;
    let file = cstr(OsStr::new(PROPS_FILE))?;
    let text = props.encode();
    let stored = if props.is_empty() { lower::removexattr(&path, &name) } else { lower::setxattr(&path, &name, text.as_bytes(), 0) };
    let in_xattr = match stored {
        Ok(()) => true,
        Err(e) if props.is_empty() && errno_of(&e) == libc::ENODATA => true, // none to remove
        Err(e) if matches!(errno_of(&e), libc::ENOTSUP | libc::ENODATA) => false,
        Err(e) => return Err(e.into()),
    };
    if in_xattr {
        // A stale fallback file must not shadow what the xattr now says.
        let _ = lower::unlinkat(dir, &file, 0);
        return Ok(());
    }
    if props.is_empty() {
        return match lower::unlinkat(dir, &file, 0) {
            Err(e) if e.raw_os_error() != Some(libc::ENOENT) => Err(e.into()),
            _ => Ok(()),
        };
    }
    // Write a temporary file and rename it over, so a crash leaves the old or the new set.
    let tmp = cstr(OsStr::new(".densefs.props.tmp"))?;
    let mut f = lower::openat(dir, &tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0o644)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    lower::renameat(dir, &tmp, dir, &file)?;
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
    fn every_property_round_trips_through_its_row_without_text_in_between() {
        let defaults = PropertyValues::default();
        for p in &PROPERTIES {
            // The default's text is a valid value that sets exactly this field, locally and
            // in options, and prints back the same.
            let text = (p.show)(&defaults);
            let mut local = LocalProps::default();
            (p.parse)(&text, &mut local).unwrap();
            assert_eq!((p.local)(&local), Some(text.clone()), "{}", p.name);
            assert_eq!(LocalProps::parse(&local.encode()).unwrap(), local, "{}", p.name);
            let mut values = defaults;
            assert!((p.apply)(&local, &mut values));
            assert_eq!(values, defaults, "{}", p.name);
            assert!(!(p.apply)(&LocalProps::default(), &mut values));
            (p.clear)(&mut local);
            assert!(local.is_empty(), "{}", p.name);
            assert!(p.parse_into("no such value", &mut values).is_err(), "{}", p.name);
        }
        assert_eq!(SETTABLE, ["compression", "recordsize", "min_savings", "checksum", "offload", "background_compression"]);
        let e = property("colour").err().unwrap();
        assert!(e.contains("settable: compression, recordsize, min_savings, checksum, offload"), "{e}");
    }

    #[test]
    fn the_readme_documents_every_property_of_the_table() {
        let readme = include_str!("../../README.md");
        for p in &PROPERTIES {
            assert!(readme.contains(&format!("| `{}` |", p.name)), "README.md's option table lacks {}", p.name);
        }
    }

    #[test]
    fn sizes_have_one_grammar() {
        for (text, bytes) in [
            ("131072", 131072),
            ("128K", 128 << 10),
            ("128k", 128 << 10),
            ("128KiB", 128 << 10),
            ("1M", 1 << 20),
            ("1MiB", 1 << 20),
            ("1m", 1 << 20),
            ("2G", 2 << 30),
            ("1GiB", 1 << 30),
        ] {
            assert_eq!(parse_size(text), Some(bytes), "{text}");
        }
        for bad in ["", "K", "12Q", "1.5M", "-1", "99999999999999999999"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
        let mut p = LocalProps::default();
        p.set("recordsize", "64KiB").unwrap();
        assert_eq!(p.get("recordsize").as_deref(), Some("64K"));
        assert!(p.set("recordsize", "1G").is_err());
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

//! Codecs: pure functions over flat buffers, one row per codec in [`CODECS`].
//!
//! Like OpenZFS's `zio_compress_table`, every codec is a row ([`CodecInfo`]: name, levels,
//! whether it is fast, which accelerators run it, compress, decompress) indexed by an
//! append-only on-disk id ([`Codec`]). A *setting* ([`Compression`]) is a codec
//! plus a level, spelled as ZFS spells it (`gzip-9`, `zstd-fast-3`, `on`).
//!
//! Contract of every row:
//! - `compress(src, dst, level)` writes at most `dst.len()` bytes and returns the length, or
//!   `None` when the output would not fit. The caller sizes `dst` to the largest result worth
//!   keeping, so "does not fit" doubles as "not worth it" and the codec may stop early.
//! - `decompress(src, len)` returns exactly `len` bytes or an error; corrupt input is an
//!   error, never a panic. The codec allocates the bytes, so that one whose decoder writes
//!   every byte it reports (lz4, zstd) decodes into fresh memory without zeroing it first:
//!   a cold read decodes every byte it returns.

pub mod deflate;
mod isal;
mod lz4;
mod lzjb;
mod setting;
mod zle;
mod zstd;

pub use setting::{setting_names, Setting};

use std::fmt;

/// On-disk codec id. Append-only: never renumber, never reuse.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Codec {
    /// Stored raw.
    Off = 0,
    /// LZ4 block format (no frame).
    Lz4 = 1,
    /// Raw deflate (RFC 1951), what ZFS calls gzip-N.
    Deflate = 2,
    /// Zstandard frame.
    Zstd = 3,
    /// Solaris LZJB.
    Lzjb = 4,
    /// ZFS zero-length encoding.
    Zle = 5,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodecError {
    /// The input is not a valid stream of this codec, or does not decode to the expected length.
    Corrupt(&'static str),
    /// An unknown codec id was found on disk.
    UnknownCodec(u8),
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecError::Corrupt(why) => write!(f, "corrupt compressed data: {why}"),
            CodecError::UnknownCodec(id) => write!(f, "unknown codec id {id}"),
        }
    }
}

impl std::error::Error for CodecError {}

pub type CompressFn = fn(src: &[u8], dst: &mut [u8], level: i32) -> Option<usize>;
pub type DecompressFn = fn(src: &[u8], len: usize) -> Result<Vec<u8>, CodecError>;

/// The levels a codec takes, as ZFS spells them: `NAME-N` for `min..=max`, and `NAME-fast-N`
/// for `1..=fast` (stored as level `-N`; `fast: 0` when there is none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Levels {
    pub min: i32,
    pub max: i32,
    /// What the bare name means (`gzip` = `gzip-6`).
    pub default: i32,
    pub fast: i32,
}

/// One codec: everything the rest of densefs knows about it. Parsing and printing settings,
/// the error messages listing valid names, the pre-check, the statistics' slots, which
/// accelerators may run it and the fuzz target's choice all derive from these rows.
pub struct CodecInfo {
    pub codec: Codec,
    pub name: &'static str,
    /// Other names of the setting with the default level (ZFS's `on`).
    pub aliases: &'static [&'static str],
    /// `None`: the codec has no levels (the level is 0 and is not printed).
    pub levels: Option<Levels>,
    /// Cheap enough that probing the data first would cost as much as compressing it (the
    /// engine's pre-check skips these).
    pub fast: bool,
    /// Accelerators (their `Device::name`) that may run it; every codec runs on the CPU.
    pub devices: &'static [&'static str],
    pub compress: CompressFn,
    pub decompress: DecompressFn,
}

impl CodecInfo {
    /// The setting the bare name stands for.
    pub fn default_setting(&self) -> Compression {
        Compression { codec: self.codec, level: self.levels.map_or(0, |l| l.default) }
    }

    /// Whether the accelerator named `device` may run this codec.
    pub fn runs_on(&self, device: &str) -> bool {
        self.devices.contains(&device)
    }
}

fn store_compress(src: &[u8], dst: &mut [u8], _level: i32) -> Option<usize> {
    let out = dst.get_mut(..src.len())?;
    out.copy_from_slice(src);
    Some(src.len())
}

/// `len` zeroed bytes that `decode` fills in place: for the decoders that write into a slice
/// (deflate, lzjb, zle) and so need it initialised.
fn into_zeroed(len: usize, decode: impl FnOnce(&mut [u8]) -> Result<(), CodecError>) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![0u8; len];
    decode(&mut out)?;
    Ok(out)
}

fn store_decompress(src: &[u8], len: usize) -> Result<Vec<u8>, CodecError> {
    if src.len() != len {
        return Err(CodecError::Corrupt("raw record length mismatch"));
    }
    Ok(src.to_vec())
}

/// Accelerators that run the standard stream formats (`engine/gpu`, and the test double
/// `engine/faulty.rs`, which mimics it).
const GPU_AND_TEST: &[&str] = &["gpu", "faulty"];

/// The codec table, indexed by `Codec as usize` (the on-disk id, docs/FORMAT.md).
///
/// Adding a codec: a module with `compress`/`decompress` (the contract above), a variant of
/// [`Codec`] with the next free id, and a row here; then its round-trip tests in `tests.rs`
/// and its line in docs/FORMAT.md's codec table. Nothing else names codecs one by one.
pub static CODECS: [CodecInfo; 6] = [
    CodecInfo {
        codec: Codec::Off,
        name: "off",
        aliases: &[],
        levels: None,
        fast: true,
        devices: &[],
        compress: store_compress,
        decompress: store_decompress,
    },
    CodecInfo {
        codec: Codec::Lz4,
        name: "lz4",
        aliases: &["on"],
        levels: None,
        fast: true,
        devices: GPU_AND_TEST,
        compress: lz4::compress,
        decompress: lz4::decompress,
    },
    CodecInfo {
        codec: Codec::Deflate,
        name: "gzip",
        aliases: &[],
        levels: Some(Levels { min: 1, max: 9, default: 6, fast: 0 }),
        fast: false,
        devices: GPU_AND_TEST,
        compress: deflate::compress,
        decompress: deflate::decompress,
    },
    CodecInfo {
        codec: Codec::Zstd,
        name: "zstd",
        aliases: &[],
        levels: Some(Levels { min: 1, max: 19, default: 3, fast: 10 }),
        fast: false,
        devices: GPU_AND_TEST,
        compress: zstd::compress,
        decompress: zstd::decompress,
    },
    CodecInfo {
        codec: Codec::Lzjb,
        name: "lzjb",
        aliases: &[],
        levels: None,
        fast: true,
        devices: &[],
        compress: lzjb::compress,
        decompress: lzjb::decompress,
    },
    CodecInfo {
        codec: Codec::Zle,
        name: "zle",
        aliases: &[],
        levels: None,
        fast: true,
        devices: &[],
        compress: zle::compress,
        decompress: zle::decompress,
    },
];

impl Codec {
    pub fn from_id(id: u8) -> Result<Codec, CodecError> {
        CODECS.get(id as usize).map(|row| row.codec).ok_or(CodecError::UnknownCodec(id))
    }

    /// The codec's row (the table is indexed by id, so every variant has one).
    pub fn row(self) -> &'static CodecInfo {
        &CODECS[self as usize]
    }

    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// Cheap enough that probing first would cost as much as compressing.
    pub fn is_fast(self) -> bool {
        self.row().fast
    }

    pub fn compress(self, src: &[u8], dst: &mut [u8], level: i32) -> Option<usize> {
        (self.row().compress)(src, dst, level)
    }

    /// Exactly `len` bytes decoded from `src`, or an error.
    pub fn decompress(self, src: &[u8], len: usize) -> Result<Vec<u8>, CodecError> {
        (self.row().decompress)(src, len)
    }
}

/// Every spelling [`Compression::parse`] accepts, for error messages and help:
/// `off, on, lz4, gzip, gzip-1..9, zstd, zstd-1..19, zstd-fast-1..10, lzjb, zle`.
pub fn codec_names() -> String {
    let mut names = Vec::new();
    for row in &CODECS {
        names.extend(row.aliases.iter().map(|a| a.to_string()));
        names.push(row.name.to_string());
        if let Some(l) = row.levels {
            names.push(format!("{}-{}..{}", row.name, l.min, l.max));
            if l.fast > 0 {
                names.push(format!("{}-fast-1..{}", row.name, l.fast));
            }
        }
    }
    names.join(", ")
}

/// A codec and its level, as a user names it (`gzip-9`). What a record was compressed with;
/// what a dataset asks for is a [`Setting`], which may also be `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Compression {
    pub codec: Codec,
    /// In the codec's [`Levels`] (negative for `-fast-N`); 0 for codecs without levels.
    pub level: i32,
}

impl Compression {
    pub const OFF: Compression = Compression { codec: Codec::Off, level: 0 };
    pub const LZ4: Compression = Compression { codec: Codec::Lz4, level: 0 };

    /// Parses ZFS's spelling from the rows of [`CODECS`] (see [`codec_names`]).
    pub fn parse(name: &str) -> Result<Compression, String> {
        let bad = || format!("unknown compression '{name}' (expected {})", codec_names());
        // Digits as written by Display: no sign, no leading zero.
        let level_in = |digits: &str, lo: i32, hi: i32| -> Option<i32> {
            digits.parse::<i32>().ok().filter(|n| (lo..=hi).contains(n) && !digits.starts_with(['+', '0']))
        };
        for row in &CODECS {
            if row.name == name || row.aliases.contains(&name) {
                return Ok(row.default_setting());
            }
            let (Some(levels), Some(rest)) = (row.levels, name.strip_prefix(row.name).and_then(|r| r.strip_prefix('-'))) else { continue };
            let level = match rest.strip_prefix("fast-") {
                Some(n) if levels.fast > 0 => level_in(n, 1, levels.fast).map(|n| -n),
                _ => level_in(rest, levels.min, levels.max),
            };
            return level.map(|level| Compression { codec: row.codec, level }).ok_or_else(bad);
        }
        Err(bad())
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let row = self.codec.row();
        match row.levels {
            Some(_) if self.level < 0 => write!(f, "{}-fast-{}", row.name, -self.level),
            Some(_) => write!(f, "{}-{}", row.name, self.level),
            None => f.write_str(row.name),
        }
    }
}

#[cfg(test)]
mod tests;

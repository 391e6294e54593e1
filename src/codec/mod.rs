//! Codecs: pure functions over flat buffers, one row per codec in [`CODECS`].
//!
//! Like OpenZFS's `zio_compress_table`, every codec is a row (name, compress, decompress)
//! indexed by an append-only on-disk id ([`Codec`]). A *setting* ([`Compression`]) is a codec
//! plus a level, spelled as ZFS spells it (`gzip-9`, `zstd-fast-3`, `on`).
//!
//! Contract of every row:
//! - `compress(src, dst, level)` writes at most `dst.len()` bytes and returns the length, or
//!   `None` when the output would not fit. The caller sizes `dst` to the largest result worth
//!   keeping, so "does not fit" doubles as "not worth it" and the codec may stop early.
//! - `decompress(src, dst)` succeeds only if it produces exactly `dst.len()` bytes; corrupt
//!   input is an error, never a panic.

mod deflate;
mod lz4;
mod lzjb;
mod zle;
mod zstd;

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
    /// Not a stream format: a *setting* that lets the engine pick a codec per record (like ZFS's
    /// `on` / `inherit` rows). Allowed in a file header, never in a record descriptor.
    Auto = 255,
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
pub type DecompressFn = fn(src: &[u8], dst: &mut [u8]) -> Result<(), CodecError>;

pub struct CodecInfo {
    pub codec: Codec,
    pub name: &'static str,
    pub compress: CompressFn,
    pub decompress: DecompressFn,
}

fn store_compress(src: &[u8], dst: &mut [u8], _level: i32) -> Option<usize> {
    let out = dst.get_mut(..src.len())?;
    out.copy_from_slice(src);
    Some(src.len())
}

fn store_decompress(src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    if src.len() != dst.len() {
        return Err(CodecError::Corrupt("raw record length mismatch"));
    }
    dst.copy_from_slice(src);
    Ok(())
}

/// The codec table, indexed by `Codec as usize`.
pub static CODECS: [CodecInfo; 6] = [
    CodecInfo { codec: Codec::Off, name: "off", compress: store_compress, decompress: store_decompress },
    CodecInfo { codec: Codec::Lz4, name: "lz4", compress: lz4::compress, decompress: lz4::decompress },
    CodecInfo { codec: Codec::Deflate, name: "gzip", compress: deflate::compress, decompress: deflate::decompress },
    CodecInfo { codec: Codec::Zstd, name: "zstd", compress: zstd::compress, decompress: zstd::decompress },
    CodecInfo { codec: Codec::Lzjb, name: "lzjb", compress: lzjb::compress, decompress: lzjb::decompress },
    CodecInfo { codec: Codec::Zle, name: "zle", compress: zle::compress, decompress: zle::decompress },
];

impl Codec {
    pub fn from_id(id: u8) -> Result<Codec, CodecError> {
        CODECS.get(id as usize).map(|row| row.codec).ok_or(CodecError::UnknownCodec(id))
    }

    /// The header's "codec new records get" byte: a codec id or [`Codec::Auto`].
    pub fn from_setting_id(id: u8) -> Result<Codec, CodecError> {
        if id == Codec::Auto as u8 { Ok(Codec::Auto) } else { Codec::from_id(id) }
    }

    pub fn info(self) -> &'static CodecInfo {
        CODECS.get(self as usize).expect("BUG: 'auto' is resolved to a codec by the engine before use")
    }

    pub fn name(self) -> &'static str {
        if self == Codec::Auto { "auto" } else { self.info().name }
    }

    pub fn compress(self, src: &[u8], dst: &mut [u8], level: i32) -> Option<usize> {
        (self.info().compress)(src, dst, level)
    }

    pub fn decompress(self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        (self.info().decompress)(src, dst)
    }
}

/// A compression setting: a codec and its level, as a user names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Compression {
    pub codec: Codec,
    /// gzip: 1..=9; zstd: 1..=19, or -1..=-10 for zstd-fast-N; ignored by the others.
    pub level: i32,
}

impl Compression {
    pub const OFF: Compression = Compression { codec: Codec::Off, level: 0 };
    pub const LZ4: Compression = Compression { codec: Codec::Lz4, level: 0 };
    pub const AUTO: Compression = Compression { codec: Codec::Auto, level: 0 };

    /// Parses ZFS's spelling: off, on, lz4, gzip, gzip-1..9, zstd, zstd-1..19,
    /// zstd-fast-1..10, lzjb, zle; and auto (the engine picks per record).
    pub fn parse(name: &str) -> Result<Compression, String> {
        let bad = || {
            format!(
                "unknown compression '{name}' (expected off, on, lz4, gzip, gzip-1..9, zstd, \
                 zstd-1..19, zstd-fast-1..10, lzjb, zle or auto)"
            )
        };
        let level_in = |digits: &str, lo: i32, hi: i32| -> Result<i32, String> {
            match digits.parse::<i32>() {
                Ok(n) if (lo..=hi).contains(&n) && !digits.starts_with(['+', '0']) => Ok(n),
                _ => Err(bad()),
            }
        };
        let setting = match name {
            "off" => Compression::OFF,
            "on" | "lz4" => Compression::LZ4,
            "gzip" => Compression { codec: Codec::Deflate, level: 6 },
            "zstd" => Compression { codec: Codec::Zstd, level: 3 },
            "lzjb" => Compression { codec: Codec::Lzjb, level: 0 },
            "zle" => Compression { codec: Codec::Zle, level: 0 },
            "auto" => Compression::AUTO,
            _ => {
                if let Some(n) = name.strip_prefix("gzip-") {
                    Compression { codec: Codec::Deflate, level: level_in(n, 1, 9)? }
                } else if let Some(n) = name.strip_prefix("zstd-fast-") {
                    Compression { codec: Codec::Zstd, level: -level_in(n, 1, 10)? }
                } else if let Some(n) = name.strip_prefix("zstd-") {
                    Compression { codec: Codec::Zstd, level: level_in(n, 1, 19)? }
                } else {
                    return Err(bad());
                }
            }
        };
        Ok(setting)
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.codec {
            Codec::Deflate => write!(f, "gzip-{}", self.level),
            Codec::Zstd if self.level < 0 => write!(f, "zstd-fast-{}", -self.level),
            Codec::Zstd => write!(f, "zstd-{}", self.level),
            other => f.write_str(other.name()),
        }
    }
}

#[cfg(test)]
mod tests;

//! What a dataset or file asks for: one codec at one level, or `auto`, which lets the engine
//! pick a codec per record (engine::policy::choose_auto). `auto` is a setting, not a codec: it
//! names no stream format, so it has no row in [`CODECS`](super::CODECS) and can never reach a
//! record descriptor.

use super::{codec_names, Codec, CodecError, Compression};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Setting {
    Fixed(Compression),
    Auto,
}

const AUTO_NAME: &str = "auto";

/// The header's codec byte for `auto` (docs/FORMAT.md); outside the range of codec ids.
const AUTO_ID: u8 = 255;

/// A user's fsync landing at most this much stores it uncompressed (`Setting::for_fsync`).
pub const FSYNC_RAW_BYTES: usize = 256 << 10;

impl Setting {
    pub const LZ4: Setting = Setting::Fixed(Compression::LZ4);

    /// `auto` or any spelling of [`Compression::parse`].
    pub fn parse(name: &str) -> Result<Setting, String> {
        if name == AUTO_NAME {
            return Ok(Setting::Auto);
        }
        Compression::parse(name).map(Setting::Fixed).map_err(|_| format!("unknown compression '{name}' (expected {})", setting_names()))
    }

    /// What a user's fsync lands `bytes` of changed records with; the caller waits for them.
    /// Little (at most [`FSYNC_RAW_BYTES`], a record or two) is stored uncompressed, as ZFS's
    /// intent log keeps small sync writes: compressing it could not be spread over the cores,
    /// so it would all be waiting. More lands with this setting if its codec is fast, else
    /// with lz4, on every core (ZFS's sync writes wait for the intent log, not for gzip or
    /// zstd). The container re-encodes those records with this setting once the file has gone
    /// quiet (`Container::settle_interim`).
    pub fn for_fsync(self, bytes: usize) -> Setting {
        match self {
            _ if bytes <= FSYNC_RAW_BYTES => Setting::Fixed(Compression::OFF),
            Setting::Fixed(c) if c.codec.is_fast() => self,
            _ => Setting::LZ4,
        }
    }

    /// The two header bytes that keep it: a codec id (or 255 for `auto`) and a level.
    pub fn to_header(self) -> (u8, i8) {
        match self {
            Setting::Fixed(c) => (c.codec as u8, c.level as i8),
            Setting::Auto => (AUTO_ID, 0),
        }
    }

    pub fn from_header(id: u8, level: i8) -> Result<Setting, CodecError> {
        match id {
            AUTO_ID => Ok(Setting::Auto),
            _ => Ok(Setting::Fixed(Compression { codec: Codec::from_id(id)?, level: i32::from(level) })),
        }
    }
}

impl From<Compression> for Setting {
    fn from(c: Compression) -> Setting {
        Setting::Fixed(c)
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Setting::Fixed(c) => c.fmt(f),
            Setting::Auto => f.write_str(AUTO_NAME),
        }
    }
}

/// Every spelling [`Setting::parse`] accepts, for error messages and help.
pub fn setting_names() -> String {
    format!("{} or {AUTO_NAME}", codec_names())
}

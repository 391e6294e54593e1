//! What a record becomes, as small pure functions (ZFS's `zio_compress_data` rules):
//! all zeros → a hole; compressed only if that saves at least `min_savings`; otherwise raw.
//! Decoding checks the checksum before any decoder sees the bytes.

use super::{CompressRequest, DecompressRequest, Encoded, EngineError};
use crate::codec::Codec;

/// The least fraction of a record that compression must save for the compressed form to be kept,
/// in 1/1000 (ZFS's rule, 12.5%, is 125).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MinSavings(pub u16);

impl MinSavings {
    pub const ZFS: MinSavings = MinSavings(125);

    /// "12.5%", "12.5" or "0%".
    pub fn parse(text: &str) -> Result<MinSavings, String> {
        let number = text.strip_suffix('%').unwrap_or(text);
        match number.parse::<f64>() {
            Ok(p) if (0.0..100.0).contains(&p) => Ok(MinSavings((p * 10.0).round() as u16)),
            _ => Err(format!("invalid min_savings '{text}' (a percentage from 0 to 99.9, e.g. 12.5%)")),
        }
    }

    /// Largest compressed length worth keeping for a record of `len` bytes.
    pub fn max_kept_len(self, len: usize) -> usize {
        len - (len * self.0 as usize).div_ceil(1000)
    }
}

impl std::fmt::Display for MinSavings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}%", self.0 as f64 / 10.0)
    }
}

pub fn is_all_zero(data: &[u8]) -> bool {
    let (head, words, tail) = unsafe { data.align_to::<u64>() };
    head.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

pub fn encode_record(req: &CompressRequest) -> Encoded {
    let data = req.data.as_slice();
    let logical_len = data.len() as u32;
    if is_all_zero(data) {
        return Encoded { codec: Codec::Off, level: 0, bytes: Vec::new(), logical_len, checksum: 0 };
    }
    let setting = req.compression;
    if setting.codec != Codec::Off {
        let mut out = vec![0u8; req.min_savings.max_kept_len(data.len())];
        if let Some(n) = setting.codec.compress(data, &mut out, setting.level) {
            out.truncate(n);
            let checksum = req.checksum.compute(&out);
            return Encoded { codec: setting.codec, level: setting.level as i8, bytes: out, logical_len, checksum };
        }
    }
    let checksum = req.checksum.compute(data);
    Encoded { codec: Codec::Off, level: 0, bytes: data.to_vec(), logical_len, checksum }
}

pub fn decode_record(req: &DecompressRequest) -> Result<Vec<u8>, EngineError> {
    if req.stored.is_empty() {
        return Ok(vec![0u8; req.logical_len]);
    }
    if req.checksum_kind.compute(&req.stored) != req.checksum {
        return Err(EngineError::ChecksumMismatch);
    }
    let mut out = vec![0u8; req.logical_len];
    req.codec.decompress(&req.stored, &mut out).map_err(EngineError::Codec)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::ChecksumKind;
    use crate::codec::Compression;
    use std::sync::Arc;

    fn encode(data: Vec<u8>, name: &str) -> Encoded {
        encode_record(&CompressRequest {
            data: Arc::new(data),
            compression: Compression::parse(name).unwrap(),
            min_savings: MinSavings::ZFS,
            checksum: ChecksumKind::Crc32c,
        })
    }

    fn decode(e: &Encoded) -> Result<Vec<u8>, EngineError> {
        decode_record(&DecompressRequest {
            codec: e.codec,
            stored: e.bytes.clone(),
            logical_len: e.logical_len as usize,
            checksum_kind: ChecksumKind::Crc32c,
            checksum: e.checksum,
        })
    }

    #[test]
    fn zeros_become_holes_and_text_compresses() {
        let hole = encode(vec![0; 4096], "gzip-9");
        assert!(hole.bytes.is_empty());
        assert_eq!(decode(&hole).unwrap(), vec![0; 4096]);
        let text: Vec<u8> = b"ACGTACGTTTGA\n".iter().cycle().take(65536).copied().collect();
        let e = encode(text.clone(), "zstd-3");
        assert_eq!(e.codec, Codec::Zstd);
        assert!(e.bytes.len() < 4096);
        assert_eq!(decode(&e).unwrap(), text);
    }

    #[test]
    fn records_that_save_too_little_are_stored_raw() {
        // Half random, half compressible: saves well under 12.5% ... or not; force it with noise.
        let mut x = 1u32;
        let noise: Vec<u8> = (0..65536).map(|_| { x = x.wrapping_mul(1664525).wrapping_add(1013904223); (x >> 24) as u8 }).collect();
        let e = encode(noise.clone(), "gzip-9");
        assert_eq!(e.codec, Codec::Off);
        assert_eq!(e.bytes, noise);
        assert_eq!(decode(&e).unwrap(), noise);
    }

    #[test]
    fn a_flipped_bit_is_caught_by_the_checksum_before_decoding() {
        let text: Vec<u8> = b"hello densefs ".iter().cycle().take(8192).copied().collect();
        let mut e = encode(text, "lz4");
        e.bytes[3] ^= 4;
        assert_eq!(decode(&e), Err(EngineError::ChecksumMismatch));
    }

    #[test]
    fn min_savings_parses_percentages() {
        assert_eq!(MinSavings::parse("12.5%").unwrap(), MinSavings::ZFS);
        assert_eq!(MinSavings::parse("0").unwrap().max_kept_len(4096), 4096);
        assert_eq!(MinSavings::ZFS.max_kept_len(131072), 131072 - 16384);
        assert!(MinSavings::parse("100").is_err());
        assert!(MinSavings::parse("x").is_err());
        assert_eq!(MinSavings::ZFS.to_string(), "12.5%");
    }
}

//! A stored record back to its contents (docs/FORMAT.md, "Codec ids"): the stored bytes'
//! checksum is verified *before* any decoder sees them (nvCOMP's decoders assume valid input),
//! and the decoder must produce exactly the logical length. A hole (nothing stored) reads as
//! zeros. This is a format rule: the engine's decoders and `inspect` both go through it.

use super::{ChecksumKind, FormatError};
use crate::codec::Codec;

/// Verifies `stored` against `checksum`, then decodes it to `logical_len` bytes.
pub fn verify_and_decode(
    codec: Codec,
    stored: &[u8],
    logical_len: usize,
    kind: ChecksumKind,
    checksum: u64,
) -> Result<Vec<u8>, FormatError> {
    if stored.is_empty() {
        return Ok(vec![0u8; logical_len]);
    }
    if kind.compute(stored) != checksum {
        return Err(FormatError::ChecksumMismatch);
    }
    Ok(codec.decompress(stored, logical_len)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hole_reads_as_zeros_without_a_checksum() {
        assert_eq!(verify_and_decode(Codec::Lz4, &[], 5, ChecksumKind::Crc32c, 12345).unwrap(), vec![0; 5]);
    }

    #[test]
    fn raw_bytes_pass_with_their_checksum_and_fail_with_a_flipped_bit() {
        let data = b"hello densefs".to_vec();
        for kind in [ChecksumKind::Crc32c, ChecksumKind::Xxh3] {
            let sum = kind.compute(&data);
            assert_eq!(verify_and_decode(Codec::Off, &data, data.len(), kind, sum).unwrap(), data);
            let mut bad = data.clone();
            bad[2] ^= 1;
            assert_eq!(verify_and_decode(Codec::Off, &bad, data.len(), kind, sum), Err(FormatError::ChecksumMismatch));
        }
    }

    #[test]
    fn garbage_with_a_matching_checksum_is_a_codec_error_not_a_panic() {
        let junk = vec![0xffu8; 64];
        let sum = ChecksumKind::Crc32c.compute(&junk);
        assert!(matches!(verify_and_decode(Codec::Lz4, &junk, 4096, ChecksumKind::Crc32c, sum), Err(FormatError::Codec(_))));
    }
}

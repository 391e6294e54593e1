//! LZ4 block format (no frame, no checksum): what ZFS stores and what nvCOMP's LZ4 emits.
//!
//! Through the reference C library (the `lz4` crate): it decodes about 2x faster than the
//! pure-Rust lz4_flex on this data (`densefs bench engine`, README), and cold reads of lz4
//! files are bound by decoding. Both calls are bounded by the buffers they are given; corrupt
//! input is an error (`LZ4_decompress_safe`).

use super::CodecError;

pub fn compress(src: &[u8], dst: &mut [u8], _level: i32) -> Option<usize> {
    // The C library stops (returns 0, an error here) when `dst` is full: "does not fit".
    lz4::block::compress_to_buffer(src, None, false, dst).ok()
}

pub fn decompress(src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    let want = i32::try_from(dst.len()).map_err(|_| CodecError::Corrupt("lz4 record too large"))?;
    match lz4::block::decompress_to_buffer(src, Some(want), dst) {
        Ok(n) if n == dst.len() => Ok(()),
        Ok(_) => Err(CodecError::Corrupt("lz4 block decodes to the wrong length")),
        Err(_) => Err(CodecError::Corrupt("invalid lz4 block")),
    }
}

//! LZ4 block format (no frame, no checksum): what ZFS stores and what nvCOMP's LZ4 emits.
//!
//! Through the reference C library (the `lz4` crate): it decodes about 2x faster than the
//! pure-Rust lz4_flex on this data (`densefs bench engine`, README), and cold reads of lz4
//! files are bound by decoding. Both calls are bounded by the buffers they are given; corrupt
//! input is an error (`LZ4_decompress_safe`), and decoding fills fresh memory that is never
//! zeroed first (the C call writes every byte it reports).

use super::CodecError;

pub fn compress(src: &[u8], dst: &mut [u8], _level: i32) -> Option<usize> {
    // The C library stops (returns 0, an error here) when `dst` is full: "does not fit".
    lz4::block::compress_to_buffer(src, None, false, dst).ok()
}

pub fn decompress(src: &[u8], len: usize) -> Result<Vec<u8>, CodecError> {
    let want = i32::try_from(len).map_err(|_| CodecError::Corrupt("lz4 record too large"))?;
    let have = i32::try_from(src.len()).map_err(|_| CodecError::Corrupt("lz4 block too large"))?;
    let mut out: Vec<u8> = Vec::with_capacity(len);
    // SAFETY: LZ4_decompress_safe reads at most `have` bytes of `src` and writes at most `want`
    // bytes into `out`'s spare capacity (at least `len`), returning how many it wrote or a
    // negative number for malformed input. Only a full `len` bytes written become the Vec's.
    let n = unsafe { lz4::liblz4::LZ4_decompress_safe(src.as_ptr().cast(), out.as_mut_ptr().cast(), have, want) };
    match usize::try_from(n) {
        Ok(n) if n == len => {
            // SAFETY: the first `len` bytes were just written.
            unsafe { out.set_len(len) };
            Ok(out)
        }
        Ok(_) => Err(CodecError::Corrupt("lz4 block decodes to the wrong length")),
        Err(_) => Err(CodecError::Corrupt("invalid lz4 block")),
    }
}

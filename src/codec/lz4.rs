//! LZ4 block format (no frame, no checksum): what ZFS stores and what nvCOMP's LZ4 emits.

use super::CodecError;
use std::cell::RefCell;

thread_local! {
    // lz4_flex wants room for the worst case up front; compress there, then keep what fits.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

pub fn compress(src: &[u8], dst: &mut [u8], _level: i32) -> Option<usize> {
    SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        scratch.resize(lz4_flex::block::get_maximum_output_size(src.len()), 0);
        let n = lz4_flex::block::compress_into(src, &mut scratch).ok()?;
        dst.get_mut(..n)?.copy_from_slice(&scratch[..n]);
        Some(n)
    })
}

pub fn decompress(src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    match lz4_flex::block::decompress_into(src, dst) {
        Ok(n) if n == dst.len() => Ok(()),
        Ok(_) => Err(CodecError::Corrupt("lz4 block decodes to the wrong length")),
        Err(_) => Err(CodecError::Corrupt("invalid lz4 block")),
    }
}

//! Raw deflate (RFC 1951) through libdeflate: zlib's `inflateInit2(-15)`, gzip's inner stream
//! and nvCOMP's Deflate all read it. Levels 1..9 are ZFS's gzip-1..9.

use super::CodecError;
use libdeflater::{CompressionLvl, Compressor, DecompressionError, Decompressor};
use std::cell::RefCell;

thread_local! {
    // libdeflate state is costly to build (hundreds of KiB); keep one per thread and level.
    static COMPRESSORS: RefCell<[Option<Compressor>; 10]> = RefCell::new(Default::default());
    static DECOMPRESSOR: RefCell<Decompressor> = RefCell::new(Decompressor::new());
}

pub fn compress(src: &[u8], dst: &mut [u8], level: i32) -> Option<usize> {
    let level = level.clamp(1, 9);
    COMPRESSORS.with(|cell| {
        let mut slots = cell.borrow_mut();
        let compressor = slots[level as usize]
            .get_or_insert_with(|| Compressor::new(CompressionLvl::new(level).expect("BUG: deflate level 1..9 is valid")));
        compressor.deflate_compress(src, dst).ok()
    })
}

pub fn decompress(src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    DECOMPRESSOR.with(|cell| match cell.borrow_mut().deflate_decompress(src, dst) {
        Ok(n) if n == dst.len() => Ok(()),
        Ok(_) => Err(CodecError::Corrupt("deflate stream decodes to the wrong length")),
        Err(DecompressionError::InsufficientSpace) => Err(CodecError::Corrupt("deflate stream decodes past the record length")),
        Err(DecompressionError::BadData) => Err(CodecError::Corrupt("invalid deflate stream")),
    })
}

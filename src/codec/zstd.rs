//! Zstandard frames (RFC 8878) through libzstd. Negative levels are zstd-fast-N.

use super::CodecError;
use std::cell::RefCell;

thread_local! {
    static CCTX: RefCell<zstd::zstd_safe::CCtx<'static>> = RefCell::new(zstd::zstd_safe::CCtx::create());
    static DCTX: RefCell<zstd::zstd_safe::DCtx<'static>> = RefCell::new(zstd::zstd_safe::DCtx::create());
}

pub fn compress(src: &[u8], dst: &mut [u8], level: i32) -> Option<usize> {
    CCTX.with(|cell| cell.borrow_mut().compress(dst, src, level).ok())
}

pub fn decompress(src: &[u8], len: usize) -> Result<Vec<u8>, CodecError> {
    // A frame may declare its content size; refuse one that disagrees before decoding.
    match zstd::zstd_safe::get_frame_content_size(src) {
        Ok(Some(n)) if n != len as u64 => return Err(CodecError::Corrupt("zstd frame declares the wrong length")),
        Err(_) => return Err(CodecError::Corrupt("invalid zstd frame header")),
        _ => {}
    }
    // Decoded into the Vec's spare capacity (zstd_safe's `WriteBuf`), never zeroed first.
    let mut out: Vec<u8> = Vec::with_capacity(len);
    DCTX.with(|cell| match cell.borrow_mut().decompress(&mut out, src) {
        Ok(n) if n == len => Ok(out),
        Ok(_) => Err(CodecError::Corrupt("zstd frame decodes to the wrong length")),
        Err(_) => Err(CodecError::Corrupt("invalid zstd frame")),
    })
}

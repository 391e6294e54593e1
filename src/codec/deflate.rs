//! Raw deflate (RFC 1951): zlib's `inflateInit2(-15)`, gzip's inner stream, libdeflate, ISA-L
//! and nvCOMP's Deflate all read it. Levels 1..9 are ZFS's gzip-1..9.
//!
//! Two encoders write the same format: libdeflate (levels 1..12) and ISA-L's igzip (levels 0..3,
//! `isal.rs`). Which one a gzip-N uses is an encoder choice, not a format: the record says only
//! "deflate", and every densefs decodes it whichever encoder wrote it. [`ENCODERS`] is the
//! choice, by measurement (see there).

use super::{isal, CodecError};
use libdeflater::{CompressionLvl, Compressor, DecompressionError, Decompressor};
use std::cell::RefCell;

/// One raw-deflate encoder at one of its own levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoder {
    /// ISA-L igzip, levels 0..=3.
    Isal(u32),
    /// libdeflate, levels 1..=12.
    Libdeflate(i32),
}

/// One raw-deflate decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decoder {
    Libdeflate,
    Isal,
}

thread_local! {
    // libdeflate state is costly to build (hundreds of KiB); keep one per thread and level.
    static COMPRESSORS: RefCell<[Option<Compressor>; 13]> = RefCell::new(Default::default());
    static DECOMPRESSOR: RefCell<Decompressor> = RefCell::new(Decompressor::new());
}

impl Encoder {
    pub fn compress(self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        match self {
            Encoder::Isal(level) => isal::compress(src, dst, level.min(isal::MAX_LEVEL)),
            Encoder::Libdeflate(level) => {
                let level = level.clamp(1, 12);
                COMPRESSORS.with(|cell| {
                    let mut slots = cell.borrow_mut();
                    let compressor = slots[level as usize]
                        .get_or_insert_with(|| Compressor::new(CompressionLvl::new(level).expect("BUG: libdeflate level 1..12 is valid")));
                    compressor.deflate_compress(src, dst).ok()
                })
            }
        }
    }
}

impl std::fmt::Display for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Encoder::Isal(l) => write!(f, "isal-{l}"),
            Encoder::Libdeflate(l) => write!(f, "libdeflate-{l}"),
        }
    }
}

impl Decoder {
    pub fn decompress(self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        match self {
            Decoder::Isal => isal::decompress(src, dst),
            Decoder::Libdeflate => DECOMPRESSOR.with(|cell| match cell.borrow_mut().deflate_decompress(src, dst) {
                Ok(n) if n == dst.len() => Ok(()),
                Ok(_) => Err(CodecError::Corrupt("deflate stream decodes to the wrong length")),
                Err(DecompressionError::InsufficientSpace) => Err(CodecError::Corrupt("deflate stream decodes past the record length")),
                Err(DecompressionError::BadData) => Err(CodecError::Corrupt("invalid deflate stream")),
            }),
        }
    }
}

/// gzip-N's encoder, indexed by N - 1: for each N, the fastest of ISA-L's levels and libdeflate
/// at N whose ratio on the real FASTQ is at least zlib's at N (the rule nvCOMP's levels follow,
/// `engine::gpu::deflate_algorithm`). Measured on 128 KiB records, one core, in
/// bench/results/deflate-encoders.md (`cargo run --release --example deflate_encoders`):
/// ISA-L 1 compresses the FASTQ at lz4's speed (~2x libdeflate 1) with ratio 3.18 (zlib 1:
/// 3.02, zlib 2: 3.12, libdeflate 1: 3.31). ISA-L 2 qualifies for gzip-2 too and is as fast
/// within 2%, with a little more ratio (3.20), so gzip-2 takes it. ISA-L 3 (3.249) falls just
/// short of zlib 3 (3.252), so gzip-3 and up stay on libdeflate at the same level.
pub const ENCODERS: [Encoder; 9] = [
    Encoder::Isal(1),
    Encoder::Isal(2),
    Encoder::Libdeflate(3),
    Encoder::Libdeflate(4),
    Encoder::Libdeflate(5),
    Encoder::Libdeflate(6),
    Encoder::Libdeflate(7),
    Encoder::Libdeflate(8),
    Encoder::Libdeflate(9),
];

/// The decoder of every deflate record: libdeflate decodes every encoder's streams as fast as
/// ISA-L's decoder or faster (same measurement), so ISA-L is only an encoder here.
pub const DECODER: Decoder = Decoder::Libdeflate;

/// The encoder gzip-`level` uses (levels outside 1..9 are clamped).
pub fn encoder(level: i32) -> Encoder {
    ENCODERS[(level.clamp(1, 9) - 1) as usize]
}

pub fn compress(src: &[u8], dst: &mut [u8], level: i32) -> Option<usize> {
    encoder(level).compress(src, dst)
}

pub fn decompress(src: &[u8], len: usize) -> Result<Vec<u8>, CodecError> {
    super::into_zeroed(len, |dst| DECODER.decompress(src, dst))
}

//! What a record becomes, as small pure functions (ZFS's `zio_compress_data` rules):
//! all zeros → a hole; compressed only if that saves at least `min_savings`; otherwise raw.
//! Also the pre-check that skips incompressible data and the `compression=auto` selector.
//! Decoding checks the checksum before any decoder sees the bytes.

use super::stats::Outcome;
use super::{DecompressRequest, Encoded, EngineError};
use crate::checksum::ChecksumKind;
use crate::codec::{Codec, Compression};

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
    // SAFETY: every bit pattern is a valid u64, so viewing aligned runs of bytes as words is
    // sound; align_to keeps the unaligned ends as bytes.
    let (head, words, tail) = unsafe { data.align_to::<u64>() };
    head.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

/// Entropy of a sample of `data` in bits per byte (0..=8): 32-byte runs at up to 128 evenly
/// spread places (4 KiB), like btrfs's compression heuristic. Cheap enough for every record.
pub fn sample_entropy(data: &[u8]) -> f32 {
    const RUN: usize = 32;
    const RUNS: usize = 128;
    let mut histogram = [0u32; 256];
    let mut n = 0u32;
    if data.len() <= RUN * RUNS {
        data.iter().for_each(|&b| histogram[b as usize] += 1);
        n = data.len() as u32;
    } else {
        let stride = data.len() / RUNS;
        for i in 0..RUNS {
            for &b in &data[i * stride..i * stride + RUN] {
                histogram[b as usize] += 1;
            }
            n += RUN as u32;
        }
    }
    if n == 0 {
        return 0.0;
    }
    let n = n as f32;
    histogram
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f32 / n;
            -p * p.log2()
        })
        .sum()
}

/// Whether a sample's byte statistics alone already promise `min_savings` (an order-0 entropy
/// coder would save it). Above this, only repeated strings can help, which an lz4 probe sees.
pub fn entropy_promises_savings(entropy: f32, min_savings: MinSavings) -> bool {
    entropy < 8.0 * (1.0 - min_savings.0 as f32 / 1000.0)
}

/// The pre-check (ZFS's zstd early abort, with btrfs's entropy sample in front): is this record
/// not worth compressing with a slow codec? True only if its bytes look random *and* a quick lz4
/// pass cannot save `min_savings` either, so compressible data never loses ratio.
pub fn probably_incompressible(data: &[u8], entropy: f32, min_savings: MinSavings) -> bool {
    if entropy_promises_savings(entropy, min_savings) {
        return false;
    }
    let mut probe = vec![0u8; min_savings.max_kept_len(data.len())];
    Codec::Lz4.compress(data, &mut probe, 0).is_none()
}

/// Where a record compressed with `compression=auto` will run, and how loaded that place is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AutoTarget {
    /// An accelerator with room: strength costs the CPU nothing.
    Accelerator,
    /// The CPU pool, with this many records waiting per worker.
    Cpu { backlog_per_worker: f32 },
}

/// compression=auto: a codec for one record from its data and the load. Incompressible-looking
/// data gets lz4 (cheapest to try); otherwise the strongest codec the place can afford: gzip-6
/// on an accelerator; on the CPU zstd-3 while it keeps up, zstd-1 when work queues, gzip-1 when
/// it is far behind (a busy CPU, whether from our writers or other programs, drains the queue
/// slower). gzip-1 is ISA-L's encoder (`codec::deflate::ENCODERS`), which compresses the real
/// FASTQ at about lz4's speed with half again lz4's ratio (3.18 vs 2.10) and text-like data
/// faster than lz4 (bench/results/deflate-encoders.md), so it replaced lz4 as the last step.
pub fn choose_auto(entropy: f32, min_savings: MinSavings, target: AutoTarget) -> Compression {
    const ZSTD_1: Compression = Compression { codec: Codec::Zstd, level: 1 };
    const ZSTD_3: Compression = Compression { codec: Codec::Zstd, level: 3 };
    const GZIP_6: Compression = Compression { codec: Codec::Deflate, level: 6 };
    const GZIP_1: Compression = Compression { codec: Codec::Deflate, level: 1 };
    if !entropy_promises_savings(entropy, min_savings) {
        return Compression::LZ4;
    }
    match target {
        AutoTarget::Accelerator => GZIP_6,
        AutoTarget::Cpu { backlog_per_worker } if backlog_per_worker <= 2.0 => ZSTD_3,
        AutoTarget::Cpu { backlog_per_worker } if backlog_per_worker <= 8.0 => ZSTD_1,
        AutoTarget::Cpu { .. } => GZIP_1,
    }
}

/// Keeps `compressed` if it saves `min_savings`, else stores `data` raw; checksums what is kept.
pub fn keep_or_raw(
    data: &[u8],
    compression: Compression,
    compressed: Option<Vec<u8>>,
    min_savings: MinSavings,
    checksum: ChecksumKind,
) -> (Encoded, Outcome) {
    let logical_len = data.len() as u32;
    if let Some(bytes) = compressed.filter(|c| c.len() <= min_savings.max_kept_len(data.len())) {
        let sum = checksum.compute(&bytes);
        let encoded = Encoded { codec: compression.codec, level: compression.level as i8, bytes, logical_len, checksum: sum };
        return (encoded, Outcome::Compressed);
    }
    let sum = checksum.compute(data);
    let outcome = if compression.codec == Codec::Off { Outcome::RawOff } else { Outcome::RawLowSavings };
    (Encoded { codec: Codec::Off, level: 0, bytes: data.to_vec(), logical_len, checksum: sum }, outcome)
}

pub fn hole(len: usize) -> Encoded {
    Encoded { codec: Codec::Off, level: 0, bytes: Vec::new(), logical_len: len as u32, checksum: 0 }
}

thread_local! {
    /// Each encoding thread's output buffer (`encode_record`), as large as the largest record
    /// it has encoded.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Encodes one record on the calling thread with a concrete `compression` (never auto).
/// `precheck`: skip slow codecs on data that looks incompressible (see [`probably_incompressible`]).
pub fn encode_record(
    data: &[u8],
    compression: Compression,
    min_savings: MinSavings,
    checksum: ChecksumKind,
    precheck: bool,
) -> (Encoded, Outcome) {
    if is_all_zero(data) {
        return (hole(data.len()), Outcome::Hole);
    }
    if compression.codec == Codec::Off {
        return keep_or_raw(data, compression, None, min_savings, checksum);
    }
    if precheck && !compression.codec.is_fast() && probably_incompressible(data, sample_entropy(data), min_savings) {
        let (encoded, _) = keep_or_raw(data, Compression::OFF, None, min_savings, checksum);
        return (encoded, Outcome::RawPrecheck);
    }
    // Into this thread's scratch buffer, initialised once, then copied out at its length: a
    // fresh output buffer would be zeroed for every record (the codecs write into slices), and
    // the compressed bytes are about half of that or less.
    let compressed = SCRATCH.with(|cell| {
        let mut out = cell.borrow_mut();
        let room = min_savings.max_kept_len(data.len());
        if out.len() < room {
            out.resize(room, 0);
        }
        compression.codec.compress(data, &mut out[..room], compression.level).map(|n| out[..n].to_vec())
    });
    keep_or_raw(data, compression, compressed, min_savings, checksum)
}

/// The format's rule (`format::record`), with the engine's error.
pub fn decode_record(req: &DecompressRequest) -> Result<Vec<u8>, EngineError> {
    Ok(crate::format::record::verify_and_decode(req.codec, &req.stored, req.logical_len, req.checksum_kind, req.checksum)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(data: Vec<u8>, name: &str) -> Encoded {
        encode_record(&data, Compression::parse(name).unwrap(), MinSavings::ZFS, ChecksumKind::Crc32c, true).0
    }

    fn decode(e: &Encoded) -> Result<Vec<u8>, EngineError> {
        decode_record(&DecompressRequest::of(e, ChecksumKind::Crc32c))
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
        let noise: Vec<u8> = (0..65536)
            .map(|_| {
                x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                (x >> 24) as u8
            })
            .collect();
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

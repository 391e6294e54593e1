//! LZJB, the Solaris/OpenZFS Lempel-Ziv variant, bit-compatible with OpenZFS `lzjb.c`.
//!
//! The stream is a sequence of groups: one copymap byte, then up to eight items whose kinds it
//! gives, least significant bit first. A clear bit is one literal byte; a set bit is a two-byte
//! match, big-endian `mlen - 3` in the top 6 bits and a backward offset (1..=1023) in the low 10
//! bits, copying 3..=66 bytes that may overlap the output being produced. The compressor finds
//! candidates through a 1024-entry table of 16-bit positions indexed by a hash of the next three
//! bytes; like OpenZFS it stores positions modulo 2^16 and masks offsets to 10 bits, so a stale
//! or empty slot just names some earlier position that the three-byte check then accepts or
//! rejects like any other candidate. The stream carries no length: the decoder stops when the
//! output is full, and here it must then have consumed every input byte.

use super::CodecError;

const MATCH_BITS: u32 = 6;
const MATCH_MIN: usize = 3;
const MATCH_MAX: usize = (1 << MATCH_BITS) + (MATCH_MIN - 1);
const OFFSET_MASK: usize = (1 << (16 - MATCH_BITS)) - 1;
const LEMPEL_SIZE: usize = 1024;
/// Worst case of one group: the copymap byte plus eight two-byte matches.
const GROUP_MAX: usize = 1 + 2 * 8;
const TRUNCATED: CodecError = CodecError::Corrupt("lzjb stream truncated");

/// OpenZFS's hash of the three bytes at the start of `s`.
fn hash(s: &[u8]) -> usize {
    let mut h = (u32::from(s[0]) << 16) + (u32::from(s[1]) << 8) + u32::from(s[2]);
    h += h >> 9;
    h += h >> 5;
    h as usize & (LEMPEL_SIZE - 1)
}

/// Writes at most `dst.len()` bytes; returns `Some(len)`, or `None` when the output would not fit.
///
/// Gives up exactly when OpenZFS does: before starting a group with fewer than 18 bytes of `dst`
/// left, so a group can never overflow and the success/failure decision matches ZFS's.
pub fn compress(src: &[u8], dst: &mut [u8], _level: i32) -> Option<usize> {
    // Zeroed, as OpenZFS does, so identical blocks compress identically (dedup relies on it).
    // Positions are relative to the start of `src`, which matches OpenZFS on a 1024-aligned
    // buffer: an empty slot then reads as position 0.
    let mut lempel = [0u16; LEMPEL_SIZE];
    let mut s = 0;
    let mut d = 0;
    let mut copymap = 0;
    let mut copymask: u32 = 1 << 7;

    while s < src.len() {
        copymask <<= 1;
        if copymask == 1 << 8 {
            if d + GROUP_MAX >= dst.len() {
                return None;
            }
            copymask = 1;
            copymap = d;
            dst[d] = 0;
            d += 1;
        }
        // Too close to the end for a full-length match: OpenZFS emits the tail as literals.
        if s + MATCH_MAX > src.len() {
            dst[d] = src[s];
            d += 1;
            s += 1;
            continue;
        }
        let slot = &mut lempel[hash(&src[s..])];
        // Both positions are taken modulo 2^16 and the difference masked, exactly as the C
        // code does with the low 16 bits of a pointer.
        let offset = s.wrapping_sub(usize::from(*slot)) & OFFSET_MASK;
        *slot = s as u16;
        if offset != 0 && offset <= s && src[s..s + MATCH_MIN] == src[s - offset..s - offset + MATCH_MIN] {
            let cpy = s - offset;
            let mut mlen = MATCH_MIN;
            while mlen < MATCH_MAX && src[s + mlen] == src[cpy + mlen] {
                mlen += 1;
            }
            dst[copymap] |= copymask as u8;
            dst[d] = (((mlen - MATCH_MIN) << (8 - MATCH_BITS)) | (offset >> 8)) as u8;
            dst[d + 1] = offset as u8;
            d += 2;
            s += mlen;
        } else {
            dst[d] = src[s];
            d += 1;
            s += 1;
        }
    }
    Some(d)
}

/// Exactly `len` bytes decoded from `src` (the table's contract).
pub fn decompress(src: &[u8], len: usize) -> Result<Vec<u8>, CodecError> {
    super::into_zeroed(len, |dst| decode_into(src, dst))
}

/// Decodes `src` into exactly `dst.len()` bytes; anything else is `CodecError::Corrupt`.
fn decode_into(src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    let mut s = 0;
    let mut d = 0;
    let mut copymap = 0u8;
    let mut copymask: u32 = 1 << 7;

    while d < dst.len() {
        copymask <<= 1;
        if copymask == 1 << 8 {
            copymask = 1;
            copymap = *src.get(s).ok_or(TRUNCATED)?;
            s += 1;
        }
        if u32::from(copymap) & copymask != 0 {
            let (b0, b1) = match src.get(s..s + 2) {
                Some(&[b0, b1]) => (b0, b1),
                _ => return Err(TRUNCATED),
            };
            s += 2;
            let mlen = usize::from(b0 >> (8 - MATCH_BITS)) + MATCH_MIN;
            let offset = ((usize::from(b0) << 8) | usize::from(b1)) & OFFSET_MASK;
            // OpenZFS's compressor never emits offset 0; decoding it would read unwritten output.
            if offset == 0 {
                return Err(CodecError::Corrupt("lzjb match with zero offset"));
            }
            if offset > d {
                return Err(CodecError::Corrupt("lzjb match before start of output"));
            }
            if mlen > dst.len() - d {
                return Err(CodecError::Corrupt("lzjb match runs past end of output"));
            }
            if offset >= mlen {
                dst.copy_within(d - offset..d - offset + mlen, d);
            } else {
                // Overlapping copy: later bytes repeat ones this same match just wrote.
                for i in d..d + mlen {
                    dst[i] = dst[i - offset];
                }
            }
            d += mlen;
        } else {
            dst[d] = *src.get(s).ok_or(TRUNCATED)?;
            s += 1;
            d += 1;
        }
    }
    // A valid stream ends exactly where the output does; leftovers mean a wrong length or junk.
    if s != src.len() {
        return Err(CodecError::Corrupt("lzjb stream longer than its output"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pseudo_random(len: usize, mut seed: u64) -> Vec<u8> {
        seed |= 1;
        (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 24) as u8
            })
            .collect()
    }

    fn text_like(len: usize) -> Vec<u8> {
        let words = ["the ", "quick ", "brown ", "fox ", "jumps ", "over ", "lazy ", "dog.\n", "densefs ", "record "];
        let picks = pseudo_random(len, 99);
        let mut out = Vec::with_capacity(len + 16);
        let mut i = 0;
        while out.len() < len {
            out.extend_from_slice(words[picks[i % picks.len().max(1)] as usize % words.len()].as_bytes());
            i += 1;
        }
        out.truncate(len);
        out
    }

    /// Zero runs, random patches and text, the mix a sparse file record tends to have.
    fn mixed(len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        let mut k = 0u64;
        while out.len() < len {
            let take = (len - out.len()).min(1 + (k as usize * 37) % 300);
            match k % 4 {
                0 => out.resize(out.len() + take, 0),
                1 => out.extend(pseudo_random(take, k)),
                2 => out.extend(text_like(take)),
                _ => out.extend((0..take).map(|i| (i % 7) as u8)),
            }
            k += 1;
        }
        out
    }

    fn bound(len: usize) -> usize {
        len + len / 8 + 32
    }

    fn round_trip(data: &[u8]) {
        let mut out = vec![0u8; bound(data.len())];
        let n = compress(data, &mut out, 0).expect("fits in the worst-case bound");
        let mut back = vec![0xAAu8; data.len()];
        decode_into(&out[..n], &mut back).expect("own output decodes");
        assert_eq!(back, data);
    }

    #[test]
    fn empty_input_is_an_empty_stream() {
        assert_eq!(compress(&[], &mut [], 0), Some(0));
        decode_into(&[], &mut []).unwrap();
        assert!(decode_into(&[0], &mut []).is_err());
        assert!(decode_into(&[], &mut [0]).is_err());
    }

    #[test]
    fn round_trips_every_size_to_4096() {
        let (zeros, rand, text, mix) = (vec![0u8; 4096], pseudo_random(4096, 5), text_like(4096), mixed(4096));
        for len in 1..=4096 {
            for data in [&zeros, &rand, &text, &mix] {
                round_trip(&data[..len]);
            }
        }
    }

    #[test]
    fn round_trips_128k() {
        let len = 128 * 1024;
        for data in [vec![0u8; len], pseudo_random(len, 9), text_like(len), mixed(len), vec![0xFF; len]] {
            round_trip(&data);
        }
    }

    #[test]
    fn repetitive_data_compresses() {
        let text = text_like(128 * 1024);
        let mut out = vec![0u8; text.len() / 2];
        assert!(compress(&text, &mut out, 0).is_some());
        let zeros = vec![0u8; 128 * 1024];
        let mut out = vec![0u8; zeros.len() / 16];
        assert!(compress(&zeros, &mut out, 0).is_some());
    }

    #[test]
    fn random_data_does_not_fit_in_seven_eighths() {
        let data = pseudo_random(64 * 1024, 3);
        let mut out = vec![0u8; data.len() - data.len() / 8];
        assert_eq!(compress(&data, &mut out, 0), None);
    }

    #[test]
    fn too_small_dst_gives_none_and_some_is_always_the_same_stream() {
        for data in [text_like(3000), mixed(2000), vec![0u8; 500], pseudo_random(300, 1), b"abc".to_vec()] {
            let mut big = vec![0u8; bound(data.len())];
            let n = compress(&data, &mut big, 0).unwrap();
            for cap in 0..n + GROUP_MAX + 2 {
                let mut out = vec![0u8; cap];
                match compress(&data, &mut out, 0) {
                    None => assert!(cap < n + GROUP_MAX, "gave up with {cap} bytes for a {n}-byte stream"),
                    Some(m) => {
                        assert!(cap >= n);
                        assert_eq!(&out[..m], &big[..n]);
                        let mut back = vec![0u8; data.len()];
                        decode_into(&out[..m], &mut back).unwrap();
                        assert_eq!(back, data);
                    }
                }
            }
        }
    }

    /// "abc" * 24, derived by hand from the format: positions 0..=2 are literals (their table
    /// slots are empty, so the candidates are position 0 itself or mismatches); at 3 the "abc"
    /// slot points at 0, offset 3, and the match runs the full 66 bytes; positions 69..72 are
    /// within MATCH_MAX of the end and go out as literals. Item 3 is the match, so copymap 0x08;
    /// the match bytes are (66 - 3) << 2 | 3 >> 8 = 0xFC and 3 & 0xFF = 0x03.
    #[test]
    fn hand_worked_repetitive_vector() {
        let data = b"abc".repeat(24);
        let expected = [0x08, b'a', b'b', b'c', 0xFC, 0x03, b'a', b'b', b'c'];
        let mut out = [0u8; 64];
        let n = compress(&data, &mut out, 0).unwrap();
        assert_eq!(&out[..n], &expected);
        let mut back = [0u8; 72];
        decode_into(&expected, &mut back).unwrap();
        assert_eq!(&back[..], &data[..]);
        // OpenZFS needs 18 free bytes before opening a group, even for a 9-byte result.
        assert_eq!(compress(&data, &mut [0u8; 17], 0), None);
        assert_eq!(compress(&data, &mut [0u8; 18], 0), Some(9));
    }

    /// 100 zero bytes: a literal 0 (the empty slot points at position 0 itself), then a match of
    /// offset 1 and length 66 (0xFC 0x01), then 33 tail literals in groups of 6, 8, 8, 8 and 3.
    #[test]
    fn hand_worked_zero_vector() {
        let mut expected = vec![0x02, 0x00, 0xFC, 0x01, 0, 0, 0, 0, 0, 0];
        for _ in 0..3 {
            expected.extend([0u8; 9]);
        }
        expected.extend([0u8; 4]);
        let data = [0u8; 100];
        let mut out = [0u8; 200];
        let n = compress(&data, &mut out, 0).unwrap();
        assert_eq!(&out[..n], &expected[..]);
        let mut back = [0xFFu8; 100];
        decode_into(&expected, &mut back).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn decoder_rejects_bad_matches_and_wrong_lengths() {
        let mut dst = [0u8; 8];
        // Offset 2 with only one byte written.
        assert!(decode_into(&[0x02, b'x', 0x00, 0x02], &mut dst).is_err());
        // Offset 0.
        assert!(decode_into(&[0x02, b'x', 0x00, 0x00], &mut dst).is_err());
        // A 4-byte match where only 3 bytes of output remain.
        assert!(decode_into(&[0x10, 1, 2, 3, 4, 0x04, 0x01], &mut [0u8; 7]).is_err());
        // Same stream decodes with 8 bytes, and with neither 7 nor 9.
        let stream = [0x10, 1, 2, 3, 4, 0x04, 0x01];
        let mut out = [0u8; 9];
        decode_into(&stream, &mut out[..8]).unwrap();
        assert_eq!(&out[..8], &[1, 2, 3, 4, 4, 4, 4, 4]);
        assert!(decode_into(&stream, &mut out).is_err());
        // Trailing bytes after the output is full.
        assert!(decode_into(&[0x00, 1, 2], &mut [0u8; 1]).is_err());
    }

    #[test]
    fn wrong_output_length_is_an_error() {
        let data = text_like(8192);
        let mut out = vec![0u8; bound(data.len())];
        let n = compress(&data, &mut out, 0).unwrap();
        for wrong in [0, 1, data.len() - 1, data.len() + 1, data.len() * 2] {
            let mut back = vec![0u8; wrong];
            assert!(decode_into(&out[..n], &mut back).is_err(), "len {wrong}");
        }
    }

    /// `mixed` data with a seeded sprinkle of small values, so each case compresses differently.
    fn salted(len: usize, seed: u64) -> Vec<u8> {
        mixed(len).iter().zip(pseudo_random(len, seed)).map(|(&a, b)| if b < 16 { b } else { a }).collect()
    }

    fn zero_heavy_byte() -> impl Strategy<Value = u8> {
        prop_oneof![Just(0u8), Just(1u8), any::<u8>()]
    }

    proptest! {
        #[test]
        fn garbage_never_panics(src in proptest::collection::vec(any::<u8>(), 0..2048), len in 0usize..8192) {
            let mut dst = vec![0u8; len];
            let _ = decode_into(&src, &mut dst);
        }

        #[test]
        fn damaged_streams_never_panic(
            seed in any::<u64>(),
            len in 1usize..3000,
            flips in proptest::collection::vec(any::<(usize, u8)>(), 1..8),
            cut in any::<usize>(),
        ) {
            let data = salted(len, seed);
            let mut out = vec![0u8; bound(len)];
            let n = compress(&data, &mut out, 0).unwrap();
            let mut stream = out[..n].to_vec();
            let mut back = vec![0u8; len];
            // A valid stream is consumed exactly, so any proper prefix runs dry before the end.
            let cut = cut % n;
            prop_assert!(decode_into(&stream[..cut], &mut back).is_err());
            for (at, mask) in flips {
                stream[at % n] ^= mask;
            }
            let _ = decode_into(&stream, &mut back);
        }

        #[test]
        fn arbitrary_inputs_round_trip(data in proptest::collection::vec(zero_heavy_byte(), 0..3000)) {
            round_trip(&data);
        }
    }
}

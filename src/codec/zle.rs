//! ZLE, the OpenZFS zero-length encoding (`zle.c`) with the parameter n = 64 that ZFS uses.
//!
//! The stream is a sequence of chunks, each opened by a control byte `c`. If `c < 64`, the next
//! `c + 1` bytes are literals (1..=64 of them); otherwise the chunk stands for `c - 64 + 1` zero
//! bytes (1..=192) and carries nothing more. The compressor is greedy like ZFS's: a zero run
//! takes up to 192 zeros; a literal run takes up to 64 bytes and ends early only where two zeros
//! in a row begin, so a lone zero between nonzero bytes stays inside the literal run, and a zero
//! left over at the end of a full 64-byte window starts the next zero run. Compression only
//! pays off on zero-heavy data; data without zeros grows by 1/64.

use super::CodecError;

/// ZFS's `n`: control bytes below it open literal runs, the rest are zero runs.
const N: usize = 64;
const MAX_ZEROS: usize = 256 - N;

/// Writes at most `dst.len()` bytes; returns `Some(len)`, or `None` when the output would not fit.
///
/// Whenever OpenZFS's `zle_compress` succeeds this produces the same bytes; unlike ZFS, which
/// wants 64 free bytes before every literal run, it gives up only when the output truly does not
/// fit, checking each chunk as it goes so hopeless inputs stop early.
pub fn compress(src: &[u8], dst: &mut [u8], _level: i32) -> Option<usize> {
    let mut s = 0;
    let mut d = 0;
    while s < src.len() {
        let first = s;
        if src[s] == 0 {
            let end = src.len().min(s + MAX_ZEROS);
            while s < end && src[s] == 0 {
                s += 1;
            }
            *dst.get_mut(d)? = (s - first - 1 + N) as u8;
            d += 1;
        } else {
            let end = src.len().min(s + N);
            // Stop in front of two zeros: they are cheaper as a zero run than as literals.
            while s + 1 < end && (src[s] | src[s + 1]) != 0 {
                s += 1;
            }
            // `s` now sits on a pair of zeros or on the window's last byte; like ZFS, that byte
            // joins the run only if it is nonzero.
            if src[s] != 0 {
                s += 1;
            }
            let len = s - first;
            let out = dst.get_mut(d..d + 1 + len)?;
            out[0] = (len - 1) as u8;
            out[1..].copy_from_slice(&src[first..s]);
            d += 1 + len;
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
    while let Some(&c) = src.get(s) {
        s += 1;
        let c = usize::from(c);
        if c < N {
            let len = c + 1;
            let lit = src.get(s..s + len).ok_or(CodecError::Corrupt("zle literal run truncated"))?;
            let out = dst.get_mut(d..d + len).ok_or(CodecError::Corrupt("zle literal run past end of output"))?;
            out.copy_from_slice(lit);
            s += len;
            d += len;
        } else {
            let len = c - N + 1;
            let out = dst.get_mut(d..d + len).ok_or(CodecError::Corrupt("zle zero run past end of output"))?;
            // The caller's buffer may hold old data, so zeros are written, not assumed.
            out.fill(0);
            d += len;
        }
    }
    if d != dst.len() {
        return Err(CodecError::Corrupt("zle stream shorter than its output"));
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

    /// Zero runs of many lengths, lone zeros, random patches and text.
    fn mixed(len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        let mut k = 0u64;
        while out.len() < len {
            let take = (len - out.len()).min(1 + (k as usize * 37) % 300);
            match k % 4 {
                0 => out.resize(out.len() + take, 0),
                1 => out.extend(pseudo_random(take, k)),
                2 => out.extend(text_like(take)),
                _ => out.extend((0..take).map(|i| (i % 3) as u8)),
            }
            k += 1;
        }
        out
    }

    fn bound(len: usize) -> usize {
        len + len / 64 + 2
    }

    fn encode(data: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; bound(data.len())];
        let n = compress(data, &mut out, 0).expect("fits in the worst-case bound");
        out.truncate(n);
        out
    }

    fn round_trip(data: &[u8]) {
        let stream = encode(data);
        let mut back = vec![0xAAu8; data.len()];
        decode_into(&stream, &mut back).expect("own output decodes");
        assert_eq!(back, data);
    }

    #[test]
    fn empty_input_is_an_empty_stream() {
        assert_eq!(compress(&[], &mut [], 0), Some(0));
        decode_into(&[], &mut []).unwrap();
        assert!(decode_into(&[64], &mut []).is_err());
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
    fn zeros_compress_and_random_data_does_not() {
        let zeros = vec![0u8; 128 * 1024];
        assert_eq!(encode(&zeros).len(), (128 * 1024usize).div_ceil(MAX_ZEROS));
        let data = pseudo_random(64 * 1024, 3);
        let mut out = vec![0u8; data.len() - data.len() / 8];
        assert_eq!(compress(&data, &mut out, 0), None);
    }

    #[test]
    fn too_small_dst_gives_none_and_exact_fit_gives_some() {
        for data in [mixed(3000), vec![0u8; 500], pseudo_random(300, 1), vec![7], b"a\0\0b".to_vec()] {
            let full = encode(&data);
            let n = full.len();
            for cap in 0..n + 3 {
                let mut out = vec![0u8; cap];
                match compress(&data, &mut out, 0) {
                    None => assert!(cap < n, "gave up with {cap} bytes for a {n}-byte stream"),
                    Some(m) => {
                        assert!(cap >= n);
                        assert_eq!(&out[..m], &full[..]);
                    }
                }
            }
        }
    }

    /// Derived by hand: four zeros are one zero run, 4 - 1 + 64 = 67 (0x43); then the literal
    /// run [1, 2] has control byte 2 - 1 = 1.
    #[test]
    fn hand_worked_vectors() {
        let cases: [(&[u8], &[u8]); 4] = [
            (&[0, 0, 0, 0, 1, 2], &[0x43, 0x01, 1, 2]),
            // A lone zero stays in the literal run; the pair of zeros becomes a run of 2 (65).
            (&[5, 0, 7, 0, 0, 9], &[2, 5, 0, 7, 65, 0, 9]),
            // A single trailing zero after a literal is its own zero run.
            (&[1, 0], &[0, 1, 64]),
            (&[0], &[64]),
        ];
        for (plain, coded) in cases {
            assert_eq!(encode(plain), coded, "{plain:?}");
            let mut back = vec![0xEEu8; plain.len()];
            decode_into(coded, &mut back).unwrap();
            assert_eq!(back, plain);
        }
    }

    #[test]
    fn runs_split_at_their_maximum_lengths() {
        // 200 zeros: 192 (code 255) then 8 (code 71).
        assert_eq!(encode(&[0; 200]), [255, 71]);
        // 100 nonzero bytes: 64 literals (code 63) then 36 (code 35).
        let ones = [1u8; 100];
        let mut expected = vec![63];
        expected.extend([1; 64]);
        expected.push(35);
        expected.extend([1; 36]);
        assert_eq!(encode(&ones), expected);
        // A zero in the last slot of a full window is left for the next chunk.
        let mut w = vec![1u8; 63];
        w.extend([0, 1]);
        let mut expected = vec![62];
        expected.extend([1; 63]);
        expected.extend([64, 0, 1]);
        assert_eq!(encode(&w), expected);
    }

    #[test]
    fn decoder_rejects_overruns_and_wrong_lengths() {
        // Literal run claims 3 bytes, stream has 2.
        assert!(decode_into(&[2, 1, 2], &mut [0u8; 3]).is_err());
        // Zero run of 10 into 9 bytes.
        assert!(decode_into(&[73], &mut [0u8; 9]).is_err());
        let data = mixed(8192);
        let stream = encode(&data);
        for wrong in [0, 1, data.len() - 1, data.len() + 1, data.len() * 2] {
            let mut back = vec![0u8; wrong];
            assert!(decode_into(&stream, &mut back).is_err(), "len {wrong}");
        }
    }

    /// `mixed` data with a seeded sprinkle of small values, so each case compresses differently.
    fn salted(len: usize, seed: u64) -> Vec<u8> {
        mixed(len).iter().zip(pseudo_random(len, seed)).map(|(&a, b)| if b < 16 { b } else { a }).collect()
    }

    fn zero_heavy_byte() -> impl Strategy<Value = u8> {
        prop_oneof![Just(0u8), Just(0u8), Just(1u8), any::<u8>()]
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
            let mut stream = encode(&data);
            let n = stream.len();
            let mut back = vec![0u8; len];
            // Every chunk yields at least one byte, so a proper prefix decodes short.
            prop_assert!(decode_into(&stream[..cut % n], &mut back).is_err());
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

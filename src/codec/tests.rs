use super::*;

fn sample_text(len: usize) -> Vec<u8> {
    let line = b"@SRR001666.1 071112_SLXA-EAS1_s_7:5:1:817:345 length=36\nGGGTGATGGCCGCTGCCGATGGCGTCAAATCCCACC\n+\nIIIIIIIIIIIIIIIIIIIIIIIIIIIIIII9IG9IC\n";
    line.iter().cycle().take(len).copied().collect()
}

fn pseudo_random(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect()
}

fn all_settings() -> Vec<Compression> {
    let mut names: Vec<String> = ["off", "on", "lz4", "gzip", "zstd", "lzjb", "zle"].map(String::from).to_vec();
    names.extend((1..=9).map(|n| format!("gzip-{n}")));
    names.extend((1..=19).map(|n| format!("zstd-{n}")));
    names.extend((1..=10).map(|n| format!("zstd-fast-{n}")));
    names.iter().map(|n| Compression::parse(n).unwrap()).collect()
}

#[test]
fn every_setting_round_trips_text_zeros_and_random() {
    for setting in all_settings() {
        for data in [sample_text(128 * 1024), vec![0u8; 4096], pseudo_random(10_000, 7), sample_text(1)] {
            let mut out = vec![0u8; data.len() + 1024];
            let Some(n) = setting.codec.compress(&data, &mut out, setting.level) else {
                assert!(setting.codec == Codec::Zle || setting.codec == Codec::Lzjb, "{setting} gave up with room");
                continue;
            };
            let back = setting.codec.decompress(&out[..n], data.len()).unwrap();
            assert_eq!(back, data, "{setting}");
        }
    }
}

#[test]
fn text_compresses_well_with_every_real_codec() {
    let data = sample_text(128 * 1024);
    for setting in all_settings().into_iter().filter(|s| !matches!(s.codec, Codec::Off | Codec::Zle)) {
        let mut out = vec![0u8; data.len() / 2];
        let n = setting.codec.compress(&data, &mut out, setting.level);
        assert!(n.is_some(), "{setting} failed to halve repetitive text");
    }
}

#[test]
fn compress_reports_when_output_does_not_fit() {
    let data = pseudo_random(64 * 1024, 3);
    for setting in all_settings() {
        let mut out = vec![0u8; data.len() - data.len() / 8];
        assert_eq!(setting.codec.compress(&data, &mut out, setting.level), None, "{setting}");
    }
}

#[test]
fn decoding_to_the_wrong_length_is_an_error() {
    let data = sample_text(8192);
    for setting in all_settings() {
        let mut out = vec![0u8; data.len() * 2];
        let Some(n) = setting.codec.compress(&data, &mut out, setting.level) else { continue };
        for wrong in [data.len() - 1, data.len() + 1] {
            assert!(setting.codec.decompress(&out[..n], wrong).is_err(), "{setting} len {wrong}");
        }
    }
}

#[test]
fn corrupt_input_is_an_error_or_wrong_bytes_but_never_a_panic() {
    let data = sample_text(16 * 1024);
    for setting in all_settings() {
        let mut out = vec![0u8; data.len() * 2];
        let Some(n) = setting.codec.compress(&data, &mut out, setting.level) else { continue };
        let stream = &out[..n];
        for i in (0..n).step_by(n / 64 + 1) {
            let mut bad = stream.to_vec();
            bad[i] ^= 0x5a;
            let _ = setting.codec.decompress(&bad, data.len());
            let _ = setting.codec.decompress(&bad[..i], data.len());
        }
        let _ = setting.codec.decompress(&pseudo_random(n, 11), data.len());
    }
}

#[test]
fn deflate_output_is_plain_rfc1951_that_a_zlib_style_decoder_reads() {
    // libdeflate's gzip wrapper around the same raw stream must decode with the standard gzip
    // header, proving the record holds a bare RFC 1951 stream.
    let data = sample_text(100_000);
    let mut raw = vec![0u8; data.len()];
    let n = Codec::Deflate.compress(&data, &mut raw, 6).unwrap();
    let mut gz = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    gz.extend_from_slice(&raw[..n]);
    gz.extend_from_slice(&crc32_ieee(&data).to_le_bytes());
    gz.extend_from_slice(&(data.len() as u32).to_le_bytes());
    let mut back = vec![0u8; data.len()];
    let got = libdeflater::Decompressor::new().gzip_decompress(&gz, &mut back).unwrap();
    assert_eq!(got, data.len());
    assert_eq!(back, data);
}

fn crc32_ieee(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

#[test]
fn names_parse_and_print_as_zfs_spells_them() {
    assert_eq!(Compression::parse("on").unwrap(), Compression::LZ4);
    assert_eq!(Compression::parse("gzip").unwrap().to_string(), "gzip-6");
    assert_eq!(Compression::parse("zstd").unwrap().to_string(), "zstd-3");
    assert_eq!(Compression::parse("zstd-fast-7").unwrap().to_string(), "zstd-fast-7");
    for setting in all_settings() {
        assert_eq!(Compression::parse(&setting.to_string()).unwrap(), setting);
    }
    for bad in ["", "gzip-0", "gzip-10", "zstd-20", "zstd-fast-11", "zstd-fast-0", "lz5", "gzip-06", "GZIP"] {
        assert!(Compression::parse(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn unknown_codec_ids_are_rejected() {
    for id in 0..=5u8 {
        assert_eq!(Codec::from_id(id).unwrap() as u8, id);
    }
    assert_eq!(Codec::from_id(6), Err(CodecError::UnknownCodec(6)));
}

#[test]
fn the_table_is_indexed_by_id_and_every_level_of_every_row_parses_and_prints() {
    for (id, row) in CODECS.iter().enumerate() {
        assert_eq!(row.codec as usize, id, "{} is not at its on-disk id", row.name);
        assert_eq!(Compression::parse(row.name).unwrap(), row.default_setting());
        for alias in row.aliases {
            assert_eq!(Compression::parse(alias).unwrap(), row.default_setting());
        }
        let Some(l) = row.levels else {
            assert!(Compression::parse(&format!("{}-1", row.name)).is_err());
            continue;
        };
        assert!((l.min..=l.max).contains(&l.default), "{}", row.name);
        for level in (l.min..=l.max).chain((1..=l.fast).map(|n| -n)) {
            let setting = Compression { codec: row.codec, level };
            assert_eq!(Compression::parse(&setting.to_string()).unwrap(), setting);
        }
        for bad in [l.min - 1, l.max + 1] {
            assert!(Compression::parse(&format!("{}-{bad}", row.name)).is_err());
        }
        assert!(Compression::parse(&format!("{}-fast-{}", row.name, l.fast + 1)).is_err());
    }
}

#[test]
fn the_list_of_valid_names_comes_from_the_table() {
    assert_eq!(codec_names(), "off, on, lz4, gzip, gzip-1..9, zstd, zstd-1..19, zstd-fast-1..10, lzjb, zle");
    assert_eq!(setting_names(), codec_names() + " or auto");
    let e = Compression::parse("lz5").unwrap_err();
    assert!(e.contains(&codec_names()), "{e}");
}

#[test]
fn auto_is_a_setting_not_a_codec() {
    assert_eq!(Setting::parse("auto").unwrap(), Setting::Auto);
    assert_eq!(Setting::Auto.to_string(), "auto");
    assert!(Compression::parse("auto").is_err(), "auto names no stream format");
    assert_eq!(Setting::from_header(255, 0).unwrap(), Setting::Auto);
    assert_eq!(Codec::from_id(255), Err(CodecError::UnknownCodec(255)), "a descriptor can never say auto");
    for name in ["off", "lz4", "gzip-9", "zstd-fast-3", "auto"] {
        let s = Setting::parse(name).unwrap();
        let (id, level) = s.to_header();
        assert_eq!(Setting::from_header(id, level).unwrap(), s, "{name}");
        assert_eq!(s.to_string(), name);
    }
    let e = Setting::parse("lz5").unwrap_err();
    assert!(e.contains(&setting_names()), "{e}");
}

#[test]
fn the_docs_list_every_codec_of_the_table() {
    let format = include_str!("../../docs/FORMAT.md");
    let readme = include_str!("../../README.md");
    for row in &CODECS {
        let id = row.codec as u8;
        assert!(
            format.lines().any(|l| l.starts_with(&format!("| {id} | {}", row.name))),
            "docs/FORMAT.md's codec id table lacks {id} ({})",
            row.name
        );
        assert!(readme.contains(&format!("`{}`", row.name)), "README.md's compression row lacks {}", row.name);
    }
}

mod deflate_encoders {
    //! The two raw-deflate encoders (libdeflate, ISA-L) and decoders: one format, so every
    //! encoder's stream must decode with every decoder, zlib's included.
    use super::super::deflate::{self, Decoder, Encoder, DECODER, ENCODERS};
    use super::*;
    use proptest::prelude::*;

    const ISAL_LEVELS: [Encoder; 4] = [Encoder::Isal(0), Encoder::Isal(1), Encoder::Isal(2), Encoder::Isal(3)];
    const DECODERS: [Decoder; 2] = [Decoder::Libdeflate, Decoder::Isal];

    /// Every encoder a gzip level maps to, and every ISA-L level.
    fn all_encoders() -> Vec<Encoder> {
        let mut v: Vec<Encoder> = ENCODERS.iter().copied().chain(ISAL_LEVELS).collect();
        v.dedup();
        v
    }

    fn zlib_inflate(src: &[u8], len: usize) -> Option<Vec<u8>> {
        let mut out = vec![0u8; len];
        let mut d = flate2::Decompress::new(false);
        match d.decompress(src, &mut out, flate2::FlushDecompress::Finish) {
            Ok(flate2::Status::StreamEnd) if d.total_out() as usize == len => Some(out),
            _ => None,
        }
    }

    fn fastq_like(len: usize, seed: u64) -> Vec<u8> {
        // Reads with random bases and qualities: compressible, but not a repeated line.
        let r = pseudo_random(len, seed);
        let mut out = Vec::with_capacity(len);
        let mut i = 0;
        while out.len() < len {
            out.extend_from_slice(format!("@SRR001666.{i} 071112_SLXA:5:1:{}:{}\n", r[i % r.len()], r[(i * 7) % r.len()]).as_bytes());
            out.extend((0..36).map(|k| b"ACGT"[(r[(i * 36 + k) % r.len()] & 3) as usize]));
            out.extend_from_slice(b"\n+\n");
            out.extend((0..36).map(|k| b'#' + r[(i * 36 + k + 5) % r.len()] % 40));
            out.push(b'\n');
            i += 1;
        }
        out.truncate(len);
        out
    }

    #[test]
    fn every_encoder_round_trips_through_every_decoder_and_zlib() {
        for enc in all_encoders() {
            for data in [fastq_like(128 * 1024, 1), sample_text(100_000), vec![0u8; 128 * 1024], pseudo_random(20_000, 5), sample_text(1)] {
                let mut out = vec![0u8; data.len() + data.len() / 8 + 1024];
                let n = enc.compress(&data, &mut out).unwrap_or_else(|| panic!("{enc} gave up with room"));
                for dec in DECODERS {
                    let mut back = vec![0u8; data.len()];
                    dec.decompress(&out[..n], &mut back).unwrap_or_else(|e| panic!("{enc} -> {dec:?}: {e}"));
                    assert!(back == data, "{enc} -> {dec:?}");
                }
                assert!(zlib_inflate(&out[..n], data.len()).as_deref() == Some(&data[..]), "{enc} -> zlib");
            }
        }
    }

    #[test]
    fn empty_input_round_trips() {
        for enc in all_encoders() {
            let mut out = [0u8; 64];
            let n = enc.compress(&[], &mut out).unwrap_or_else(|| panic!("{enc}: empty input"));
            for dec in DECODERS {
                dec.decompress(&out[..n], &mut []).unwrap_or_else(|e| panic!("{enc} -> {dec:?}: {e}"));
            }
            assert_eq!(zlib_inflate(&out[..n], 0), Some(vec![]), "{enc} -> zlib");
        }
    }

    #[test]
    fn output_that_does_not_fit_is_none_and_nothing_is_written_past_dst() {
        let random = pseudo_random(128 * 1024, 9);
        let text = fastq_like(128 * 1024, 2);
        for enc in all_encoders() {
            for (data, room) in [(&random, random.len() - random.len() / 8), (&random, random.len()), (&text, 1000), (&text, 0)] {
                let mut buf = vec![0xa5u8; room + 4096];
                let (dst, guard) = buf.split_at_mut(room);
                assert_eq!(enc.compress(data, dst), None, "{enc} into {room} bytes");
                assert!(guard.iter().all(|&b| b == 0xa5), "{enc} wrote past dst ({room} bytes)");
            }
            // Room for the stream and 8 bytes more is enough (ISA-L's bit buffer stores 8 bytes at
            // a time: with less room it stops early, which the contract allows); one byte less
            // than the stream never is.
            for data in [&text, &fastq_like(5000, 8), &sample_text(128 * 1024)] {
                let mut out = vec![0u8; data.len()];
                let n = enc.compress(data, &mut out).unwrap();
                assert_eq!(enc.compress(data, &mut out[..n + 8]), Some(n), "{enc}");
                assert_eq!(enc.compress(data, &mut out[..n - 1]), None, "{enc}");
            }
        }
    }

    #[test]
    fn libdeflate_streams_decode_with_isal_and_back() {
        let data = fastq_like(128 * 1024, 3);
        for level in 1..=12 {
            let mut out = vec![0u8; data.len()];
            let n = Encoder::Libdeflate(level).compress(&data, &mut out).unwrap();
            let mut back = vec![0u8; data.len()];
            Decoder::Isal.decompress(&out[..n], &mut back).unwrap();
            assert!(back == data, "libdeflate-{level} -> isal");
        }
    }

    #[test]
    fn both_decoders_reject_wrong_lengths_and_survive_corruption() {
        let data = fastq_like(16 * 1024, 4);
        for enc in all_encoders() {
            let mut out = vec![0u8; data.len() * 2];
            let n = enc.compress(&data, &mut out).unwrap();
            let stream = &out[..n];
            for dec in DECODERS {
                for wrong in [0, data.len() - 1, data.len() + 1] {
                    let mut back = vec![0u8; wrong];
                    assert!(dec.decompress(stream, &mut back).is_err(), "{enc} -> {dec:?} len {wrong}");
                }
                let mut back = vec![0u8; data.len()];
                assert!(dec.decompress(&stream[..n / 2], &mut back).is_err(), "{enc} -> {dec:?}: truncated stream");
                for i in (0..n).step_by(n / 64 + 1) {
                    let mut bad = stream.to_vec();
                    bad[i] ^= 0x5a;
                    let _ = dec.decompress(&bad, &mut back);
                }
                let _ = dec.decompress(&pseudo_random(n, 11), &mut back);
            }
        }
    }

    #[test]
    fn the_level_table_names_valid_encoders_and_gzip_levels_use_it() {
        for (i, enc) in ENCODERS.iter().enumerate() {
            match *enc {
                Encoder::Isal(l) => assert!(l <= 3, "gzip-{}: {enc}", i + 1),
                Encoder::Libdeflate(l) => assert!((1..=12).contains(&l), "gzip-{}: {enc}", i + 1),
            }
            assert_eq!(deflate::encoder(i as i32 + 1), *enc);
        }
        // gzip-N goes through the table: its bytes are exactly its encoder's.
        let data = fastq_like(64 * 1024, 6);
        for level in 1..=9 {
            let (mut a, mut b) = (vec![0u8; data.len()], vec![0u8; data.len()]);
            let n = Codec::Deflate.compress(&data, &mut a, level).unwrap();
            assert_eq!(deflate::encoder(level).compress(&data, &mut b), Some(n));
            assert!(a[..n] == b[..n], "gzip-{level}");
        }
        let mut back = vec![0u8; data.len()];
        let mut out = vec![0u8; data.len()];
        let n = ENCODERS[0].compress(&data, &mut out).unwrap();
        DECODER.decompress(&out[..n], &mut back).unwrap();
        assert!(back == data);
    }

    #[test]
    fn threads_compress_at_once_with_their_own_state() {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                std::thread::spawn(move || {
                    for round in 0..20u64 {
                        let data = fastq_like(32 * 1024 + (round as usize) * 100, t * 100 + round);
                        let enc = ISAL_LEVELS[((t + round) % 4) as usize];
                        let mut out = vec![0u8; data.len()];
                        let n = enc.compress(&data, &mut out).unwrap();
                        let mut back = vec![0u8; data.len()];
                        DECODERS[(round % 2) as usize].decompress(&out[..n], &mut back).unwrap();
                        assert!(back == data, "thread {t} round {round} {enc}");
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    fn short_alphabet_byte() -> impl Strategy<Value = u8> {
        prop_oneof![Just(b'A'), Just(b'C'), Just(b'G'), Just(b'T'), Just(b'\n'), any::<u8>()]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn isal_round_trips_or_says_it_does_not_fit(
            data in proptest::collection::vec(short_alphabet_byte(), 0..40_000),
            level in 0u32..=3,
            room_pct in 0usize..130,
        ) {
            let room = data.len() * room_pct / 100;
            let mut buf = vec![0x3cu8; room + 1024];
            let (dst, guard) = buf.split_at_mut(room);
            let got = Encoder::Isal(level).compress(&data, dst);
            prop_assert!(guard.iter().all(|&b| b == 0x3c), "wrote past dst");
            if let Some(n) = got {
                prop_assert!(n <= room);
                for dec in DECODERS {
                    let mut back = vec![0u8; data.len()];
                    prop_assert!(dec.decompress(&dst[..n], &mut back).is_ok());
                    prop_assert!(back == data);
                }
            }
        }

        #[test]
        fn isal_decoder_never_panics_on_garbage(src in proptest::collection::vec(any::<u8>(), 0..4096), len in 0usize..70_000) {
            let mut out = vec![0u8; len];
            let _ = Decoder::Isal.decompress(&src, &mut out);
        }
    }
}

#[test]
fn a_users_fsync_lands_a_record_or_two_uncompressed_and_more_with_a_fast_codec() {
    use setting::{Setting, FSYNC_RAW_BYTES};
    let gzip_6 = Setting::parse("gzip-6").unwrap();
    let zle = Setting::parse("zle").unwrap();
    for setting in [gzip_6, zle, Setting::LZ4, Setting::Auto] {
        assert_eq!(setting.for_fsync(4096), Setting::Fixed(Compression::OFF), "{setting}");
        assert_eq!(setting.for_fsync(FSYNC_RAW_BYTES), Setting::Fixed(Compression::OFF), "{setting}");
    }
    assert_eq!(gzip_6.for_fsync(FSYNC_RAW_BYTES + 1), Setting::LZ4);
    assert_eq!(Setting::Auto.for_fsync(FSYNC_RAW_BYTES + 1), Setting::LZ4);
    assert_eq!(zle.for_fsync(FSYNC_RAW_BYTES + 1), zle);
    assert_eq!(Setting::LZ4.for_fsync(FSYNC_RAW_BYTES + 1), Setting::LZ4);
}

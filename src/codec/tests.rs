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
            let mut back = vec![0u8; data.len()];
            setting.codec.decompress(&out[..n], &mut back).unwrap();
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
            let mut back = vec![0u8; wrong];
            assert!(setting.codec.decompress(&out[..n], &mut back).is_err(), "{setting} len {wrong}");
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
            let mut back = vec![0u8; data.len()];
            let _ = setting.codec.decompress(&bad, &mut back);
            let _ = setting.codec.decompress(&bad[..i], &mut back);
        }
        let mut back = vec![0u8; data.len()];
        let _ = setting.codec.decompress(&pseudo_random(n, 11), &mut back);
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

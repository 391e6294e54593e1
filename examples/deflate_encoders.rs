//! Measures the raw-deflate encoders densefs can use, one core, record by record, for
//! bench/results/deflate-encoders.md: ISA-L levels 0..3, libdeflate 1..9 and zlib 1..9 (the C
//! library, through flate2), each stream also decoded by libdeflate, ISA-L and zlib.
//!
//!     cargo run --release --example deflate_encoders -- [--record 131072] [--bytes 33554432]
//!         [--repeat 3] [--only isal-1,zlib-1,...] NAME=FILE...
//!
//! Prints one JSON array (every row) on stdout and a Markdown table per file on stderr. MB/s are
//! bytes per second of this thread's CPU time (CLOCK_THREAD_CPUTIME_ID: one core, and time the
//! kernel gives other programs does not count), the best of up to `--repeat` passes (default 3;
//! passes stop after 2 s). A record that does not shrink counts at its own length in the ratio.

use std::time::{Duration, Instant};

use densefs::codec::deflate::{Decoder, Encoder};
use densefs::codec::Compression;

struct Stream {
    out: Vec<u8>,
    len: usize,
}

/// This thread's CPU time: other programs sharing the cores do not count against a codec.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn best_of(repeat: usize, mut f: impl FnMut()) -> Duration {
    let mut best = Duration::MAX;
    let start = Instant::now();
    for i in 0..repeat {
        let t = thread_cpu();
        f();
        best = best.min(thread_cpu() - t);
        if i > 0 && start.elapsed() > Duration::from_secs(2) {
            break;
        }
    }
    best
}

type Enc = Box<dyn Fn(&[u8], &mut [u8]) -> Option<usize>>;

fn encoders() -> Vec<(String, Enc)> {
    let mut v: Vec<(String, Enc)> = Vec::new();
    // For reference: the other formats densefs writes (decoded below by their own codec).
    for name in ["lz4", "zstd-1", "zstd-3"] {
        let c = Compression::parse(name).unwrap();
        v.push((name.to_string(), Box::new(move |s, d| c.codec.compress(s, d, c.level))));
    }
    for e in (0..=3).map(Encoder::Isal).chain((1..=9).map(Encoder::Libdeflate)) {
        v.push((e.to_string(), Box::new(move |s, d| e.compress(s, d))));
    }
    for l in 1..=9u32 {
        v.push((format!("zlib-{l}"), Box::new(move |s, d| zlib_compress(s, d, l))));
    }
    v
}

fn zlib_compress(src: &[u8], dst: &mut [u8], level: u32) -> Option<usize> {
    let mut c = flate2::Compress::new(flate2::Compression::new(level), false);
    match c.compress(src, dst, flate2::FlushCompress::Finish) {
        Ok(flate2::Status::StreamEnd) => Some(c.total_out() as usize),
        _ => None,
    }
}

fn zlib_decompress(src: &[u8], dst: &mut [u8]) -> bool {
    let mut d = flate2::Decompress::new(false);
    matches!(d.decompress(src, dst, flate2::FlushDecompress::Finish), Ok(flate2::Status::StreamEnd)) && d.total_out() as usize == dst.len()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut record, mut bytes, mut repeat, mut files, mut only) = (128 * 1024usize, 32usize << 20, 3usize, Vec::new(), None::<String>);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--record" => record = args.next().unwrap().parse().unwrap(),
            "--bytes" => bytes = args.next().unwrap().parse().unwrap(),
            "--repeat" => repeat = args.next().unwrap().parse().unwrap(),
            "--only" => only = args.next(),
            _ => files.push(a.split_once('=').map(|(n, f)| (n.to_string(), f.to_string())).expect("NAME=FILE")),
        }
    }
    let mut json = Vec::new();
    for (name, file) in files {
        let mut data = std::fs::read(&file).unwrap();
        data.truncate(bytes);
        let records: Vec<&[u8]> = data.chunks(record).collect();
        eprintln!("\n## {name}: {file}, {} bytes, {} records of {record}\n", data.len(), records.len());
        eprintln!("| encoder | ratio | compress MB/s | decode MB/s: libdeflate | ISA-L | zlib |");
        eprintln!("|---|---:|---:|---:|---:|---:|");
        let wanted = |n: &str| only.as_deref().is_none_or(|o| o.split(',').any(|p| n == p));
        for (enc_name, enc) in encoders().into_iter().filter(|(n, _)| wanted(n)) {
            let mut streams: Vec<Stream> =
                records.iter().map(|r| Stream { out: vec![0u8; r.len() + r.len() / 8 + 1024], len: 0 }).collect();
            let t_c = best_of(repeat, || {
                for (r, s) in records.iter().zip(streams.iter_mut()) {
                    s.len = enc(r, &mut s.out).expect("fits with room");
                }
            });
            // A record that does not shrink is stored raw by densefs: count its own length.
            let stored: usize = records.iter().zip(&streams).map(|(r, s)| s.len.min(r.len())).sum();
            let ratio = data.len() as f64 / stored as f64;
            let mut back = vec![0u8; record];
            let mut dec = |f: &dyn Fn(&[u8], &mut [u8]) -> bool| {
                best_of(repeat, || {
                    for (r, s) in records.iter().zip(&streams) {
                        assert!(f(&s.out[..s.len], &mut back[..r.len()]), "{enc_name}: decode failed");
                        assert!(back[..r.len()] == **r, "{enc_name}: decoded bytes differ");
                    }
                })
            };
            let mbs = |t: Duration| data.len() as f64 / t.as_secs_f64() / 1e6;
            if let Ok(other) = Compression::parse(&enc_name) {
                let t = dec(&|s, d| {
                    other.codec.decompress(s, d.len()).is_ok_and(|b| {
                        d.copy_from_slice(&b);
                        true
                    })
                });
                eprintln!("| {enc_name} | {ratio:.3} | {:.0} | {:.0} (own decoder) | | |", mbs(t_c), mbs(t));
                json.push(format!(
                    "{{\"data\":\"{name}\",\"encoder\":\"{enc_name}\",\"ratio\":{ratio:.4},\"compress_mbps\":{:.1},\"decompress_mbps\":{{\"own\":{:.1}}}}}",
                    mbs(t_c),
                    mbs(t)
                ));
                continue;
            }
            let t_ld = dec(&|s, d| Decoder::Libdeflate.decompress(s, d).is_ok());
            let t_is = dec(&|s, d| Decoder::Isal.decompress(s, d).is_ok());
            let t_z = dec(&|s, d| zlib_decompress(s, d));
            eprintln!("| {enc_name} | {ratio:.3} | {:.0} | {:.0} | {:.0} | {:.0} |", mbs(t_c), mbs(t_ld), mbs(t_is), mbs(t_z));
            json.push(format!(
                "{{\"data\":\"{name}\",\"encoder\":\"{enc_name}\",\"ratio\":{ratio:.4},\"compress_mbps\":{:.1},\"decompress_mbps\":{{\"libdeflate\":{:.1},\"isal\":{:.1},\"zlib\":{:.1}}}}}",
                mbs(t_c), mbs(t_ld), mbs(t_is), mbs(t_z)
            ));
        }
    }
    println!("[\n{}\n]", json.join(",\n"));
}

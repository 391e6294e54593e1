//! Many threads writing interleaved 4 KiB blocks of the same records (so every record is
//! read-modify-written concurrently), while readers check every block they see; at the end every
//! block must hold its owner's last version. This is the race that loses updates if a record's
//! buffer can change hands between loading it and modifying it.

mod common;

use common::{Dirs, Mount};
use rand::{Rng, SeedableRng};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const BLOCK: usize = 4096;
const WRITERS: usize = 4;
const BLOCKS: usize = 256; // 1 MiB file

fn block_bytes(block: usize, version: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(BLOCK);
    out.extend_from_slice(&(block as u32).to_le_bytes());
    out.extend_from_slice(&version.to_le_bytes());
    let fill = b"ACGTTGCA"[(block + version as usize) % 8];
    out.resize(BLOCK - 8, fill);
    out.extend_from_slice(&(version ^ 0xA5A5_A5A5).to_le_bytes());
    out.extend_from_slice(&(block as u32 ^ 0x5A5A_5A5A).to_le_bytes());
    out
}

fn check_block(block: usize, buf: &[u8]) -> Option<u32> {
    if buf.iter().all(|&b| b == 0) {
        return None;
    }
    let version = u32::from_le_bytes(buf[4..8].try_into().unwrap());
    assert!(buf == &block_bytes(block, version)[..], "block {block} is not any whole version of itself (v{version}?)");
    Some(version)
}

/// What a reader racing the writers may assert: a read can see a block half old, half new (the
/// kernel copies pages without excluding readers, on any file system), but never another
/// block's bytes.
fn check_racing_read(block: usize, buf: &[u8]) {
    let first = u32::from_le_bytes(buf[0..4].try_into().unwrap());
    let last = u32::from_le_bytes(buf[BLOCK - 4..].try_into().unwrap());
    assert!(first == 0 || first == block as u32, "block {block} starts with block {first}'s bytes");
    assert!(last == 0 || last == block as u32 ^ 0x5A5A_5A5A, "block {block} ends with foreign bytes");
}

fn run(options: &str, seed: u64) {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, options);
    let path = m.path("shared");
    OpenOptions::new().write(true).create(true).truncate(true).open(&path).unwrap().set_len((BLOCKS * BLOCK) as u64).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                let f = OpenOptions::new().read(true).open(&path).unwrap();
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (r + 100));
                let mut buf = vec![0u8; BLOCK];
                while !stop.load(Ordering::Relaxed) {
                    let block = rng.gen_range(0..BLOCKS);
                    f.read_exact_at(&mut buf, (block * BLOCK) as u64).unwrap();
                    check_racing_read(block, &buf);
                }
            })
        })
        .collect();
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let path = path.clone();
            std::thread::spawn(move || {
                let f = OpenOptions::new().read(true).write(true).open(&path).unwrap();
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ w as u64);
                let mine: Vec<usize> = (0..BLOCKS).filter(|b| b % WRITERS == w).collect();
                let mut last = vec![0u32; BLOCKS];
                for i in 0..1500u32 {
                    let block = mine[rng.gen_range(0..mine.len())];
                    last[block] = i + 1;
                    f.write_all_at(&block_bytes(block, i + 1), (block * BLOCK) as u64).unwrap();
                    if rng.gen_ratio(1, 200) {
                        f.sync_data().unwrap();
                    }
                }
                last
            })
        })
        .collect();
    let mut last = vec![0u32; BLOCKS];
    for (w, h) in writers.into_iter().enumerate() {
        for (b, v) in h.join().unwrap().into_iter().enumerate() {
            if b % WRITERS == w {
                last[b] = v;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    let verify = |m: &Mount| {
        let data = std::fs::read(m.path("shared")).unwrap();
        for (block, &v) in last.iter().enumerate() {
            let got = check_block(block, &data[block * BLOCK..(block + 1) * BLOCK]);
            assert_eq!(got.unwrap_or(0), v, "block {block}: lost update ({options}, seed {seed})");
        }
    };
    verify(&m);
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    verify(&m);
    m.unmount();
}

#[test]
fn concurrent_partial_writes_to_shared_records_lose_nothing() {
    let seed = std::env::var("DENSEFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64);
    eprintln!("concurrency seed {seed}");
    run("compression=lz4,recordsize=16K", seed);
    run("compression=zstd-1,recordsize=128K", seed + 1);
}

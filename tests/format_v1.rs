//! Frozen containers of format version 1 (tests/fixtures/v1, made by `make_fixtures` below with
//! densefs 0.1) must read back byte for byte forever. If this test fails, the format changed:
//! bump FORMAT_VERSION and keep reading version 1.

mod common;

use common::{compressible, random_bytes, Dirs, Mount};
use std::fs;
use std::path::Path;

/// (file name, mount options it was written with, contents)
fn fixture_files() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let mut sparse = vec![0u8; 200_000];
    sparse[150_000..150_100].copy_from_slice(&compressible(100, 7));
    vec![
        ("lz4-4k", "compression=lz4,recordsize=4K", compressible(40_000, 1)),
        ("gzip9-8k-xxh3", "compression=gzip-9,recordsize=8K,checksum=xxh3", compressible(30_000, 2)),
        ("zstd3-16k", "compression=zstd-3,recordsize=16K", compressible(50_000, 3)),
        ("zstdfast5-4k", "compression=zstd-fast-5,recordsize=4K", compressible(9_000, 4)),
        ("lzjb-4k", "compression=lzjb,recordsize=4K", compressible(12_000, 5)),
        ("zle-4k", "compression=zle,recordsize=4K", sparse.clone()),
        ("off-4k", "compression=off,recordsize=4K", compressible(5_000, 6)),
        ("raw-random-4k", "compression=gzip-1,recordsize=4K", random_bytes(10_000, 8)),
        ("sparse-zstd-64k", "compression=zstd-1,recordsize=64K", sparse),
        ("empty", "compression=lz4", Vec::new()),
    ]
}

fn copy_dir(from: &Path, to: &Path) {
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn version_1_fixtures_read_back_exactly() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1");
    let d = Dirs::new();
    copy_dir(&fixtures, &d.lower);
    let m = Mount::new(&d.lower, &d.mnt, "");
    for (name, _, data) in fixture_files() {
        assert_eq!(fs::read(m.path(name)).unwrap(), data, "{name}");
        let raw = fs::read(d.lower.join(name)).unwrap();
        assert!(&raw[..8] == b"DENSEFS\0" || &raw[64..72] == b"DENSEFS\0", "{name} is a container");
    }
    m.unmount();
}

/// Regenerates the fixtures: `cargo test --test format_v1 -- --ignored make_fixtures`.
#[test]
#[ignore]
fn make_fixtures() {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1");
    fs::create_dir_all(&out).unwrap();
    for (name, options, data) in fixture_files() {
        let d = Dirs::new();
        let m = Mount::new(&d.lower, &d.mnt, options);
        fs::write(m.path(name), &data).unwrap();
        m.unmount();
        fs::copy(d.lower.join(name), out.join(name)).unwrap();
    }
}

//! Frozen containers of every format version must read back byte for byte forever, and reading
//! them must not change a byte of them (docs/FORMAT.md, "Version history"):
//! - tests/fixtures/v1-first: version 1 as the first densefs wrote it (header copy B at 512);
//! - tests/fixtures/v1: version 1 after the inline area moved copy B to 64 (epoch fields zero);
//! - tests/fixtures/v2: version 2, made by `make_fixtures` below.
//!
//! If this test fails, the format changed: bump FORMAT_VERSION, keep reading every version, and
//! freeze a new set.

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
fn fixtures_of_every_version_read_back_exactly_and_stay_unchanged() {
    for set in ["v1-first", "v1", "v2", "v3"] {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(set);
        let d = Dirs::new();
        copy_dir(&fixtures, &d.lower);
        let m = Mount::new(&d.lower, &d.mnt, "");
        for (name, _, data) in fixture_files() {
            assert_eq!(fs::read(m.path(name)).unwrap(), data, "{set}/{name}");
            let raw = fs::read(d.lower.join(name)).unwrap();
            // Since version 2 an empty file is an empty lower file.
            let empty = data.is_empty() && raw.is_empty();
            assert!(empty || raw.windows(8).take(520).any(|w| w == b"DENSEFS\0"), "{set}/{name} is a container");
        }
        m.unmount();
        for (name, _, _) in fixture_files() {
            assert!(fs::read(d.lower.join(name)).unwrap() == fs::read(fixtures.join(name)).unwrap(), "reading {set}/{name} changed it");
        }
    }
}

/// Makes the fixtures of the current version (once per version; never regenerate a frozen set):
/// `cargo test --test format_v1 -- --ignored make_fixtures`.
#[test]
#[ignore]
fn make_fixtures() {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/v{}", densefs::format::FORMAT_VERSION));
    fs::create_dir_all(&out).unwrap();
    for (name, options, data) in fixture_files() {
        let d = Dirs::new();
        let m = Mount::new(&d.lower, &d.mnt, options);
        fs::write(m.path(name), &data).unwrap();
        m.unmount();
        fs::copy(d.lower.join(name), out.join(name)).unwrap();
    }
}

//! Frozen containers of every format version must read back byte for byte forever, and reading
//! them must not change a byte of them (docs/FORMAT.md, "Version history"):
//! - tests/fixtures/v1-first: version 1 as the first densefs wrote it (header copy B at 512);
//! - tests/fixtures/v1: version 1 after the inline area moved copy B to 64 (epoch fields zero);
//! - tests/fixtures/v2 to v6: versions 2 to 6, made by `make_fixtures` below.
//!
//! Files of versions 1 to 3 stay writable, in version 3's layout (each copy in its record's
//! slot), files of version 4 in version 4's (tables at version 3's offsets), and files of
//! version 5 become version 6 (the same layout): `files_of_earlier_versions_take_writes_and_keep_their_layout`.
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

fn fixtures(set: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(set)
}

/// A lower directory holding a copy of the fixture set `set` (`v1`, ... `v6`).
fn lower_with_fixtures(set: &str) -> Dirs {
    let d = Dirs::new();
    for e in fs::read_dir(fixtures(set)).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), d.lower.join(e.file_name())).unwrap();
    }
    d
}

#[test]
fn fixtures_of_every_version_read_back_exactly_and_stay_unchanged() {
    for set in ["v1-first", "v1", "v2", "v3", "v4", "v5", "v6"] {
        let d = lower_with_fixtures(set);
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
            assert!(
                fs::read(d.lower.join(name)).unwrap() == fs::read(fixtures(set).join(name)).unwrap(),
                "reading {set}/{name} changed it"
            );
        }
    }
}

/// The format version a lower file's newest header copy records.
fn header_version(lower_file: &Path) -> u16 {
    let header = common::current_header(lower_file);
    u16::from_le_bytes([header[8], header[9]])
}

fn has_size_hint(lower_file: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(lower_file.as_os_str().as_bytes()).unwrap();
    let name = std::ffi::CString::new(densefs::format::hints::SIZE_HINT_XATTR).unwrap();
    // SAFETY: both strings are NUL-terminated; a null buffer of size 0 asks for the length.
    unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) > 0 }
}

#[test]
fn files_of_earlier_versions_take_writes_and_keep_their_layout() {
    const CURRENT: u16 = densefs::format::FORMAT_VERSION;
    for version in [3u16, 4, 5] {
        // Version 6 is version 5's layout: a header write makes a file of version 5 version 6.
        let written_as = if version == 5 { CURRENT } else { version };
        let d = lower_with_fixtures(&format!("v{version}"));
        let m = Mount::new(&d.lower, &d.mnt, "");
        let mut expected = Vec::new();
        for (name, _, data) in fixture_files() {
            let mut data = data;
            if data.is_empty() {
                continue;
            }
            // Overwrite the middle, grow past the end (into later groups, whose tables lie
            // where the file's version puts them), then cut back inside the last record.
            let mid = data.len() / 2;
            let patch = compressible(3_000, 9);
            use std::os::unix::fs::FileExt;
            let f = fs::OpenOptions::new().write(true).open(m.path(name)).unwrap();
            f.write_all_at(&patch, mid as u64).unwrap();
            data.splice(mid..(mid + patch.len()).min(data.len()), patch.iter().copied());
            let tail = random_bytes(300_000, 10);
            f.write_all_at(&tail, data.len() as u64).unwrap();
            data.extend_from_slice(&tail);
            let cut = data.len() - 7_000;
            f.set_len(cut as u64).unwrap();
            data.truncate(cut);
            f.sync_all().unwrap();
            expected.push((name, data));
        }
        m.unmount();
        let m = Mount::new(&d.lower, &d.mnt, "");
        for (name, data) in &expected {
            assert!(fs::read(m.path(name)).unwrap() == *data, "v{version}/{name}");
        }
        m.unmount();
        for (name, _) in &expected {
            assert_eq!(header_version(&d.lower.join(name)), written_as, "v{version}/{name} keeps version {version}'s layout");
            // A densefs reading versions 3 and 4 writes those files and knows no size hints:
            // only files of the current version get one (docs/FORMAT.md, "Size hints and runs").
            assert_eq!(has_size_hint(&d.lower.join(name)), written_as == CURRENT, "v{version}/{name}'s size hint");
        }
        // A new file is of the current version.
        let m = Mount::new(&d.lower, &d.mnt, "");
        fs::write(m.path("new"), compressible(50_000, 11)).unwrap();
        m.unmount();
        assert_eq!(header_version(&d.lower.join("new")), CURRENT);
    }
}

/// `densefs recompress` moves a file of an earlier format into the current one (a new container
/// renamed over it), keeping its bytes; a format-4 file it cannot move is re-encoded in place.
#[test]
fn recompress_moves_files_of_versions_3_and_4_to_the_current_version() {
    for version in [3u16, 4] {
        let d = lower_with_fixtures(&format!("v{version}"));
        let (name, options, data) = fixture_files().into_iter().find(|f| f.0 == "zle-4k").unwrap();
        let m = Mount::new(&d.lower, &d.mnt, options);
        let out = std::process::Command::new(common::BIN).arg("recompress").arg(m.path(name)).output().unwrap();
        assert!(out.status.success(), "recompress: {}", String::from_utf8_lossy(&out.stderr));
        assert!(fs::read(m.path(name)).unwrap() == data, "v{version}/{name} after recompress");
        m.unmount();
        assert_eq!(header_version(&d.lower.join(name)), densefs::format::FORMAT_VERSION, "v{version}/{name} recompressed");
        let m = Mount::new(&d.lower, &d.mnt, "");
        assert!(fs::read(m.path(name)).unwrap() == data, "v{version}/{name} after a remount");
        m.unmount();
    }
    // A format-4 file held open is re-encoded where it is, and stays format 4.
    let d = lower_with_fixtures("v4");
    let (name, options, data) = fixture_files().into_iter().find(|f| f.0 == "zle-4k").unwrap();
    let m = Mount::new(&d.lower, &d.mnt, options);
    let held = fs::File::open(m.path(name)).unwrap();
    let out = std::process::Command::new(common::BIN).arg("recompress").arg(m.path(name)).output().unwrap();
    assert!(out.status.success(), "recompress of an open v4 file: {}", String::from_utf8_lossy(&out.stderr));
    drop(held);
    assert!(fs::read(m.path(name)).unwrap() == data);
    m.unmount();
    assert_eq!(header_version(&d.lower.join(name)), 4, "an open v4 file stays v4");
}

/// Runs of data on a lower file (between holes), by SEEK_DATA / SEEK_HOLE.
fn data_runs(path: &Path) -> usize {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(path).unwrap();
    let (fd, len) = (f.as_raw_fd(), f.metadata().unwrap().len() as i64);
    let (mut off, mut runs) = (0i64, 0);
    while off < len {
        // SAFETY: lseek on a descriptor open for the call.
        let data = unsafe { libc::lseek(fd, off, libc::SEEK_DATA) };
        if data < 0 {
            break;
        }
        // SAFETY: as above.
        off = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        runs += 1;
    }
    runs
}

/// Formats 4 and 5 pack the copies of a file written in order one after another, so the lower
/// file system reads them back as one stream (bench/results/layout-2026-11-26); version 3 left
/// a hole after each record's copy. Format 5's tables lie among the copies, so the lower file
/// is about as long as what it stores (format 4's tables reached twice the logical size).
#[test]
fn a_file_written_in_order_lies_packed_on_the_lower_file() {
    use std::os::unix::fs::MetadataExt;
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4,recordsize=128K");
    let data = compressible(10 << 20, 12);
    fs::write(m.path("packed"), &data).unwrap();
    m.unmount();
    let lower = d.lower.join("packed");
    assert_eq!(header_version(&lower), densefs::format::FORMAT_VERSION);
    // 80 records in 3 groups: one run of data (block 0, the copies and the tables of groups 1
    // and 2 among them), split only where a copy that does not fit before a table block goes
    // past it (a hole of less than a record) and at the table blocks of groups the file does
    // not have (holes). Version 3 made a run per record.
    let meta = fs::metadata(&lower).unwrap();
    let (lower_len, allocated) = (meta.len(), meta.blocks() * 512);
    assert!(lower_len < data.len() as u64 * 3 / 4, "lower file of {lower_len} bytes for {} compressible ones", data.len());
    let tables_crossed = lower_len / ((8 << 17) + 4096);
    assert!(allocated + tables_crossed * (128 << 10) >= lower_len, "{allocated} bytes allocated of {lower_len}");
    let runs = data_runs(&lower);
    assert!(runs as u64 <= 1 + tables_crossed, "{runs} runs of data on the lower file");
    // Rewritten in the middle: the new copies go elsewhere, the old places are freed.
    let m = Mount::new(&d.lower, &d.mnt, "");
    use std::os::unix::fs::FileExt;
    let f = fs::OpenOptions::new().write(true).open(m.path("packed")).unwrap();
    let mut expected = data.clone();
    let patch = compressible(1 << 20, 13);
    f.write_all_at(&patch, 3 << 20).unwrap();
    expected[3 << 20..4 << 20].copy_from_slice(&patch);
    f.sync_all().unwrap();
    drop(f);
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert!(fs::read(m.path("packed")).unwrap() == expected);
    // Cut to a third: the lower file shrinks with it once the cut is synced.
    let f = fs::OpenOptions::new().write(true).open(m.path("packed")).unwrap();
    f.set_len(3 << 20).unwrap();
    f.sync_all().unwrap();
    drop(f);
    m.unmount();
    let lower_len = fs::metadata(&lower).unwrap().len();
    assert!(lower_len < 3 << 20, "lower file of {lower_len} bytes after the cut");
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert!(fs::read(m.path("packed")).unwrap() == expected[..3 << 20]);
    m.unmount();
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

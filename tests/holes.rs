//! SEEK_DATA / SEEK_HOLE against the lower's own file system: the same writes, punches and
//! fsyncs in a plain directory beside the lower one and through the mount, the data map read
//! back with lseek (while records are still in memory, and after they land).

mod common;

use common::{random_bytes, Dirs, Mount};
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

const K: u64 = 1024;
const RECORD: u64 = 128 * K;

fn seek(f: &File, offset: u64, whence: i32) -> Result<u64, i32> {
    // SAFETY: lseek on a descriptor this File owns.
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset as i64, whence) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(r as u64)
    }
}

/// The file's data extents as SEEK_DATA and SEEK_HOLE walk them.
fn data_map(f: &File) -> Vec<(u64, u64)> {
    let size = f.metadata().unwrap().len();
    let mut map = Vec::new();
    let mut offset = 0;
    while offset < size {
        let data = match seek(f, offset, libc::SEEK_DATA) {
            Ok(data) => data,
            Err(libc::ENXIO) => break,
            Err(e) => panic!("SEEK_DATA {offset}: errno {e}"),
        };
        let hole = seek(f, data, libc::SEEK_HOLE).unwrap();
        assert!(hole > data && hole <= size, "SEEK_DATA {offset} = {data}, SEEK_HOLE {data} = {hole}, size {size}");
        map.push((data, hole));
        offset = hole;
    }
    map
}

/// ext4's map as densefs keeps holes: whole records (a record with any data in it is data).
fn by_records(map: &[(u64, u64)], size: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &(data, hole) in map {
        let (start, end) = (data / RECORD * RECORD, hole.div_ceil(RECORD).saturating_mul(RECORD).min(size));
        match out.last_mut() {
            Some(last) if last.1 >= start => last.1 = last.1.max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

enum Op {
    Write(u64, u64),
    Punch(u64, u64),
    Zero(u64, u64),
    Fsync,
}

fn fallocate(f: &File, mode: i32, offset: u64, len: u64) {
    // SAFETY: fallocate on a descriptor this File owns.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) };
    assert_eq!(r, 0, "fallocate({mode:#x}, {offset}, {len}): {}", std::io::Error::last_os_error());
}

/// Runs `ops` on a new file `name` in `dir`; the file stays open (its records in memory).
fn run(dir: &Path, name: &str, ops: &[Op]) -> File {
    let f = OpenOptions::new().read(true).write(true).create_new(true).open(dir.join(name)).unwrap();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Write(offset, len) => f.write_all_at(&random_bytes(len as usize, i as u64 + 1), offset).unwrap(),
            Op::Punch(offset, len) => fallocate(&f, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, len),
            Op::Zero(offset, len) => fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, offset, len),
            Op::Fsync => f.sync_all().unwrap(),
        }
    }
    f
}

/// A record all zeros in memory (punched, not yet landed) is a hole, as it will be stored as
/// one: SEEK_HOLE and SEEK_DATA answer as ext4 does before the fsync as after it. They counted
/// every record in memory as data: `pwrite 0 384k; fpunch 128k 128k` gave a hole at 384k and
/// data at 128k until the next fsync.
#[test]
fn holes_punched_in_records_not_yet_landed_are_holes() {
    use Op::*;
    let d = Dirs::new();
    let reference = d.root.path().join("ext4");
    fs::create_dir(&reference).unwrap();
    let m = Mount::new(&d.lower, &d.mnt, "recordsize=128K");
    let patterns: Vec<(&str, Vec<Op>)> = vec![
        ("punch one record", vec![Write(0, 384 * K), Punch(128 * K, 128 * K)]),
        ("punch across records", vec![Write(0, 640 * K), Punch(100 * K, 300 * K)]),
        ("punch everything", vec![Write(0, 256 * K), Punch(0, 256 * K)]),
        ("punch the tail", vec![Write(0, 300 * K), Punch(256 * K, 44 * K)]),
        ("punch, then write in the hole", vec![Write(0, 512 * K), Punch(0, 512 * K), Write(200 * K, 4 * K)]),
        ("partly written records", vec![Write(0, 64 * K), Write(300 * K, 12 * K), Write(520 * K, 8 * K)]),
        ("landed, then punched", vec![Write(0, 512 * K), Fsync, Punch(128 * K, 256 * K)]),
        ("punched, then landed", vec![Write(0, 384 * K), Punch(128 * K, 128 * K), Fsync]),
        ("landed partly", vec![Write(0, 256 * K), Fsync, Write(256 * K, 256 * K), Punch(0, 128 * K), Punch(384 * K, 128 * K)]),
    ];
    let mut wrong = Vec::new();
    for (i, (what, ops)) in patterns.iter().enumerate() {
        let name = format!("f{i}");
        let (ext4, dense) = (run(&reference, &name, ops), run(&d.mnt, &name, ops));
        let size = ext4.metadata().unwrap().len();
        assert_eq!(dense.metadata().unwrap().len(), size, "{what}: size");
        let want = by_records(&data_map(&ext4), size);
        let got = data_map(&dense);
        if got != want {
            wrong.push(format!("{what}: ext4 {want:?} (by records; exactly {:?}), densefs {got:?}", data_map(&ext4)));
        }
        // And once landed: the same.
        dense.sync_all().unwrap();
        let landed = data_map(&dense);
        if landed != want {
            wrong.push(format!("{what}, after fsync: ext4 {want:?}, densefs {landed:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // ZERO_RANGE leaves ext4 an allocated (unwritten) extent, which SEEK_DATA counts as data;
    // densefs stores a record of zeros as a hole however it came to be zeros. It says so
    // before the records land as after.
    let f = run(&d.mnt, "zeroed", &[Write(0, 512 * K), Zero(128 * K, 256 * K)]);
    let in_memory = data_map(&f);
    f.sync_all().unwrap();
    assert_eq!(in_memory, data_map(&f), "ZERO_RANGE: in memory, then landed");
    assert_eq!(in_memory, [(0, 128 * K), (384 * K, 512 * K)]);
    drop(f);
    // The issue's own case, as xfs_io's `seek -h 0` and `seek -d 128k` ask it.
    let f = run(&d.mnt, "issue", &[Write(0, 384 * K), Punch(128 * K, 128 * K)]);
    let e = run(&reference, "issue", &[Write(0, 384 * K), Punch(128 * K, 128 * K)]);
    for (whence, offset) in [(libc::SEEK_HOLE, 0), (libc::SEEK_DATA, 128 * K)] {
        assert_eq!(seek(&f, offset, whence), seek(&e, offset, whence), "whence {whence} from {offset}");
    }
    drop((f, e));
    m.unmount();
}

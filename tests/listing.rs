//! Directory listings (READDIRPLUS: each entry comes with its attributes, and counts as one
//! kernel lookup the kernel will forget): `ls -l` of big directories shows logical sizes and
//! the right types and links, entries created, deleted and renamed during a listing behave as
//! POSIX allows, hard links and remounts agree, and the daemon's inode table returns to the
//! root alone once the kernel drops its caches (no lookup counted that the kernel will not
//! forget, none missing). A closed file's size stays right across writes, truncates and
//! listings (the daemon keeps what a header said while the lower file is unchanged). Listings
//! read in turns or seeking back see every name once (the daemon keeps no open directory).

mod common;

use common::{census, compressible, requests, wait_until, Dirs, Mount};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileTypeExt, MetadataExt};
use std::path::Path;

fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// The kernel's dentry and inode caches belong to the whole machine: a test here that drops them
/// (to see the daemon's table return to the root) makes the kernel forget another test's entries
/// in the middle of its listing, and the other's lookup counts go wrong. The tests of this file
/// take turns.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static KERNEL_CACHES: std::sync::Mutex<()> = std::sync::Mutex::new(());
    KERNEL_CACHES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes the kernel forget every dentry and inode it does not use (it sends FORGET for each).
fn drop_kernel_caches() {
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
}

/// Once the kernel has dropped its caches, the daemon holds the root alone (and one descriptor).
fn assert_table_returns_to_root(mnt: &Path, when: &str) {
    wait_until(&format!("the inode table to hold the root alone {when}"), || {
        drop_kernel_caches();
        census(mnt) == (1, 1)
    });
}

/// The size the daemon reports now (statx with AT_STATX_FORCE_SYNC: no cached attributes).
fn fresh_size(path: &Path) -> u64 {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::statx(libc::AT_FDCWD, c.as_ptr(), libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_FORCE_SYNC, libc::STATX_SIZE, &mut stx)
    };
    assert_eq!(r, 0, "statx {}: {}", path.display(), std::io::Error::last_os_error());
    stx.stx_size
}

/// What `ls -l` shows of a directory: name → (kind letter, size, nlink, ino), read with
/// readdir and lstat of each entry, as ls does.
fn long_listing(dir: &Path) -> BTreeMap<String, (char, u64, u64, u64)> {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        let m = fs::symlink_metadata(entry.path()).unwrap();
        let t = m.file_type();
        let kind = if t.is_dir() {
            'd'
        } else if t.is_symlink() {
            'l'
        } else if t.is_fifo() {
            'p'
        } else {
            '-'
        };
        assert_eq!(entry.ino(), m.ino(), "{name}: readdir's inode number and lstat's differ");
        assert!(out.insert(name, (kind, m.len(), m.nlink(), m.ino())).is_none(), "a name listed twice");
    }
    out
}

/// A directory of `count` files of varied sizes and name lengths (so that listings span many
/// replies), with a subdirectory, a symlink, a FIFO and an empty file. Returns name → size.
fn make_big_dir(dir: &Path, count: usize) -> BTreeMap<String, u64> {
    fs::create_dir(dir).unwrap();
    let mut sizes = BTreeMap::new();
    for i in 0..count {
        let name = format!("f{i:05}-{}", "n".repeat(i % 37));
        let len = if i % 50 == 0 { 300_000 } else { (i * 37) % 5000 + 1 };
        fs::write(dir.join(&name), compressible(len, i as u64)).unwrap();
        sizes.insert(name, len as u64);
    }
    fs::write(dir.join("empty"), b"").unwrap();
    sizes.insert("empty".into(), 0);
    fs::create_dir(dir.join("sub")).unwrap();
    std::os::unix::fs::symlink("f00001-n", dir.join("link")).unwrap();
    let fifo = CString::new(dir.join("fifo").as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    sizes
}

#[test]
fn long_listings_show_logical_sizes_and_lookups_balance() {
    let _turn = one_at_a_time();
    if !is_root() {
        eprintln!("skipped: dropping the kernel's caches needs root");
        return;
    }
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let sizes = make_big_dir(&m.path("big"), 2500);
    m.unmount();

    // Cold: a new daemon, a kernel that knows nothing.
    let m = Mount::new(&d.lower, &d.mnt, "");
    let check = |listing: &BTreeMap<String, (char, u64, u64, u64)>, when: &str| {
        assert_eq!(listing.len(), sizes.len() + 3, "{when}: entries listed");
        for (name, len) in &sizes {
            let (kind, size, nlink, _) = listing[name];
            assert_eq!((kind, size, nlink), ('-', *len, 1), "{when}: {name}");
        }
        assert_eq!(listing["sub"].0, 'd');
        assert_eq!(listing["sub"].2, 2);
        assert_eq!(listing["link"], ('l', "f00001-n".len() as u64, 1, listing["link"].3));
        assert_eq!(listing["fifo"].0, 'p');
    };
    // The lower files are containers: their own sizes are not the logical ones.
    let big_lower = fs::metadata(d.lower.join("big/f00000-")).unwrap().len();
    assert_ne!(big_lower, 300_000, "the lower file should be a compressed container");

    let first = long_listing(&m.path("big"));
    check(&first, "cold");
    let (known, _) = census(&m.mnt);
    assert!(known >= sizes.len() as u64, "the listing registered its entries ({known} known)");
    // Listed again while the kernel still holds every entry: each reply adds one more lookup
    // to inodes the kernel has, which it forgets together later.
    check(&long_listing(&m.path("big")), "warm");
    assert_table_returns_to_root(&m.mnt, "after two listings");

    // The kernel forgot everything: listing again registers afresh, with the same answers.
    let again = long_listing(&m.path("big"));
    check(&again, "after drop_caches");
    assert_eq!(first, again, "the same inode numbers and attributes");
    // Contents read through names the listing brought in.
    for (name, len) in sizes.iter().step_by(97) {
        if let Some(i) = name.strip_prefix('f').and_then(|n| n[..5].parse::<u64>().ok()) {
            assert_eq!(fs::read(m.path("big").join(name)).unwrap(), compressible(*len as usize, i), "{name}");
        }
    }
    assert_table_returns_to_root(&m.mnt, "after reading");
    m.unmount();

    // A remount lists the same.
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(long_listing(&m.path("big")), first, "after a remount");
    m.unmount();
}

/// Reads every file under `dir` as `find -type f | xargs cat` does: each directory listed
/// whole first (names and types, no stat), then each file opened by its path.
fn walk_and_read(dir: &Path, read: &mut u64) {
    let entries: Vec<_> = fs::read_dir(dir).unwrap().map(Result::unwrap).collect();
    for entry in entries {
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            walk_and_read(&entry.path(), read);
        } else if kind.is_file() {
            *read += fs::read(entry.path()).unwrap().len() as u64;
        }
    }
}

#[test]
fn a_cold_walk_that_reads_every_file_asks_no_lookup() {
    // Every listing chunk carries its entries' attributes (READDIRPLUS, not the kernel's AUTO
    // heuristic, which falls back to plain READDIR when nobody stats the entries): a `find`
    // then `cat` of a cold tree opens every file through a name the listing brought in,
    // where before each second name cost a LOOKUP.
    let _turn = one_at_a_time();
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    // Directories of more entries than one listing chunk holds.
    let mut written = 0;
    for (dir, files) in [("t", 1200), ("t/a", 400), ("t/a/b", 400)] {
        fs::create_dir_all(m.path(dir)).unwrap();
        for i in 0..files {
            let data = compressible(1 + (i * 131) % 9000, i as u64);
            fs::write(m.path(&format!("{dir}/file-{i:05}")), &data).unwrap();
            written += data.len() as u64;
        }
    }
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let mut read = 0;
    walk_and_read(&m.path("t"), &mut read);
    assert_eq!(read, written);
    // The one lookup allowed: "t" itself, which the walk names.
    let lookups = requests(&m.mnt, "lookup");
    assert!(lookups <= 1, "{lookups} LOOKUPs for a walk of 2000 files");
    assert_eq!(requests(&m.mnt, "open"), 2000);
}

#[test]
fn entries_created_deleted_and_renamed_during_a_listing() {
    let _turn = one_at_a_time();
    if !is_root() {
        eprintln!("skipped: dropping the kernel's caches needs root");
        return;
    }
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let dir = m.path("busy");
    let count = 3000;
    let sizes = make_big_dir(&dir, count);
    drop_kernel_caches();

    let mut listing = fs::read_dir(&dir).unwrap();
    let mut seen = vec![listing.next().unwrap().unwrap().file_name().to_string_lossy().into_owned()];
    // While the listing is under way: remove a fifth, rename a fifth, grow a fifth, add 500.
    let mut expected_sizes = BTreeMap::new();
    let mut gone = Vec::new();
    for (i, (name, len)) in sizes.iter().enumerate() {
        match i % 5 {
            1 | 2 => {
                if i % 5 == 1 {
                    fs::remove_file(dir.join(name)).unwrap();
                } else {
                    fs::rename(dir.join(name), dir.join(format!("renamed-{name}"))).unwrap();
                }
                gone.push(name.clone());
            }
            3 => {
                let mut f = OpenOptions::new().append(true).open(dir.join(name)).unwrap();
                f.write_all(&compressible(1000, 7)).unwrap();
                expected_sizes.insert(name.clone(), len + 1000);
            }
            _ => {
                expected_sizes.insert(name.clone(), *len);
            }
        }
    }
    for i in 0..500 {
        fs::write(dir.join(format!("new-{i}")), vec![b'x'; i]).unwrap();
    }
    for entry in listing {
        seen.push(entry.unwrap().file_name().to_string_lossy().into_owned());
    }

    let unique: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no entry listed twice");
    // A name removed or renamed away during the listing is gone: the listing's attributes never
    // bring it back into the kernel's cache (say, from a file opened ahead of its turn).
    for name in &gone {
        assert!(fs::symlink_metadata(dir.join(name)).is_err(), "{name} was removed but still stats");
    }
    for name in expected_sizes.keys() {
        assert!(unique.contains(name), "{name} existed throughout but was not listed");
    }
    // Whatever was listed and still exists shows its size now, through the attributes the
    // listing brought (lstat within the entry timeout) and afresh.
    for name in &seen {
        let path = dir.join(name);
        let Ok(m) = fs::symlink_metadata(&path) else { continue };
        if !m.is_file() {
            continue;
        }
        let real = fs::read(&path).unwrap().len() as u64;
        assert_eq!(m.len(), real, "{name}: listed size");
        assert_eq!(fresh_size(&path), real, "{name}: fresh size");
        if let Some(len) = expected_sizes.get(name) {
            assert_eq!(real, *len, "{name}: contents");
        }
    }
    assert_table_returns_to_root(&m.mnt, "after a listing that raced with changes");
    m.unmount();
}

#[test]
fn hard_links_listed_in_two_directories() {
    let _turn = one_at_a_time();
    if !is_root() {
        eprintln!("skipped: dropping the kernel's caches needs root");
        return;
    }
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    fs::create_dir(m.path("a")).unwrap();
    fs::create_dir(m.path("b")).unwrap();
    let data = compressible(200_000, 5);
    fs::write(m.path("a/one"), &data).unwrap();
    fs::hard_link(m.path("a/one"), m.path("a/two")).unwrap();
    fs::hard_link(m.path("a/one"), m.path("b/three")).unwrap();
    m.unmount();

    let m = Mount::new(&d.lower, &d.mnt, "");
    let a = long_listing(&m.path("a"));
    let b = long_listing(&m.path("b"));
    let ino = a["one"].3;
    assert_eq!(a["one"], ('-', 200_000, 3, ino));
    assert_eq!(a["two"], ('-', 200_000, 3, ino));
    assert_eq!(b["three"], ('-', 200_000, 3, ino));
    assert_eq!(census(&m.mnt).0, 4, "root, a, b and the one file");
    assert_table_returns_to_root(&m.mnt, "after listing hard links");

    long_listing(&m.path("b"));
    fs::remove_file(m.path("a/one")).unwrap();
    let b = long_listing(&m.path("b"));
    assert_eq!(b["three"], ('-', 200_000, 2, ino));
    assert_eq!(fs::read(m.path("b/three")).unwrap(), data);
    assert_eq!(long_listing(&m.path("a"))["two"], ('-', 200_000, 2, ino));
    assert_table_returns_to_root(&m.mnt, "after unlinking one of the links");
    m.unmount();
}

#[test]
fn a_closed_files_size_follows_writes_and_truncates() {
    let _turn = one_at_a_time();
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let path = m.path("f");
    let listed = |m: &Mount| long_listing(&m.mnt)["f"].1;
    // The daemon keeps a header's answer once the lower ctime is a second old: each step
    // waits for that, so its first look fills the cache and the change must be noticed.
    let settle = || std::thread::sleep(std::time::Duration::from_millis(1100));
    fs::write(&path, compressible(300_000, 1)).unwrap();
    settle();
    assert_eq!((fresh_size(&path), listed(&m)), (300_000, 300_000));
    fresh_size(&path); // a second look: served from what the daemon kept

    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(b"more").unwrap();
    drop(f);
    assert_eq!((fresh_size(&path), listed(&m)), (300_004, 300_004), "after an append");
    settle();
    assert_eq!(fresh_size(&path), 300_004);

    // Inside the last record: the lower file may keep its size while the header changes.
    OpenOptions::new().write(true).open(&path).unwrap().set_len(299_999).unwrap();
    assert_eq!((fresh_size(&path), listed(&m)), (299_999, 299_999), "after ftruncate");
    settle();
    assert_eq!(fresh_size(&path), 299_999);

    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::truncate(c.as_ptr(), 299_998) }, 0);
    assert_eq!((fresh_size(&path), listed(&m)), (299_998, 299_998), "after truncate(2)");
    settle();
    assert_eq!(fresh_size(&path), 299_998);

    fs::write(&path, b"short").unwrap();
    assert_eq!((fresh_size(&path), listed(&m)), (5, 5), "after rewriting it");
    m.unmount();

    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!((fresh_size(&m.path("f")), listed(&m)), (5, 5), "after a remount");
    assert_eq!(fs::read(m.path("f")).unwrap(), b"short");
    m.unmount();
}

fn lgetxattr(path: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    let len = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if len < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    buf.truncate(len as usize);
    Ok(buf)
}

fn lsetxattr(path: &Path, name: &str, value: &[u8]) -> Result<(), i32> {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let r = unsafe { libc::lsetxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if r < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    Ok(())
}

fn lremovexattr(path: &Path, name: &str) -> Result<(), i32> {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    if unsafe { libc::lremovexattr(p.as_ptr(), n.as_ptr()) } < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    Ok(())
}

fn llistxattr(path: &Path) -> Vec<String> {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 4096];
    let len = unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(len >= 0, "llistxattr {}: {}", path.display(), std::io::Error::last_os_error());
    buf[..len as usize].split(|&b| b == 0).filter(|n| !n.is_empty()).map(|n| String::from_utf8_lossy(n).into_owned()).collect()
}

/// Files met in a listing keep a read-only lower descriptor, which their xattr calls use (no
/// /proc path): values, lists, creation and removal reach the lower file as before, and
/// densefs's own names stay hidden.
#[test]
fn xattrs_of_files_met_in_a_listing() {
    let _turn = one_at_a_time();
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    fs::create_dir(m.path("dir")).unwrap();
    fs::write(m.path("dir/file"), compressible(10_000, 1)).unwrap();
    lsetxattr(&m.path("dir/file"), "user.before", b"one").unwrap();
    m.unmount();

    let m = Mount::new(&d.lower, &d.mnt, "");
    long_listing(&m.path("dir"));
    let file = m.path("dir/file");
    assert_eq!(lgetxattr(&file, "user.before"), Ok(b"one".to_vec()));
    assert_eq!(lgetxattr(&file, "user.absent"), Err(libc::ENODATA));
    lsetxattr(&file, "user.after", b"two").unwrap();
    assert_eq!(lgetxattr(&d.lower.join("dir/file"), "user.after"), Ok(b"two".to_vec()), "set on the lower file");
    let mut names = llistxattr(&file);
    names.sort();
    assert_eq!(names, ["user.after", "user.before"]);
    lremovexattr(&file, "user.before").unwrap();
    assert_eq!(lremovexattr(&file, "user.before"), Err(libc::ENODATA));
    assert_eq!(lgetxattr(&d.lower.join("dir/file"), "user.before"), Err(libc::ENODATA), "removed from the lower file");
    assert_eq!(fs::read(&file).unwrap(), compressible(10_000, 1));
    m.unmount();
}

/// How many descriptors the daemon (the foreground `densefs mount` child) has open.
fn daemon_fds(m: &Mount) -> usize {
    let pid = m.child.as_ref().expect("daemon running").id();
    fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// An open file costs the daemon one descriptor: its content reads and writes through the
/// inode's own. A server that keeps thousands of files open (nfs-ganesha's descriptor cache)
/// otherwise ran the daemon out of descriptors at half its limit.
#[test]
fn an_open_file_costs_the_daemon_one_descriptor() {
    let _turn = one_at_a_time();
    const FILES: usize = 300;
    const SLACK: usize = 20;
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    let data = |i: usize| compressible(3000 + 7 * i, i as u64);
    let before = daemon_fds(&m);
    let mut writers: Vec<fs::File> =
        (0..FILES).map(|i| OpenOptions::new().create_new(true).read(true).write(true).open(m.path(&format!("f{i}"))).unwrap()).collect();
    for (i, f) in writers.iter_mut().enumerate() {
        f.write_all(&data(i)).unwrap();
    }
    let created = daemon_fds(&m) - before;
    assert!(created <= FILES + SLACK, "{FILES} files created and held open cost the daemon {created} descriptors");
    // Readers of the same open files share them too, and see the writers' bytes.
    let readers: Vec<fs::File> = (0..FILES).map(|i| fs::File::open(m.path(&format!("f{i}"))).unwrap()).collect();
    for (i, mut f) in readers.iter().enumerate() {
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut got).unwrap();
        assert!(got == data(i), "f{i} read back while its writer holds it open");
    }
    let both = daemon_fds(&m) - before;
    assert!(both <= created + SLACK, "readers of {FILES} open files added {} descriptors", both - created);
    drop(writers);
    drop(readers);
    m.unmount();

    // After a remount: files first met in a listing (opened there to read their headers), then
    // opened to read and to write, keep the listing's descriptor.
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    let before = daemon_fds(&m);
    let listing = long_listing(&m.mnt);
    for i in 0..FILES {
        assert_eq!(listing[&format!("f{i}")].1, data(i).len() as u64, "f{i}'s size in a listing");
    }
    let listed = daemon_fds(&m) - before;
    let readers: Vec<fs::File> = (0..FILES).map(|i| fs::File::open(m.path(&format!("f{i}"))).unwrap()).collect();
    let writers: Vec<fs::File> = (0..FILES).map(|i| OpenOptions::new().append(true).open(m.path(&format!("f{i}"))).unwrap()).collect();
    for (i, mut f) in writers.iter().enumerate() {
        f.write_all(format!("+{i}").as_bytes()).unwrap();
    }
    for (i, mut f) in readers.iter().enumerate() {
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut got).unwrap();
        let mut want = data(i);
        want.extend_from_slice(format!("+{i}").as_bytes());
        assert!(got == want, "f{i} read through a reader opened before a writer appended");
    }
    let open = daemon_fds(&m) - before;
    assert!(open <= listed + SLACK, "{FILES} listed files, opened to read and to write: {listed} → {open} descriptors");
    drop(writers);
    drop(readers);
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    for i in 0..FILES {
        let mut want = data(i);
        want.extend_from_slice(format!("+{i}").as_bytes());
        assert!(fs::read(m.path(&format!("f{i}"))).unwrap() == want, "f{i} after a remount");
    }
}

/// A read through the mount moves the file's access time as a read on the lower does (the
/// descriptor a listing opened for the daemon's header reads, which leaves it alone, serves the
/// reader too), and the daemon's own header reads still leave it alone.
#[test]
fn a_reader_moves_the_access_time_as_on_the_lower_and_a_listing_does_not() {
    let _turn = one_at_a_time();
    let d = Dirs::new();
    let long_ago = libc::timespec { tv_sec: 1_000_000_000, tv_nsec: 0 };
    let set_atime = |path: &Path| {
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        let times = [long_ago, libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT }];
        assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) }, 0);
    };
    // The control: does a read on the lower file system move an old access time at all
    // (relatime, strictatime), or is it mounted noatime?
    let control = d.root.path().join("control");
    fs::write(&control, b"control").unwrap();
    set_atime(&control);
    fs::read(&control).unwrap();
    let lower_moves_atime = fs::metadata(&control).unwrap().atime() != long_ago.tv_sec;

    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    for name in ["a", "b"] {
        fs::write(m.path(name), compressible(20_000, 3)).unwrap();
        set_atime(&m.path(name));
    }
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    // The listing reads both headers (logical sizes).
    let listing = long_listing(&m.mnt);
    assert_eq!(listing["a"].1, 20_000);
    assert_eq!(fs::metadata(d.lower.join("a")).unwrap().atime(), long_ago.tv_sec, "a listing moved the access time");
    fs::read(m.path("b")).unwrap();
    if lower_moves_atime {
        assert_ne!(fs::metadata(d.lower.join("b")).unwrap().atime(), long_ago.tv_sec, "a read through the mount left the access time");
    }
    // Once the reader has closed it, the daemon's header reads leave b's access time alone again
    // (the new ctime makes a fresh stat read the header).
    set_atime(&m.path("b"));
    assert_eq!(fresh_size(&m.path("b")), 20_000);
    m.unmount();
    for name in ["a", "b"] {
        assert_eq!(fs::metadata(d.lower.join(name)).unwrap().atime(), long_ago.tv_sec, "the daemon's reads moved {name}'s access time");
    }
}

/// A daemon held to 256 descriptors (`ulimit -n 256` where it may not be raised) takes a tree of
/// thousands of files that the kernel keeps cached: the inode table closes the least recently
/// used descriptors and opens them again when they are used. The threshold for evicting used to
/// creep up by one with every eviction, and after some 3,000 new files every create and every
/// listing failed with EMFILE ("Too many open files").
#[test]
fn a_daemon_held_to_256_descriptors_takes_thousands_of_cached_files() {
    let _turn = one_at_a_time();
    const DIRS: usize = 60;
    const FILES: usize = 100;
    let d = Dirs::new();
    let m = Mount::with_fd_limit(&d.lower, &d.mnt, "", 256);
    let pid = m.child.as_ref().expect("daemon running").id();
    let limits = fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let nofile = limits.lines().find(|l| l.starts_with("Max open files")).expect("Max open files");
    assert_eq!(nofile.split_whitespace().nth(3), Some("256"), "the daemon raised its limit: {nofile}");
    let content = |dir: usize, file: usize| compressible(500 + file * 37, (dir * FILES + file) as u64);
    for dir in 0..DIRS {
        let path = m.path(&format!("d{dir}"));
        fs::create_dir(&path).unwrap();
        for file in 0..FILES {
            fs::write(path.join(format!("f{file}")), content(dir, file))
                .unwrap_or_else(|e| panic!("creating d{dir}/f{file}: {e} (daemon descriptors: {})", daemon_fds(&m)));
        }
    }
    assert!(daemon_fds(&m) < 200, "{} descriptors open in the daemon", daemon_fds(&m));
    let (_, kept) = census(&d.mnt);
    assert!(kept <= 128, "the inode table keeps {kept} descriptors, over half the limit");
    // Everything is listed and reads back: the evicted inodes open again.
    for dir in 0..DIRS {
        let path = m.path(&format!("d{dir}"));
        assert_eq!(fs::read_dir(&path).unwrap().count(), FILES);
        for file in 0..FILES {
            let want = content(dir, file);
            let p = path.join(format!("f{file}"));
            assert_eq!(fs::metadata(&p).unwrap().len(), want.len() as u64);
            assert!(fs::read(&p).unwrap() == want, "d{dir}/f{file} reads back wrong");
        }
    }
    m.unmount();
}

/// Names of `dir` read through libc with a `telldir` after the `mark`-th entry: (every name in
/// order, the position after the mark-th, the names after it).
fn names_with_position(dir: &Path, mark: usize) -> (Vec<String>, libc::c_long, Vec<String>) {
    let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: plain libc directory calls on a stream opened and closed here.
    unsafe {
        let stream = libc::opendir(c.as_ptr());
        assert!(!stream.is_null());
        let mut names = Vec::new();
        let mut position = 0;
        loop {
            let ent = libc::readdir64(stream);
            if ent.is_null() {
                break;
            }
            names.push(std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()).to_string_lossy().into_owned());
            if names.len() == mark {
                position = libc::telldir(stream);
            }
        }
        libc::seekdir(stream, position);
        let mut after = Vec::new();
        loop {
            let ent = libc::readdir64(stream);
            if ent.is_null() {
                break;
            }
            after.push(std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()).to_string_lossy().into_owned());
        }
        libc::closedir(stream);
        (names, position, after)
    }
}

/// The daemon keeps no open directory between READDIRs (listings go by the lower's own
/// positions, and a writable mount answers OPENDIR with ENOSYS): two listings of one directory
/// read in turns each see every name once, a `seekdir` back to a `telldir` position goes on
/// from there, and densefs's reserved names never show, with and without the kernel keeping
/// the listing (read-write and read-only mounts).
#[test]
fn listings_read_in_turns_or_seeking_back_see_every_name_once() {
    let d = Dirs::new();
    let dir = d.lower.join("many");
    fs::create_dir(&dir).unwrap();
    let mut expected = BTreeSet::new();
    for i in 0..3000 {
        let name = format!("entry-{i:04}-{}", "x".repeat(i % 40));
        fs::write(dir.join(&name), b"plain").unwrap();
        expected.insert(name);
    }
    fs::write(dir.join(".densefs.props"), b"compression=lz4\n").unwrap();
    for options in ["", "ro", ""] {
        let m = Mount::new(&d.lower, &d.mnt, options);
        let listed = m.path("many");
        let (mut a, mut b) = (fs::read_dir(&listed).unwrap(), fs::read_dir(&listed).unwrap());
        let (mut seen_a, mut seen_b) = (Vec::new(), Vec::new());
        loop {
            let (x, y) = (a.next(), b.next().and_then(|_| b.next().map(|e| e.unwrap().file_name())));
            if let Some(x) = &x {
                seen_a.push(x.as_ref().unwrap().file_name().into_string().unwrap());
            }
            if let Some(y) = &y {
                seen_b.push(y.clone().into_string().unwrap());
            }
            if x.is_none() && y.is_none() {
                break;
            }
        }
        drop((a, b)); // open directories keep the mount busy
        let set_a: BTreeSet<String> = seen_a.iter().cloned().collect();
        assert_eq!(set_a.len(), seen_a.len(), "-o {options:?}: a name listed twice");
        assert_eq!(set_a, expected, "-o {options:?}: the first of two listings in turns");
        // The second listing kept every other name (it reads two per turn, keeping the second).
        assert!(seen_b.len() >= expected.len() / 2 - 1, "-o {options:?}: {} names in the second listing", seen_b.len());

        let (names, position, after) = names_with_position(&listed, 1234);
        assert_eq!(names.iter().filter(|n| *n != "." && *n != "..").cloned().collect::<BTreeSet<_>>(), expected);
        assert_eq!(names.len(), expected.len() + 2, "-o {options:?}: names listed twice or missing");
        assert_eq!(after, names[1234..], "-o {options:?}: seekdir({position}) did not go on after the 1234th name");
        m.unmount();
    }
}

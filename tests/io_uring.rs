//! FUSE over io_uring (Linux 6.14+): requests come through one queue per CPU, served by ring
//! threads pinned to it (vendor/fuser/src/uring.rs). Everything a program does through the mount
//! must behave as through /dev/fuse: these tests drive each CPU's queue with every kind of
//! request, check the bytes and metadata against the same work done through /dev/fuse, and check
//! that each CPU's ring threads answered that CPU's requests (and that a thread serving a
//! reader's large READs may run on any CPU until it serves a small request again).
//!
//! The kernel offers the rings only with /sys/module/fuse/parameters/enable_uring set: the tests
//! set it (they run as root, as the suite does); on a kernel without the switch they say so and
//! check that `io_uring=on` is refused with a clear error. One test is /dev/fuse's own: its
//! readers may step aside (vendor/fuser/src/step_aside.rs), and every request must still be
//! answered.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";
const IO_URING_DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";

/// One test of this file at a time: one of them turns io_uring off for the whole machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Turns the kernel's switch on; false where this kernel has none.
fn offer_io_uring() -> bool {
    if !Path::new(ENABLE_URING).exists() {
        eprintln!("this kernel has no FUSE over io_uring ({ENABLE_URING} missing)");
        return false;
    }
    if fs::read_to_string(ENABLE_URING).unwrap().trim() != "Y" {
        fs::write(ENABLE_URING, "Y").expect("set enable_uring (the suite runs as root)");
    }
    true
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set), 0, "pin to CPU {cpu}");
    }
}

fn unpin() {
    // SAFETY: as in pin_to.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for cpu in 0..cpus() {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The daemon's threads: each one's name and its `/proc/.../status` field `field`, trimmed.
fn thread_field(pid: u32, field: &str) -> Vec<(String, String)> {
    let mut threads = Vec::new();
    for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let name = fs::read_to_string(task.path().join("comm")).unwrap_or_default().trim().to_string();
        let status = fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let value = status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')).unwrap_or_default().trim().to_string();
        threads.push((name, value));
    }
    threads
}

/// The sum of counters of /proc/PID/task/*/status (`fields`) for each of the daemon's threads,
/// by thread name.
fn counts_by_thread(pid: u32, fields: &[&str]) -> BTreeMap<String, u64> {
    let mut by_name = BTreeMap::new();
    for field in fields {
        for (name, count) in thread_field(pid, field) {
            *by_name.entry(name).or_default() += if count.is_empty() { 0 } else { count.parse::<u64>().unwrap() };
        }
    }
    by_name
}

/// Voluntary context switches of the daemon's threads, by thread name: a thread that answered
/// requests slept waiting for each.
fn switches_by_thread(pid: u32) -> BTreeMap<String, u64> {
    counts_by_thread(pid, &["voluntary_ctxt_switches"])
}

/// Context switches of the daemon's threads, voluntary or not, by thread name: a ring thread
/// that answered requests slept waiting for each, or (looking for the next one after an
/// answer, fuser's `PollWindow`) yielded its CPU to the program that made it.
fn turns_by_thread(pid: u32) -> BTreeMap<String, u64> {
    counts_by_thread(pid, &["voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"])
}

/// Every kind of request a program makes, from the calling thread: creates, small and large
/// writes (1 MiB requests), reads, overwrites, truncates, fsync, renames, links, symlinks,
/// xattrs, chmod, utimes, listing, unlink, rmdir. Returns what the tree should hold.
fn workload(root: &Path, tag: &str) -> BTreeMap<String, Vec<u8>> {
    let mut expect = BTreeMap::new();
    let dir = root.join(format!("d-{tag}"));
    fs::create_dir_all(dir.join("sub")).unwrap();
    for (i, len) in [0usize, 1, 4095, 4096, 131_073, 3 << 20].into_iter().enumerate() {
        let name = format!("d-{tag}/f{i}");
        let data = if i % 2 == 0 { compressible(len, i as u64) } else { random_bytes(len, i as u64) };
        fs::write(root.join(&name), &data).unwrap();
        assert_eq!(fs::read(root.join(&name)).unwrap(), data, "{name} read back");
        expect.insert(name, data);
    }
    // Overwrite the middle of the large file, extend it, fsync, truncate it.
    let big = format!("d-{tag}/f5");
    let mut data = expect.remove(&big).unwrap();
    let mut f = fs::OpenOptions::new().read(true).write(true).open(root.join(&big)).unwrap();
    let patch = random_bytes(200_000, 77);
    f.write_all_at(&patch, 1_000_000).unwrap();
    data[1_000_000..1_200_000].copy_from_slice(&patch);
    f.seek(SeekFrom::End(0)).unwrap();
    f.write_all(b"tail").unwrap();
    data.extend_from_slice(b"tail");
    f.sync_all().unwrap();
    f.set_len(2_500_000).unwrap();
    data.truncate(2_500_000);
    let mut back = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut back).unwrap();
    assert!(back == data, "{big} after overwrite, extend, fsync, truncate");
    drop(f);
    expect.insert(big, data);
    // Rename, hard link, symlink, xattr, mode, times.
    fs::rename(dir.join("f1"), dir.join("sub/moved")).unwrap();
    let moved = expect.remove(&format!("d-{tag}/f1")).unwrap();
    expect.insert(format!("d-{tag}/sub/moved"), moved.clone());
    fs::hard_link(dir.join("sub/moved"), dir.join("linked")).unwrap();
    expect.insert(format!("d-{tag}/linked"), moved);
    std::os::unix::fs::symlink("sub/moved", dir.join("sym")).unwrap();
    assert_eq!(fs::read_link(dir.join("sym")).unwrap(), Path::new("sub/moved"));
    xattr_set(&dir.join("f2"), "user.tag", tag.as_bytes());
    assert_eq!(xattr_get(&dir.join("f2"), "user.tag"), tag.as_bytes());
    fs::set_permissions(dir.join("f3"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(dir.join("f3")).unwrap().mode() & 0o777, 0o640);
    // Many small entries, listed and half removed.
    for i in 0..200 {
        fs::write(dir.join(format!("sub/s{i}")), format!("{tag}{i}")).unwrap();
    }
    for i in (0..200).step_by(2) {
        fs::remove_file(dir.join(format!("sub/s{i}"))).unwrap();
    }
    for i in (1..200).step_by(2) {
        expect.insert(format!("d-{tag}/sub/s{i}"), format!("{tag}{i}").into_bytes());
    }
    let listed = fs::read_dir(dir.join("sub")).unwrap().count();
    assert_eq!(listed, 101, "100 small files and `moved`");
    fs::create_dir(dir.join("gone")).unwrap();
    fs::remove_dir(dir.join("gone")).unwrap();
    expect
}

fn xattr_set(path: &Path, name: &str, value: &[u8]) {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: NUL-terminated strings and a buffer of the given length.
    let rc = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    assert_eq!(rc, 0, "setxattr {name}: {}", std::io::Error::last_os_error());
}

fn xattr_get(path: &Path, name: &str) -> Vec<u8> {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: NUL-terminated strings and a buffer of the given length.
    let rc = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(rc >= 0, "getxattr {name}: {}", std::io::Error::last_os_error());
    buf.truncate(rc as usize);
    buf
}

fn check_tree(root: &Path, expect: &BTreeMap<String, Vec<u8>>) {
    for (name, data) in expect {
        let got = fs::read(root.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(got == *data, "{name}: {} bytes read, {} expected, or other bytes", got.len(), data.len());
    }
}

#[test]
fn every_cpus_queue_serves_every_kind_of_request_through_the_rings() {
    let _serial = serial();
    if !offer_io_uring() {
        return;
    }
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "io_uring=on,compression=zstd-3,recordsize=64K");
    let log = fs::read_to_string(&m.log).unwrap();
    assert!(log.contains("requests through io_uring"), "the log names the transport: {log}");
    let pid = m.child.as_ref().unwrap().id();
    let before = turns_by_thread(pid);
    let mut expect = BTreeMap::new();
    for cpu in 0..cpus() {
        pin_to(cpu);
        expect.extend(workload(&d.mnt, &format!("cpu{cpu}")));
    }
    unpin();
    let after = turns_by_thread(pid);
    let answered = |prefix: &str| -> u64 {
        after.iter().filter(|(name, _)| name.starts_with(prefix)).map(|(name, n)| n - before.get(name).copied().unwrap_or(0)).sum()
    };
    // Each CPU's workload makes a few thousand requests (200 small files alone take a LOOKUP, a
    // CREATE, a WRITE, a FLUSH and a RELEASE each); /dev/fuse still brings the FORGETs.
    for cpu in 0..cpus() {
        let ring = answered(&format!("fuser-ring-{cpu}."));
        assert!(ring > 1000, "CPU {cpu}'s ring threads answered the requests made from CPU {cpu} (ran {ring} times)");
    }
    check_tree(&d.mnt, &expect);
    m.unmount();

    // What the rings stored reads back through /dev/fuse, identically.
    let m = Mount::new(&d.lower, &d.mnt, "io_uring=off");
    let log = fs::read_to_string(&m.log).unwrap();
    assert!(log.contains("requests through /dev/fuse"), "io_uring=off keeps to /dev/fuse: {log}");
    check_tree(&d.mnt, &expect);
    m.unmount();
}

/// Each ring thread's `Cpus_allowed_list` ("1", "0-1"), by thread name.
fn ring_affinities(pid: u32) -> BTreeMap<String, String> {
    thread_field(pid, "Cpus_allowed_list").into_iter().filter(|(name, _)| name.starts_with("fuser-ring-")).collect()
}

/// The queue a ring thread serves, from its name (`fuser-ring-CPU.N`).
fn ring_cpu(name: &str) -> String {
    name.trim_start_matches("fuser-ring-").split('.').next().unwrap().to_string()
}

#[test]
fn a_large_read_is_served_from_any_cpu_and_small_requests_from_the_callers() {
    let _serial = serial();
    if !offer_io_uring() || cpus() < 2 {
        return;
    }
    let d = Dirs::new();
    let data = compressible(16 << 20, 7);
    let m = Mount::new(&d.lower, &d.mnt, "io_uring=on,compression=zstd-3");
    fs::write(m.path("big"), &data).unwrap();
    m.unmount();

    // Remounted, so the kernel has none of the file cached and its read-ahead sends 1 MiB READs.
    let m = Mount::new(&d.lower, &d.mnt, "io_uring=on");
    let pid = m.child.as_ref().unwrap().id();
    let pinned = ring_affinities(pid);
    assert!(pinned.len() >= 2 * cpus(), "two ring threads per CPU at least: {pinned:?}");
    for (name, allowed) in &pinned {
        assert_eq!(*allowed, ring_cpu(name), "{name} starts pinned to its queue's CPU");
    }
    pin_to(0);
    let mut got = Vec::new();
    // Kept open until the threads are looked at: its close's RELEASE is a small request too,
    // sent without waiting for its answer, and would pin again the thread that took it.
    let mut big = fs::File::open(m.path("big")).unwrap();
    big.read_to_end(&mut got).unwrap();
    unpin();
    assert!(got == data, "the file reads back whole ({} bytes of {})", got.len(), data.len());
    // The reader's READs all came to CPU 0's queue; the threads that served them may run anywhere.
    let after_read = ring_affinities(pid);
    let widened: Vec<&String> = after_read.iter().filter(|(name, allowed)| **allowed != ring_cpu(name)).map(|(name, _)| name).collect();
    assert!(!widened.is_empty(), "a thread that served a large READ is free to run on any CPU: {after_read:?}");
    for name in &widened {
        assert_eq!(ring_cpu(name), "0", "only the reader's queue served large READs: {after_read:?}");
    }

    drop(big);

    // Small requests from CPU 0, two callers at once so that both of its threads take some:
    // each thread that takes one is pinned again. On a busy machine one thread may take a
    // round's every request, so rounds go on until each is pinned (or the wait's bound).
    let mut round = 0;
    wait_until("every ring thread pinned again by the small requests it served", || {
        round += 1;
        std::thread::scope(|s| {
            for t in 0..2 {
                let dir = m.path(&format!("small{round}.{t}"));
                s.spawn(move || {
                    pin_to(0);
                    fs::create_dir(&dir).unwrap();
                    for i in 0..300 {
                        let f = dir.join(format!("f{i}"));
                        fs::write(&f, b"x").unwrap();
                        fs::remove_file(&f).unwrap();
                    }
                });
            }
        });
        let after_small = ring_affinities(pid);
        let widened: Vec<_> = after_small.iter().filter(|(name, allowed)| **allowed != ring_cpu(name)).collect();
        eprintln!("round {round}: still free to run anywhere: {widened:?}");
        widened.is_empty()
    });
    m.unmount();
}

#[test]
fn a_tree_untarred_through_the_rings_equals_the_same_through_dev_fuse() {
    let _serial = serial();
    if !offer_io_uring() {
        return;
    }
    // A real tree (the project's own sources and tests) through tar, as outsiders tested.
    let src = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tarball = tempfile::NamedTempFile::new().unwrap();
    let status = Command::new("tar").arg("cf").arg(tarball.path()).arg("-C").arg(src).args(["src", "tests", "docs"]).status().unwrap();
    assert!(status.success());
    let mut listings = Vec::new();
    for transport in ["io_uring=on", "io_uring=off"] {
        let d = Dirs::new();
        let m = Mount::new(&d.lower, &d.mnt, transport);
        let status = Command::new("tar").arg("xpf").arg(tarball.path()).arg("-C").arg(&d.mnt).status().unwrap();
        assert!(status.success(), "untar through {transport}");
        let diff = Command::new("tar").arg("--diff").arg("-f").arg(tarball.path()).arg("-C").arg(&d.mnt).output().unwrap();
        assert!(diff.status.success(), "tar --diff through {transport}: {}", String::from_utf8_lossy(&diff.stdout));
        let listing =
            Command::new("find").arg(".").args(["-mindepth", "1", "-printf", "%p %y %m %s %T@\\n"]).current_dir(&d.mnt).output().unwrap();
        let mut lines: Vec<String> = String::from_utf8(listing.stdout).unwrap().lines().map(str::to_string).collect();
        lines.sort();
        assert!(lines.len() > 50, "the tree has its entries");
        listings.push(lines);
        m.unmount();
    }
    assert_eq!(listings[0], listings[1], "the same names, types, modes, sizes and mtimes");
}

/// Through /dev/fuse, a reader whose answers keep waking their callers on other CPUs stops
/// reading for a while (vendor/fuser/src/step_aside.rs), where such wake-ups are expensive (on
/// this project's VMs: an exit to the hypervisor for each). Whoever stepped aside, every request
/// must still be answered, and right: one program makes 20,000 small requests from one CPU
/// (which sends the other CPUs' readers aside on such a VM), then a program on every CPU at
/// once does every kind of request; every answer and every byte is checked, again after a
/// remount.
#[test]
fn through_dev_fuse_programs_on_every_cpu_are_answered_after_one_cpu_sent_readers_aside() {
    let _serial = serial();
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "io_uring=off");
    let log = fs::read_to_string(&m.log).unwrap();
    assert!(log.contains("requests through /dev/fuse"), "{log}");
    fs::write(m.path("probe"), b"probe").unwrap();
    xattr_set(&m.path("probe"), "user.n", b"answer");
    pin_to(0);
    for i in 0..20_000 {
        assert_eq!(xattr_get(&m.path("probe"), "user.n"), b"answer", "GETXATTR {i}");
    }
    unpin();
    let trees: Vec<BTreeMap<String, Vec<u8>>> = std::thread::scope(|s| {
        let programs: Vec<_> = (0..cpus())
            .map(|cpu| {
                let mnt = &d.mnt;
                s.spawn(move || {
                    pin_to(cpu);
                    workload(mnt, &format!("cpu{cpu}"))
                })
            })
            .collect();
        programs.into_iter().map(|p| p.join().expect("a program through /dev/fuse")).collect()
    });
    for tree in &trees {
        check_tree(&d.mnt, tree);
    }
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "io_uring=off");
    for tree in &trees {
        check_tree(&d.mnt, tree);
    }
    m.unmount();
}

/// Over io_uring, /dev/fuse brings only what the rings do not (FORGETs, INTERRUPTs), to one
/// reader. `rm` makes a FORGET from inside each unlink; a reader woken by every one would cost
/// each unlink a wake-up of another core, so while they come the reader keeps looking for them
/// without waiting in the kernel, and takes them a batch at a time. Every deleted file is still
/// let go (its lower descriptor closed, so its space freed) within a moment.
#[test]
fn the_forgets_of_many_deletions_come_to_one_reader_in_batches_and_every_file_is_let_go() {
    let _serial = serial();
    if !offer_io_uring() {
        return;
    }
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "io_uring=on");
    let pid = m.child.as_ref().unwrap().id();
    let is_reader = |name: &String| name.starts_with("fuser-") && !name.starts_with("fuser-ring-");
    let readers: Vec<String> = switches_by_thread(pid).into_keys().filter(is_reader).collect();
    assert_eq!(readers, ["fuser-0"], "one /dev/fuse reader beside the rings");
    const FILES: usize = 3000;
    let dir = m.path("many");
    fs::create_dir(&dir).unwrap();
    for i in 0..FILES {
        fs::write(dir.join(format!("f{i}")), format!("file {i}\n")).unwrap();
    }
    let (known, _) = census(&m.mnt);
    assert!(known as usize > FILES, "the daemon holds the files it created ({known} inodes)");
    let before = switches_by_thread(pid)["fuser-0"];
    let started = std::time::Instant::now();
    for i in 0..FILES {
        fs::remove_file(dir.join(format!("f{i}"))).unwrap();
    }
    let took_ms = started.elapsed().as_millis() as u64;
    wait_until("every deleted file to be let go", || census(&m.mnt).0 <= known - FILES as u64);
    let woke = switches_by_thread(pid)["fuser-0"] - before;
    eprintln!("{FILES} deletions in {took_ms} ms; the /dev/fuse reader woke {woke} times");
    // While FORGETs come less than 200 µs apart the reader keeps looking for the next and
    // hardly ever sleeps; woken by each one, it would sleep and wake about once per file. A
    // machine so loaded that the deletions came further apart than that cannot tell the two,
    // and on one core the reader does not look (there is no other core to keep busy).
    let per_deletion_us = took_ms * 1000 / FILES as u64;
    if cpus() < 2 {
        eprintln!("one core: the reader waits for each FORGET");
    } else if per_deletion_us <= 100 {
        assert!(woke < FILES as u64 / 10, "the reader woke {woke} times for {FILES} deletions: once per FORGET, not once per burst");
    } else {
        eprintln!("deletions {per_deletion_us} µs apart (a loaded machine): the reader's wake-ups not judged");
    }
    assert!(fs::read_dir(&dir).unwrap().next().is_none(), "the directory is empty");
    m.unmount();
}

/// A kernel setting (`IO_URING_DISABLED`, `ENABLE_URING`), put back as it was when dropped.
struct RestoreSetting {
    path: &'static str,
    was: String,
}

impl RestoreSetting {
    fn save(path: &'static str) -> RestoreSetting {
        RestoreSetting { path, was: fs::read_to_string(path).unwrap() }
    }
}

impl Drop for RestoreSetting {
    fn drop(&mut self) {
        let _ = fs::write(self.path, &self.was);
    }
}

#[test]
fn a_daemon_that_may_not_use_io_uring_serves_through_dev_fuse() {
    let _serial = serial();
    if !offer_io_uring() || !Path::new(IO_URING_DISABLED).exists() {
        return;
    }
    // Once INIT agrees on io_uring the kernel holds every request until each CPU's queue has an
    // entry: a daemon that then could not set up its rings would hang its mount. It must find
    // out before INIT and stay on /dev/fuse.
    let _restore = RestoreSetting::save(IO_URING_DISABLED);
    fs::write(IO_URING_DISABLED, "2").unwrap();
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let log = fs::read_to_string(&m.log).unwrap();
    assert!(log.contains("cannot set up a ring"), "the log says why: {log}");
    assert!(log.contains("requests through /dev/fuse"), "{log}");
    fs::write(m.path("f"), b"served").unwrap();
    assert_eq!(fs::read(m.path("f")).unwrap(), b"served");
    m.unmount();
    let refused = Command::new(BIN).args(["mount", "-o", "io_uring=on"]).arg(&d.lower).arg(&d.mnt).output().unwrap();
    assert!(!refused.status.success(), "io_uring=on without rings is refused");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("io_uring=on") && said.contains("io_uring_disabled"), "{said}");
    let left = densefs::cli::mountinfo::mountinfo().into_iter().any(|m| m.point == d.mnt);
    assert!(!left, "the refused mount is taken away again");
}

/// A kernel that has FUSE over io_uring but keeps it switched off (the default) gets a mount
/// through /dev/fuse whose log line says how to turn it on; a mount asked for `io_uring=off`
/// is not told.
#[test]
fn a_mount_on_a_kernel_with_the_switch_off_says_how_to_turn_it_on() {
    let _serial = serial();
    if !offer_io_uring() {
        return;
    }
    let _restore = RestoreSetting::save(ENABLE_URING);
    fs::write(ENABLE_URING, "N").unwrap();
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let log = fs::read_to_string(&m.log).unwrap();
    assert!(log.contains("requests through /dev/fuse") && log.contains(&format!("Y in {ENABLE_URING}")), "{log}");
    fs::write(m.path("f"), b"served").unwrap();
    assert_eq!(fs::read(m.path("f")).unwrap(), b"served");
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "io_uring=off");
    let log = fs::read_to_string(&m.log).unwrap();
    let line = log.lines().rfind(|l| l.contains("mounted")).unwrap();
    assert!(line.contains("requests through /dev/fuse") && !line.contains(ENABLE_URING), "{line}");
    m.unmount();
}

//! NFS export: kernel file handles of densefs files stay valid after the kernel drops its
//! caches and after the daemon restarts (what an NFS server such as nfs-ganesha relies on), and
//! a real nfs-ganesha exporting a densefs mount serves files through those events.

mod common;

use common::{compressible, Dirs, Mount};
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A kernel file handle as name_to_handle_at returns it.
#[derive(Clone)]
struct Handle {
    kind: i32,
    bytes: Vec<u8>,
}

#[repr(C)]
struct RawHandle {
    bytes: u32,
    kind: i32,
    data: [u8; 128],
}

fn handle_of(path: &Path) -> Handle {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut h = RawHandle { bytes: 128, kind: 0, data: [0; 128] };
    let mut mount_id = 0;
    let r = unsafe {
        libc::name_to_handle_at(libc::AT_FDCWD, c.as_ptr(), &mut h as *mut RawHandle as *mut libc::file_handle, &mut mount_id, 0)
    };
    assert_eq!(r, 0, "name_to_handle_at {}: {}", path.display(), std::io::Error::last_os_error());
    Handle { kind: h.kind, bytes: h.data[..h.bytes as usize].to_vec() }
}

fn open_by_handle(mount: &Path, h: &Handle, flags: i32) -> std::io::Result<OwnedFd> {
    let mnt = File::open(mount).unwrap();
    let mut raw = RawHandle { bytes: h.bytes.len() as u32, kind: h.kind, data: [0; 128] };
    raw.data[..h.bytes.len()].copy_from_slice(&h.bytes);
    let fd = unsafe {
        libc::open_by_handle_at(mnt.as_raw_fd(), &mut raw as *mut RawHandle as *mut libc::file_handle, flags | libc::O_CLOEXEC)
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ino_of(fd: &OwnedFd) -> u64 {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::fstatat(fd.as_raw_fd(), c"".as_ptr(), &mut st, libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW) };
    assert_eq!(r, 0);
    st.st_ino
}

fn drop_caches() {
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches (needs root)");
    // FORGETs reach the daemon asynchronously; give them a moment.
    std::thread::sleep(Duration::from_millis(200));
}

/// Whether the lower file system (ext2/3/4) lets densefs reopen inodes by number, which handles
/// need after a forget or a restart. Elsewhere they work only while the kernel holds the inode.
fn lower_reopens_by_number(lower: &Path) -> bool {
    let c = CString::new(lower.as_os_str().as_bytes()).unwrap();
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    unsafe { libc::statfs(c.as_ptr(), &mut sfs) == 0 && sfs.f_type as i64 == 0xEF53 }
}

fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

struct Tree {
    file: Handle,
    file_ino: u64,
    big: Handle,
    big_ino: u64,
    dir: Handle,
    dir_ino: u64,
    link: Handle,
    link_ino: u64,
    doomed: Handle,
}

/// Opens every handle of `t` through the mount at `mnt` and checks it is the same file.
fn check_handles(mnt: &Path, t: &Tree, big: &[u8], when: &str) {
    let fd = open_by_handle(mnt, &t.file, libc::O_RDONLY).unwrap_or_else(|e| panic!("{when}: file handle: {e}"));
    assert_eq!(ino_of(&fd), t.file_ino, "{when}: file st_ino");
    let mut s = String::new();
    File::from(fd).read_to_string(&mut s).unwrap();
    assert_eq!(s, "hello through a handle\n", "{when}: file content");

    let fd = open_by_handle(mnt, &t.big, libc::O_RDONLY).unwrap_or_else(|e| panic!("{when}: big file handle: {e}"));
    assert_eq!(ino_of(&fd), t.big_ino, "{when}: big st_ino");
    let mut data = Vec::new();
    File::from(fd).read_to_end(&mut data).unwrap();
    assert!(data == big, "{when}: big file content differs");

    let fd = open_by_handle(mnt, &t.dir, libc::O_RDONLY | libc::O_DIRECTORY).unwrap_or_else(|e| panic!("{when}: dir handle: {e}"));
    assert_eq!(ino_of(&fd), t.dir_ino, "{when}: dir st_ino");
    // A directory comes back connected to the tree (the kernel walked ".." up to the root).
    let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
    assert_eq!(path, mnt.join("a/b"), "{when}: dir path");
    let mut names: Vec<String> =
        std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["big.fastq", "file.txt"], "{when}: dir listing");

    // A symlink opens only with O_PATH (open_by_handle_at never follows it).
    let fd = open_by_handle(mnt, &t.link, libc::O_PATH).unwrap_or_else(|e| panic!("{when}: symlink handle: {e}"));
    assert_eq!(ino_of(&fd), t.link_ino, "{when}: symlink st_ino");
    let mut buf = [0u8; 256];
    let n = unsafe { libc::readlinkat(fd.as_raw_fd(), c"".as_ptr(), buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    assert!(n > 0, "{when}: readlink: {}", std::io::Error::last_os_error());
    assert_eq!(&buf[..n as usize], b"b/file.txt", "{when}: symlink target");

    // The deleted file's number may be reused by a new file: its handle must not open that.
    match open_by_handle(mnt, &t.doomed, libc::O_RDONLY) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{when}: deleted file's handle: {e}"),
        Ok(fd) => panic!("{when}: a deleted file's handle opened inode {}", ino_of(&fd)),
    }
}

#[test]
fn handles_survive_drop_caches_and_restart() {
    if !is_root() {
        println!("SKIP: file handles need root (open_by_handle_at needs CAP_DAC_READ_SEARCH)");
        return;
    }
    let d = Dirs::new();
    let by_number = lower_reopens_by_number(&d.lower);
    let m = Mount::new(&d.lower, &d.mnt, "");
    std::fs::create_dir_all(m.path("a/b")).unwrap();
    std::fs::write(m.path("a/b/file.txt"), "hello through a handle\n").unwrap();
    let big = compressible(3 << 20, 7);
    std::fs::write(m.path("a/b/big.fastq"), &big).unwrap();
    std::os::unix::fs::symlink("b/file.txt", m.path("a/link")).unwrap();
    std::fs::write(m.path("a/doomed"), "soon gone\n").unwrap();

    let t = Tree {
        file: handle_of(&m.path("a/b/file.txt")),
        file_ino: std::fs::metadata(m.path("a/b/file.txt")).unwrap().ino(),
        big: handle_of(&m.path("a/b/big.fastq")),
        big_ino: std::fs::metadata(m.path("a/b/big.fastq")).unwrap().ino(),
        dir: handle_of(&m.path("a/b")),
        dir_ino: std::fs::metadata(m.path("a/b")).unwrap().ino(),
        link: handle_of(&m.path("a/link")),
        link_ino: std::fs::symlink_metadata(m.path("a/link")).unwrap().ino(),
        doomed: handle_of(&m.path("a/doomed")),
    };
    let doomed_ino = std::fs::metadata(m.path("a/doomed")).unwrap().ino();
    std::fs::remove_file(m.path("a/doomed")).unwrap();
    // Often gets the freed inode number: then only the generation tells them apart.
    std::fs::write(m.path("a/reuser"), "not the doomed file\n").unwrap();
    let reused = std::fs::metadata(m.path("a/reuser")).unwrap().ino() == doomed_ino;
    println!("deleted file's inode number reused by a new file: {reused}");

    check_handles(&d.mnt, &t, &big, "while cached");
    if !by_number {
        println!("SKIP (rest): the lower file system is not ext2/3/4; handles work only while the kernel holds the inode");
        return;
    }
    drop_caches();
    check_handles(&d.mnt, &t, &big, "after drop_caches");

    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    check_handles(&d.mnt, &t, &big, "after a daemon restart");
    drop_caches();
    check_handles(&d.mnt, &t, &big, "after a restart and drop_caches");

    // Writing through a file reopened by handle (its directory unknown to the daemon).
    drop_caches();
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    {
        let fd = open_by_handle(&d.mnt, &t.file, libc::O_WRONLY | libc::O_TRUNC).expect("open for writing by handle");
        File::from(fd).write_all(b"rewritten by handle\n").unwrap();
    }
    assert_eq!(std::fs::read_to_string(m.path("a/b/file.txt")).unwrap(), "rewritten by handle\n");
    assert_eq!(std::fs::read_to_string(m.path("a/reuser")).unwrap(), "not the doomed file\n");
    m.unmount();
}

#[test]
fn dot_and_dotdot_lookups_of_the_root_and_unknown_nodes() {
    if !is_root() {
        println!("SKIP: file handles need root");
        return;
    }
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    std::fs::create_dir_all(m.path("x/y/z")).unwrap();
    let root = handle_of(&d.mnt);
    let deep = handle_of(&m.path("x/y/z"));
    let z_ino = std::fs::metadata(m.path("x/y/z")).unwrap().ino();
    drop_caches();
    let fd = open_by_handle(&d.mnt, &root, libc::O_RDONLY | libc::O_DIRECTORY).expect("root handle");
    assert_eq!(std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap(), d.mnt);
    drop(fd);
    if lower_reopens_by_number(&d.lower) {
        m.unmount();
        let m = Mount::new(&d.lower, &d.mnt, "");
        let fd = open_by_handle(&d.mnt, &deep, libc::O_RDONLY | libc::O_DIRECTORY).expect("deep dir handle after restart");
        assert_eq!(ino_of(&fd), z_ino);
        assert_eq!(std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap(), m.path("x/y/z"));
        // ".." from a directory found by handle, as a process walking up would.
        let up = std::fs::metadata(format!("/proc/self/fd/{}/..", fd.as_raw_fd())).unwrap();
        assert_eq!(up.ino(), std::fs::metadata(m.path("x/y")).unwrap().ino());
        drop(fd);
        m.unmount();
    } else {
        m.unmount();
    }
}

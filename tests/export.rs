//! NFS export: kernel file handles of densefs files stay valid after the kernel drops its
//! caches and after the daemon restarts (what an NFS server such as nfs-ganesha relies on), and
//! a real nfs-ganesha exporting a densefs mount serves files through those events and across
//! `densefs recompress`.

mod common;

use common::{compressible, Dirs, Mount};
use std::collections::BTreeSet;
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
    let fd =
        unsafe { libc::open_by_handle_at(mnt.as_raw_fd(), &mut raw as *mut RawHandle as *mut libc::file_handle, flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn stat_of(fd: &OwnedFd) -> libc::stat {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::fstatat(fd.as_raw_fd(), c"".as_ptr(), &mut st, libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW) };
    assert_eq!(r, 0);
    st
}

fn ino_of(fd: &OwnedFd) -> u64 {
    stat_of(fd).st_ino
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
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
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
        // The kernel holds a closed file's inode until the daemon answers its RELEASE, which it
        // sends without waiting: until then the deleted file itself (no name left) opens, as an
        // open-by-handle of a deleted file still in use does on ext4. Never another file.
        Ok(fd) if when == "while cached" && stat_of(&fd).st_nlink == 0 => {}
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

/// Distinct contents for recompress tests: text and random bytes of sizes apart, so that no
/// file's bytes could pass for another's.
fn distinct_files(n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let len = 100_000 + i * 97_000;
            let data = if i % 3 == 2 { common::random_bytes(len, 40 + i as u64) } else { compressible(len, 40 + i as u64) };
            (format!("f{i}.dat"), data)
        })
        .collect()
}

/// Which of `files` `data` is (for messages).
fn which_file(files: &[(String, Vec<u8>)], data: &[u8]) -> String {
    files.iter().find(|(_, d)| d == data).map_or(format!("no file's ({} bytes)", data.len()), |(n, _)| format!("{n}'s"))
}

/// Whose bytes `data` are, or begin (for messages).
fn whose_bytes(files: &[(String, Vec<u8>)], data: &[u8]) -> String {
    let starts: Vec<&str> = files.iter().filter(|(_, d)| !data.is_empty() && d.starts_with(data)).map(|(n, _)| n.as_str()).collect();
    match files.iter().find(|(_, d)| d == data) {
        Some((n, _)) => format!("{n}'s bytes"),
        None if !starts.is_empty() => format!("{} bytes, the start of {}", data.len(), starts.join(", ")),
        None => format!("{} bytes, no file's", data.len()),
    }
}

/// `densefs recompress -r -q -o SPEC PATH`, which must rewrite every file.
fn recompress(path: &Path, spec: &str) {
    let (ok, out) = common::recompress(&[path], true, spec);
    assert!(ok, "densefs recompress -r -o {spec}: {out}");
}

/// Kernel handles taken before `densefs recompress` moves files into new containers (each a new
/// lower inode; ext4 hands a number freed by one file to the next file moved): opened by
/// handle, each gives that file's bytes or ESTALE, never another file's, while the kernel still
/// holds the inodes and after it dropped them; every name shows its own inode and bytes, and
/// handles taken after the recompress open the right files.
#[test]
fn handles_across_recompress() {
    if !is_root() {
        println!("SKIP: file handles need root");
        return;
    }
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let _show = Show(m.log.clone());
    std::fs::create_dir(m.path("r")).unwrap();
    let files = distinct_files(6);
    for (name, data) in &files {
        std::fs::write(m.path(&format!("r/{name}")), data).unwrap();
    }
    // (handle, index into files, taken when)
    let mut handles: Vec<(Handle, usize, String)> =
        files.iter().enumerate().map(|(i, (name, _))| (handle_of(&m.path(&format!("r/{name}"))), i, "at the start".to_string())).collect();
    let check = |handles: &[(Handle, usize, String)], when: &str| {
        let mut stale = 0;
        for (h, i, taken) in handles {
            let name = &files[*i].0;
            match open_by_handle(&d.mnt, h, libc::O_RDONLY) {
                Err(e) if e.raw_os_error() == Some(libc::ESTALE) => stale += 1,
                Err(e) => panic!("{when}: handle of {name} taken {taken}: {e}"),
                Ok(fd) => {
                    let mut data = Vec::new();
                    File::from(fd).read_to_end(&mut data).unwrap();
                    assert!(data == files[*i].1, "{when}: handle of {name} taken {taken} opened {} bytes", which_file(&files, &data));
                }
            }
        }
        println!("{when}: {stale} of {} handles stale, the rest open their own files", handles.len());
    };
    let names = |when: &str| {
        let mut inos = std::collections::BTreeMap::new();
        for (name, data) in &files {
            let p = m.path(&format!("r/{name}"));
            let ino = std::fs::metadata(&p).unwrap_or_else(|e| panic!("{when}: stat {name}: {e}")).ino();
            if let Some(other) = inos.insert(ino, name) {
                panic!("{when}: {other} and {name} both show inode {ino}");
            }
            let got = std::fs::read(&p).unwrap_or_else(|e| panic!("{when}: read {name}: {e}"));
            assert!(&got == data, "{when}: {name} reads as {} bytes", which_file(&files, &got));
        }
    };
    check(&handles, "before any recompress");
    for size in ["64K", "256K"] {
        recompress(&m.path("r"), &format!("recordsize={size}"));
        check(&handles, &format!("after recompress to {size}"));
        names(&format!("after recompress to {size}"));
        // The names were looked up again and found the new files, while the kernel still holds
        // the old inodes the handles name.
        check(&handles, &format!("after recompress to {size} and a lookup of each name"));
        let fresh: Vec<_> = files
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (handle_of(&m.path(&format!("r/{name}"))), i, format!("after recompress to {size}")))
            .collect();
        check(&fresh, &format!("after recompress to {size}, new handles"));
        handles.extend(fresh);
        drop_caches();
        check(&handles, &format!("after recompress to {size} and drop_caches"));
        names(&format!("after recompress to {size} and drop_caches"));
    }
    m.unmount();
}

/// Whether the NFS server and client tools are here, installing them (Debian) if not.
fn nfs_tools() -> Result<(), String> {
    let vfs_fsal =
        || std::fs::read_dir("/usr/lib").into_iter().flatten().flatten().any(|d| d.path().join("ganesha/libfsalvfs.so").exists());
    let have = || ["ganesha.nfsd", "nfs-cp", "nfs-cat", "rpcbind"].iter().all(|t| which(t)) && vfs_fsal();
    if have() {
        return Ok(());
    }
    println!("installing nfs-ganesha, nfs-ganesha-vfs, libnfs-utils, rpcbind");
    let ok = Command::new("sh")
        .args(["-c", "export DEBIAN_FRONTEND=noninteractive; (apt-get install -y -qq nfs-ganesha nfs-ganesha-vfs libnfs-utils rpcbind || (apt-get update -qq && apt-get install -y -qq nfs-ganesha nfs-ganesha-vfs libnfs-utils rpcbind)) >/dev/null 2>&1"])
        .status()
        .is_ok_and(|s| s.success());
    if ok && have() {
        Ok(())
    } else {
        Err("nfs-ganesha, nfs-ganesha-vfs, libnfs-utils or rpcbind cannot be installed".into())
    }
}

fn which(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).chain(["/usr/sbin".into(), "/sbin".into()]).any(|d| d.join(tool).exists()))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Processes the test started (ganesha, rpcbind): killed on drop.
struct Servers(Vec<std::process::Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for c in self.0.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn rpcbind_running() -> bool {
    std::net::TcpStream::connect_timeout(&"127.0.0.1:111".parse().unwrap(), Duration::from_secs(1)).is_ok()
}

fn wait_for_port(port: u16, secs: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

fn sha256(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("sha256sum");
    let mut stdin = child.stdin.take().unwrap();
    let data = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    String::from_utf8(out.stdout).unwrap().split_whitespace().next().unwrap().to_string()
}

/// Runs a libnfs tool; on failure shows the end of ganesha's log (`log`).
fn nfs(log: &Path, tool: &str, args: &[&str]) -> Vec<u8> {
    let out = Command::new("timeout").arg("30").arg(tool).args(args).stderr(Stdio::piped()).output().expect(tool);
    if !out.status.success() {
        panic!("{tool} {args:?}: {}\n{}\nganesha log (end):\n{}", out.status, String::from_utf8_lossy(&out.stderr), log_tail(log));
    }
    out.stdout
}

/// The last lines of ganesha's log `log`.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().filter(|l| !l.contains("DBUS") && !l.contains("TIRPC")).collect();
    tail[tail.len().saturating_sub(15)..].join("\n")
}

/// An nfs-ganesha (VFS FSAL) set up to export `d.mnt` over NFSv3 on free ports, with rpcbind
/// started if none runs (killed on drop); `start` runs the server. One at a time: the tests
/// share rpcbind.
struct NfsServer {
    _rpcbind: Servers,
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
    work: std::path::PathBuf,
    conf: std::path::PathBuf,
    log: std::path::PathBuf,
    mnt: std::path::PathBuf,
    nfs_port: u16,
    mnt_port: u16,
}

impl NfsServer {
    fn new(d: &Dirs) -> NfsServer {
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let one_at_a_time = ONE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let work = d.root.path();
        let mut rpcbind = Servers(Vec::new());
        // libnfs finds nothing without the portmapper, and ganesha will not serve NFSv3 without
        // registering there (NFSv4 in libnfs 4.0 cannot write more than ~2 KB at a time).
        if !rpcbind_running() {
            rpcbind.0.push(Command::new("rpcbind").args(["-f", "-w"]).stderr(Stdio::null()).spawn().expect("start rpcbind"));
            assert!(wait_for_port(111, 10), "rpcbind did not start");
        }
        let (nfs_port, mnt_port) = (free_port(), free_port());
        std::fs::create_dir(work.join("recovery")).unwrap();
        let conf = work.join("ganesha.conf");
        std::fs::write(
            &conf,
            format!(
                r#"NFS_CORE_PARAM {{
    Protocols = 3;
    NFS_Port = {nfs_port};
    MNT_Port = {mnt_port};
    Bind_addr = 127.0.0.1;
    Enable_NLM = false;
    Enable_RQUOTA = false;
}}
NFSv4 {{
    Graceless = true;
    RecoveryBackend = fs;
    RecoveryRoot = "{recovery}";
}}
EXPORT {{
    Export_Id = 1;
    Path = "{mnt}";
    Pseudo = "/dense";
    Access_Type = RW;
    Squash = No_Root_Squash;
    Protocols = 3;
    Transports = TCP;
    SecType = sys;
    FSAL {{ Name = VFS; }}
}}
LOG {{ Default_Log_Level = EVENT; }}
"#,
                recovery = work.join("recovery").display(),
                mnt = d.mnt.display()
            ),
        )
        .unwrap();
        NfsServer {
            _rpcbind: rpcbind,
            _one_at_a_time: one_at_a_time,
            work: work.to_path_buf(),
            conf,
            log: work.join("ganesha.log"),
            mnt: d.mnt.clone(),
            nfs_port,
            mnt_port,
        }
    }

    fn start(&self) -> std::process::Child {
        let child = Command::new("ganesha.nfsd")
            .arg("-F")
            .arg("-f")
            .arg(&self.conf)
            .arg("-L")
            .arg(&self.log)
            .arg("-p")
            .arg(self.work.join("ganesha.pid"))
            .args(["-N", "NIV_EVENT"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ganesha.nfsd");
        assert!(
            wait_for_port(self.nfs_port, 30),
            "ganesha did not listen; log:\n{}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
        child
    }

    fn url(&self, name: &str) -> String {
        format!("nfs://127.0.0.1{}/{name}?version=3&nfsport={}&mountport={}", self.mnt.display(), self.nfs_port, self.mnt_port)
    }
}

/// nfs-ganesha (VFS FSAL) exports a densefs mount over NFSv3; libnfs's nfs-cp / nfs-cat write
/// and read through it, across dropped kernel caches and a restart of the densefs daemon.
#[test]
fn nfs_ganesha_exports_a_densefs_mount() {
    if !is_root() {
        println!("SKIP: nfs-ganesha and file handles need root");
        return;
    }
    if let Err(why) = nfs_tools() {
        println!("SKIP: {why}");
        return;
    }
    let start = Instant::now();
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let work = d.root.path();
    let nfs_server = NfsServer::new(&d);
    let log = nfs_server.log.clone();
    let start_ganesha = || nfs_server.start();
    let ganesha = Servers(vec![start_ganesha()]);
    let url = |name: &str| nfs_server.url(name);

    let one = compressible(6 << 20, 11);
    let two = common::random_bytes(1 << 20, 12);
    std::fs::write(work.join("one.fastq"), &one).unwrap();
    std::fs::write(work.join("two.bin"), &two).unwrap();
    nfs(&log, "nfs-cp", &[work.join("one.fastq").to_str().unwrap(), &url("one.fastq")]);
    assert_eq!(sha256(&nfs(&log, "nfs-cat", &[&url("one.fastq")])), sha256(&one), "read back over NFS");
    assert_eq!(sha256(&std::fs::read(m.path("one.fastq")).unwrap()), sha256(&one), "read back through the mount");

    drop_caches();
    assert_eq!(sha256(&nfs(&log, "nfs-cat", &[&url("one.fastq")])), sha256(&one), "read over NFS after drop_caches");

    // Restart the densefs daemon under the running ganesha. ganesha keeps descriptors open on
    // the mount (its export root among them), so a clean unmount is refused (busy): make the
    // data durable (fsync through the mount), detach the mount, kill the daemon, mount again.
    File::open(m.path("one.fastq")).unwrap().sync_all().unwrap();
    let status = Command::new("fusermount3").args(["-u", "-z"]).arg(&d.mnt).status().unwrap();
    assert!(status.success(), "lazy unmount");
    m.kill();
    let m = Mount::new(&d.lower, &d.mnt, "");
    let _show = Show(m.log.clone());
    // The handles ganesha holds are fine, but its descriptor of the export's root (opened at
    // startup, and the mount fd for open_by_handle_at) belongs to the dead mount: lookups and
    // reads of what it already knows may still work, anything needing the root fails with
    // ENOTCONN until ganesha opens the export again.
    let read = Command::new("timeout").arg("30").arg("nfs-cat").arg(url("one.fastq")).stderr(Stdio::null()).output().unwrap();
    println!(
        "after a densefs restart under a running ganesha: nfs-cat {}",
        if read.status.success() && sha256(&read.stdout) == sha256(&one) { "returns the right data" } else { "fails" }
    );
    let created = Command::new("timeout")
        .arg("30")
        .arg("nfs-cp")
        .arg(work.join("two.bin"))
        .arg(url("two.bin"))
        .stderr(Stdio::null())
        .status()
        .unwrap();
    println!("after a densefs restart under a running ganesha: nfs-cp (CREATE) {}", if created.success() { "works" } else { "fails" });

    // ganesha restarted (an NFS server restart): it opens the export again and reaches files
    // by the handles it stored; nothing of the earlier densefs session is left in the kernel.
    drop(ganesha);
    let ganesha = Servers(vec![start_ganesha()]);
    assert_eq!(sha256(&nfs(&log, "nfs-cat", &[&url("one.fastq")])), sha256(&one), "read over NFS after both restarted");
    nfs(&log, "nfs-cp", &[work.join("two.bin").to_str().unwrap(), &url("two.bin")]);
    assert_eq!(sha256(&nfs(&log, "nfs-cat", &[&url("two.bin")])), sha256(&two), "write after a daemon restart");
    drop_caches();
    assert_eq!(sha256(&std::fs::read(m.path("two.bin")).unwrap()), sha256(&two), "written over NFS, read through the mount");
    assert_eq!(sha256(&nfs(&log, "nfs-cat", &[&url("one.fastq")])), sha256(&one), "read over NFS at the end");

    drop(ganesha); // lets go of the mount
    drop(nfs_server);
    m.unmount();
    println!("ganesha test took {:.1}s", start.elapsed().as_secs_f64());
}

/// `densefs stat`'s record size of `file` ("64K"), or "plain".
fn record_size(file: &Path) -> String {
    let out = Command::new(common::BIN).arg("stat").arg(file).output().unwrap();
    assert!(out.status.success(), "densefs stat {}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split(", record size ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or("plain").to_string()
}

/// The names of the files in `dir` that process `pid` holds a descriptor of.
fn held_open(pid: u32, dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|target| target.parent() == Some(dir))
        .map(|target| target.file_name().unwrap().to_string_lossy().trim_end_matches(" (deleted)").to_string())
        .collect()
}

/// Files written through the mount, looked up by nfs-ganesha (its cache holds their handles and
/// directory entries, but no descriptor of them), then moved by `densefs recompress -r` into new
/// lower files, on a lower whose freed inode numbers are handed out again at once: read over
/// NFS, each gives its own bytes, never another's, and a file created over NFS lands in its own
/// file. ganesha asks densefs by the handle it cached; densefs answers ESTALE for a file it
/// replaced, ganesha drops that entry and answers the read NFS3ERR_STALE, and the next try looks
/// the name up again (ganesha does the same for files replaced behind its back on a plain ext4
/// export: its cache is its own, and no invalidation densefs sends the kernel reaches it). A
/// densefs whose old node ids named the file now at a freed number (before 0bb7f8a) serves
/// another file's bytes here. Round 1 moves all twelve files to 64K records and reads the first
/// six over NFS; round 2 moves the six ganesha never opened to 256K records, and is refused
/// (open elsewhere) only for files ganesha holds open: those it read.
#[test]
fn nfs_ganesha_across_recompress() {
    if !is_root() {
        println!("SKIP: nfs-ganesha and file handles need root");
        return;
    }
    if let Err(why) = nfs_tools() {
        println!("SKIP: {why}");
        return;
    }
    let start = Instant::now();
    let d = Dirs::new();
    let lower = d.root.path().join("small");
    let Some(_disk) = common::SmallExt4::new(&d.root.path().join("small.ext4"), &lower, 64) else {
        println!("SKIP: cannot make and loop-mount an ext4 image");
        return;
    };
    let m = Mount::new(&lower, &d.mnt, "");
    let _show = Show(m.log.clone());
    let server = NfsServer::new(&d);
    let ganesha = Servers(vec![server.start()]);
    let pid = ganesha.0[0].id();
    let mut files = distinct_files(12);
    for (name, data) in &files {
        std::fs::write(m.path(name), data).unwrap();
    }
    let all: Vec<usize> = (0..files.len()).collect();
    let (first, second): (Vec<usize>, Vec<usize>) = all.iter().partition(|&&i| i < 6);
    // nfs-cat, tried again after an error (at most twice): what it wrote last, whether that try
    // succeeded, and the errors met. Its output is cut at 4 MB (no file here is half that long).
    let cat = |name: &str| {
        let mut errors = Vec::new();
        loop {
            let out = Command::new("bash")
                .args(["-c", "set -o pipefail; timeout 10 nfs-cat \"$1\" | head -c 4000000", "-", &server.url(name)])
                .stderr(Stdio::piped())
                .output()
                .unwrap();
            if out.status.success() || errors.len() == 2 {
                if !out.status.success() {
                    errors.push(format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()));
                    errors.push(format!("ganesha log (end):\n{}", log_tail(&server.log)));
                }
                return (out.stdout, out.status.success(), errors);
            }
            errors.push(format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()));
        }
    };
    let lower_ino = |name: &str| std::fs::metadata(lower.join(name)).unwrap().ino();
    for (round, size, moved) in [(1, "64K", &all), (2, "256K", &second)] {
        // ganesha looks every file up (READDIRPLUS): its cache holds their handles.
        let listing = String::from_utf8(nfs(&server.log, "nfs-ls", &[&server.url("")])).unwrap();
        for (name, _) in &files {
            assert!(listing.split_whitespace().any(|w| w == name), "round {round}: nfs-ls lacks {name}:\n{listing}");
        }
        let held = held_open(pid, &d.mnt);
        for &i in moved {
            assert!(!held.contains(&files[i].0), "round {round}: ganesha holds {} open", files[i].0);
        }
        let before: Vec<u64> = files.iter().map(|(name, _)| lower_ino(name)).collect();
        let out =
            Command::new(common::BIN).args(["recompress", "-r", "-q", "-o", &format!("recordsize={size}")]).arg(&d.mnt).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let mut refused = BTreeSet::new();
        for line in err.lines() {
            match line.strip_suffix(": open elsewhere; close it and run again to change its record size or convert it") {
                Some(path) => refused.insert(Path::new(path).file_name().unwrap().to_string_lossy().into_owned()),
                None => {
                    assert!(line.ends_with(" files were left as they were"), "round {round}: recompress: {line}");
                    false
                }
            };
        }
        assert_eq!(out.status.success(), refused.is_empty(), "round {round}: recompress: {err}");
        let mut reused = 0;
        for (i, (name, _)) in files.iter().enumerate() {
            let (ino, records) = (lower_ino(name), record_size(&m.path(name)));
            if refused.contains(name) {
                // Only a file ganesha holds open is refused, and it stays as it was.
                assert!(held.contains(name), "round {round}: {name} refused, yet ganesha held no descriptor of it");
                assert_eq!(ino, before[i], "round {round}: {name} refused, yet moved");
            } else {
                assert!(
                    ino != before[i] && records == size,
                    "round {round}: {name} not moved to {size} records: lower inode {} -> {ino}, records {records}",
                    before[i]
                );
                reused += usize::from(before.contains(&ino));
            }
        }
        for &i in moved {
            assert!(!refused.contains(&files[i].0), "round {round}: {} refused", files[i].0);
        }
        // Without numbers moving from file to file, this test could not see a stale name.
        assert!(reused > 0, "round {round}: no file moved into a number another file had");
        println!(
            "round {round}: {} files moved to {size} records ({reused} into a number another file had), {} refused as open in ganesha",
            files.len() - refused.len(),
            refused.len()
        );
        // Over NFS: the files moved this round, whose old handles ganesha holds (and in round 2
        // also those it holds open).
        let read: &Vec<usize> = if round == 1 { &first } else { &all };
        let mut stale = 0;
        for &i in read {
            let (name, data) = &files[i];
            let (got, ok, errors) = cat(name);
            assert!(ok && &got == data, "round {round}: nfs-cat {name} gave {} (errors: {errors:?})", whose_bytes(&files, &got));
            // Only a handle densefs replaced is refused: a file left as it was reads at once.
            assert!(errors.is_empty() || !refused.contains(name), "round {round}: nfs-cat {name}, not moved: {errors:?}");
            stale += errors.len();
        }
        println!("round {round}: nfs-cat of {} files: each its own bytes, {stale} tries answered with an error first", read.len());
        // A file created over NFS (libnfs's nfs-cp creates GUARDED: it cannot write over an
        // existing file) takes a number freed by this round's moves; it and every other file read
        // their own bytes, through the mount and over NFS.
        let name = format!("w{round}.dat");
        let data = compressible(150_000 + round * 1000, 90 + round as u64);
        let local = d.root.path().join(&name);
        std::fs::write(&local, &data).unwrap();
        nfs(&server.log, "nfs-cp", &[local.to_str().unwrap(), &server.url(&name)]);
        files.push((name.clone(), data));
        for (name, data) in &files {
            let got = std::fs::read(m.path(name)).unwrap();
            assert!(
                &got == data,
                "round {round}: after nfs-cp of {}: {name} reads through the mount as {} bytes",
                files.last().unwrap().0,
                which_file(&files, &got)
            );
        }
        let (got, ok, errors) = cat(&name);
        assert!(
            ok && got == files.last().unwrap().1,
            "round {round}: nfs-cat {name} gave {} (errors: {errors:?})",
            whose_bytes(&files, &got)
        );
    }
    drop(ganesha);
    drop(server);
    m.unmount();
    println!("ganesha recompress test took {:.1}s", start.elapsed().as_secs_f64());
}

struct Show(std::path::PathBuf);
impl Drop for Show {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("densefs log:\n{}", std::fs::read_to_string(&self.0).unwrap_or_default());
        }
    }
}

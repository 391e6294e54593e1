//! Multihost protection: one writing daemon per lower directory, across machines.
//!
//! The flock in mount.rs keeps two daemons of one kernel off a lower directory, but a lower on
//! a network file system (a GlusterFS or MooseFS client, NFS) is seen by other machines whose
//! locks this kernel never sees. Two daemons writing one container corrupt it, so a writable
//! mount over such a lower keeps an *owner record* in it, `.densefs.owner`, as ZFS's multihost
//! and ext4's MMP do: it names the daemon (host, boot id, pid, mount point) and carries a
//! heartbeat counter the daemon advances every `HEARTBEAT`. A mount that finds a record of
//! another daemon:
//! - on this machine (same boot and pid namespace): refuses while that pid is a densefs, takes
//!   the record over at once when it is gone (a killed daemon);
//! - elsewhere: watches the counter for `TAKEOVER_AFTER`; refuses if it moves, takes over if
//!   it stands still (that machine stopped or crashed).
//!
//! The record is plain text, so `cat LOWER/.densefs.owner` tells a person who holds a lower. A
//! clean unmount removes it. A daemon that finds its record replaced (it stalled for longer than
//! `TAKEOVER_AFTER` and another took over) remounts itself read-only and says so.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const OWNER_FILE: &str = ".densefs.owner";

/// How often the owner advances its heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// How long another machine's heartbeat must stand still before its record is taken over: five
/// beats, so that a network hiccup of a few seconds does not hand a live lower to a second daemon.
pub const TAKEOVER_AFTER: Duration = Duration::from_secs(10);

/// `multihost=auto|on|off`: whether a writable mount keeps an owner record in its lower.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Multihost {
    /// On when the lower is on a network or FUSE file system, which other machines may mount.
    #[default]
    Auto,
    On,
    Off,
}

impl Multihost {
    pub fn parse(value: Option<&str>) -> Result<Multihost, String> {
        match value {
            None | Some("on") => Ok(Multihost::On),
            Some("off") => Ok(Multihost::Off),
            Some("auto") => Ok(Multihost::Auto),
            Some(v) => Err(format!("invalid multihost '{v}' (auto, on or off)")),
        }
    }

    /// Does a writable mount of `lower` keep an owner record?
    pub fn applies_to(self, lower: &Path) -> bool {
        match self {
            Multihost::On => true,
            Multihost::Off => false,
            Multihost::Auto => shared_file_system(lower).unwrap_or(false),
        }
    }
}

/// Is `dir` on a file system other machines can mount too (network, cluster or FUSE)?
fn shared_file_system(dir: &Path) -> Option<bool> {
    let c = super::mount::cpath(dir);
    // SAFETY: statfs fills the zeroed struct from a NUL-terminated path that lives across the call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    const SHARED: [i64; 10] = [
        0x6969,      // NFS
        0xFF53_4D42, // CIFS
        0xFE53_4D42, // SMB2
        0x6573_5546, // FUSE (GlusterFS, MooseFS, SSHFS, ...)
        0x00C3_6400, // Ceph
        0x0102_1997, // 9P
        0x5346_414F, // AFS
        0x0116_1970, // GFS2
        0x7461_636F, // OCFS2
        0x0BD0_0BD0, // Lustre
    ];
    Some(SHARED.contains(&(st.f_type as i64)))
}

/// Who holds a lower directory: the parsed owner record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub host: String,
    pub boot_id: String,
    pub pid_ns: String,
    pub pid: u32,
    pub mountpoint: String,
    pub nonce: String,
    pub beat: u64,
}

impl Owner {
    /// This process, about to serve `mountpoint`.
    fn this_process(mountpoint: &Path) -> Owner {
        Owner {
            host: read_trimmed("/proc/sys/kernel/hostname").unwrap_or_else(|| "unknown".into()),
            boot_id: boot_id(),
            pid_ns: pid_namespace(),
            pid: std::process::id(),
            mountpoint: mountpoint.display().to_string(),
            nonce: random_nonce(),
            beat: 0,
        }
    }

    /// The record's text. The counter has a fixed width so that a beat rewrites the same bytes
    /// in place and a reader never sees a shorter file with a stale tail.
    pub fn encode(&self) -> String {
        format!(
            "densefs owner record 1\nhost={}\nboot_id={}\npid_ns={}\npid={}\nmountpoint={}\nnonce={}\nbeat={:020}\n",
            self.host.replace('\n', " "),
            self.boot_id,
            self.pid_ns,
            self.pid,
            self.mountpoint.replace('\n', " "),
            self.nonce,
            self.beat
        )
    }

    pub fn parse(text: &str) -> Option<Owner> {
        let mut lines = text.lines();
        if lines.next()? != "densefs owner record 1" {
            return None;
        }
        let fields: std::collections::HashMap<&str, &str> = lines.filter_map(|l| l.split_once('=')).collect();
        let get = |k: &str| fields.get(k).map(|v| v.to_string());
        Some(Owner {
            host: get("host")?,
            boot_id: get("boot_id")?,
            pid_ns: get("pid_ns")?,
            pid: get("pid")?.parse().ok()?,
            mountpoint: get("mountpoint")?,
            nonce: get("nonce")?,
            beat: get("beat")?.parse().ok()?,
        })
    }

    fn same_machine(&self, other: &Owner) -> bool {
        self.boot_id == other.boot_id && self.pid_ns == other.pid_ns
    }

    fn describe(&self) -> String {
        format!("host {} (pid {}, mounted at {})", self.host, self.pid, self.mountpoint)
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

fn boot_id() -> String {
    read_trimmed("/proc/sys/kernel/random/boot_id").unwrap_or_else(|| "unknown".into())
}

/// Pids mean something only within one pid namespace (a container has its own).
fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid").map(|p| p.display().to_string()).unwrap_or_else(|_| "unknown".into())
}

fn random_nonce() -> String {
    let mut bytes = [0u8; 16];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).is_err() {
        // Without /dev/urandom: the time and pid still tell two daemons apart.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        bytes[..8].copy_from_slice(&(t.as_nanos() as u64).to_le_bytes());
        bytes[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Is `pid` (in this pid namespace) a running densefs?
pub(super) fn densefs_running(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|cmd| {
            let argv0 = cmd.split(|&b| b == 0).next().unwrap_or_default();
            Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(argv0))
                .file_name()
                .is_some_and(|n| n.to_string_lossy().contains("densefs"))
        })
        .unwrap_or(false)
}

/// This daemon's hold on a lower directory; removed from the lower when released.
#[derive(Debug)]
pub struct Lease {
    path: PathBuf,
    me: std::sync::Mutex<Owner>,
    lost: std::sync::atomic::AtomicBool,
}

/// Why a lower cannot be taken.
#[derive(Debug)]
pub enum Refusal {
    InUse(Box<Owner>),
    Io(std::io::Error),
}

impl Refusal {
    pub fn message(&self, lower: &Path) -> String {
        match self {
            Refusal::InUse(o) => format!(
                "{} is in use by another densefs daemon: {}. Two daemons writing one lower directory \
                 corrupt each other's files. Unmount it there first, or mount this one read-only (-o ro). \
                 If that machine is gone, mount again: its record ({}) is taken over once its heartbeat \
                 has stood still for {} s.",
                lower.display(),
                o.describe(),
                lower.join(OWNER_FILE).display(),
                TAKEOVER_AFTER.as_secs()
            ),
            Refusal::Io(e) => format!("cannot keep the owner record {}: {e}", lower.join(OWNER_FILE).display()),
        }
    }
}

impl From<std::io::Error> for Refusal {
    fn from(e: std::io::Error) -> Refusal {
        Refusal::Io(e)
    }
}

fn read_owner(path: &Path) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Watches the record for `period`: its new text (None if removed) as soon as it differs from
/// `text`, or None if it stood still.
fn changes_within(path: &Path, text: &str, period: Duration) -> std::io::Result<Option<Option<String>>> {
    let start = Instant::now();
    while start.elapsed() < period {
        std::thread::sleep(HEARTBEAT.min(period) / 4);
        let now = read_owner(path)?;
        if now.as_deref() != Some(text) {
            return Ok(Some(now));
        }
    }
    Ok(None)
}

/// Writes `text` over the record in place (same length every beat) and closes it, which
/// network clients take as the moment to send it (GlusterFS's write-behind flushes on close).
fn write_in_place(path: &Path, text: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_data()
}

/// Writes a new record through a temporary file and a rename, so a reader sees the old record
/// or the new one, never a mix.
fn replace(path: &Path, text: &str, nonce: &str) -> std::io::Result<()> {
    let tmp = path.with_file_name(format!("{OWNER_FILE}.{nonce}"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_data()?;
    drop(f);
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

impl Lease {
    /// Takes `lower` for a daemon that will serve `mountpoint`, or says who holds it. May wait
    /// `takeover_after` to see whether another machine's record is still beating (`waiting` is
    /// told first, so a person knows why the mount pauses).
    pub fn acquire(lower: &Path, mountpoint: &Path, takeover_after: Duration, waiting: impl Fn(&Owner)) -> Result<Lease, Refusal> {
        let path = lower.join(OWNER_FILE);
        let me = Owner::this_process(mountpoint);
        // A free lower: create the record exclusively, so two mounts racing for it cannot both win.
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut f) => {
                f.write_all(me.encode().as_bytes())?;
                f.sync_data()?;
                return Ok(Lease::held(path, me));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e.into()),
        }
        let Some(text) = read_owner(&path)? else {
            // Removed between the create and the read (its daemon just unmounted): try once more.
            return Lease::acquire(lower, mountpoint, takeover_after, waiting);
        };
        match Owner::parse(&text) {
            Some(holder) if holder.same_machine(&me) && holder.pid != me.pid && densefs_running(holder.pid) => {
                return Err(Refusal::InUse(Box::new(holder)));
            }
            // This machine's daemon is gone (killed): nothing can be beating it.
            Some(holder) if holder.same_machine(&me) => {}
            // Another machine's, or unreadable (torn by a crash, or a read that met a write):
            // only a counter that stands still shows that nobody is there.
            other => {
                if let Some(holder) = &other {
                    waiting(holder);
                }
                if let Some(changed) = changes_within(&path, &text, takeover_after)? {
                    let now = changed.as_deref().and_then(Owner::parse).or(other);
                    return Err(now.map_or_else(
                        || Refusal::Io(std::io::Error::other("its owner record keeps changing")),
                        |o| Refusal::InUse(Box::new(o)),
                    ));
                }
            }
        }
        replace(&path, &me.encode(), &me.nonce)?;
        // Two mounts taking over one stale record at once: the later rename wins; the earlier
        // sees that here.
        std::thread::sleep(HEARTBEAT / 4);
        match read_owner(&path)?.and_then(|t| Owner::parse(&t)) {
            Some(now) if now.nonce == me.nonce => Ok(Lease::held(path, me)),
            Some(now) => Err(Refusal::InUse(Box::new(now))),
            None => Err(Refusal::Io(std::io::Error::other("the owner record vanished while taking it over"))),
        }
    }

    fn held(path: PathBuf, me: Owner) -> Lease {
        Lease { path, me: std::sync::Mutex::new(me), lost: Default::default() }
    }

    /// Names the calling process in the record: `densefs mount` takes the lower before it forks
    /// the daemon, and the record must name the process that goes on serving.
    pub fn adopt(&self) -> std::io::Result<()> {
        let mut me = self.me.lock().unwrap_or_else(|e| e.into_inner());
        if me.pid == std::process::id() {
            return Ok(());
        }
        me.pid = std::process::id();
        replace(&self.path, &me.encode(), &me.nonce)
    }

    /// One heartbeat: checks the record is still this daemon's and advances its counter. Returns
    /// false (and remembers) once another daemon has taken the lower over.
    pub fn beat(&self) -> bool {
        if self.lost.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        let mut me = self.me.lock().unwrap_or_else(|e| e.into_inner());
        match read_owner(&self.path) {
            Ok(Some(text)) if Owner::parse(&text).is_some_and(|o| o.nonce == me.nonce) => {}
            Ok(_) => {
                self.lost.store(true, std::sync::atomic::Ordering::SeqCst);
                return false;
            }
            // The lower did not answer (a network outage): try again next beat.
            Err(e) => {
                tracing::warn!("owner record {}: {e}", self.path.display());
                return true;
            }
        }
        me.beat += 1;
        if let Err(e) = write_in_place(&self.path, &me.encode()) {
            tracing::warn!("owner record {}: heartbeat not written: {e}", self.path.display());
        }
        true
    }

    /// Removes the record if it is still this daemon's (a clean unmount).
    pub fn release(&self) {
        let me = self.me.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(Some(text)) = read_owner(&self.path) {
            if Owner::parse(&text).is_some_and(|o| o.nonce == me.nonce) {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn other_machine(beat: u64) -> Owner {
        Owner {
            host: "elsewhere".into(),
            boot_id: "00000000-0000-0000-0000-000000000000".into(),
            pid_ns: "pid:[1]".into(),
            pid: 4242,
            mountpoint: "/mnt/far".into(),
            nonce: "feed".into(),
            beat,
        }
    }

    #[test]
    fn a_record_round_trips_and_keeps_its_length_as_it_beats() {
        let mut o = Owner::this_process(Path::new("/mnt/x"));
        let len = o.encode().len();
        assert_eq!(Owner::parse(&o.encode()), Some(o.clone()));
        o.beat = 123_456_789;
        assert_eq!(o.encode().len(), len);
        assert_eq!(Owner::parse("something else\nhost=x\n"), None);
    }

    #[test]
    fn a_free_lower_is_taken_and_released() {
        let d = dir();
        let lease = Lease::acquire(d.path(), Path::new("/mnt/x"), TAKEOVER_AFTER, |_| panic!("no wait")).unwrap();
        let text = std::fs::read_to_string(d.path().join(OWNER_FILE)).unwrap();
        assert!(text.contains(&format!("pid={}", std::process::id())), "{text}");
        assert!(lease.beat());
        assert!(std::fs::read_to_string(d.path().join(OWNER_FILE)).unwrap().contains("beat=00000000000000000001"));
        lease.release();
        assert!(!d.path().join(OWNER_FILE).exists());
    }

    #[test]
    fn a_live_densefs_on_this_machine_is_refused_and_a_dead_one_taken_over_at_once() {
        let d = dir();
        let mut holder = Owner::this_process(Path::new("/mnt/a"));
        holder.pid = u32::MAX - 1; // no such process: its daemon was killed
        holder.nonce = "old".into();
        std::fs::write(d.path().join(OWNER_FILE), holder.encode()).unwrap();
        let start = Instant::now();
        Lease::acquire(d.path(), Path::new("/mnt/b"), TAKEOVER_AFTER, |_| panic!("no wait on this machine")).unwrap();
        assert!(start.elapsed() < TAKEOVER_AFTER / 2);
        // A live pid is refused only if it is a densefs (the mount tests refuse a real daemon).
        assert!(densefs_running(std::process::id()), "this test binary is named densefs-*");
        assert!(!densefs_running(1), "pid 1 (init) counted as a densefs");
    }

    #[test]
    fn another_machines_beating_record_is_refused_and_a_still_one_taken_over() {
        let d = dir();
        let path = d.path().join(OWNER_FILE);
        std::fs::write(&path, other_machine(7).encode()).unwrap();
        // Beating: a thread advances the counter as a live daemon elsewhere would.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (p, s) = (path.clone(), stop.clone());
        let beater = std::thread::spawn(move || {
            let mut beat = 8;
            while !s.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
                std::fs::write(&p, other_machine(beat).encode()).unwrap();
                beat += 1;
            }
        });
        let told = std::sync::atomic::AtomicBool::new(false);
        let err = Lease::acquire(d.path(), Path::new("/mnt/b"), Duration::from_secs(2), |o| {
            assert_eq!(o.host, "elsewhere");
            told.store(true, std::sync::atomic::Ordering::SeqCst);
        })
        .unwrap_err();
        assert!(told.load(std::sync::atomic::Ordering::SeqCst));
        let msg = err.message(d.path());
        assert!(msg.contains("host elsewhere (pid 4242, mounted at /mnt/far)"), "{msg}");
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        beater.join().unwrap();
        // Standing still: taken over after the wait, and the old holder's beat sees it lost.
        let start = Instant::now();
        let lease = Lease::acquire(d.path(), Path::new("/mnt/b"), Duration::from_secs(1), |_| {}).unwrap();
        assert!(start.elapsed() >= Duration::from_secs(1));
        assert!(Owner::parse(&std::fs::read_to_string(&path).unwrap()).unwrap().pid == std::process::id());
        std::fs::write(&path, other_machine(99).encode()).unwrap();
        assert!(!lease.beat(), "a replaced record is lost");
        lease.release();
        assert!(path.exists(), "release leaves another daemon's record alone");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1, "no temporary record left behind");
    }
}

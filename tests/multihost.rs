//! Multihost protection (src/cli/owner.rs): a lower directory that other machines can mount (a
//! network file system) is written by one daemon at a time. Another machine's mount of the same
//! directory is simulated by a second lower holding a copy of the first one's owner record,
//! which is what a second network client sees; the GlusterFS deployment of `scripts/cluster`
//! tries the real thing.

mod common;

use common::{wait_until, Dirs, Mount, BIN};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const OWNER: &str = ".densefs.owner";

fn record(lower: &Path) -> String {
    std::fs::read_to_string(lower.join(OWNER)).unwrap_or_default()
}

fn field(record: &str, key: &str) -> String {
    record.lines().find_map(|l| l.strip_prefix(&format!("{key}="))).unwrap_or_default().to_string()
}

/// `densefs mount` in the background (the daemon forks), as a user runs it.
fn mount_bg(lower: &Path, mnt: &Path, options: &str) -> Output {
    Command::new(BIN).args(["mount", "-o", options]).arg(lower).arg(mnt).output().expect("run densefs mount")
}

fn umount(mnt: &Path) {
    let ok = Command::new(BIN).arg("umount").arg(mnt).status().unwrap().success();
    assert!(ok, "densefs umount {}", mnt.display());
}

#[test]
fn a_shared_lower_keeps_an_owner_record_that_names_the_daemon_beats_and_goes_at_unmount() {
    let d = Dirs::new();
    // In the background: `densefs mount` takes the lower, then forks the daemon, which must be
    // the process the record names (the parent has exited by then).
    let out = mount_bg(&d.lower, &d.mnt, "multihost=on");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let first = record(&d.lower);
    let pid = field(&first, "pid");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(String::from_utf8_lossy(&cmdline).contains("densefs"), "record names pid {pid}, not the daemon: {first}");
    assert_eq!(field(&first, "mountpoint"), d.mnt.display().to_string());
    assert!(!std::fs::read_dir(&d.mnt).unwrap().any(|e| e.unwrap().file_name() == OWNER), "the record shows in the mount");
    wait_until("the heartbeat advances", || field(&record(&d.lower), "beat").parse::<u64>().unwrap_or(0) >= 1);
    umount(&d.mnt);
    wait_until("the daemon exits and removes its record", || !d.lower.join(OWNER).exists());

    // multihost=auto on a local lower keeps no record (the flock covers one machine).
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert!(!d.lower.join(OWNER).exists());
    m.unmount();
}

#[test]
fn a_second_daemon_is_refused_while_the_owner_lives_and_takes_over_once_it_is_killed() {
    let (a, b) = (Dirs::new(), Dirs::new());
    let first = Mount::new(&a.lower, &a.mnt, "multihost=on");
    std::fs::write(first.path("data"), b"written through the first mount").unwrap();
    // The second client's view of the same directory: the first daemon's record.
    std::fs::copy(a.lower.join(OWNER), b.lower.join(OWNER)).unwrap();

    let refused = mount_bg(&b.lower, &b.mnt, "multihost=on");
    let msg = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a second writable mount was allowed");
    let pid = first.child.as_ref().unwrap().id();
    assert!(msg.contains("in use by another densefs daemon") && msg.contains(&format!("pid {pid}")), "unclear refusal: {msg}");
    assert!(msg.contains(&a.mnt.display().to_string()), "the refusal does not say where it is mounted: {msg}");
    assert_eq!(field(&record(&b.lower), "pid"), pid.to_string(), "the refused mount changed the owner's record");

    // Read-only is allowed: it writes nothing.
    let ro = Mount::new(&b.lower, &b.mnt, "ro,multihost=on");
    assert_eq!(field(&record(&b.lower), "pid"), pid.to_string(), "a read-only mount took the record");
    ro.unmount();

    // Once the owner is gone (killed: its record stays), the next mount takes over at once.
    first.kill();
    let start = Instant::now();
    let second = Mount::new(&b.lower, &b.mnt, "multihost=on");
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?} to take over a dead daemon's record", start.elapsed());
    assert_eq!(field(&record(&b.lower), "pid"), second.child.as_ref().unwrap().id().to_string());
    second.unmount();
}

#[test]
fn another_machines_record_is_taken_over_once_its_heartbeat_has_stood_still() {
    let d = Dirs::new();
    let stale = "densefs owner record 1\nhost=elsewhere\nboot_id=00000000-0000-0000-0000-000000000000\npid_ns=pid:[1]\n\
                 pid=4242\nmountpoint=/mnt/far\nnonce=feed\nbeat=00000000000000000007\n";
    std::fs::write(d.lower.join(OWNER), stale).unwrap();
    let start = Instant::now();
    let out = mount_bg(&d.lower, &d.mnt, "multihost=on");
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{msg}");
    assert!(start.elapsed() >= Duration::from_secs(10), "took the record over without watching it");
    assert!(msg.contains("host elsewhere (pid 4242)") && msg.contains("watching its heartbeat"), "the wait was not explained: {msg}");
    assert_eq!(field(&record(&d.lower), "host"), std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim());
    umount(&d.mnt);
    wait_until("the record goes", || !d.lower.join(OWNER).exists());
}

//! Security: permissions are enforced for other users (default_permissions, allow_other), the
//! daemon never reaches outside the lower directory, and setuid files and devices follow
//! nosuid/nodev. Runs as root and acts as `nobody` through runuser.

mod common;

use common::{Dirs, Mount};
use std::fs;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

fn as_nobody(args: &[&str]) -> Output {
    Command::new("runuser").args(["-u", "nobody", "--"]).args(args).output().expect("runuser")
}

fn open_to_everyone(d: &Dirs) {
    for p in [d.root.path(), &d.mnt, &d.lower] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// A plain directory beside the lower one, on its file system: what it answers is what densefs
/// must answer.
fn reference_dir(d: &Dirs, name: &str, mode: u32) -> std::path::PathBuf {
    let dir = d.root.path().join(name);
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn other_users_get_exactly_the_access_the_modes_give() {
    let d = Dirs::new();
    open_to_everyone(&d);
    // A file the lower directory already denies to others.
    fs::write(d.lower.join("lower_secret"), b"lower secret").unwrap();
    fs::set_permissions(d.lower.join("lower_secret"), fs::Permissions::from_mode(0o600)).unwrap();
    let m = Mount::new(&d.lower, &d.mnt, "");
    fs::write(m.path("public"), b"public").unwrap();
    fs::set_permissions(m.path("public"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(m.path("secret")).unwrap();
    fs::write(m.path("secret"), b"secret").unwrap();
    fs::create_dir(m.path("private")).unwrap();
    fs::set_permissions(m.path("private"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(m.path("private/inner"), b"inner").unwrap();
    let out = as_nobody(&["cat", s(&m.path("public"))]);
    assert!(out.status.success(), "nobody cannot read a 0644 file: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, b"public");
    for denied in [m.path("secret"), m.path("lower_secret"), m.path("private/inner")] {
        let out = as_nobody(&["cat", s(&denied)]);
        assert!(!out.status.success() && out.stdout.is_empty(), "nobody read {}", denied.display());
        assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(!as_nobody(&["ls", s(&m.path("private"))]).status.success());
    assert!(!as_nobody(&["sh", "-c", &format!("echo x >> {}", s(&m.path("public")))]).status.success(), "nobody wrote a 0644 root file");
    assert!(!as_nobody(&["touch", s(&m.path("new"))]).status.success(), "nobody created a file in a 0755 root directory");
    assert!(!as_nobody(&["chmod", "666", s(&m.path("public"))]).status.success(), "nobody changed root's mode");
    // densefs's own xattr interface obeys the same rules: no property changes by others.
    assert!(!as_nobody(&["setfattr", "-n", "user.densefs.compression", "-v", "gzip-9", s(&m.mnt)]).status.success());
    assert_eq!(fs::read(m.path("public")).unwrap(), b"public");
    m.unmount();
}

#[test]
fn the_daemon_never_follows_a_path_out_of_the_lower_directory() {
    let d = Dirs::new();
    let outside = d.root.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("f"), b"outside, must not change").unwrap();
    fs::create_dir(d.lower.join("d")).unwrap();
    let m = Mount::new(&d.lower, &d.mnt, "");
    fs::write(m.path("d/f"), b"inside").unwrap();
    let handle = fs::OpenOptions::new().read(true).write(true).open(m.path("d/f")).unwrap();
    // Behind the daemon's back, the directory becomes a symlink to a directory outside.
    fs::rename(d.lower.join("d"), d.lower.join("d_old")).unwrap();
    std::os::unix::fs::symlink(&outside, d.lower.join("d")).unwrap();
    // The open handle keeps writing the file it opened, never the one the new path leads to.
    use std::os::unix::fs::FileExt;
    handle.write_all_at(b"INSIDE", 0).unwrap();
    handle.sync_all().unwrap();
    drop(handle);
    assert_eq!(fs::read(outside.join("f")).unwrap(), b"outside, must not change");
    // recompress with a name hint pointing out of the directory does not touch it either.
    let _ = Command::new("setfattr")
        .args(["-n", "user.densefs.recompress", "-v", "name=../../outside/f,recordsize=4K"])
        .arg(m.path("d_old/f"))
        .status();
    assert_eq!(fs::read(outside.join("f")).unwrap(), b"outside, must not change");
    // The symlink is served as a symlink (its target string), not followed by the daemon.
    std::thread::sleep(std::time::Duration::from_millis(1200)); // past the kernel's entry TTL
    assert_eq!(fs::read_link(m.path("d")).unwrap(), outside);
    assert!(fs::symlink_metadata(m.path("d")).unwrap().file_type().is_symlink());
    m.unmount();
    assert_eq!(fs::read(outside.join("f")).unwrap(), b"outside, must not change");
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(fs::read(m.path("d_old/f")).unwrap(), b"INSIDE");
    m.unmount();
}

#[test]
fn setuid_files_and_devices_follow_nosuid_and_nodev() {
    let d = Dirs::new();
    open_to_everyone(&d);
    let m = Mount::new(&d.lower, &d.mnt, "");
    let entry = densefs::cli::mountinfo::mountinfo().into_iter().find(|e| e.point == m.mnt).unwrap();
    let flags = entry.mount_options;
    assert!(flags.contains("nosuid") && flags.contains("nodev"), "mount flags: {flags}");
    // A setuid-root copy of id(1) does not make nobody root.
    fs::copy("/usr/bin/id", m.path("id")).unwrap();
    fs::set_permissions(m.path("id"), fs::Permissions::from_mode(0o4755)).unwrap();
    let out = as_nobody(&[s(&m.path("id")), "-u"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_ne!(String::from_utf8_lossy(&out.stdout).trim(), "0", "setuid worked on a nosuid mount");
    // A device node can be made (root) but not opened through a nodev mount.
    let ok = Command::new("mknod").arg(m.path("zero")).args(["c", "1", "5"]).status().unwrap();
    assert!(ok.success());
    let err = fs::File::open(m.path("zero")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EACCES), "opened a device on a nodev mount");
    m.unmount();
}

/// Writes and truncates by a user without CAP_FSETID drop setuid (and setgid where the group
/// may execute), exactly as on the lower file system itself; root's writes keep them.
#[test]
fn writes_by_other_users_clear_setuid_and_setgid_as_on_ext4() {
    use std::os::unix::fs::chown;
    let d = Dirs::new();
    open_to_everyone(&d);
    let reference = reference_dir(&d, "ext4", 0o777);
    let m = Mount::new(&d.lower, &d.mnt, "");
    let nobody = 65534;
    // (name, mode, what nobody does to it)
    let cases: [(&str, u32, &str); 6] = [
        ("append", 0o6775, "echo more >> \"$1\""),
        ("no_group_exec", 0o6764, "echo more >> \"$1\""),
        ("truncate_down", 0o4777, "truncate -s 3 \"$1\""),
        ("truncate_up", 0o2775, "truncate -s 100000 \"$1\""),
        ("o_trunc", 0o4755, ": > \"$1\""),
        ("overwrite", 0o6777, "printf zz | dd of=\"$1\" conv=notrunc status=none"),
    ];
    for dir in [&reference, &d.mnt] {
        for (name, mode, _) in &cases {
            let p = dir.join(name);
            fs::write(&p, b"some data").unwrap();
            chown(&p, Some(nobody), Some(nobody)).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(*mode)).unwrap();
        }
        // Root's own write keeps the bits (CAP_FSETID).
        let p = dir.join("root_writes");
        fs::write(&p, b"x").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o6775)).unwrap();
        fs::OpenOptions::new().append(true).open(&p).unwrap().write_all_at(b"more", 1).unwrap();
        for (name, _, action) in &cases {
            let out = as_nobody(&["sh", "-c", action, "sh", s(&dir.join(name))]);
            assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    // File capabilities go with any write by another user, on ext4 and through densefs.
    for dir in [&reference, &d.mnt] {
        let p = dir.join("capable");
        // Created exclusively: densefs then knows it has no capabilities until setcap says otherwise.
        fs::OpenOptions::new().write(true).create_new(true).open(&p).unwrap().write_all_at(b"#!/bin/sh\n", 0).unwrap();
        chown(&p, Some(nobody), Some(nobody)).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o777)).unwrap();
        let out = Command::new("setcap").args(["cap_net_raw+ep", s(&p)]).output().expect("setcap (libcap2-bin)");
        assert!(out.status.success(), "setcap: {}", String::from_utf8_lossy(&out.stderr));
        let caps = || String::from_utf8_lossy(&Command::new("getcap").arg(&p).output().unwrap().stdout).into_owned();
        assert!(caps().contains("cap_net_raw"), "{}", caps());
        assert!(as_nobody(&["sh", "-c", "echo more >> \"$1\"", "sh", s(&p)]).status.success());
        assert_eq!(caps(), "", "{}: a write by another user keeps the file's capabilities", p.display());
    }
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    for name in cases.iter().map(|c| c.0).chain(["root_writes"]) {
        assert_eq!(mode(&m.path(name)), mode(&reference.join(name)), "{name}: densefs vs ext4");
    }
    assert_eq!(mode(&m.path("append")) & 0o6000, 0, "ext4 itself cleared them");
    assert_eq!(mode(&m.path("root_writes")), 0o6775);
    // And the lower files agree with what the mount shows.
    for name in cases.iter().map(|c| c.0) {
        assert_eq!(mode(&d.lower.join(name)), mode(&m.path(name)), "{name}: lower");
    }
    m.unmount();
}

/// POSIX ACLs and umasks behave as on the lower file system. The same steps run in a plain
/// directory of the lower's file system and through the mount, and must give the same modes,
/// ACLs and access: a named-user entry grants `nobody` a file its mode refuses, another
/// refuses one its mode grants, chmod moves the mask, removing the ACL takes the grant back, a
/// directory's default ACL is inherited (the creator's umask then ignored) and, without one,
/// the creator's umask applies.
#[test]
fn acls_and_umasks_work_as_on_the_lower_file_system() {
    let d = Dirs::new();
    open_to_everyone(&d);
    let reference = reference_dir(&d, "reference", 0o755);
    let steps = |dir: &Path| -> Vec<String> {
        let sh = |script: &str| {
            let out = Command::new("sh").arg("-c").arg(script).current_dir(dir).output().expect("sh");
            assert!(out.status.success(), "{script} in {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
            String::from_utf8(out.stdout).unwrap()
        };
        let nobody_reads = |name: &str| format!("nobody reads {name}: {}", as_nobody(&["cat", s(&dir.join(name))]).status.success());
        let mut seen = Vec::new();
        sh("echo secret > f; chmod 600 f; setfacl -m u:nobody:r f; echo open > g; chmod 644 g; setfacl -m u:nobody:- g");
        seen.push(nobody_reads("f"));
        seen.push(nobody_reads("g"));
        sh("(umask 077; touch u077; mkdir d077; mkfifo p077); (umask 022; touch u022; mkdir d022)");
        sh("mkdir dacl; setfacl -d -m u:nobody:rwx,g::r-x dacl; (umask 077; touch dacl/inh; mkdir dacl/sub)");
        seen.extend(
            sh("stat -c '%n %a' u077 d077 p077 u022 d022 dacl/inh dacl/sub; getfacl -p f g dacl/inh dacl/sub").lines().map(String::from),
        );
        sh("chmod 640 f");
        seen.push(sh("getfacl -p f"));
        seen.push(nobody_reads("f"));
        sh("setfacl -b f");
        seen.push(nobody_reads("f"));
        seen.push(sh("stat -c '%n %a' f; getfacl -p f"));
        seen
    };
    let want = steps(&reference);
    // What the comparison rests on: the lower's own answers are the interesting ones.
    assert!(want.contains(&"nobody reads f: true".to_string()) && want.contains(&"nobody reads g: false".to_string()), "{want:#?}");
    assert!(want.contains(&"dacl/inh 664".to_string()) && want.contains(&"u077 600".to_string()), "{want:#?}");
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(steps(&d.mnt), want, "through the mount");
    fs::write(m.path("h"), b"shared").unwrap();
    fs::set_permissions(m.path("h"), fs::Permissions::from_mode(0o600)).unwrap();
    assert!(Command::new("setfacl").args(["-m", "u:nobody:r", s(&m.path("h"))]).status().unwrap().success());
    m.unmount();
    // After a remount (the kernel's cached ACLs gone), the ACLs read from the lower still count.
    let m = Mount::new(&d.lower, &d.mnt, "");
    assert_eq!(as_nobody(&["cat", s(&m.path("h"))]).stdout, b"shared", "nobody reads h (mode 600, ACL u:nobody:r) after a remount");
    assert!(!as_nobody(&["cat", s(&m.path("g"))]).status.success(), "nobody reads g (mode 644, ACL u:nobody:---) after a remount");
    m.unmount();
}

/// Runs `script` (sh, the file as $1) as `actor`: a user id and group list through setpriv, or
/// root with or without CAP_FSETID. Returns whether it succeeded.
fn as_actor(actor: &str, script: &str, file: &Path) -> bool {
    let mut cmd = Command::new("setpriv");
    match actor {
        "owner" => cmd.args(["--reuid=4000", "--regid=4000", "--clear-groups"]),
        "group member" => cmd.args(["--reuid=4001", "--regid=4001", "--groups=4000"]),
        "other" => cmd.args(["--reuid=4002", "--regid=4002", "--clear-groups"]),
        // Root's exec takes its capabilities from the bounding set.
        "root without CAP_FSETID" => cmd.args(["--bounding-set=-fsetid"]),
        "root" => &mut cmd,
        _ => unreachable!("{actor}"),
    };
    let out = cmd.args(["sh", "-c", script, "sh"]).arg(file).output().expect("setpriv (util-linux)");
    out.status.success()
}

/// What each change of contents leaves of setuid and setgid, beside ext4 on the running kernel
/// (6.18), for a file of uid 4000, gid 4000 with 16 KiB of data. What ext4 did there (the mode
/// after, by mode before):
///
/// | who \ mode              | 6666 | 6676 | 2666 | 4666 |
/// |-------------------------|------|------|------|------|
/// | owner (in the group)    | 2666 | 0676 | 2666 | 0666 |
/// | group member (2nd list) | 2666 | 0676 | 2666 | 0666 |
/// | other (not in group)    | 0666 | 0676 | 0666 | 0666 |
/// | root without CAP_FSETID | 0666 | 0676 | 0666 | 0666 |
/// | root                    | 6666 | 6676 | 2666 | 4666 |
///
/// the same for every operation: write, fallocate (mode 0, PUNCH_HOLE, ZERO_RANGE), ftruncate
/// and an O_TRUNC open. setgid stays where the group cannot execute only for a writer in the
/// file's group (the kernel's `setattr_should_drop_sgid`). densefs kept setgid on every write
/// to a file whose group cannot execute, and fallocate cleared nothing.
#[test]
fn every_change_of_contents_clears_setuid_and_setgid_as_on_ext4() {
    use std::os::unix::fs::chown;
    let d = Dirs::new();
    open_to_everyone(&d);
    let reference = reference_dir(&d, "ext4", 0o777);
    let m = Mount::new(&d.lower, &d.mnt, "");
    let ops = [
        ("write", "xfs_io -c 'pwrite -q 4k 4k' \"$1\""),
        ("fallocate", "xfs_io -c 'falloc 64k 64k' \"$1\""),
        ("punch hole", "xfs_io -c 'fpunch 0 4k' \"$1\""),
        ("zero range", "xfs_io -c 'fzero 0 4k' \"$1\""),
        ("ftruncate", "xfs_io -c 'truncate 8k' \"$1\""),
        ("O_TRUNC", ": > \"$1\""),
    ];
    let actors = ["owner", "group member", "other", "root without CAP_FSETID", "root"];
    let modes = [0o6666, 0o6676, 0o2666, 0o4666];
    let outcomes = |dir: &Path| {
        let mut seen = Vec::new();
        for (i, (op, script)) in ops.iter().enumerate() {
            for (j, actor) in actors.iter().enumerate() {
                for (k, mode) in modes.iter().enumerate() {
                    let p = dir.join(format!("f{i}{j}{k}"));
                    fs::write(&p, vec![7u8; 16 << 10]).unwrap();
                    chown(&p, Some(4000), Some(4000)).unwrap();
                    fs::set_permissions(&p, fs::Permissions::from_mode(*mode)).unwrap();
                    let ok = as_actor(actor, script, &p);
                    let after = fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
                    seen.push(format!("{op} by {actor} on {mode:o}: {} {after:o}", if ok { "done" } else { "FAILED" }));
                }
            }
        }
        seen
    };
    let want = outcomes(&reference);
    assert!(want.iter().all(|s| s.contains("done")), "{want:#?}");
    let got = outcomes(&d.mnt);
    let wrong: Vec<_> = want.iter().zip(&got).filter(|(w, g)| w != g).map(|(w, g)| format!("ext4 {w:?}, densefs {g:?}")).collect();
    assert!(wrong.is_empty(), "{} of {} differ:\n{}", wrong.len(), want.len(), wrong.join("\n"));
    for entry in fs::read_dir(&d.lower).unwrap() {
        let p = entry.unwrap().path();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode();
        assert_eq!(mode(&p), mode(&d.mnt.join(p.file_name().unwrap())), "{}: lower and mount", p.display());
    }
    m.unmount();
}

/// Setting an ACL clears setgid as chmod does when the setter is neither in the file's group
/// nor has CAP_FSETID (the kernel flags the SETXATTR: FUSE_SETXATTR_ACL_KILL_SGID). densefs kept
/// it: the daemon, root, set the ACL on the lower file.
#[test]
fn setting_an_acl_clears_setgid_as_chmod_does_on_ext4() {
    use std::os::unix::fs::chown;
    let d = Dirs::new();
    open_to_everyone(&d);
    let reference = reference_dir(&d, "ext4", 0o777);
    let m = Mount::new(&d.lower, &d.mnt, "");
    let changes = [
        ("chmod", "chmod 2777 \"$1\""),
        ("ACL like a mode", "setfacl -m u::rwx,g::rwx,o::rwx \"$1\""),
        ("ACL with a user entry", "setfacl -m u:nobody:r \"$1\""),
    ];
    // The owner in the file's group keeps setgid; not in it, or another group, loses it.
    let groups = [("owner in the group", 4000), ("owner not in the group", 4100)];
    let outcomes = |dir: &Path| {
        let mut seen = Vec::new();
        for (i, (change, script)) in changes.iter().enumerate() {
            for (j, (who, gid)) in groups.iter().enumerate() {
                let p = dir.join(format!("a{i}{j}"));
                fs::write(&p, b"data").unwrap();
                chown(&p, Some(4000), Some(*gid)).unwrap();
                fs::set_permissions(&p, fs::Permissions::from_mode(0o2775)).unwrap();
                let ok = as_actor("owner", script, &p);
                let after = fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
                let acl = Command::new("getfacl").args(["-cp"]).arg(&p).output().unwrap().stdout;
                seen.push(format!("{change} by the {who}: {ok} {after:o} {}", String::from_utf8_lossy(&acl).replace('\n', " ")));
            }
        }
        seen
    };
    let want = outcomes(&reference);
    assert!(want.iter().all(|s| s.contains("true")), "{want:#?}");
    assert!(want[3].contains(" 777 "), "ext4 itself cleared setgid: {want:#?}");
    assert_eq!(outcomes(&d.mnt), want, "through the mount");
    m.unmount();
}

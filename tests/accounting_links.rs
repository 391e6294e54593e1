//! Accounting counts a hard-linked file once, as `du` does (GlusterFS hard-links every file of a
//! brick into .glusterfs/, which must not double a brick's figures).

mod common;

use common::{compressible, wait_until, Dirs, Mount, BIN};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

/// `densefs get -H -p -o value PROP PATH`
fn value(prop: &str, path: &Path) -> u64 {
    let out = Command::new(BIN).args(["get", "-H", "-p", "-o", "value", prop]).arg(path).output().unwrap();
    assert!(out.status.success(), "densefs get: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    text.trim().parse().unwrap_or_else(|_| panic!("{prop} of {}: {text:?}", path.display()))
}

fn ratio(path: &Path) -> String {
    let out = Command::new(BIN).args(["get", "-H", "-p", "-o", "value", "compressratio"]).arg(path).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The daemon's JSON report on a mount path.
fn report(path: &Path) -> serde_json::Value {
    let out = Command::new("getfattr")
        .args(["--only-values", "-n", "user.densefs.report"])
        .arg(path)
        .output()
        .expect("getfattr (apt-get install attr)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `du -c ARGS PATHS...`'s total in bytes (du counts each inode once across its arguments).
fn du_total(args: &[&str], paths: &[std::path::PathBuf]) -> u64 {
    let out = Command::new("du").arg("-c").args(args).args(paths).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let last = text.lines().last().unwrap();
    assert!(last.ends_with("total"), "{text}");
    last.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn a_hard_linked_file_is_counted_once() {
    let d = Dirs::new();
    let m = Mount::new(&d.lower, &d.mnt, "compression=gzip-6,recordsize=16K");
    let data = compressible(1 << 20, 5);
    for dir in ["single", "linked"] {
        fs::create_dir_all(m.path(dir).join("sub")).unwrap();
        fs::write(m.path(dir).join("file"), &data).unwrap();
    }
    let linked = m.path("linked");
    fs::hard_link(linked.join("file"), linked.join("l1")).unwrap();
    fs::hard_link(linked.join("file"), linked.join("l2")).unwrap();
    fs::hard_link(linked.join("file"), linked.join("sub/l3")).unwrap();
    assert_eq!(fs::metadata(linked.join("sub/l3")).unwrap().nlink(), 4);
    // Let the lower file system allocate what it delayed (st_blocks: extent blocks appear at
    // writeback); the daemon's writeback tick sees the change and the mount follows.
    Command::new("sync").status().unwrap();
    wait_until("the mount to show the lower's blocks", || {
        fs::metadata(linked.join("file")).unwrap().blocks() == fs::metadata(d.lower.join("linked/file")).unwrap().blocks()
    });

    let lower_file = fs::metadata(d.lower.join("linked/file")).unwrap();
    let used = lower_file.blocks() * 512;
    assert!(used < data.len() as u64 / 2, "compressed: {used}");
    for dir in [m.path("single"), linked.clone()] {
        assert_eq!(value("used", &dir), used, "{}", dir.display());
        assert_eq!(value("logicalused", &dir), data.len() as u64, "{}", dir.display());
        assert_eq!(value("written", &dir), data.len() as u64, "{}", dir.display());
    }
    assert_eq!(ratio(&linked), ratio(&m.path("single")));
    assert_eq!(ratio(&linked), ratio(&linked.join("file")), "the tree is the file");
    assert_eq!(value("used", &linked.join("l1")), used, "a link reports its file");
    assert_eq!(value("used", &d.mnt), 2 * used, "two files in all, whatever the names");
    assert_eq!(value("logicalused", &d.mnt), 2 * data.len() as u64);
    let r = report(&linked);
    assert_eq!((r["files"].as_u64(), r["containers"].as_u64(), r["directories"].as_u64()), (Some(1), Some(1), Some(2)), "{r}");
    // A link's subdirectory on its own holds the file.
    assert_eq!(value("used", &linked.join("sub")), used);

    // du agrees: on the lower, one inode's blocks; through the mount, the same blocks and the
    // logical size once.
    let names: Vec<_> = ["file", "l1", "l2", "sub/l3"].iter().map(|n| d.lower.join("linked").join(n)).collect();
    assert_eq!(du_total(&["-B1"], &names), used, "du on the lower counts the inode once");
    let names: Vec<_> = ["file", "l1", "l2", "sub/l3"].iter().map(|n| linked.join(n)).collect();
    assert_eq!(du_total(&["-B1"], &names), used, "du through the mount");
    assert_eq!(du_total(&["-b"], &names), data.len() as u64, "du --apparent-size through the mount");
    // Whole directories: du adds the directories' own blocks, the same in both trees.
    let du_dir = |args: &[&str], p: &Path| du_total(args, &[p.to_path_buf()]);
    assert_eq!(du_dir(&["-B1"], &d.lower.join("linked")), du_dir(&["-B1"], &d.lower.join("single")));
    assert_eq!(du_dir(&["-b"], &linked), du_dir(&["-b"], &m.path("single")));

    // Removing names changes nothing until the last one goes.
    for n in ["file", "l1", "sub/l3"] {
        fs::remove_file(linked.join(n)).unwrap();
        assert_eq!(value("used", &linked), used, "after removing {n}");
    }
    fs::remove_file(linked.join("l2")).unwrap();
    assert_eq!(value("used", &linked), 0);
    assert_eq!(value("written", &linked), 0);
    m.unmount();
}

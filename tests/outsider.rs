//! The check an outsider runs: copy a real tree in with rsync, read everything (tar, cat, git),
//! remount, and ask rsync what it would copy again: nothing, ever. The tree has what real trees
//! have: many small files, empty and sparse files, hard links, symlinks (dangling too), fifos,
//! xattrs (user and trusted, on links too), POSIX ACLs, odd owners and modes, old and
//! nanosecond mtimes, a git repository, and a copy of a system header tree. And a database:
//! SQLite keeps every acknowledged commit, whole, when the daemon is killed under it.

mod common;

use common::{compressible, random_bytes, Dirs, Mount};
use std::fs;
use std::path::Path;
use std::process::Command;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sh(script: &str) -> String {
    run(Command::new("bash").arg("-euc").arg(script))
}

fn build_tree(src: &Path) {
    fs::create_dir_all(src.join("data/deep/er")).unwrap();
    for i in 0..40u64 {
        let len = [0, 1, 100, 4096, 5000, 70_000, 300_000, 1 << 20][i as usize % 8];
        let data = if i % 3 == 0 { random_bytes(len, i) } else { compressible(len, i) };
        fs::write(src.join(format!("data/deep/er/f{i}")), data).unwrap();
    }
    let s = src.display();
    sh(&format!(
        "cd {s}
        truncate -s 3M data/sparse && printf tail >> data/sparse
        dd if=/dev/urandom of=data/holes bs=4k count=1 seek=100 status=none
        ln data/deep/er/f5 data/hardlink1 && ln data/deep/er/f5 data/deep/hardlink2
        ln -s deep/er/f1 data/rel-link && ln -s /nonexistent/target data/dangling
        mkfifo data/fifo
        setfattr -n user.note -v hello data/deep/er/f2
        setfattr -n user.dir -v 0xdeadbeef data/deep
        setfattr -h -n trusted.gfid -v 0x0123456789abcdef0123456789abcdef data/rel-link
        setfacl -m u:1234:rw data/deep/er/f3 && setfacl -d -m g:5678:rx data/deep
        chown 1234:5678 data/deep/er/f4 && chmod 4750 data/deep/er/f4 && chmod 1777 data/deep/er
        touch -d '2001-02-03 04:05:06.123456789' data/deep/er/f6
        touch -h -d '1999-12-31 23:59:59' data/rel-link
        mkdir repo && cd repo && git init -q && git config user.email t@e && git config user.name t
        for i in 1 2 3; do seq $i 5000 > file$i; done && git add . && git commit -qm one
        seq 1 10 >> file1 && git commit -qam two && cd ..
        cp -a /usr/include/linux headers 2>/dev/null || mkdir headers"
    ));
}

fn rsync_would_change(src: &Path, dst: &Path) -> String {
    run(Command::new("rsync")
        .args(["-aHAXn", "--itemize-changes", "--delete"])
        .arg(format!("{}/", src.display()))
        .arg(format!("{}/", dst.display())))
}

#[test]
fn rsync_finds_nothing_to_copy_after_reading_everything_and_remounting() {
    let d = Dirs::new();
    let src = d.root.path().join("src");
    fs::create_dir(&src).unwrap();
    build_tree(&src);
    let m = Mount::new(&d.lower, &d.mnt, "compression=lz4");
    run(Command::new("rsync").args(["-aHAX"]).arg(format!("{}/", src.display())).arg(format!("{}/", d.mnt.display())));
    assert_eq!(rsync_would_change(&src, &d.mnt), "", "right after the copy");

    // Read everything as tools do: tar, cat, git.
    let mnt = d.mnt.display();
    sh(&format!("tar -C {mnt} -cf - . > /dev/null && find {mnt} -type f -exec cat {{}} + > /dev/null"));
    assert_eq!(rsync_would_change(&src, &d.mnt), "", "after reading everything");
    // git refreshes a copied repository's index once (inode numbers and ctimes are new on any
    // copy); after that, its stat data must hold across remounts: no rewrite, nothing modified.
    assert_eq!(sh(&format!("cd {mnt}/repo && git status --porcelain && git log --oneline | wc -l")).trim(), "2");
    let index =
        |root: &std::path::Path| sh(&format!("stat -c %Y.%y {0}/repo/.git/index && sha256sum < {0}/repo/.git/index", root.display()));
    let refreshed = index(&d.mnt);
    sh(&format!("cd {mnt}/repo && git status --porcelain"));
    assert_eq!(index(&d.mnt), refreshed, "git rewrote its index twice");
    m.unmount();

    let m = Mount::new(&d.lower, &d.mnt, "");
    let except_index =
        |out: String| out.lines().filter(|l| !l.ends_with("repo/.git/") && !l.ends_with("repo/.git/index")).collect::<Vec<_>>().join("\n");
    assert_eq!(except_index(rsync_would_change(&src, &d.mnt)), "", "after a remount");
    assert_eq!(sh(&format!("cd {mnt}/repo && git status --porcelain && git diff --stat")), "", "git sees changes after a remount");
    assert_eq!(index(&d.mnt), refreshed, "git had to refresh its index after a remount");
    sh(&format!("tar -C {mnt} -cf - . > /dev/null && cd {mnt}/repo && git fsck --no-progress"));
    assert_eq!(except_index(rsync_would_change(&src, &d.mnt)), "", "after reading again");
    // Two tar archives of the mount are byte for byte the same, and the same as the source's.
    let a = sh(&format!("tar --sort=name -C {mnt} -cf - data | sha256sum"));
    let b = sh(&format!("tar --sort=name -C {} -cf - data | sha256sum", src.display()));
    assert_eq!(a, b, "tar of the mount differs from tar of the source");
    m.unmount();
}

/// A database's writer: SQLite in `mode` (wal or delete), synchronous=FULL, committing
/// transactions of 50 rows tagged with the transaction's number, and writing how many COMMITs
/// returned to `acked` after each, until the file system fails under it. A reader beside it
/// takes shared locks (WAL: the -shm file, mmapped) all the while.
const SQLITE_WRITER: &str = r#"
import sqlite3, sys, threading, time
db, mode, acked = sys.argv[1], sys.argv[2], sys.argv[3]
c = sqlite3.connect(db, timeout=30, isolation_level=None)
c.execute(f"PRAGMA journal_mode={mode}")
c.execute("PRAGMA synchronous=FULL")
c.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, tx INTEGER, v TEXT)")
c.execute("CREATE INDEX IF NOT EXISTS tv ON t(v)")
def read():
    r = sqlite3.connect(db, timeout=30)
    try:
        while True:
            r.execute("SELECT count(*), max(tx) FROM t").fetchone()
            time.sleep(0.005)
    except sqlite3.Error:
        pass
threading.Thread(target=read, daemon=True).start()
tx = 0
try:
    while True:
        c.execute("BEGIN")
        for i in range(50):
            c.execute("INSERT INTO t(tx, v) VALUES(?, ?)", (tx, f"{tx:06d}-{i:02d}-" + "acgt" * (i % 23)))
        c.execute("COMMIT")
        tx += 1
        open(acked, "w").write(str(tx))
except sqlite3.Error:
    pass
"#;

/// integrity_check, and (transactions, rows, rows in incomplete transactions) of the database.
const SQLITE_CHECK: &str = r#"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
print(c.execute("PRAGMA integrity_check").fetchone()[0])
print(*c.execute("SELECT count(DISTINCT tx), count(*) FROM t").fetchone())
print(c.execute("SELECT count(*) FROM (SELECT tx FROM t GROUP BY tx HAVING count(*) != 50)").fetchone()[0])
"#;

#[test]
fn sqlite_keeps_every_acknowledged_commit_when_the_daemon_is_killed() {
    for mode in ["wal", "delete"] {
        let d = Dirs::new();
        let m = Mount::new(&d.lower, &d.mnt, "compression=zstd-3");
        let (db, acked) = (d.mnt.join("app.db"), d.root.path().join("acked"));
        let mut writer = Command::new("python3").args(["-c", SQLITE_WRITER]).arg(&db).arg(mode).arg(&acked).spawn().expect("python3 runs");
        let count = || fs::read_to_string(&acked).ok().and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        common::wait_until("the writer to commit 60 transactions", || count() >= 60);
        m.kill();
        let _ = writer.wait();
        let committed = count();

        let m = Mount::new(&d.lower, &d.mnt, "");
        let out = run(Command::new("python3").args(["-c", SQLITE_CHECK]).arg(&db));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "ok", "{mode}: integrity_check after the daemon was killed");
        let (txs, rows): (u64, u64) = {
            let v: Vec<u64> = lines[1].split(' ').map(|x| x.parse().unwrap()).collect();
            (v[0], v[1])
        };
        assert!(txs >= committed, "{mode}: {committed} COMMITs returned but only {txs} transactions are in the database");
        assert!(txs <= committed + 1, "{mode}: {txs} transactions for {committed} acknowledged");
        assert_eq!((rows, lines[2]), (txs * 50, "0"), "{mode}: a transaction is there in part");
        m.unmount();
    }
}

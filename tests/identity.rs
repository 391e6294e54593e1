//! A node id names one file for as long as the kernel may hold it: `densefs recompress` gives
//! a file a new lower inode, the lower file system hands the freed number to the next file it
//! creates, and a name the kernel still held must never lead to that other file's bytes.
//! Tested the way it was found (issue 44), on the lower as it comes (ext4 here), on a small ext4
//! image whose few inodes are reused at once, with processes holding names, descriptors and
//! mappings across the recompress, and with kernel file handles (NFS export) taken before it.

mod common;

use common::{recompress, Dirs, Mount, SmallExt4};
use std::collections::{BTreeMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A helper process, killed when the test ends however it ends.
struct Killed(Child);

impl Killed {
    fn wait(mut self) {
        self.0.wait().unwrap();
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every file of `expected` through the mount: its bytes, and no two names sharing an inode
/// number (none of these files is hard-linked).
fn check_files(mnt: &Path, expected: &BTreeMap<String, Vec<u8>>, when: &str) {
    let mut inos: BTreeMap<u64, String> = BTreeMap::new();
    for (name, want) in expected {
        let path = mnt.join(name);
        let meta = std::fs::metadata(&path).unwrap_or_else(|e| panic!("{when}: stat {name}: {e}"));
        if let Some(other) = inos.insert(meta.ino(), name.clone()) {
            panic!("{when}: {name} and {other} both have inode number {}", meta.ino());
        }
        assert_eq!(meta.len(), want.len() as u64, "{when}: size of {name}");
        let got = std::fs::read(&path).unwrap_or_else(|e| panic!("{when}: read {name}: {e}"));
        assert!(
            got == *want,
            "{when}: {name} holds {} bytes starting {:?}, not its own",
            got.len(),
            String::from_utf8_lossy(&got[..got.len().min(40)])
        );
    }
}

/// Appends a line naming the file through each name, as `echo >> name` does.
fn append_through_names(mnt: &Path, expected: &mut BTreeMap<String, Vec<u8>>, round: usize) {
    for (name, content) in expected.iter_mut() {
        let line = format!("written via {name} in round {round}\n");
        OpenOptions::new().append(true).open(mnt.join(name)).unwrap().write_all(line.as_bytes()).unwrap();
        content.extend_from_slice(line.as_bytes());
    }
}

/// The sequence from issue 44, on the lower as it comes: two plain files, both read (the kernel
/// holds their names), `recompress -r`; then the same with more files, another record size and
/// another codec, each time checked by name, by inode number, by a write through every name,
/// and again after a remount.
#[test]
fn recompress_never_lets_a_name_serve_another_files_bytes() {
    let d = Dirs::new();
    let mut expected = BTreeMap::new();
    expected.insert("hello.txt".to_string(), b"hello plain\n".to_vec());
    expected.insert("numbers.txt".to_string(), (1..=100_000).map(|i| format!("{i}\n")).collect::<String>().into_bytes());
    for i in 0..30 {
        expected.insert(format!("f{i:02}.txt"), format!("file {i}\n").repeat(1 + i * 700).into_bytes());
    }
    for (name, content) in &expected {
        std::fs::write(d.lower.join(name), content).unwrap();
    }
    let mut m = Mount::new(&d.lower, &d.mnt, "");
    check_files(&d.mnt, &expected, "before");
    let specs = ["", "recordsize=64K", "compression=zstd-3", "recordsize=256K,compression=lz4", "recordsize=128K"];
    for (round, spec) in specs.iter().enumerate() {
        let (ok, out) = recompress(&[&d.mnt], true, spec);
        assert!(ok, "recompress -r -o '{spec}': {out}");
        let when = format!("after recompress -o '{spec}'");
        check_files(&d.mnt, &expected, &when);
        append_through_names(&d.mnt, &mut expected, round);
        check_files(&d.mnt, &expected, &format!("{when} and a write through every name"));
        if round % 2 == 1 {
            m.unmount();
            m = Mount::new(&d.lower, &d.mnt, "");
            check_files(&d.mnt, &expected, &format!("{when}, remounted"));
        }
    }
    m.unmount();
    let m = Mount::new(&d.lower, &d.mnt, "");
    check_files(&d.mnt, &expected, "at the end, remounted");
    m.unmount();
}

/// Rounds of recompress on a lower whose inode numbers are all reused, while other processes
/// hold things: a shell whose working directory is in the tree, a descriptor open for writing
/// (its file is left as it is, EBUSY, and every write through it lands in it), a shared mapping
/// written through, and names read just before. Every file keeps its own bytes and number.
#[test]
fn reused_inode_numbers_never_alias_names_held_across_recompress() {
    let d = Dirs::new();
    let image = d.root.path().join("small.ext4");
    let lower = d.root.path().join("small");
    let Some(_disk) = SmallExt4::new(&image, &lower, 64) else {
        println!("SKIP: cannot make and loop-mount an ext4 image (needs root and mkfs.ext4)");
        return;
    };
    std::fs::create_dir(lower.join("sub")).unwrap();
    let mut expected = BTreeMap::new();
    for i in 0..24 {
        let name = if i % 3 == 0 { format!("sub/g{i:02}") } else { format!("g{i:02}") };
        let content = format!("{name} line\n").repeat(1 + i * 300).into_bytes();
        std::fs::write(lower.join(&name), &content).unwrap();
        expected.insert(name, content);
    }
    let m = Mount::new(&lower, &d.mnt, "");
    // A process whose working directory is inside the tree, listing it now and then.
    File::create(d.mnt.join("sub/keep")).unwrap();
    let shell = Killed(
        Command::new("sh")
            .arg("-c")
            .arg("while [ -e keep ]; do ls -l >/dev/null 2>&1; cat * >/dev/null 2>&1; sleep 0.05; done")
            .current_dir(d.mnt.join("sub"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    expected.insert("sub/keep".to_string(), Vec::new());
    // g01 stays open for writing and g02 mapped shared, across every round.
    let mut held = OpenOptions::new().read(true).append(true).open(d.mnt.join("g01")).unwrap();
    let mapped_file = OpenOptions::new().read(true).write(true).open(d.mnt.join("g02")).unwrap();
    let mut map = unsafe { memmap2::MmapOptions::new().map_mut(&mapped_file).unwrap() };
    let specs = ["recordsize=64K", "recordsize=128K,compression=zstd-3", "recordsize=32K,compression=lz4", "recordsize=256K"];
    for round in 0..8 {
        check_files(&d.mnt, &expected, &format!("round {round}, before"));
        let spec = specs[round % specs.len()];
        let (_, out) = recompress(&[&d.mnt], true, spec);
        // Files open (the held and mapped ones, those the shell is reading) are left alone, with
        // a reason; nothing else fails.
        for line in out.lines().filter(|l| l.starts_with("densefs:") && !l.contains("files were left as they were")) {
            assert!(line.contains("open elsewhere"), "round {round}: {line}");
        }
        assert!(out.contains("/g01: open elsewhere") && out.contains("/g02: open elsewhere"), "round {round}: {out}");
        let when = format!("round {round}, after recompress -o {spec}");
        // Through the held descriptor and the mapping: their own files.
        let line = format!("held write {round}\n");
        held.write_all(line.as_bytes()).unwrap();
        expected.get_mut("g01").unwrap().extend_from_slice(line.as_bytes());
        map[round] = b'#';
        expected.get_mut("g02").unwrap()[round] = b'#';
        map.flush().unwrap();
        check_files(&d.mnt, &expected, &when);
        append_through_names(&d.mnt, &mut expected, round);
        check_files(&d.mnt, &expected, &format!("{when} and a write through every name"));
        // New files take the numbers freed last, and one file goes.
        let name = format!("new{round}");
        let content = format!("new file of round {round}\n").repeat(round + 1).into_bytes();
        std::fs::write(d.mnt.join(&name), &content).unwrap();
        expected.insert(name, content);
        if round % 2 == 0 {
            let gone = format!("new{}", round / 2);
            if expected.remove(&gone).is_some() {
                std::fs::remove_file(d.mnt.join(&gone)).unwrap();
            }
        }
    }
    let mut read_back = Vec::new();
    held.flush().unwrap();
    File::open(d.mnt.join("g01")).unwrap().read_to_end(&mut read_back).unwrap();
    assert!(read_back == expected["g01"], "the descriptor held open wrote into its own file");
    drop(map);
    drop(mapped_file);
    drop(held);
    std::fs::remove_file(d.mnt.join("sub/keep")).unwrap();
    expected.remove("sub/keep");
    shell.wait();
    m.unmount();
    let m = Mount::new(&lower, &d.mnt, "");
    check_files(&d.mnt, &expected, "remounted at the end");
    let inos: HashSet<u64> = expected.keys().map(|n| std::fs::metadata(d.mnt.join(n)).unwrap().ino()).collect();
    assert_eq!(inos.len(), expected.len(), "one inode number per file after the remount");
    m.unmount();
}

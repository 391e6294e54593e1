use super::*;

/// A table over a temporary directory of `files` files, with room for `budget` descriptors.
fn table_over(files: usize, budget: usize) -> (tempfile::TempDir, InodeTable) {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..files {
        std::fs::write(dir.path().join(format!("f{i}")), b"x").unwrap();
    }
    let root = lower::open_root(dir.path()).unwrap();
    let st = lower::stat_fd(root.as_raw_fd()).unwrap();
    (dir, InodeTable::new(root, st.st_dev, st.st_ino, budget))
}

/// Looks up `f{i}` as the kernel's LOOKUP does: an O_PATH descriptor for the table.
fn look_up(table: &InodeTable, i: usize) -> Arc<Inode> {
    let root = table.node(ROOT).unwrap();
    let name = OsString::from(format!("f{i}"));
    let fd = lower::open_path(root.raw_fd(), &name).unwrap();
    let st = lower::stat_fd(fd.as_raw_fd()).unwrap();
    table.remember(ROOT, &name, fd, false, &st)
}

#[test]
fn cached_descriptors_stay_within_the_budget_however_many_files_are_looked_up() {
    // 64 a quarter at a time: before the fix the threshold crept up by one per eviction,
    // past 200 descriptors after these 4,000 lookups (a daemon with `ulimit -n 256` ran out).
    let (_dir, table) = table_over(4000, 64);
    let first = look_up(&table, 0);
    for i in 1..4000 {
        look_up(&table, i);
        let (_, open) = table.census();
        assert!(open <= 64, "after {} lookups the table keeps {open} descriptors, over its budget of 64", i + 1);
    }
    // The first file's descriptor went long ago; using it opens it again.
    assert!(first.place.lock().fd.is_none());
    let node = table.node(first.nodeid).unwrap();
    assert_eq!(lower::stat_fd(node.raw_fd()).unwrap().st_ino, first.ino);
}

#[test]
fn open_files_over_the_budget_do_not_make_every_lookup_scan_and_the_budget_returns_when_they_close() {
    let (_dir, table) = table_over(1000, 64);
    // 100 files held open (their descriptors cannot be closed): more than the budget.
    let held: Vec<Arc<Inode>> = (0..100)
        .map(|i| {
            let inode = look_up(&table, i);
            inode.open.lock().handles = 1;
            inode
        })
        .collect();
    for i in 100..600 {
        look_up(&table, i);
        let (_, open) = table.census();
        // Held, the root's, and a quarter of the budget between scans.
        assert!(open <= 100 + 1 + 16, "{open} descriptors with 100 held open and a budget of 64");
    }
    assert!(table.evict_above.load(Ordering::Relaxed) > 100, "evicts again only past what is held open");
    for inode in &held {
        inode.open.lock().handles = 0;
    }
    for i in 600..1000 {
        look_up(&table, i);
    }
    let (_, open) = table.census();
    assert!(open <= 64, "{open} descriptors once the files closed");
    assert_eq!(table.evict_above.load(Ordering::Relaxed), 64);
}

/// What the kernel would get for lower file `f{i}` if the lower had given it number `ino`
/// (a number freed by another file and reused).
fn look_up_as(table: &InodeTable, i: usize, ino: u64) -> Arc<Inode> {
    let root = table.node(ROOT).unwrap();
    let name = OsString::from(format!("f{i}"));
    let fd = lower::open_path(root.raw_fd(), &name).unwrap();
    let mut st = lower::stat_fd(fd.as_raw_fd()).unwrap();
    st.st_ino = ino;
    table.remember(ROOT, &name, fd, false, &st)
}

#[test]
fn a_reused_number_never_leads_to_the_node_the_kernel_holds_for_the_file_that_had_it() {
    let (_dir, table) = table_over(4, 64);
    // f0 replaced (recompress): its node is retired, the kernel has not forgotten it yet,
    // and the lower gives its number to f1.
    let old = look_up(&table, 0);
    assert_eq!(old.nodeid, old.ino, "node ids are lower inode numbers where free");
    table.retire(&old);
    let new = look_up_as(&table, 1, old.ino);
    assert_ne!(new.nodeid, old.nodeid, "the reused number got the retired node's id");
    assert!(new.nodeid >= REMAPPED_BASE);
    assert!(table.node(old.nodeid).is_err_and(|e| e.raw_os_error() == Some(libc::ESTALE)), "a retired node answers ESTALE");
    assert_eq!(table.node(new.nodeid).unwrap().nodeid, new.nodeid);
    assert_eq!(look_up_as(&table, 1, old.ino).nodeid, new.nodeid, "the new file keeps its id");
    // Once the kernel forgets the old node, the new file still keeps its id for the mount.
    table.forget(old.nodeid, 1);
    assert_eq!(look_up_as(&table, 1, old.ino).nodeid, new.nodeid);

    // f2's number reused behind densefs's back while its node held no descriptor (evicted):
    // the lower's generation tells the files apart, where it has generations.
    let gone = look_up(&table, 2);
    let fd3 = lower::open_path(table.node(ROOT).unwrap().raw_fd(), OsStr::new("f3")).unwrap();
    if gone.generation == 0 || lower::generation(fd3.as_raw_fd()) == gone.generation {
        println!("SKIP: the temporary directory's file system reports no generations");
        return;
    }
    let evicted = gone.place.lock().fd.take();
    drop(evicted);
    let other = look_up_as(&table, 3, gone.ino);
    assert_ne!(other.nodeid, gone.nodeid, "another generation got the old node");
    assert!(gone.is_retired());
    assert!(table.node(gone.nodeid).is_err());
}

#[test]
fn an_inode_forgotten_while_busy_is_let_go_of_once_free() {
    let (dir, table) = table_over(1, 64);
    let inode = look_up(&table, 0);
    let (inodes, fds) = table.census();
    // The kernel forgets it while a request holds its lock (a RELEASE closing it, say): an
    // unlinked file kept its blocks from the lower until some later FORGET, if any came.
    let busy = inode.open.lock();
    table.forget(inode.nodeid, 1);
    assert_eq!(table.census(), (inodes, fds), "kept while busy");
    table.retry_deferred_forgets();
    assert_eq!(table.census(), (inodes, fds), "still busy: kept again");
    drop(busy);
    table.retry_deferred_forgets();
    assert_eq!(table.census(), (inodes - 1, fds - 1), "let go of once free");
    assert!(inode.place.lock().fd.is_none(), "its descriptor is closed");
    assert!(table.node(inode.nodeid).is_err(), "gone from the table");
    drop(dir);
}

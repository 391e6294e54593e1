//! The mount's statistics kept as counters (as ZFS keeps a dataset's `used`), so that `densefs
//! get` on the mount root answers without walking the lower tree.
//!
//! Each regular file contributes what `inspect` (the walk's own measure) says of its lower file.
//! A file is measured when a container is first made writable for it (none for a file `create`
//! makes: it contributed nothing), and again when the last such container goes, after its last
//! landing; the counters move by the difference. An unlink or a rename over the last name takes
//! the file's contribution away; mkdir and rmdir count directories; a plain lower file written
//! in place is measured around each change. A report measures the files still being written.
//!
//! The counters are saved in the lower root at a clean unmount, tied to the run record
//! (`hints.rs`): a run that did not end cleanly, a lower without extended attributes, or a first
//! mount leaves them unknown, and the mount counts them by a walk of its own on an idle thread
//! (`DenseFs::start_usage_rebuild`); a report on the root before that walks, and so does every
//! `densefs scrub`. A walk is taken only if nothing changed while it ran (`adopt_walk`).
//! Changes made directly in the lower behind densefs's back are seen after the next walk.

use crate::inspect::{inspect, inspect_owned, FileStats};
use parking_lot::{Condvar, Mutex};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a tree holds, as the walk counts it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    pub files: u64,
    pub containers: u64,
    pub directories: u64,
    /// The sums of the files' statistics (only the summed fields are kept).
    pub stats: FileStats,
}

impl Usage {
    /// One regular file's contribution.
    pub fn of_file(stats: &FileStats) -> Usage {
        let mut sum = FileStats::default();
        sum.add(stats);
        Usage { files: 1, containers: stats.container as u64, directories: 0, stats: sum }
    }

    /// A lower file's contribution now (none where it cannot be read: the walk skips it too).
    pub fn measure(file: &File) -> Usage {
        inspect(file, false).map(|s| Usage::of_file(&s)).unwrap_or_default()
    }

    /// As `measure`, for a file a container tracks: one without a name (an O_TMPFILE not linked
    /// yet, open or on its way to its last close) counts nothing, as no walk finds it; linked,
    /// it counts from its next measure on.
    fn measure_named(file: &File) -> Usage {
        use std::os::unix::fs::MetadataExt;
        if file.metadata().is_ok_and(|m| m.nlink() == 0) {
            return Usage::default();
        }
        Usage::measure(file)
    }

    /// As `measure`, on a descriptor it closes after.
    pub fn measure_owned(file: File) -> Usage {
        inspect_owned(file, false).map(|s| Usage::of_file(&s)).unwrap_or_default()
    }

    pub fn directory() -> Usage {
        Usage { directories: 1, ..Usage::default() }
    }

    fn add(&mut self, o: &Usage) {
        self.files += o.files;
        self.containers += o.containers;
        self.directories += o.directories;
        self.stats.add(&o.stats);
    }

    fn sub(&mut self, o: &Usage) {
        self.files = self.files.saturating_sub(o.files);
        self.containers = self.containers.saturating_sub(o.containers);
        self.directories = self.directories.saturating_sub(o.directories);
        self.stats.sub(&o.stats);
    }

    /// The saved form (`user.densefs.usage` on the lower root, docs/FORMAT.md), for run `run`
    /// of tree `tree`.
    pub fn encode(&self, tree: u16, run: u32) -> Vec<u8> {
        let s = &self.stats;
        json!({
            "version": 1, "tree": tree, "run": run,
            "files": self.files, "containers": self.containers, "directories": self.directories,
            "written": s.logical_size, "logicalused": s.logical_data, "used": s.physical,
            "stored": s.stored_data, "lower_length": s.lower_length,
            "raw_low_savings": s.raw_low_savings, "records": s.records,
        })
        .to_string()
        .into_bytes()
    }

    /// The counters saved for run `run` of tree `tree`, if that is what `value` holds.
    pub fn decode(value: &[u8], tree: u16, run: u32) -> Option<Usage> {
        let v: Value = serde_json::from_slice(value).ok()?;
        let n = |k: &str| v[k].as_u64();
        if n("version")? != 1 || n("tree")? != u64::from(tree) || n("run")? != u64::from(run) {
            return None;
        }
        let records = v["records"].as_object()?.iter().map(|(k, c)| Some((k.clone(), c.as_u64()?))).collect::<Option<_>>()?;
        let stats = FileStats {
            logical_size: n("written")?,
            logical_data: n("logicalused")?,
            physical: n("used")?,
            stored_data: n("stored")?,
            lower_length: n("lower_length")?,
            raw_low_savings: n("raw_low_savings")?,
            records,
            ..FileStats::default()
        };
        Some(Usage { files: n("files")?, containers: n("containers")?, directories: n("directories")?, stats })
    }
}

/// A file being changed through writable containers: its contribution as last counted.
struct Tracked {
    key: (u64, u64),
    file: Arc<File>,
    state: Mutex<TrackedState>,
}

struct TrackedState {
    counted: Usage,
    /// Containers holding it.
    holders: usize,
    /// Its last name went: it no longer counts.
    gone: bool,
}

/// The mount's counters, and the files being changed.
#[derive(Default)]
pub struct Accounting {
    /// `None`: unknown until a walk rebuilds them.
    totals: Mutex<Option<Usage>>,
    tracked: Mutex<HashMap<(u64, u64), Arc<Tracked>>>,
    /// Changes counted (or not, while unknown) so far: a walk's result is adopted only if none
    /// came during it (`adopt_walk`).
    changes: AtomicU64,
    /// Small files whose last name went, held open until measured (`remove_leaving`).
    leaving: Mutex<Leaving>,
    left: Condvar,
}

#[derive(Default)]
struct Leaving {
    queue: VecDeque<File>,
    /// Taken from the queue, being measured.
    measuring: usize,
    threads: usize,
}

/// Files waiting to be measured after their unlink, at most: beyond, the unlink measures its
/// file itself. Their blocks come back once measured (milliseconds).
const LEAVING_LIMIT: usize = 64;
/// Threads that measure them: a cold file's header is a random read, which several overlap.
const LEAVING_THREADS: usize = 4;

/// Held by a writable container; when the last one of a file goes (after its last landing),
/// the file is measured again and the counters move by what changed.
pub struct UsageHold {
    accounting: Arc<Accounting>,
    tracked: Arc<Tracked>,
}

impl Drop for UsageHold {
    fn drop(&mut self) {
        self.accounting.release(&self.tracked);
    }
}

impl Accounting {
    /// The counters now, if known; the files being changed are measured first (and the files
    /// deleted lately, `remove_leaving`).
    pub fn current(&self) -> Option<Usage> {
        self.wait_for_leaving();
        if self.totals.lock().is_none() {
            return None;
        }
        let tracked: Vec<_> = self.tracked.lock().values().cloned().collect();
        for t in tracked {
            let mut st = t.state.lock();
            if !st.gone {
                let now = Usage::measure_named(&t.file);
                self.apply(&now, &st.counted);
                st.counted = now;
            }
        }
        self.totals.lock().clone()
    }

    /// Counters a clean run saved.
    pub fn set(&self, usage: Usage) {
        *self.totals.lock() = Some(usage);
    }

    /// The counters as the last changes left them, without measuring the files being changed
    /// (cheap: what the metrics show).
    pub fn settled(&self) -> Option<Usage> {
        self.totals.lock().clone()
    }

    /// Something changed that a walk counting now may have seen either way (counted by
    /// `apply` where the counters are known).
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// Where the changes stand, before a walk.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }

    /// Takes what a walk of the whole tree found as the counters, if nothing changed during it
    /// (`changes_before`: `changes()` before it began) and no file is being changed now: a walk
    /// may meet a file half landed, whose own count at its end would then be off. Says whether.
    pub fn adopt_walk(&self, usage: Usage, changes_before: u64) -> bool {
        let tracked = self.tracked.lock();
        let leaving = self.leaving.lock();
        let mut totals = self.totals.lock();
        if !tracked.is_empty() || !leaving.queue.is_empty() || leaving.measuring > 0 || self.changes() != changes_before {
            return false;
        }
        *totals = Some(usage);
        true
    }

    pub fn known(&self) -> bool {
        self.totals.lock().is_some()
    }

    /// Moves the counters by `after - before`.
    pub fn apply(&self, after: &Usage, before: &Usage) {
        self.changes.fetch_add(1, Ordering::SeqCst);
        if let Some(totals) = self.totals.lock().as_mut() {
            totals.add(after);
            totals.sub(before);
        }
    }

    /// Starts (or joins) tracking the file `key` whose lower file is `file`: `counted` says what
    /// it contributes now (nothing, for a file just created), asked only if nobody tracks it.
    pub fn track(self: &Arc<Self>, key: (u64, u64), file: &Arc<File>, counted: impl FnOnce() -> Usage) -> UsageHold {
        let mut map = self.tracked.lock();
        self.changes.fetch_add(1, Ordering::SeqCst);
        let tracked = match map.get(&key) {
            Some(t) => {
                t.state.lock().holders += 1;
                t.clone()
            }
            None => {
                let t = Arc::new(Tracked {
                    key,
                    file: file.clone(),
                    state: Mutex::new(TrackedState { counted: counted(), holders: 1, gone: false }),
                });
                map.insert(key, t.clone());
                t
            }
        };
        UsageHold { accounting: self.clone(), tracked }
    }

    fn release(&self, tracked: &Arc<Tracked>) {
        let mut map = self.tracked.lock();
        let mut st = tracked.state.lock();
        st.holders -= 1;
        if st.holders > 0 {
            return;
        }
        if map.get(&tracked.key).is_some_and(|t| Arc::ptr_eq(t, tracked)) {
            map.remove(&tracked.key);
        }
        drop(map);
        if !st.gone {
            let now = Usage::measure_named(&tracked.file);
            self.apply(&now, &st.counted);
            st.counted = now;
        }
    }

    /// The last name of the file `key` is about to go: what it contributes goes with it (as
    /// last counted where it is being changed, else `measure`d now).
    pub fn remove_file(&self, key: (u64, u64), measure: impl FnOnce() -> Usage) {
        if !self.untrack_gone(key) {
            self.apply(&Usage::default(), &measure());
        }
    }

    /// Where a container tracks the file `key`, whose last name went: its part as last
    /// counted leaves the counters, and its containers count nothing more. Says whether.
    fn untrack_gone(&self, key: (u64, u64)) -> bool {
        let Some(t) = self.tracked.lock().remove(&key) else { return false };
        let mut st = t.state.lock();
        if !st.gone {
            st.gone = true;
            self.apply(&Usage::default(), &st.counted);
        }
        true
    }

    /// Takes the part of the file `file` (its last name gone) from the counters, and closes it.
    fn subtract_measured(&self, file: File) {
        self.apply(&Usage::default(), &Usage::measure_owned(file));
    }

    /// As `remove_file`, for a file whose lower file `file` was opened before its last name
    /// went (a container tracking it then may have gone meanwhile: its RELEASE comes when the
    /// kernel sends it). `later`: a small file no container tracks is measured on another
    /// thread, so that an `rm -rf` does not wait for each file's header to be read in turn.
    pub fn remove_leaving(self: &Arc<Self>, key: (u64, u64), file: Option<File>, later: bool) {
        if self.untrack_gone(key) {
            return;
        }
        match file {
            Some(file) if later => self.measure_later(file),
            Some(file) => self.subtract_measured(file),
            None => {}
        }
    }

    fn measure_later(self: &Arc<Self>, file: File) {
        let mut leaving = self.leaving.lock();
        if leaving.queue.len() >= LEAVING_LIMIT {
            drop(leaving);
            return self.subtract_measured(file);
        }
        self.changes.fetch_add(1, Ordering::SeqCst);
        leaving.queue.push_back(file);
        if leaving.threads < LEAVING_THREADS.min(leaving.queue.len()) {
            let me = self.clone();
            let spawned = std::thread::Builder::new().name("densefs-unlinked".into()).spawn(move || me.measure_leaving());
            if spawned.is_ok() {
                leaving.threads += 1;
            }
        }
        if leaving.threads == 0 {
            let file = leaving.queue.pop_back().expect("just pushed");
            drop(leaving);
            return self.subtract_measured(file);
        }
        self.left.notify_all();
    }

    fn measure_leaving(&self) {
        let mut leaving = self.leaving.lock();
        loop {
            let Some(file) = leaving.queue.pop_front() else {
                self.left.wait(&mut leaving);
                continue;
            };
            leaving.measuring += 1;
            drop(leaving);
            self.subtract_measured(file);
            leaving = self.leaving.lock();
            leaving.measuring -= 1;
            self.left.notify_all();
        }
    }

    /// Waits until every file `remove_leaving` took is measured and closed.
    pub fn wait_for_leaving(&self) {
        let mut leaving = self.leaving.lock();
        while !leaving.queue.is_empty() || leaving.measuring > 0 {
            self.left.wait(&mut leaving);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_saved_form_reads_back_only_for_its_run() {
        let mut stats =
            FileStats { logical_size: 10, logical_data: 9, physical: 4096, stored_data: 3, lower_length: 8192, ..Default::default() };
        stats.records.insert("zstd-3".into(), 2);
        let u = Usage { files: 3, containers: 2, directories: 1, ..Usage::of_file(&stats) };
        let saved = u.encode(7, 42);
        assert_eq!(Usage::decode(&saved, 7, 42), Some(u));
        assert_eq!(Usage::decode(&saved, 7, 43), None, "another run's");
        assert_eq!(Usage::decode(&saved, 8, 42), None, "another tree's");
        assert_eq!(Usage::decode(b"{}", 7, 42), None);
    }

    #[test]
    fn unknown_counters_stay_unknown_until_a_quiet_walk() {
        let a = Accounting::default();
        a.apply(&Usage::directory(), &Usage::default());
        assert_eq!(a.current(), None);
        let before = a.changes();
        a.apply(&Usage::directory(), &Usage::default());
        assert!(!a.adopt_walk(Usage::default(), before), "a change came during the walk");
        assert!(a.adopt_walk(Usage::default(), a.changes()));
        a.apply(&Usage::directory(), &Usage::default());
        assert_eq!(a.current().unwrap().directories, 1);
    }
}

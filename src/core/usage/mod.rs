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

mod datasets;

pub use datasets::{nowhere, DatasetCounters, Key, Within};

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
    /// Also says how many names it has.
    fn measure_named(file: &File) -> (Usage, u64) {
        use std::os::unix::fs::MetadataExt;
        match file.metadata().map(|m| m.nlink()) {
            Ok(0) => (Usage::default(), 0),
            links => (Usage::measure(file), links.unwrap_or(1)),
        }
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

    /// The counters as JSON (the saved forms, docs/FORMAT.md).
    pub fn to_json(&self) -> Value {
        let s = &self.stats;
        json!({
            "files": self.files, "containers": self.containers, "directories": self.directories,
            "written": s.logical_size, "logicalused": s.logical_data, "used": s.physical,
            "stored": s.stored_data, "lower_length": s.lower_length,
            "raw_low_savings": s.raw_low_savings, "records": s.records,
        })
    }

    pub fn from_json(v: &Value) -> Option<Usage> {
        let n = |k: &str| v[k].as_u64();
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

    /// The saved form (`user.densefs.usage` on the lower root, docs/FORMAT.md), for run `run`
    /// of tree `tree`.
    pub fn encode(&self, tree: u16, run: u32) -> Vec<u8> {
        let mut v = self.to_json();
        v["version"] = 1.into();
        v["tree"] = tree.into();
        v["run"] = run.into();
        v.to_string().into_bytes()
    }

    /// The counters saved for run `run` of tree `tree`, if that is what `value` holds.
    pub fn decode(value: &[u8], tree: u16, run: u32) -> Option<Usage> {
        let v: Value = serde_json::from_slice(value).ok()?;
        saved_by(&v, tree, run).then(|| Usage::from_json(&v)).flatten()
    }
}

/// Whether a saved form (the mount's or the datasets', docs/FORMAT.md) is version 1 and was
/// saved by run `run` of tree `tree`.
pub fn saved_by(v: &Value, tree: u16, run: u32) -> bool {
    v["version"].as_u64() == Some(1) && v["tree"].as_u64() == Some(u64::from(tree)) && v["run"].as_u64() == Some(u64::from(run))
}

/// A file being changed through writable containers: its contribution as last counted.
struct Tracked {
    key: (u64, u64),
    file: Arc<File>,
    state: Mutex<TrackedState>,
}

struct TrackedState {
    counted: Usage,
    /// The datasets holding its name (`datasets.rs`), kept as it moves.
    within: Within,
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
    /// The datasets' (`datasets.rs`); locked after `totals` where both are.
    datasets: Mutex<DatasetCounters>,
    tracked: Mutex<HashMap<(u64, u64), Arc<Tracked>>>,
    /// Changes counted (or not, while unknown) so far: a walk's result is adopted only if none
    /// came during it (`adopt_walk`).
    changes: AtomicU64,
    /// Changes of the tree under way (`begin`): a walk meeting one is not adopted either.
    in_flight: AtomicU64,
    /// Small files whose last name went, held open until measured (`remove_leaving`).
    leaving: Mutex<Leaving>,
    left: Condvar,
}

#[derive(Default)]
struct Leaving {
    queue: VecDeque<(File, Within)>,
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

/// A change of the tree under way, from before it reaches the lower until its counters moved:
/// no walk is adopted across it (`Accounting::begin`).
pub struct ChangeGuard<'a>(&'a Accounting);

impl Drop for ChangeGuard<'_> {
    fn drop(&mut self) {
        self.0.changes.fetch_add(1, Ordering::SeqCst);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Accounting {
    /// The counters now, if known; the files being changed are measured first (and the files
    /// deleted lately, `remove_leaving`). Unknown, nothing is measured: a walk answers.
    pub fn current(&self) -> Option<Usage> {
        if !self.known() {
            return None;
        }
        self.settle_tracked();
        self.totals.lock().clone()
    }

    /// A dataset's counters now, if it has them (`datasets.rs`).
    pub fn current_dataset(&self, key: Key) -> Option<Usage> {
        if !self.datasets.lock().has(key) {
            return None;
        }
        self.settle_tracked();
        self.datasets.lock().get(key).cloned()
    }

    /// Measures the files being changed and those deleted lately.
    fn settle_tracked(&self) {
        self.wait_for_leaving();
        let tracked: Vec<_> = self.tracked.lock().values().cloned().collect();
        for t in tracked {
            let mut st = t.state.lock();
            if !st.gone {
                let (now, links) = Usage::measure_named(&t.file);
                self.apply_file(&st.within, &now, &st.counted, links);
                st.counted = now;
            }
        }
    }

    /// Counters a clean run saved.
    pub fn set(&self, usage: Usage, datasets: DatasetCounters) {
        *self.totals.lock() = Some(usage);
        *self.datasets.lock() = datasets;
    }

    /// The counters as the last changes left them, without measuring the files being changed
    /// (cheap: what the metrics show).
    pub fn settled(&self) -> Option<Usage> {
        self.totals.lock().clone()
    }

    /// The datasets' counters as the last changes left them (cheap: what the metrics show).
    pub fn settled_datasets(&self) -> Vec<(Key, Usage)> {
        self.datasets.lock().iter().map(|(k, u)| (*k, u.clone())).collect()
    }

    /// The datasets' counters in their saved form (`datasets.rs`).
    pub fn encode_datasets(&self, dev: u64) -> Value {
        self.datasets.lock().encode(dev)
    }

    /// Whether any dataset has counters: where none does, no change needs to know where it
    /// happened (a dataset gets counters only by a walk adopted with nothing tracked and nothing
    /// under way, or at mount).
    pub fn counts_datasets(&self) -> bool {
        !self.datasets.lock().is_empty()
    }

    /// Something changed that a walk counting now may have seen either way (counted by
    /// `apply` where the counters are known).
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// A change of the tree begins (before it reaches the lower): until the guard goes, no walk
    /// is adopted, as the walk may have seen the tree before or after it.
    pub fn begin(&self) -> ChangeGuard<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.changes.fetch_add(1, Ordering::SeqCst);
        ChangeGuard(self)
    }

    /// Where the changes stand, before a walk.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }

    /// Whether a walk that began at `changes_before` saw a tree at rest: nothing changed during
    /// it, no change is under way, no file is being changed (a walk may meet a file half
    /// landed, whose own count at its end would then be off).
    fn quiet_since(&self, tracked: &HashMap<(u64, u64), Arc<Tracked>>, leaving: &Leaving, changes_before: u64) -> bool {
        tracked.is_empty()
            && leaving.queue.is_empty()
            && leaving.measuring == 0
            && self.in_flight.load(Ordering::SeqCst) == 0
            && self.changes() == changes_before
    }

    /// Takes what a walk of the whole tree found as the counters, if it saw the tree at rest
    /// (`changes_before`: `changes()` before it began). Says whether.
    pub fn adopt_walk(&self, usage: Usage, changes_before: u64) -> bool {
        let tracked = self.tracked.lock();
        let leaving = self.leaving.lock();
        let mut totals = self.totals.lock();
        if !self.quiet_since(&tracked, &leaving, changes_before) {
            return false;
        }
        *totals = Some(usage);
        true
    }

    /// As `adopt_walk`, for a walk of the dataset `key`; only while the mount's own counters
    /// are known (until then, changes are not followed at all).
    pub fn adopt_dataset_walk(&self, key: Key, usage: Usage, changes_before: u64) -> bool {
        let tracked = self.tracked.lock();
        let leaving = self.leaving.lock();
        let totals = self.totals.lock();
        let mut datasets = self.datasets.lock();
        if totals.is_none() || !self.quiet_since(&tracked, &leaving, changes_before) {
            return false;
        }
        datasets.set(key, usage);
        true
    }

    pub fn known(&self) -> bool {
        self.totals.lock().is_some()
    }

    /// Moves the counters by `after - before`, for a change in the place `within`.
    pub fn apply(&self, within: &Within, after: &Usage, before: &Usage) {
        self.changes.fetch_add(1, Ordering::SeqCst);
        let mut totals = self.totals.lock();
        if let Some(totals) = totals.as_mut() {
            totals.add(after);
            totals.sub(before);
        }
        self.datasets.lock().apply(within, after, before);
    }

    /// As `apply`, for a file with `links` names: where it has more than one, the datasets
    /// holding the others are not known, and every dataset loses its counters.
    pub fn apply_file(&self, within: &Within, after: &Usage, before: &Usage, links: u64) {
        self.apply(within, after, before);
        if links > 1 && after != before {
            self.datasets.lock().forget_all();
        }
    }

    /// The datasets of `within` lose their counters (`datasets.rs`).
    pub fn forget_datasets(&self, within: &Within) {
        self.changes.fetch_add(1, Ordering::SeqCst);
        self.datasets.lock().forget(within);
    }

    /// The datasets in one of `a`, `b` but not both lose their counters.
    pub fn forget_datasets_between(&self, a: &Within, b: &Within) {
        self.changes.fetch_add(1, Ordering::SeqCst);
        self.datasets.lock().forget_difference(a, b);
    }

    /// A file in `from` got a name in `to`: the datasets only `to` is in lose their counters.
    pub fn forget_datasets_gained(&self, from: &Within, to: &Within) {
        self.changes.fetch_add(1, Ordering::SeqCst);
        self.datasets.lock().forget_gained(from, to);
    }

    /// The file `key` (one name) moved from the place `from` to `to`: what it contributes moves
    /// between the datasets that differ (as last counted where it is being changed, else
    /// `measure`d now).
    pub fn moved_file(&self, key: (u64, u64), from: &Within, to: &Within, measure: impl FnOnce() -> Usage) {
        self.changes.fetch_add(1, Ordering::SeqCst);
        if let Some(t) = self.tracked.lock().get(&key).cloned() {
            let mut st = t.state.lock();
            if !st.gone {
                self.datasets.lock().moved(from, to, &st.counted);
            }
            st.within = to.clone();
            return;
        }
        if from.as_deref() != to.as_deref() {
            let usage = measure();
            self.datasets.lock().moved(from, to, &usage);
        }
    }

    /// Starts (or joins) tracking the file `key` whose lower file is `file`: `counted` says what
    /// it contributes now (nothing, for a file just created), `within` where its name is; both
    /// asked only if nobody tracks it.
    pub fn track(
        self: &Arc<Self>,
        key: (u64, u64),
        file: &Arc<File>,
        counted: impl FnOnce() -> Usage,
        within: impl FnOnce() -> Within,
    ) -> UsageHold {
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
                    state: Mutex::new(TrackedState { counted: counted(), within: within(), holders: 1, gone: false }),
                });
                map.insert(key, t.clone());
                t
            }
        };
        UsageHold { accounting: self.clone(), tracked }
    }

    /// A container of the file went; after the last, the file is measured and untracked. It
    /// stays tracked until measured: a last name going meanwhile (`untrack_gone`) then finds it
    /// and takes what this measure left counted, not a measure of its own as well.
    fn release(&self, tracked: &Arc<Tracked>) {
        let mut st = tracked.state.lock();
        st.holders -= 1;
        if st.holders > 0 {
            return;
        }
        if !st.gone {
            let (now, links) = Usage::measure_named(&tracked.file);
            self.apply_file(&st.within, &now, &st.counted, links);
            st.counted = now;
        }
        // The map before the state (`track`'s order); a container may have joined meanwhile.
        drop(st);
        let mut map = self.tracked.lock();
        if tracked.state.lock().holders == 0 && map.get(&tracked.key).is_some_and(|t| Arc::ptr_eq(t, tracked)) {
            map.remove(&tracked.key);
        }
    }

    /// Keeps the file `key` tracked until the returned hold goes, where a container tracks it
    /// now. A change taking a file's last name pins it first: else its last container could go
    /// meanwhile, measure it nameless and take its part away, and the change, finding it
    /// untracked, would take its own measure away as well (`remove_leaving`).
    pub fn pin(self: &Arc<Self>, key: (u64, u64)) -> Option<UsageHold> {
        let map = self.tracked.lock();
        let tracked = map.get(&key)?.clone();
        tracked.state.lock().holders += 1;
        Some(UsageHold { accounting: self.clone(), tracked })
    }

    /// The last name of the file `key`, in the place `within`, is about to go: what it
    /// contributes goes with it (as last counted where it is being changed, else `measure`d now).
    pub fn remove_file(&self, key: (u64, u64), within: &Within, measure: impl FnOnce() -> Usage) {
        if !self.untrack_gone(key, within) {
            self.apply(within, &Usage::default(), &measure());
        }
    }

    /// Where a container tracks the file `key`, whose last name (in `within`) went: its part
    /// as last counted leaves the counters, and its containers count nothing more. Says whether.
    fn untrack_gone(&self, key: (u64, u64), within: &Within) -> bool {
        let Some(t) = self.tracked.lock().remove(&key) else { return false };
        let mut st = t.state.lock();
        if !st.gone {
            st.gone = true;
            self.apply(within, &Usage::default(), &st.counted);
        }
        true
    }

    /// Takes the part of the file `file` (its last name, in `within`, gone) from the counters,
    /// and closes it.
    fn subtract_measured(&self, file: File, within: &Within) {
        self.apply(within, &Usage::default(), &Usage::measure_owned(file));
    }

    /// As `remove_file`, for a file whose lower file `file` was opened before its last name
    /// went (a container tracking it then may have gone meanwhile: its RELEASE comes when the
    /// kernel sends it). `later`: a small file no container tracks is measured on another
    /// thread, so that an `rm -rf` does not wait for each file's header to be read in turn.
    pub fn remove_leaving(self: &Arc<Self>, key: (u64, u64), file: Option<File>, later: bool, within: Within) {
        if self.untrack_gone(key, &within) {
            return;
        }
        match file {
            Some(file) if later => self.measure_later(file, within),
            Some(file) => self.subtract_measured(file, &within),
            None => {}
        }
    }

    fn measure_later(self: &Arc<Self>, file: File, within: Within) {
        let mut leaving = self.leaving.lock();
        if leaving.queue.len() >= LEAVING_LIMIT {
            drop(leaving);
            return self.subtract_measured(file, &within);
        }
        self.changes.fetch_add(1, Ordering::SeqCst);
        leaving.queue.push_back((file, within));
        if leaving.threads < LEAVING_THREADS.min(leaving.queue.len()) {
            let me = self.clone();
            let spawned = std::thread::Builder::new().name("densefs-unlinked".into()).spawn(move || me.measure_leaving());
            if spawned.is_ok() {
                leaving.threads += 1;
            }
        }
        if leaving.threads == 0 {
            let (file, within) = leaving.queue.pop_back().expect("just pushed");
            drop(leaving);
            return self.subtract_measured(file, &within);
        }
        self.left.notify_all();
    }

    fn measure_leaving(&self) {
        let mut leaving = self.leaving.lock();
        loop {
            let Some((file, within)) = leaving.queue.pop_front() else {
                self.left.wait(&mut leaving);
                continue;
            };
            leaving.measuring += 1;
            drop(leaving);
            self.subtract_measured(file, &within);
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

    /// A file's last container going (its RELEASE) while its last name goes on another thread
    /// (unlink, rename over it, recompress): its part leaves the counters once, whichever comes
    /// first. The window is narrow; many rounds find it.
    #[test]
    fn a_release_racing_the_last_name_going_subtracts_the_file_once() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let kept = dir.path().join("kept");
        std::fs::write(&kept, b"a file nothing touches").unwrap();
        let a = Arc::new(Accounting::default());
        let baseline = Usage::measure(&File::open(&kept).unwrap());
        for round in 0..20000 {
            let path = dir.path().join(format!("f{round}"));
            std::fs::write(&path, vec![b'x'; 5000]).unwrap();
            let file = Arc::new(std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap());
            let mut totals = baseline.clone();
            totals.add(&Usage::measure(&file));
            a.set(totals, DatasetCounters::default());
            let key = (file.metadata().unwrap().dev(), file.metadata().unwrap().ino());
            let hold = a.track(key, &file, || Usage::measure(&file), nowhere);
            std::io::Write::write_all(&mut &*file, b"grown while tracked").unwrap();
            let releasing = std::thread::spawn(move || drop(hold));
            // As an unlink does it (`DenseFs::leaving_counters`).
            let opened = File::open(&path).unwrap();
            let pin = a.pin(key);
            std::fs::remove_file(&path).unwrap();
            a.remove_leaving(key, Some(opened), round % 2 == 0, nowhere());
            drop(pin);
            releasing.join().unwrap();
            assert_eq!(a.current(), Some(baseline.clone()), "round {round}");
        }
    }

    #[test]
    fn unknown_counters_stay_unknown_until_a_quiet_walk() {
        let a = Accounting::default();
        a.apply(&nowhere(), &Usage::directory(), &Usage::default());
        assert_eq!(a.current(), None);
        let before = a.changes();
        a.apply(&nowhere(), &Usage::directory(), &Usage::default());
        assert!(!a.adopt_walk(Usage::default(), before), "a change came during the walk");
        assert!(a.adopt_walk(Usage::default(), a.changes()));
        a.apply(&nowhere(), &Usage::directory(), &Usage::default());
        assert_eq!(a.current().unwrap().directories, 1);
    }
}

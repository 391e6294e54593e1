//! Background compression (`background_compression`, as bcachefs names it): a file written with
//! a fast codec is re-encoded with a dense one once it has been closed and left alone for
//! `background_delay`, by threads the kernel schedules after everything else (SCHED_IDLE, idle
//! I/O priority), record by record inside its own container (`Container::densify_record`).
//!
//! Which files wait is kept in memory and in a work log in the lower root
//! (`.densefs.background`, one line per queued file and per file done), so a remount picks up
//! where the last run left off and a million densified files cost nothing at mount: only the
//! files still waiting are in the log, which each mount compacts.

use super::container::densify::{Densified, Densify};
use super::container::Container;
use super::inodes::{Content, Inode};
use super::lower;
use super::{DenseFs, FsResult};
use crate::codec::Compression;
use parking_lot::{Condvar, Mutex};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The work log's name in the lower root (hidden like every `.densefs.` name).
pub const WORK_LOG: &str = ".densefs.background";
/// The log is rewritten from the queue once it holds this many lines more than twice the queue.
const COMPACT_SLACK: u64 = 4096;
/// The pass syncs a file (freeing the old copies) after re-encoding this many bytes of it: the
/// lower file holds both encodings of at most this much (a sync costs tens of milliseconds, and
/// its old copies are punched a run at a time).
const SYNC_EVERY_BYTES: u64 = 32 << 20;
/// A pass goes on only once users' reads and writes have paused this long.
const USER_QUIET: Duration = Duration::from_millis(100);
/// How long a pass's thread waits before looking again while users are busy.
const YIELD_WAIT: Duration = Duration::from_millis(20);

/// A lower file, as the work log names it.
type Key = (u64, u64);

/// A file waiting for its pass.
#[derive(Clone, Debug)]
struct Waiting {
    generation: u32,
    /// Below the lower root, as it was when queued (after a remount the file is found by it, or
    /// by number where the lower allows).
    path: OsString,
    target: Compression,
    /// Its size when queued (what `densefs get` shows as waiting).
    bytes: u64,
    due: Instant,
}

#[derive(Default)]
struct Queue {
    /// Keys in the order they come due (a key queued again is found here twice; only the entry
    /// whose time matches `files` counts).
    order: VecDeque<(Instant, Key)>,
    files: HashMap<Key, Waiting>,
    log: Option<File>,
    log_lines: u64,
    /// The lower root (a /proc/self/fd path), where the log is made at its first line: a mount
    /// that never queues a file leaves the lower as it found it.
    log_dir: Option<std::path::PathBuf>,
    /// Writing the log failed once (logged): the queue is kept in memory only.
    log_failed: bool,
}

/// Counters shown by `densefs get`, `iostat` and the metrics.
#[derive(Default)]
struct Counters {
    files_done: AtomicU64,
    records: AtomicU64,
    /// Logical bytes of the records read for re-encoding.
    bytes_in: AtomicU64,
    /// Encoded bytes of the new copies (kept or not), counted by whoever compresses them.
    bytes_out: Arc<AtomicU64>,
    /// Bytes the lower files took before and after their passes.
    stored_before: AtomicU64,
    stored_after: AtomicU64,
    /// Passes put off because the file was open.
    postponed: AtomicU64,
    failed: AtomicU64,
    /// Times a pass's thread waited for users' writes to land first.
    yielded: AtomicU64,
    /// Milliseconds the pass's threads waited for `background_rate`.
    rate_waits_ms: AtomicU64,
}

/// The bound on the pass's lower I/O (`background_rate`): each record's bytes push the time
/// the next may start by their share of a second, and a thread ahead of it waits. The idle
/// I/O class alone orders nothing where the disk's scheduler ignores priorities (`none` and
/// `mq-deadline`, the defaults for NVMe and most SSDs).
struct Rate {
    bytes_per_second: u64,
    /// When the bytes charged so far have been spent at the rate.
    spent_until: Mutex<Instant>,
}

impl Rate {
    fn new(bytes_per_second: u64) -> Rate {
        Rate { bytes_per_second, spent_until: Mutex::new(Instant::now()) }
    }

    /// Charges `bytes`; waits while the pass is ahead of its rate (none for a rate of 0).
    fn take(&self, bytes: u64, waited_ms: &AtomicU64) {
        if self.bytes_per_second == 0 {
            return;
        }
        let now = Instant::now();
        let wait = {
            let mut until = self.spent_until.lock();
            *until = (*until).max(now) + Duration::from_secs_f64(bytes as f64 / self.bytes_per_second as f64);
            until.saturating_duration_since(now)
        };
        // Up to a second ahead is let through: a record of the largest size at a low rate.
        let wait = wait.saturating_sub(Duration::from_secs(1));
        if !wait.is_zero() {
            waited_ms.fetch_add(wait.as_millis() as u64, Ordering::Relaxed);
            std::thread::sleep(wait);
        }
    }
}

/// Whether the mount takes writes now (`mount -o remount,ro` changes it behind the daemon).
pub type Writable = Box<dyn Fn() -> bool + Send + Sync>;

pub struct Background {
    delay: Duration,
    rate: Rate,
    writable: Writable,
    queue: Mutex<Queue>,
    wake: Condvar,
    counters: Counters,
    stop: AtomicBool,
    /// Held by the pass for the file it works on (`stop` waits for it).
    busy: Mutex<()>,
    /// When a user last read or wrote (milliseconds after `epoch`).
    last_user_io: AtomicU64,
    epoch: Instant,
}

impl Background {
    pub fn new(delay: Duration, rate: u64, writable: Writable) -> Background {
        Background {
            delay,
            rate: Rate::new(rate),
            writable,
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            counters: Counters::default(),
            stop: AtomicBool::new(false),
            busy: Mutex::new(()),
            last_user_io: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn log_line(q: &mut Queue, line: String) {
        if q.log.is_none() && !q.log_failed {
            if let Some(dir) = &q.log_dir {
                match std::fs::OpenOptions::new().append(true).create(true).mode(0o600).open(dir.join(WORK_LOG)) {
                    Ok(file) => q.log = Some(file),
                    Err(e) => Self::log_failed(q, e),
                }
            }
        }
        if let Some(log) = &mut q.log {
            if let Err(e) = log.write_all(line.as_bytes()) {
                Self::log_failed(q, e);
            }
            q.log_lines += 1;
        }
    }

    fn log_failed(q: &mut Queue, e: std::io::Error) {
        tracing::warn!(
            "background compression's work log {WORK_LOG} in the lower root: {e}; the files waiting now are remembered until unmount only"
        );
        q.log = None;
        q.log_failed = true;
    }

    fn queue(&self, key: Key, waiting: Waiting) {
        let mut q = self.queue.lock();
        Self::log_line(&mut q, queued_line(key, &waiting));
        q.order.push_back((waiting.due, key));
        q.files.insert(key, waiting);
        drop(q);
        self.wake.notify_one();
    }

    /// `key`'s pass for the entry due at `due` is done (or the file is gone): out of the queue
    /// and the log, unless the file was closed again meanwhile (that later entry stands).
    fn done(&self, key: Key, generation: u32, due: Instant) {
        let mut q = self.queue.lock();
        if q.files.get(&key).is_some_and(|w| w.due != due) {
            return;
        }
        q.files.remove(&key);
        Self::log_line(&mut q, format!("- {} {generation}\n", key.1));
    }

    /// The next file whose time has come, waiting up to a second for one.
    fn next_due(&self) -> Option<(Key, Waiting)> {
        let mut q = self.queue.lock();
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return None;
            }
            let now = Instant::now();
            match q.order.front().copied() {
                Some((due, key)) if due <= now => {
                    q.order.pop_front();
                    match q.files.get(&key) {
                        Some(w) if w.due == due => return Some((key, w.clone())),
                        _ => continue, // queued again since: a later entry stands for it
                    }
                }
                Some((due, _)) => {
                    let until = due.min(deadline);
                    if until <= now || self.wake.wait_until(&mut q, until).timed_out() && Instant::now() >= deadline {
                        return None;
                    }
                }
                None => {
                    if self.wake.wait_until(&mut q, deadline).timed_out() {
                        return None;
                    }
                }
            }
        }
    }
}

impl DenseFs {
    /// A user's READ or WRITE came: a pass waits until they have been quiet a moment.
    pub(super) fn user_io(&self) {
        if let Some(b) = self.background.get() {
            b.last_user_io.store(b.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
    }

    /// A file written since it was opened has just been closed: where its directory asks for
    /// background compression, it is re-encoded once left alone for `background_delay`.
    pub(super) fn queue_background(&self, inode: &Inode, c: &Container) {
        let Some(background) = self.background.get() else { return };
        let parent = self.inodes.parent_of(inode.nodeid).unwrap_or(super::ROOT);
        let settings = self.settings_in(parent);
        let target = settings.background_compression;
        if target == Compression::OFF || c.compression() == crate::codec::Setting::Fixed(target) {
            return;
        }
        if asked_for_none(c, settings.compression) {
            return;
        }
        let path = inode
            .cached_fd()
            .and_then(|fd| std::fs::read_link(lower::proc_path(std::os::fd::AsRawFd::as_raw_fd(&*fd)).to_str().ok()?).ok())
            .and_then(|p| p.strip_prefix(&self.lower_root).ok().map(|p| p.as_os_str().to_os_string()))
            .unwrap_or_default();
        let waiting = Waiting { generation: inode.generation, path, target, bytes: c.size(), due: Instant::now() + background.delay };
        background.queue(inode.lower_id(), waiting);
    }

    /// Starts the background pass (a writable mount): reads and compacts the work log the last
    /// run left, queues what it names, and starts the thread.
    /// `writable`: asked before each file's pass; a mount remounted read-only writes nothing
    /// (its files wait, and go once it is writable again).
    pub fn start_background(self: &Arc<Self>, writable: Writable) {
        let background = Arc::new(Background::new(self.options.background_delay, self.options.background_rate, writable));
        if self.background.set(background.clone()).is_err() {
            return;
        }
        let root = match self.inode(super::ROOT) {
            Ok(root) => root,
            Err(e) => return tracing::warn!("background compression: {e}"),
        };
        let (dev, _) = root.lower_id();
        let (left, had_lines) = read_work_log(root.raw_fd());
        let mut q = background.queue.lock();
        q.log_dir = Some(Path::new("/proc/self/fd").join(root.raw_fd().to_string()));
        let due = Instant::now() + background.delay;
        for (ino, (generation, target, path)) in &left {
            q.order.push_back((due, (dev, *ino)));
            q.files.insert((dev, *ino), Waiting { generation: *generation, path: path.clone(), target: *target, bytes: 0, due });
        }
        // Compacted where the last run left lines; none is made until a file is queued.
        if had_lines {
            q.log = rewrite_work_log(root.raw_fd(), &q.files);
            q.log_failed = q.log.is_none();
            q.log_lines = q.files.len() as u64;
        }
        drop(q);
        if !left.is_empty() {
            tracing::info!("background compression: {} files left waiting by the last run", left.len());
        }
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("densefs-background".into()).spawn(move || {
            lower::run_when_idle();
            background_loop(weak, background);
        });
        if let Err(e) = spawned {
            tracing::error!("background compression: cannot start its thread: {e}");
        }
    }

    /// Stops the background pass (unmount): the file it is working on is left between two
    /// records, each whole; what is still waiting stays in the work log for the next mount.
    pub fn stop_background(&self) {
        if let Some(background) = self.background.get() {
            background.stop.store(true, Ordering::Relaxed);
            background.wake.notify_all();
            drop(background.busy.lock());
        }
    }

    /// `background` in `user.densefs.engine`: files and bytes waiting, and what was done.
    pub(super) fn background_snapshot(&self) -> Value {
        let Some(b) = self.background.get() else { return json!({"enabled": false}) };
        let (files, bytes) = {
            let q = b.queue.lock();
            (q.files.len(), q.files.values().map(|w| w.bytes).sum::<u64>())
        };
        let c = &b.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        json!({
            "enabled": true,
            "delay_seconds": b.delay.as_secs_f64(),
            "waiting_files": files,
            "waiting_bytes": bytes,
            "files_done": load(&c.files_done),
            "records": load(&c.records),
            "bytes_in": load(&c.bytes_in),
            "bytes_out": load(&c.bytes_out),
            "stored_before": load(&c.stored_before),
            "stored_after": load(&c.stored_after),
            "postponed": load(&c.postponed),
            "failed": load(&c.failed),
            "yielded": load(&c.yielded),
            "rate_bytes_per_second": b.rate.bytes_per_second,
            "rate_waits_ms": load(&c.rate_waits_ms),
        })
    }

    /// One file's pass. Returns whether it should be tried again later.
    fn densify(&self, background: &Background, key: Key, waiting: &Waiting) -> Retry {
        if !(background.writable)() {
            return Retry::Later;
        }
        let Some(inode) = self.inodes.find_file(&waiting.path, key.0, key.1, waiting.generation) else {
            return Retry::Gone;
        };
        let result = self.densify_inode(background, &inode, waiting.target);
        // A node the pass registered (no kernel lookup) goes again unless the kernel found it meanwhile.
        self.inodes.forget(inode.nodeid, 0);
        result
    }

    fn densify_inode(&self, background: &Background, inode: &Arc<Inode>, target: Compression) -> Retry {
        let node = match self.inode(inode.nodeid) {
            Ok(node) => node,
            Err(_) => return Retry::Gone,
        };
        let (c, opens) = {
            let mut open = node.open.lock();
            if open.handles > 0 || open.content.is_some() {
                return Retry::Later; // open (or data a failed close left in memory)
            }
            // Emptied since (a writable load would make an empty file a container).
            if lower::stat_fd(node.raw_fd()).is_ok_and(|st| st.st_size == 0) {
                return Retry::Gone;
            }
            let directory_compression = || self.settings_in(self.inodes.parent_of(inode.nodeid).unwrap_or(super::ROOT)).compression;
            match self.load_content(&node, true, None) {
                Ok(Content::Container(c)) if asked_for_none(&c, directory_compression()) => return Retry::Gone,
                Ok(Content::Container(c)) => {
                    open.content = Some(Content::Container(c.clone()));
                    open.background = true;
                    (c, open.opens)
                }
                Ok(Content::Plain(_)) => return Retry::Gone,
                Err(e) => {
                    tracing::warn!(file = %self.label(&node), "background compression cannot open the file: {e}");
                    return Retry::Failed;
                }
            }
        };
        let before = stored_bytes(&c);
        // Whether the mount is writable, asked again at most every 200 ms.
        let writable = Mutex::new((Instant::now(), true));
        let left_alone = || {
            {
                let open = node.open.lock();
                if open.opens != opens || node.is_retired() || background.stop.load(Ordering::Relaxed) {
                    return false;
                }
            }
            let mut w = writable.lock();
            if w.0.elapsed() > Duration::from_millis(200) {
                *w = (Instant::now(), (background.writable)());
            }
            w.1
        };
        let outcome = self.densify_records(background, &c, target, &left_alone);
        let finished = outcome.as_ref().is_ok_and(|&done| done) && left_alone();
        let result = if finished { c.finish_densify(target) } else { Ok(()) };
        let mut open = node.open.lock();
        open.background = false;
        let mine = open.content.as_ref().is_some_and(|k| matches!(k, Content::Container(k) if Arc::ptr_eq(k, &c)));
        if let Err(e) = outcome.and(result) {
            tracing::warn!(file = %self.label(&node), "background compression: {e}; tried again later");
            // Whatever it left in memory is what the lower holds: retried like a failed close.
            return Retry::Failed;
        }
        if mine && open.handles == 0 {
            open.content = None;
            if c.take_lower_changed() {
                self.lower_changed(inode, &mut open);
            } else {
                self.note_written_back(&mut open);
            }
        }
        drop(open);
        if !finished {
            return if background.stop.load(Ordering::Relaxed) { Retry::Stopped } else { Retry::Later };
        }
        self.record_size_hint(&c);
        let after = stored_bytes(&c);
        background.counters.stored_before.fetch_add(before, Ordering::Relaxed);
        background.counters.stored_after.fetch_add(after, Ordering::Relaxed);
        background.counters.files_done.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(file = %self.label(&node), before, after, "densified with {target}");
        Retry::Done
    }

    /// Re-encodes every record of `c` that is not in `target` yet, on this thread and helpers
    /// on the other cores (all scheduled only when nothing else runs). Ok(false): stopped
    /// because the file was opened (or the mount is going).
    fn densify_records(
        &self,
        background: &Background,
        c: &Arc<Container>,
        target: Compression,
        left_alone: &(dyn Fn() -> bool + Sync),
    ) -> FsResult<bool> {
        let records = c.record_count();
        let per_sync = (SYNC_EVERY_BYTES / c.layout().record_size()).max(1);
        let stopped = AtomicBool::new(false);
        let mut first = 0;
        while first < records && !stopped.load(Ordering::Relaxed) {
            let end = records.min(first + per_sync);
            self.densify_range(background, c, target, first..end, left_alone, &stopped)?;
            // The old copies are freed as it goes: the lower file never holds both encodings of
            // more than this much.
            c.sync(true)?;
            first = end;
        }
        Ok(!stopped.load(Ordering::Relaxed))
    }

    /// `densify_records` over `range`, on this thread and helpers.
    fn densify_range(
        &self,
        background: &Background,
        c: &Arc<Container>,
        target: Compression,
        range: std::ops::Range<u64>,
        left_alone: &(dyn Fn() -> bool + Sync),
        stopped: &AtomicBool,
    ) -> FsResult<()> {
        let records = range.end;
        let next = AtomicU64::new(range.start);
        let count = range.end - range.start;
        // One thread per core: a third on two cores made zstd-19 cost 10 % more CPU per byte (its
        // tables, about 2 MB a thread, no longer stayed in a core's cache between time slices).
        let threads = self.engine.cpu_threads().min(count as usize).max(1);
        // Users reading or writing lately, data of their writes not landed yet (beyond what the
        // pass's own threads hold in flight, a record each), or the engine's workers with a
        // queue: the pass waits (its threads are the kernel's last choice for a CPU, but the
        // lower disk has no such order for their reads and writes).
        let own = (threads * c.layout().record_size() as usize) as u64;
        let densify = Densify { target, encoded: background.counters.bytes_out.clone() };
        let foreground_busy = || {
            let quiet_ms = (background.epoch.elapsed().as_millis() as u64).saturating_sub(background.last_user_io.load(Ordering::Relaxed));
            quiet_ms < USER_QUIET.as_millis() as u64 || self.memory.admission().unlanded() > own || self.engine.cpu_queued() > 0
        };
        let work = || -> FsResult<()> {
            loop {
                let record = next.fetch_add(1, Ordering::Relaxed);
                if record >= records || stopped.load(Ordering::Relaxed) {
                    return Ok(());
                }
                loop {
                    if !left_alone() {
                        stopped.store(true, Ordering::Relaxed);
                        return Ok(());
                    }
                    if !foreground_busy() {
                        break;
                    }
                    background.counters.yielded.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(YIELD_WAIT);
                }
                let counters = &background.counters;
                match c.densify_record(record, &densify)? {
                    Densified::Skipped => continue,
                    Densified::Sent { logical, stored } => {
                        counters.bytes_in.fetch_add(logical, Ordering::Relaxed);
                        counters.records.fetch_add(1, Ordering::Relaxed);
                        // The copy read, and at most as much written (a copy lands only smaller).
                        background.rate.take(2 * stored, &counters.rate_waits_ms);
                    }
                }
            }
        };
        let helpers = threads - 1;
        let results: Vec<FsResult<()>> = std::thread::scope(|s| {
            let spawned: Vec<_> = (0..helpers)
                .map(|_| {
                    s.spawn(|| {
                        lower::run_when_idle();
                        work()
                    })
                })
                .collect();
            let mut results = vec![work()];
            results.extend(spawned.into_iter().map(|h| h.join().expect("background helper panicked")));
            results
        });
        results.into_iter().collect::<FsResult<Vec<()>>>()?;
        Ok(())
    }
}

/// What became of a file's pass.
enum Retry {
    Done,
    /// Deleted, replaced, or not a container: dropped from the queue.
    Gone,
    /// Open, or opened during the pass: queued again for after the delay.
    Later,
    /// An error (logged): queued again for after the delay.
    Failed,
    /// The mount is going: stays in the work log.
    Stopped,
}

fn background_loop(fs: Weak<DenseFs>, background: Arc<Background>) {
    loop {
        if background.stop.load(Ordering::Relaxed) {
            return;
        }
        let Some((key, waiting)) = background.next_due() else {
            if fs.strong_count() == 0 {
                return;
            }
            continue;
        };
        let Some(fs) = fs.upgrade() else { return };
        let _busy = background.busy.lock();
        if background.stop.load(Ordering::Relaxed) {
            return;
        }
        match fs.densify(&background, key, &waiting) {
            Retry::Done | Retry::Gone => background.done(key, waiting.generation, waiting.due),
            Retry::Stopped => {}
            retry @ (Retry::Later | Retry::Failed) => {
                let counter = if matches!(retry, Retry::Later) { &background.counters.postponed } else { &background.counters.failed };
                counter.fetch_add(1, Ordering::Relaxed);
                let again = Waiting { due: Instant::now() + background.delay, ..waiting };
                // Still in the log from its first line: no new one.
                let mut q = background.queue.lock();
                if q.files.get(&key).is_some_and(|w| w.due > again.due) {
                    continue; // closed again meanwhile: that entry stands
                }
                q.order.push_back((again.due, key));
                q.files.insert(key, again);
            }
        }
        compact_if_large(&fs, &background);
    }
}

/// The lower file's allocated bytes.
/// A file stored without compression where its directory compresses was asked for none
/// (`chattr +m`, `fileattr.rs`): the pass leaves it alone.
fn asked_for_none(c: &Container, directory_compression: crate::codec::Setting) -> bool {
    let off = crate::codec::Setting::Fixed(Compression::OFF);
    c.compression() == off && directory_compression != off
}

fn stored_bytes(c: &Container) -> u64 {
    c.lower_file().metadata().map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512).unwrap_or(0)
}

/// The work log's line for a file waiting (FORMAT.md, "Background compression work log").
fn queued_line(key: Key, w: &Waiting) -> String {
    format!("+ {} {} {} {}\n", key.1, w.generation, w.target, hex(w.path.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect()
}

/// The files a work log names as waiting: (inode number → generation, codec, path).
fn parse_work_log(text: &str) -> HashMap<u64, (u32, Compression, OsString)> {
    let mut waiting = HashMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields.as_slice() {
            ["+", ino, generation, target, path] => {
                let (Ok(ino), Ok(generation), Ok(target), Some(path)) =
                    (ino.parse(), generation.parse(), Compression::parse(target), unhex(path))
                else {
                    continue;
                };
                waiting.insert(ino, (generation, target, OsString::from_vec(path)));
            }
            ["-", ino, generation] => {
                if let (Ok(ino), Ok(generation)) = (ino.parse::<u64>(), generation.parse::<u32>()) {
                    if waiting.get(&ino).is_some_and(|(g, _, _)| *g == generation) {
                        waiting.remove(&ino);
                    }
                }
            }
            // A line a crash cut short, or from a later version: skipped.
            _ => {}
        }
    }
    waiting
}

/// The files the work log names as waiting, and whether it had any line.
fn read_work_log(root: std::os::fd::RawFd) -> (HashMap<u64, (u32, Compression, OsString)>, bool) {
    let path = Path::new("/proc/self/fd").join(root.to_string()).join(WORK_LOG);
    match std::fs::read_to_string(&path) {
        Ok(text) => (parse_work_log(&text), !text.is_empty()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (HashMap::new(), false),
        Err(e) => {
            tracing::warn!("background compression: cannot read its work log {WORK_LOG}: {e}");
            (HashMap::new(), false)
        }
    }
}

/// Writes the log anew with the files waiting (a new file renamed over the old), and returns
/// it open for appending; None (logged) where the lower refuses.
fn rewrite_work_log(root: std::os::fd::RawFd, files: &HashMap<Key, Waiting>) -> Option<File> {
    let dir = Path::new("/proc/self/fd").join(root.to_string());
    let tmp = dir.join(format!("{WORK_LOG}.tmp"));
    let write = || -> std::io::Result<File> {
        let mut text = String::new();
        for (key, w) in files {
            text.push_str(&queued_line(*key, w));
        }
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, dir.join(WORK_LOG))?;
        std::fs::OpenOptions::new().append(true).open(dir.join(WORK_LOG))
    };
    match write() {
        Ok(file) => Some(file),
        Err(e) => {
            tracing::warn!("background compression: cannot write its work log {WORK_LOG} in the lower root ({e}); files waiting are remembered until unmount only");
            None
        }
    }
}

fn compact_if_large(fs: &DenseFs, background: &Background) {
    let mut q = background.queue.lock();
    if q.log.is_none() || q.log_lines < 2 * q.files.len() as u64 + COMPACT_SLACK {
        return;
    }
    let Ok(root) = fs.inode(super::ROOT) else { return };
    q.log = rewrite_work_log(root.raw_fd(), &q.files);
    q.log_lines = q.files.len() as u64;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn the_work_log_keeps_what_was_queued_and_not_done() {
        let text = format!(
            "+ 12 7 zstd-19 {}\n+ 13 1 gzip-9 {}\n- 12 7\n+ 14 0 zstd-3 {}\n- 14 9\n+ 15 2 zstd-19 6",
            hex(b"a/b c"),
            hex("d/\u{e9}\n".as_bytes()),
            hex(b"e")
        );
        let waiting = parse_work_log(&text);
        let mut inos: Vec<u64> = waiting.keys().copied().collect();
        inos.sort();
        // 12 done; 14's done line names another generation (a reused number); 15 is cut short.
        assert_eq!(inos, vec![13, 14]);
        assert_eq!(waiting[&13].2, OsStr::new("d/\u{e9}\n"));
        assert_eq!(waiting[&13].1.to_string(), "gzip-9");
    }
}

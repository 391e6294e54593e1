//! Size hints (`format::hints`): the run record kept in the lower root, the hints a closed
//! file gets, and the check a cold lookup makes before reading a header.
//!
//! Rules that keep a hint true (docs/FORMAT.md, "Size hints and runs"):
//! - a writing run marks itself running in the record, durably, before it writes any hint,
//!   and marks itself ended only after its last write back and a `syncfs` of the lower;
//! - a hint is written when a file's last handle closes (at the FLUSH of its only handle,
//!   which close(2) waits for, else at the last RELEASE), or when a user sets the mtime of an
//!   open file (tar and cp -p do as they close it), once its header on the lower records the
//!   size the file has;
//! - before a header records another size, the store removes the file's hint (`Store`), so a
//!   run never leaves a hint behind that its own header contradicts.
//!
//! A power cut can keep a hint and undo the header write it follows: the run then never ends
//! cleanly, and its successors trust no hint written up to it.

use super::container::Container;
use super::lower::{self, XattrOn};
use super::usage::{DatasetCounters, Usage};
use super::DenseFs;
use crate::format::hints::{HintTrust, RunRecord, SizeHint, RUN_RECORD_LEN, SIZE_HINT_LEN};
use std::ffi::CStr;
use std::fs::File;
use std::os::fd::AsFd;

const HINT_NAME: &CStr = c"user.densefs.size";
const RECORD_NAME: &CStr = c"user.densefs.runs";
/// The datasets' statistics a clean run saved (`usage/datasets.rs`, docs/FORMAT.md).
pub const DATASETS_FILE: &str = ".densefs.datasets";

/// The datasets' counters run `run` of tree `tree` saved, if it saved any.
fn read_datasets(root: &File, tree: u16, run: u32) -> DatasetCounters {
    use std::os::unix::fs::MetadataExt;
    let path = std::path::Path::new("/proc/self/fd").join(std::os::fd::AsRawFd::as_raw_fd(root).to_string()).join(DATASETS_FILE);
    let read = || -> Option<DatasetCounters> {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
        if !super::usage::saved_by(&v, tree, run) {
            return None;
        }
        DatasetCounters::decode(&v["datasets"], root.metadata().ok()?.dev())
    };
    read().unwrap_or_default()
}

/// The statistics a clean run saved (`usage/`).
const USAGE_NAME: &CStr = c"user.densefs.usage";

/// What this run does with hints.
pub struct Hints {
    trust: HintTrust,
    /// The record as this run wrote it (writing runs only).
    writing: Option<RunRecord>,
}

impl Hints {
    /// The hint on the lower file `on`, if this run trusts it and it matches the lower file's
    /// length `lower_len` (None: not checked).
    fn trusted(&self, on: XattrOn<'_>, lower_len: Option<u64>) -> Option<SizeHint> {
        let hint = read_hint(on)?;
        (self.trust.trusts(&hint) && lower_len.is_none_or(|len| len == hint.lower_len)).then_some(hint)
    }
}

fn read_hint(on: XattrOn<'_>) -> Option<SizeHint> {
    let mut buf = [0u8; SIZE_HINT_LEN + 1];
    let n = lower::getxattr_on(on, HINT_NAME, &mut buf).ok()?;
    SizeHint::decode(&buf[..n])
}

fn read_record(root: &File) -> Option<RunRecord> {
    let mut buf = [0u8; RUN_RECORD_LEN + 1];
    let n = lower::getxattr_on(XattrOn::Fd(root.as_fd()), RECORD_NAME, &mut buf).ok()?;
    RunRecord::decode(&buf[..n])
}

/// Writes the record and makes it durable (an fsync of the root directory commits it).
fn write_record(root: &File, record: &RunRecord) -> std::io::Result<()> {
    lower::fsetxattr(root, RECORD_NAME, &record.encode(), 0)?;
    lower::fsync(root)
}

fn random_tree_id() -> u16 {
    let mut id = [0u8; 2];
    // SAFETY: getrandom writes at most 2 bytes into `id`.
    let n = unsafe { libc::getrandom(id.as_mut_ptr().cast(), id.len(), 0) };
    if n != 2 {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        id = (nanos as u16 ^ std::process::id() as u16).to_le_bytes();
    }
    u16::from_le_bytes(id)
}

/// Drops the size hint of a lower file whose header is about to record another size (an
/// absent hint, or a lower file system without user xattrs, is fine).
pub fn drop_size_hint(file: &File) -> std::io::Result<()> {
    match lower::removexattr_on(XattrOn::Fd(file.as_fd()), HINT_NAME) {
        Err(e) if !matches!(e.raw_os_error(), Some(libc::ENODATA | libc::ENOTSUP)) => Err(e),
        _ => Ok(()),
    }
}

impl DenseFs {
    /// The lower root directory, opened through the descriptor the daemon took before
    /// mounting: its path may lead to this very mount (a mount over the lower directory itself),
    /// which does not answer yet when a run begins.
    pub(super) fn lower_root_dir(&self) -> std::io::Result<File> {
        let root = self.inodes.node(super::ROOT)?;
        lower::reopen(root.raw_fd(), libc::O_RDONLY | libc::O_DIRECTORY)
    }

    /// Starts this run's use of hints: a writing run records itself in the lower root (and
    /// trusts its own hints); a read-only one reads the record. Without a record it can keep
    /// (no user xattrs on the lower), a run uses no hints.
    pub fn begin_run(&self, writable: bool) {
        let Ok(root) = self.lower_root_dir() else { return };
        let previous = read_record(&root);
        // The statistics the last run saved, if it ended cleanly (`usage/`).
        if let Some(p) = previous.filter(|p| !p.running) {
            let mut buf = vec![0u8; 64 * 1024];
            if let Ok(n) = lower::getxattr_on(XattrOn::Fd(root.as_fd()), USAGE_NAME, &mut buf) {
                if let Some(usage) = Usage::decode(&buf[..n], p.tree, p.run) {
                    self.usage.set(usage, read_datasets(&root, p.tree, p.run));
                }
            }
        }
        let hints = if writable {
            let record = RunRecord::begin(previous, random_tree_id());
            if let Err(e) = write_record(&root, &record) {
                tracing::info!("no size hints this run: the lower root keeps no run record ({e})");
                return;
            }
            if previous.is_some_and(|p| p.running) {
                tracing::info!("the last run did not end cleanly: files written before it read their headers for their sizes");
            }
            Hints { trust: record.trust(true), writing: Some(record) }
        } else {
            let Some(record) = previous else { return };
            Hints { trust: record.trust(false), writing: None }
        };
        let _ = self.hints.set(hints);
    }

    /// This run ended cleanly: everything it wrote is on stable storage (the caller synced the
    /// lower file system after the last write back), so its hints are trusted from now on.
    pub fn end_run(&self) {
        let Some(record) = self.hints.get().and_then(|h| h.writing) else { return };
        if lower::fence::raised() {
            tracing::warn!("this run was shut down: its end is not recorded, and the next mount treats it as a crash");
            return;
        }
        let result = self.lower_root_dir().and_then(|root| {
            // Another daemon took the lower over meanwhile (multihost: this one stalled): the
            // record is its run's now, and this run's end must not hide how that one ends.
            if read_record(&root) != Some(record) {
                tracing::warn!("the lower's run record is another run's now: this run's end is not recorded");
                return Ok(());
            }
            // The statistics first: the record's end is what makes them trusted.
            if let Some(usage) = self.usage.current() {
                if let Err(e) = lower::fsetxattr(&root, USAGE_NAME, &usage.encode(record.tree, record.run), 0) {
                    tracing::info!("cannot save the statistics ({e}): the next run walks the tree for them");
                }
                if let Err(e) = self.save_datasets(&root, record.tree, record.run) {
                    tracing::info!("cannot save the datasets' statistics in {DATASETS_FILE} ({e}): the next run walks each for them");
                }
            }
            write_record(&root, &record.end())
        });
        if let Err(e) = result {
            tracing::warn!("cannot record the clean end of this run ({e}): the next one will read headers for sizes");
        }
    }

    /// The datasets' counters (`usage/datasets.rs`), in a file of the lower root beside the
    /// mount's own (an xattr value is too small for many): written anew, renamed over the old.
    fn save_datasets(&self, root: &File, tree: u16, run: u32) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let dir = std::path::Path::new("/proc/self/fd").join(std::os::fd::AsRawFd::as_raw_fd(root).to_string());
        let datasets = self.usage.encode_datasets(root.metadata()?.dev());
        if datasets.as_array().is_none_or(|a| a.is_empty()) {
            return match std::fs::remove_file(dir.join(DATASETS_FILE)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        let text = serde_json::json!({"version": 1, "tree": tree, "run": run, "datasets": datasets}).to_string();
        let tmp = dir.join(format!("{DATASETS_FILE}.tmp"));
        std::fs::write(&tmp, text)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, dir.join(DATASETS_FILE))
    }

    pub(super) fn uses_hints(&self) -> bool {
        self.hints.get().is_some()
    }

    /// The size and record size a trusted hint gives a closed file whose lower status is `st`.
    pub(super) fn hinted_size(&self, on: XattrOn<'_>, st: &libc::stat) -> Option<(u64, u32)> {
        let hint = self.hints.get()?.trusted(on, Some(st.st_size as u64))?;
        Some((hint.size, 1 << hint.record_shift))
    }

    /// The hint this run trusts on the lower file `on` (its length not checked yet): a listing
    /// then does not read the file's header ahead, and keeps the size it gives
    /// (`DenseFs::keep_listed_size`).
    pub(super) fn listed_hint(&self, on: XattrOn<'_>) -> Option<SizeHint> {
        self.hints.get()?.trusted(on, None)
    }

    /// Gives a file whose last handle is closing the hint of its size, once its header records
    /// it (a failed write back leaves none). Best effort: a file without one reads its header.
    /// A hint already there as it would be is left alone; one written counts as a change of the
    /// lower file (its ctime moved), which `Container::take_lower_changed` reports.
    pub(super) fn record_size_hint(&self, c: &Container) {
        let Some(record) = self.hints.get().and_then(|h| h.writing) else { return };
        let Some((size, record_shift)) = c.settled_size() else { return };
        let (known, may_exist) = c.size_hint_known();
        // Given at the FLUSH, nothing written since: the RELEASE after it has nothing to do.
        if known.is_some_and(|h| (h.tree, h.run, h.size, h.record_shift) == (record.tree, record.run, size, record_shift)) {
            return;
        }
        let file = c.lower_file();
        let Ok(st) = lower::stat_fd(std::os::fd::AsRawFd::as_raw_fd(&**file)) else { return };
        let hint = SizeHint { tree: record.tree, run: record.run, size, record_shift, lower_len: st.st_size as u64 };
        let Some(value) = hint.encode() else { return };
        // From here on the file may carry a hint, which the store must remove before its header
        // records another size (a FLUSH leaves the store open: writes may follow). A file this
        // run created, or whose hint it removed, carries none to read.
        if may_exist && read_hint(XattrOn::Fd(file.as_fd())) == Some(hint) {
            c.size_hint_written(hint, false);
            return;
        }
        c.size_hint_written(hint, true);
        if let Err(e) = lower::fsetxattr(file, HINT_NAME, &value, 0) {
            tracing::debug!("no size hint for {}: {e}", c.label());
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::format::hints::{RUN_RECORD_XATTR, SIZE_HINT_XATTR};

    #[test]
    fn the_names_are_the_formats() {
        assert_eq!(super::HINT_NAME.to_str().unwrap(), SIZE_HINT_XATTR);
        assert_eq!(super::RECORD_NAME.to_str().unwrap(), RUN_RECORD_XATTR);
        assert!(SIZE_HINT_XATTR.starts_with(crate::core::props::XATTR_PREFIX), "hidden from users");
        assert!(RUN_RECORD_XATTR.starts_with(crate::core::props::XATTR_PREFIX), "hidden from users");
    }
}

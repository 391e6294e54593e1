//! `densefs recompress`: rewrite a file's stored form with the current (or given) properties,
//! online.
//!
//! A container keeping its record size and layout is re-encoded in place, record by record,
//! through the ordinary write path (readers and writers carry on). A plain file, or a container
//! changing its record size or of an earlier format (whose layout a write keeps: format 4's far
//! tables, format 3's slots; a format-4 file that is open or hard-linked is re-encoded in place
//! instead), is copied into a new container next to it (a hidden `.densefs.` name), synced,
//! given the old one's owner, mode, times and xattrs, and renamed over it; that needs the file
//! not to be open and not hard-linked (its lower inode changes), else it is left alone with an
//! error saying why.

use super::container::Container;
use super::inodes::{Content, Node};
use super::lower::{self, cstr};
use super::props::PropertyValues;
use super::usage::Usage;
use super::{DenseFs, FsError, FsResult, KernelCache};
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes copied per step when a file moves into a new container.
const COPY_CHUNK: usize = 1 << 20;

/// How long a recompress that needs the file closed waits for RELEASEs still on their way:
/// where every handle open on the file has been closed by its program (a FLUSH came, so close(2)
/// has returned and the RELEASE follows on its own), and otherwise briefly (a reader's close
/// sends no FLUSH), so that a file someone really holds open is refused without a long wait.
const RELEASE_GRACE_WHEN_CLOSING: Duration = Duration::from_millis(1500);
const RELEASE_GRACE: Duration = Duration::from_millis(100);

impl DenseFs {
    /// `spec`: empty, or `compression=…,recordsize=…` overriding the directory's properties;
    /// `name=…` is the file name the caller used (the kernel does not tell, and a hard-linked
    /// inode's remembered name may be stale).
    pub fn recompress(&self, nodeid: u64, spec: &str) -> FsResult<()> {
        let node = self.inode(nodeid)?;
        self.recompress_node(&node, spec)?;
        self.lower_changed(&node.inode, &mut node.open.lock());
        Ok(())
    }

    fn recompress_node(&self, node: &Node, spec: &str) -> FsResult<()> {
        match self.recompress_now(node, spec) {
            // close(2) returns before the kernel's RELEASE reaches the daemon: a file just
            // closed by the caller still counts as open for a moment.
            Err(e) if e.errno == libc::EBUSY && self.wait_for_last_close(node) => self.recompress_now(node, spec),
            result => result,
        }
    }

    /// Whether `node`'s handles all went within the grace that applies to it.
    fn wait_for_last_close(&self, node: &Node) -> bool {
        let all_closing = self
            .handles
            .lock()
            .values()
            .filter(|h| h.inode.nodeid == node.nodeid)
            .all(|h| h.closing.load(std::sync::atomic::Ordering::Relaxed));
        let deadline = Instant::now() + if all_closing { RELEASE_GRACE_WHEN_CLOSING } else { RELEASE_GRACE };
        while node.open.lock().handles > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    fn recompress_now(&self, node: &Node, spec: &str) -> FsResult<()> {
        let nodeid = node.nodeid;
        if node.kind != libc::S_IFREG {
            return Err(FsError::new(libc::EINVAL, "only regular files are recompressed"));
        }
        let parent = self.inodes.parent_of(nodeid).unwrap_or(super::ROOT);
        let mut settings = self.settings_in(parent);
        apply_spec(&mut settings, spec)?;
        let mut open = node.open.lock();
        let content = match &open.content {
            Some(c) => {
                self.make_content_writable(c, node)?; // readers may have it open read-only
                c.clone()
            }
            None => self.load_content(node, true, None)?,
        };
        let lower_meta = lower::reopen(node.raw_fd(), libc::O_RDONLY)?.metadata()?;
        let movable = open.handles == 0 && lower_meta.nlink() <= 1;
        if let Content::Container(c) = &content {
            // A file of format 4 that cannot move (open, hard-linked) is re-encoded in place and
            // keeps its format, as before format 5 existed.
            let same_records = c.layout().record_size() == settings.layout.record_size();
            if c.layout() == settings.layout || (same_records && c.layout().placed() && !movable) {
                return c.recompress(settings.compression, settings.record_policy());
            }
        }
        if open.handles > 0 {
            return Err(FsError::new(libc::EBUSY, "open; changing how it is stored needs it closed"));
        }
        if self.protected.flags(node) != 0 {
            return Err(FsError::new(libc::EPERM, "immutable or append-only (chattr): it stays in its lower file"));
        }
        if lower_meta.nlink() > 1 {
            return Err(FsError::new(libc::EMLINK, "hard-linked; changing how it is stored would split the links"));
        }
        let size = content_size(&content)?;
        let dir = self.inode(parent)?;
        // Rename over the name that really is this inode in its directory.
        let given = spec.split(',').find_map(|i| i.trim().strip_prefix("name=")).map(OsString::from);
        let name = given
            .into_iter()
            .chain(self.inodes.name_of(nodeid))
            // One name in this directory: a hint like "../x" must never reach outside it.
            .filter(|n| !n.as_encoded_bytes().contains(&b'/') && n != "." && n != ".." && !n.is_empty())
            .find(|n| {
                let Ok(c) = cstr(n) else { return false };
                lower::id_at(dir.raw_fd(), &c) == Some(node.lower_id())
            })
            .ok_or_else(|| FsError::new(libc::ESTALE, "cannot tell the file's name; run again"))?;
        let tmp_name = OsString::from(format!(".densefs.recompress.{nodeid}"));
        let tmp = cstr(&tmp_name)?;
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let file = lower::openat(dir.raw_fd(), &tmp, flags, 0o600)?;
        let copy = || -> FsResult<()> {
            let target = Arc::new(Container::create(
                file.try_clone()?,
                None,
                Self::create_settings(&settings),
                settings.record_policy(),
                self.engine.clone(),
                self.memory.clone(),
                Some(self.label(node)),
            )?);
            let mut at = 0;
            while at < size {
                let chunk = match &content {
                    Content::Container(c) => c.read(at, COPY_CHUNK)?.to_vec(),
                    Content::Plain(f) => {
                        let mut buf = vec![0u8; COPY_CHUNK.min((size - at) as usize)];
                        let n = lower::pread_full(f, &mut buf, at)?;
                        buf.truncate(n);
                        buf
                    }
                };
                if chunk.is_empty() {
                    break;
                }
                target.write(at, &chunk)?;
                at += chunk.len() as u64;
            }
            target.set_size(size)?;
            target.sync(false)?;
            copy_metadata(&lower_meta, lower::proc_path(node.raw_fd()), &file)?;
            let name = cstr(&name)?;
            let _change = self.usage.begin();
            lower::renameat(dir.raw_fd(), &tmp, dir.raw_fd(), &name)?;
            // The counters: the old lower file's part goes (its last name did), the new one's comes.
            let within = self.within(parent);
            self.usage.remove_file(node.lower_id(), &within, || Usage::measure(content.file()));
            self.usage.apply(&within, &Usage::measure(&file), &Usage::default());
            lower::fsync(&lower::reopen(dir.raw_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?)?;
            Ok(())
        };
        let result = copy();
        if result.is_err() {
            let _ = lower::unlinkat(dir.raw_fd(), &tmp, 0);
        }
        // The old inode's content is gone from this name; forget what was loaded for it.
        open.content = None;
        if result.is_ok() {
            // The name leads to another lower inode now: the old node may never stand for
            // anything else (its number is free to name the next file the lower creates), and
            // the kernel drops the name and the listing that carry it.
            self.inodes.retire(node);
            self.kernel_cache_stale(parent, KernelCache::Entry(name));
            self.kernel_cache_stale(parent, KernelCache::Listing);
        }
        result
    }
}

impl DenseFs {
    /// The codec `node`'s records get from now on (`chattr +c`/`+m`, `fileattr.rs`), made
    /// durable in its header. A plain file (there before the mount) has no header to keep one:
    /// it moves into a container only by `densefs recompress`, which needs it closed.
    pub(super) fn set_file_codec(&self, node: &Node, setting: crate::codec::Setting) -> FsResult<()> {
        let open = node.open.lock();
        let empty_plain = |c: &Content| matches!(c, Content::Plain(f) if f.metadata().is_ok_and(|m| m.len() == 0));
        if open.content.as_ref().is_none_or(empty_plain) {
            // No header to keep it in yet (an empty file takes no space): noted on the lower
            // file for its first write (`load_content_of`).
            let file = lower::reopen(node.raw_fd(), libc::O_RDONLY | libc::O_NONBLOCK)?;
            if file.metadata()?.len() == 0 {
                return super::data::set_codec_wish(&file, setting);
            }
        }
        let content = match &open.content {
            Some(c) => {
                self.make_content_writable(c, node)?;
                c.clone()
            }
            None => self.load_content(node, true, None)?,
        };
        match content {
            Content::Container(c) => {
                c.set_compression(setting);
                c.sync(true)
            }
            Content::Plain(_) if setting == crate::codec::Setting::Fixed(crate::codec::Compression::OFF) => Ok(()),
            Content::Plain(_) => Err(FsError::new(
                libc::EOPNOTSUPP,
                "a file that was on the lower before the mount is stored as it is: `densefs recompress` compresses it",
            )),
        }
    }
}

fn content_size(content: &Content) -> FsResult<u64> {
    Ok(match content {
        Content::Container(c) => c.size(),
        Content::Plain(f) => f.metadata()?.len(),
    })
}

fn apply_spec(settings: &mut PropertyValues, spec: &str) -> FsResult<()> {
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty() && !s.starts_with("name=")) {
        let (name, value) = item.split_once('=').ok_or_else(|| FsError::new(libc::EINVAL, format!("bad setting '{item}'")))?;
        super::props::property(name).and_then(|p| p.parse_into(value, settings)).map_err(|e| FsError::new(libc::EINVAL, e))?;
    }
    Ok(())
}

/// Gives the new lower file the old one's owner, mode, times and extended attributes.
fn copy_metadata(old: &std::fs::Metadata, old_path: std::ffi::CString, new: &std::fs::File) -> FsResult<()> {
    lower::fchown(new, old.uid(), old.gid())?;
    lower::fchmod(new, old.mode() & 0o7777)?;
    let mut names = vec![0u8; 65536];
    if let Ok(n @ 1..) = lower::listxattr(&old_path, &mut names) {
        for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
            let cname = std::ffi::CString::new(name).expect("BUG: split on NUL");
            let mut value = vec![0u8; 65536];
            if let Ok(len) = lower::getxattr(&old_path, &cname, &mut value) {
                lower::fsetxattr(new, &cname, &value[..len], 0)?;
            }
        }
    }
    let times = [
        libc::timespec { tv_sec: old.atime(), tv_nsec: old.atime_nsec() },
        libc::timespec { tv_sec: old.mtime(), tv_nsec: old.mtime_nsec() },
    ];
    lower::futimens(new, &times)?;
    Ok(())
}

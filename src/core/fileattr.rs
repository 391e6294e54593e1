//! File attributes, as `lsattr` and `chattr` see them (FS_IOC_GETFLAGS/SETFLAGS and
//! FS_IOC_FSGETXATTR/FSSETXATTR, which the kernel forwards to the daemon).
//!
//! - `c` and `m` follow btrfs: `c` shows on a file stored compressed (a container whose codec
//!   is not `off`) and on a directory whose `compression` is not `off`, `m` on the others.
//!   Setting them changes densefs's own setting: on a directory its `compression` property
//!   (`+c`: the mount's codec, or lz4 where that is `off`; `+m`: `off`; clearing both: inherit),
//!   on a container the codec its records get from now on (existing records keep theirs until
//!   rewritten: a write, `densefs recompress`, the background pass, which leaves `m` files
//!   alone), an empty file's first write included; a plain file (one that was there before the
//!   mount) shows `m` and refuses `+c` (EOPNOTSUPP: `densefs recompress` compresses it).
//! - `i` (immutable) and `a` (append only) on a regular file are kept and enforced by densefs
//!   (`Protected`), since the daemon itself must go on writing the file's container (landing
//!   records, freeing old copies) where the lower would refuse it: ext4's `a` allows no pwrite
//!   but at the end, no punched hole, no truncate. They are kept in `.densefs.attributes` in
//!   the lower root (docs/FORMAT.md), a line per protected inode. On a directory they go to
//!   the lower directory, which enforces them.
//! - Every other flag (`d`, `A`, `S`, `e`, the project id, ...) is the lower inode's own, as
//!   the lower file system supports it (EOPNOTSUPP where it does not).

use super::error::{FsError, FsResult};
use super::inodes::{Content, Inode, Node};
use super::lower::{self, cstr, FSXATTR_SIZE};
use super::DenseFs;
use crate::codec::{Compression, Setting};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};

/// linux/fs.h's FS_*_FL flags densefs interprets.
pub const FS_COMPR_FL: u32 = 0x0000_0004;
pub const FS_IMMUTABLE_FL: u32 = 0x0000_0010;
pub const FS_APPEND_FL: u32 = 0x0000_0020;
pub const FS_NOCOMP_FL: u32 = 0x0000_0400;
/// The same two in `struct fsxattr`'s fsx_xflags.
const FS_XFLAG_IMMUTABLE: u32 = 0x0000_0008;
const FS_XFLAG_APPEND: u32 = 0x0000_0010;
/// The flags densefs keeps itself for a regular file.
const PROTECTION: u32 = FS_IMMUTABLE_FL | FS_APPEND_FL;
/// The flags that are densefs's compression setting, never the lower's.
const COMPRESSION_FLAGS: u32 = FS_COMPR_FL | FS_NOCOMP_FL;

/// Where the protected inodes are kept, in the lower root (a reserved name: never listed).
const TABLE_NAME: &str = ".densefs.attributes";
const TABLE_HEADER: &str = "densefs attributes 1";

/// What a request is about to do to a regular file, for the protection flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Change bytes before the end, the size, or open for that (no O_APPEND, O_TRUNC).
    Contents,
    /// Add at the end, or open for writing with O_APPEND: `a` allows it.
    Append,
    /// Mode, owner, times set to a given value, xattrs.
    Metadata,
    /// Times set to now (`touch`): `a` allows it.
    Touch,
    /// Remove, rename or link one of its names.
    Name,
}

/// The regular files `i` or `a` protect: lower inode number → (generation, flags). The
/// generation tells a protected inode from a later one that reuses its number.
#[derive(Default)]
pub struct Protected {
    table: Mutex<HashMap<u64, (u32, u32)>>,
    /// Whether any file is protected: every check costs one load until one is.
    any: AtomicBool,
}

impl Protected {
    /// The table kept in lower root `root` (empty where there is none).
    pub fn load(root: RawFd) -> Protected {
        let name = cstr(OsStr::new(TABLE_NAME)).expect("BUG: no NUL in the name");
        let text = match lower::openat(root, &name, libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0) {
            Ok(f) => std::io::read_to_string(f).unwrap_or_default(),
            Err(_) => String::new(),
        };
        let mut table = HashMap::new();
        let mut lines = text.lines();
        if lines.next() == Some(TABLE_HEADER) {
            for line in lines {
                let mut words = line.split_whitespace();
                let parsed =
                    (|| Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?, u32::from_str_radix(words.next()?, 16).ok()?)))();
                match parsed {
                    Some((ino, generation, flags)) if flags & PROTECTION != 0 => {
                        table.insert(ino, (generation, flags & PROTECTION));
                    }
                    _ => tracing::warn!("{TABLE_NAME}: ignoring line '{line}'"),
                }
            }
        } else if !text.is_empty() {
            tracing::warn!("{TABLE_NAME} is not a table this densefs reads: no file is immutable or append-only");
        }
        let any = AtomicBool::new(!table.is_empty());
        Protected { table: Mutex::new(table), any }
    }

    /// `i` and `a` of the lower inode `ino` of generation `generation`.
    fn flags_of(&self, ino: u64, generation: impl FnOnce() -> u32) -> u32 {
        if !self.any.load(Ordering::Acquire) {
            return 0;
        }
        let Some((kept, flags)) = self.table.lock().get(&ino).copied() else { return 0 };
        if kept == generation() {
            flags
        } else {
            0
        }
    }

    /// `i` and `a` of a regular file.
    pub fn flags(&self, inode: &Inode) -> u32 {
        self.flags_of(inode.lower_id().1, || inode.generation)
    }

    /// EPERM where `i` or `a` forbid `change` to the regular file `inode`, as ext4 answers.
    pub fn check(&self, inode: &Inode, change: Change) -> FsResult<()> {
        refuse(self.flags(inode), change)
    }

    /// As `check`, for the entry `name` in lower directory `dir` whose inode number is `ino`
    /// (a name about to be removed or replaced).
    pub fn check_entry(&self, dir: RawFd, name: &std::ffi::CStr, ino: u64) -> FsResult<()> {
        let generation = || {
            let name = OsStr::from_bytes(name.to_bytes());
            lower::open_path(dir, name).map(|fd| lower::generation(fd.as_raw_fd())).unwrap_or(0)
        };
        refuse(self.flags_of(ino, generation), Change::Name)
    }

    /// Sets the protection of `inode` to `flags` and saves the table in lower root `root`
    /// (written aside, synced, renamed over the old one: a crash leaves one or the other).
    fn set(&self, root: RawFd, inode: &Inode, flags: u32) -> FsResult<()> {
        let mut table = self.table.lock();
        let key = inode.lower_id().1;
        let before = table.get(&key).copied();
        match flags & PROTECTION {
            0 => table.remove(&key),
            f => table.insert(key, (inode.generation, f)),
        };
        if let Err(e) = save(root, &table) {
            match before {
                Some(f) => table.insert(key, f),
                None => table.remove(&key),
            };
            return Err(e);
        }
        self.any.store(!table.is_empty(), Ordering::Release);
        Ok(())
    }
}

/// EPERM where `flags` (`i`, `a`) forbid `change`, as ext4 answers.
fn refuse(flags: u32, change: Change) -> FsResult<()> {
    let refused = match change {
        _ if flags & FS_IMMUTABLE_FL != 0 => true,
        Change::Append | Change::Touch => false,
        _ => flags & FS_APPEND_FL != 0,
    };
    if refused {
        let what = if flags & FS_IMMUTABLE_FL != 0 { "immutable" } else { "append-only" };
        return Err(FsError::new(libc::EPERM, format!("the file is {what} (chattr)")));
    }
    Ok(())
}

fn save(root: RawFd, table: &HashMap<u64, (u32, u32)>) -> FsResult<()> {
    let mut text = format!("{TABLE_HEADER}\n");
    let mut entries: Vec<_> = table.iter().collect();
    entries.sort();
    for (ino, (generation, flags)) in entries {
        text += &format!("{ino} {generation} {flags:x}\n");
    }
    let name = cstr(OsStr::new(TABLE_NAME))?;
    let aside = cstr(OsStr::new(&format!("{TABLE_NAME}.new")))?;
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let file = lower::openat(root, &aside, flags, 0o600)?;
    lower::pwrite_all(&file, text.as_bytes(), 0)?;
    lower::fdatasync(&file)?;
    lower::renameat(root, &aside, root, &name)?;
    Ok(())
}

/// What `c`/`m` say of a codec setting.
fn compression_flag(setting: Setting) -> u32 {
    if setting == Setting::Fixed(Compression::OFF) {
        FS_NOCOMP_FL
    } else {
        FS_COMPR_FL
    }
}

/// `i` and `a` as FS_*_FL flags and as fsx_xflags bits.
const XFLAG_OF: [(u32, u32); 2] = [(FS_IMMUTABLE_FL, FS_XFLAG_IMMUTABLE), (FS_APPEND_FL, FS_XFLAG_APPEND)];

/// `xflags` with its `i` and `a` bits those of the FS_*_FL `flags`.
fn with_protection(xflags: u32, flags: u32) -> u32 {
    XFLAG_OF.iter().fold(xflags, |x, &(fl, xf)| if flags & fl != 0 { x | xf } else { x & !xf })
}

/// The FS_*_FL `i` and `a` of fsx_xflags `xflags`.
fn protection_of(xflags: u32) -> u32 {
    XFLAG_OF.iter().filter(|&&(_, xf)| xflags & xf != 0).fold(0, |f, &(fl, _)| f | fl)
}

/// fsx_xflags, the first field of a `struct fsxattr`.
fn xflags(fsx: &[u8; FSXATTR_SIZE]) -> u32 {
    u32::from_ne_bytes(fsx[0..4].try_into().expect("4 bytes"))
}

fn set_xflags(fsx: &mut [u8; FSXATTR_SIZE], xflags: u32) {
    fsx[0..4].copy_from_slice(&xflags.to_ne_bytes());
}

impl DenseFs {
    /// FS_IOC_GETFLAGS.
    pub fn file_flags(&self, nodeid: u64) -> FsResult<u32> {
        let node = self.inode(nodeid)?;
        let lower_flags = lower::get_flags(&self.reopen_for_flags(&node)?)?;
        self.shown_flags(&node, lower_flags)
    }

    /// The flags `lsattr` sees of `node`, whose lower inode has `lower_flags`.
    fn shown_flags(&self, node: &Node, lower_flags: u32) -> FsResult<u32> {
        Ok(match node.kind {
            libc::S_IFDIR => (lower_flags & !COMPRESSION_FLAGS) | compression_flag(self.effective(node)?.values.compression),
            _ => (lower_flags & !COMPRESSION_FLAGS) | self.protected.flags(node) | self.file_compression_flag(node)?,
        })
    }

    /// FS_IOC_SETFLAGS (the kernel checked ownership, and CAP_LINUX_IMMUTABLE for `i`/`a`).
    pub fn set_file_flags(&self, nodeid: u64, flags: u32) -> FsResult<()> {
        let node = self.inode(nodeid)?;
        let file = self.reopen_for_flags(&node)?;
        let lower_before = lower::get_flags(&file)?;
        let before = self.shown_flags(&node, lower_before)?;
        // chattr sets what it read plus or minus the flags asked for: `+m` on a file showing
        // `c` sends both, and the one added wins.
        let compression = match flags & !before & COMPRESSION_FLAGS {
            COMPRESSION_FLAGS => return Err(FsError::new(libc::EINVAL, "c and m exclude each other")),
            0 => flags & before & COMPRESSION_FLAGS,
            added => added,
        };
        let kept_here = if node.kind == libc::S_IFDIR { COMPRESSION_FLAGS } else { COMPRESSION_FLAGS | PROTECTION };
        let lower_after = (flags & !kept_here) | (lower_before & kept_here & !COMPRESSION_FLAGS);
        if lower_after != lower_before {
            lower::set_flags(&file, lower_after)?;
        }
        if node.kind != libc::S_IFDIR && (flags ^ before) & PROTECTION != 0 {
            self.protected.set(self.inode(super::ROOT)?.raw_fd(), &node, flags)?;
        }
        if compression != before & COMPRESSION_FLAGS {
            self.set_compression_flags(&node, compression)?;
        }
        self.kernel_attrs_stale(&node);
        Ok(())
    }

    /// FS_IOC_FSGETXATTR: the lower's `struct fsxattr`, with densefs's `i` and `a`.
    pub fn file_xattr_flags(&self, nodeid: u64) -> FsResult<[u8; FSXATTR_SIZE]> {
        let node = self.inode(nodeid)?;
        let mut fsx = lower::get_fsxattr(&self.reopen_for_flags(&node)?)?;
        if node.kind != libc::S_IFDIR {
            let shown = with_protection(xflags(&fsx), self.protected.flags(&node));
            set_xflags(&mut fsx, shown);
        }
        Ok(fsx)
    }

    /// FS_IOC_FSSETXATTR: `i` and `a` of a regular file kept here, the rest (project id
    /// included) to the lower.
    pub fn set_file_xattr_flags(&self, nodeid: u64, fsx: &[u8]) -> FsResult<()> {
        let mut fsx: [u8; FSXATTR_SIZE] = fsx.try_into().map_err(|_| FsError::errno(libc::EINVAL))?;
        let node = self.inode(nodeid)?;
        let file = self.reopen_for_flags(&node)?;
        if node.kind != libc::S_IFDIR {
            let ours = protection_of(xflags(&fsx));
            // The lower inode keeps its own `i` and `a` (none, unless set before the mount).
            let lower_now = protection_of(xflags(&lower::get_fsxattr(&file)?));
            let to_lower = with_protection(xflags(&fsx), lower_now);
            set_xflags(&mut fsx, to_lower);
            lower::set_fsxattr(&file, &fsx)?;
            if ours != self.protected.flags(&node) {
                self.protected.set(self.inode(super::ROOT)?.raw_fd(), &node, ours)?;
            }
        } else {
            lower::set_fsxattr(&file, &fsx)?;
        }
        self.kernel_attrs_stale(&node);
        Ok(())
    }

    /// EPERM where `i` or `a` forbid `change` to `inode` (regular files; the lower enforces
    /// them on the rest).
    pub(super) fn check_protection(&self, inode: &Inode, change: Change) -> FsResult<()> {
        if inode.kind != libc::S_IFREG {
            return Ok(());
        }
        self.protected.check(inode, change)
    }

    /// The lower inode opened for the flag ioctls (ENOTTY for what has no flags here).
    fn reopen_for_flags(&self, node: &Node) -> FsResult<std::fs::File> {
        match node.kind {
            libc::S_IFDIR => Ok(lower::reopen(node.raw_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?),
            libc::S_IFREG => Ok(lower::reopen(node.raw_fd(), libc::O_RDONLY | libc::O_NONBLOCK)?),
            _ => Err(FsError::errno(libc::ENOTTY)),
        }
    }

    /// `c` for a container with a codec, `m` for one without and for a plain file; an empty
    /// file is what its first write will make it, a container of its directory's codec.
    fn file_compression_flag(&self, node: &Node) -> FsResult<u32> {
        let content = {
            let open = node.open.lock();
            match &open.content {
                Some(c) => c.clone(),
                None => self.load_content(node, false, None)?,
            }
        };
        Ok(match content {
            Content::Container(c) => compression_flag(c.compression()),
            Content::Plain(file) if file.metadata()?.len() == 0 => match super::data::codec_wish(&file) {
                Some(wish) => compression_flag(wish),
                None => {
                    let parent = self.inodes.parent_of(node.nodeid).unwrap_or(super::ROOT);
                    compression_flag(self.settings_in(parent).compression)
                }
            },
            Content::Plain(_) => FS_NOCOMP_FL,
        })
    }

    /// `chattr +c`, `+m`, or neither, as the module's comment says.
    fn set_compression_flags(&self, node: &Node, wanted: u32) -> FsResult<()> {
        let mount_codec = match self.options.properties.compression {
            s if s == Setting::Fixed(Compression::OFF) => Setting::LZ4,
            s => s,
        };
        if node.kind == libc::S_IFDIR {
            let value = match wanted {
                FS_COMPR_FL => Some(mount_codec.to_string()),
                FS_NOCOMP_FL => Some("off".to_string()),
                _ => None,
            };
            return self.set_property(node.nodeid, "compression", value.as_deref());
        }
        let parent = self.inodes.parent_of(node.nodeid).unwrap_or(super::ROOT);
        let here = self.settings_in(parent).compression;
        let setting = match wanted {
            FS_COMPR_FL if here == Setting::Fixed(Compression::OFF) => mount_codec,
            FS_NOCOMP_FL => Setting::Fixed(Compression::OFF),
            _ => here,
        };
        self.set_file_codec(node, setting)
    }
}

//! Open files: positioned reads and writes, space (fallocate), syncing and seeking.

use crate::core::error::check;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd};
use std::os::unix::fs::FileExt;

/// Asks the lower file system to start reading a range into its page cache (read-ahead); it
/// returns without waiting for the I/O.
pub fn will_need(file: impl AsFd, offset: u64, len: u64) -> io::Result<()> {
    fadvise(file, offset, len, libc::POSIX_FADV_WILLNEED)
}

/// Drops the cached pages of a range that will not be read again (a stream's past).
pub fn dont_need(file: impl AsFd, offset: u64, len: u64) -> io::Result<()> {
    fadvise(file, offset, len, libc::POSIX_FADV_DONTNEED)
}

fn fadvise(file: impl AsFd, offset: u64, len: u64, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: posix_fadvise only reads its integer arguments; the fd is open for the call.
    let r = unsafe { libc::posix_fadvise(file.as_fd().as_raw_fd(), offset as libc::off_t, len as libc::off_t, advice) };
    match r {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// Asks the lower file system to start writing the file's dirty pages to its disk; it returns
/// without waiting for them (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, no durability implied).
pub fn start_writeback(file: impl AsFd) -> io::Result<()> {
    // SAFETY: sync_file_range only reads its integer arguments; the fd is open for the call.
    check(unsafe { libc::sync_file_range(file.as_fd().as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) }).map(|_| ())
}

/// Reads until `buf` is full or the file ends: the bytes read.
pub fn pread_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// [`pread_full`] on a descriptor the caller keeps (an inode's cached one, opened readable).
pub fn pread_full_fd(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    // SAFETY: the File is only borrowed for the reads: ManuallyDrop never closes the
    // descriptor, which `fd` keeps owning and which stays open for the borrow's lifetime.
    let file = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(fd.as_raw_fd()) });
    pread_full(&file, buf, offset)
}

pub fn pwrite_all(file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    super::fence::check()?;
    #[cfg(test)]
    power_cut::before_write(file, offset, buf.len());
    file.write_all_at(buf, offset)
}

/// syncfs(2): everything written to the file system `file` is on, on stable storage.
pub fn syncfs(file: &File) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: a plain call on the descriptor `file` owns.
    check(unsafe { libc::syncfs(file.as_raw_fd()) })?;
    Ok(())
}

/// ftruncate(2): the file's new size.
pub fn set_len(file: &File, size: u64) -> io::Result<()> {
    super::fence::check()?;
    file.set_len(size)
}

/// fallocate(2) with its mode bits (FALLOC_FL_*).
pub fn fallocate(file: &File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: a plain call on the descriptor `file` owns.
    check(unsafe { libc::fallocate(file.as_raw_fd(), mode, offset as libc::off_t, len as libc::off_t) })?;
    Ok(())
}

/// Deallocates a range, keeping the size (nothing for an empty range).
pub fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    #[cfg(test)]
    power_cut::punched(file);
    fallocate(file, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, len)
}

pub fn fdatasync(file: &File) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: a plain call on the descriptor `file` owns.
    check(unsafe { libc::fdatasync(file.as_raw_fd()) })?;
    #[cfg(test)]
    power_cut::synced(file);
    Ok(())
}

pub fn fsync(file: &File) -> io::Result<()> {
    super::fence::check()?;
    // SAFETY: a plain call on the descriptor `file` owns.
    check(unsafe { libc::fsync(file.as_raw_fd()) })?;
    #[cfg(test)]
    power_cut::synced(file);
    Ok(())
}

/// lseek(2): the new position.
pub fn lseek(file: &File, offset: libc::off_t, whence: libc::c_int) -> io::Result<libc::off_t> {
    // SAFETY: a plain call on the descriptor `file` owns.
    let r = unsafe { libc::lseek(file.as_raw_fd(), offset, whence) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The first offset at or after `from` holding data (SEEK_DATA), or `None` past the last.
/// A file system without SEEK_DATA reports everything as data, which is only slower.
pub fn seek_data(file: &File, from: u64) -> io::Result<Option<u64>> {
    let Ok(from) = libc::off_t::try_from(from) else { return Ok(None) };
    match lseek(file, from, libc::SEEK_DATA) {
        Ok(r) => Ok(Some(r as u64)),
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(Some(from as u64)),
        Err(e) => Err(e),
    }
}

/// Whether the lower file system allows a file to reach `offset` (its largest file size):
/// llseek refuses positions past it. The descriptor's position is not used for I/O here.
pub fn offset_allowed(file: &File, offset: u64) -> bool {
    libc::off_t::try_from(offset).is_ok_and(|off| lseek(file, off, libc::SEEK_SET).is_ok())
}

/// For tests: what a power cut could undo in a watched lower file, as tests/fault/libpowercut.c
/// records it for the daemon. Every 4 KiB block written since the file's last successful sync
/// keeps, with each block's contents at that sync (its first pre-image since); size changes and
/// hole punches are taken as durable (the lower file system journals them).
#[cfg(test)]
pub mod power_cut {
    use std::collections::{BTreeMap, HashMap};
    use std::fs::File;
    use std::os::unix::fs::MetadataExt;
    use std::sync::Mutex;

    const BLOCK: u64 = 4096;

    /// Block offset -> its contents at the last sync.
    type Blocks = BTreeMap<u64, Vec<u8>>;

    /// What is recorded of one watched file.
    #[derive(Default)]
    struct Watched {
        /// Its blocks written since the last sync.
        unsynced: Blocks,
        /// How many writes it took (each a round trip on a network lower).
        writes: usize,
        /// How many hole punches it took.
        punches: usize,
    }

    /// (dev, ino) of each watched file -> what is recorded of it.
    static WATCHED: Mutex<Option<HashMap<(u64, u64), Watched>>> = Mutex::new(None);

    fn key(file: &File) -> Option<(u64, u64)> {
        file.metadata().ok().map(|m| (m.dev(), m.ino()))
    }

    /// Runs `f` on the record of `file`, if it is watched.
    fn with_watched<T>(file: &File, f: impl FnOnce(&mut Watched) -> T) -> Option<T> {
        let key = key(file)?;
        WATCHED.lock().unwrap().as_mut().and_then(|m| m.get_mut(&key)).map(f)
    }

    /// Starts recording the writes to `file` (nothing written before counts as unsynced).
    pub fn watch(file: &File) {
        let key = key(file).expect("stat of a watched file");
        WATCHED.lock().unwrap().get_or_insert_with(HashMap::new).insert(key, Watched::default());
    }

    pub(super) fn before_write(file: &File, offset: u64, len: usize) {
        with_watched(file, |w| {
            w.writes += 1;
            let mut block = offset / BLOCK * BLOCK;
            while block < offset + len as u64 {
                w.unsynced.entry(block).or_insert_with(|| {
                    let mut old = vec![0u8; BLOCK as usize];
                    super::pread_full(file, &mut old, block).expect("pre-image of a watched block");
                    old
                });
                block += BLOCK;
            }
        });
    }

    pub(super) fn punched(file: &File) {
        with_watched(file, |w| w.punches += 1);
    }

    /// How many hole punches a watched file took since it was watched.
    pub fn punches(file: &File) -> usize {
        with_watched(file, |w| w.punches).unwrap_or(0)
    }

    pub(super) fn synced(file: &File) {
        with_watched(file, |w| w.unsynced.clear());
    }

    /// How many writes a watched file took since it was watched.
    pub fn writes(file: &File) -> usize {
        with_watched(file, |w| w.writes).unwrap_or(0)
    }

    /// The blocks of a watched file written since its last sync, with their contents at that sync.
    pub fn unsynced(file: &File) -> Blocks {
        with_watched(file, |w| w.unsynced.clone()).unwrap_or_default()
    }
}

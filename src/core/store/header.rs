//! The header and block 0: the header writes, the announcement of a run (a new file's birth
//! header with it), block 0 of a new file gathered into one write, and syncs of the lower file.

use super::{GatheredBlock, Store, StoreState};
use crate::core::error::FsResult;
use crate::core::lower;
use crate::format::layout::HEADER_BLOCK;
use crate::format::{Header, BIRTH_HEADER_SIZE, BIRTH_HEADER_XATTR};
use std::os::fd::{AsFd, BorrowedFd};

impl Store {
    // ---- header and syncs --------------------------------------------------------------

    /// Writes the header (if anything in it changed), recording the current size; block 0 is
    /// on the lower file afterwards, if it was being gathered.
    pub fn write_header(&self, st: &mut StoreState) -> FsResult<()> {
        if !st.header_on_disk {
            if st.size == 0 {
                return Ok(()); // an empty new file stays an empty lower file
            }
            self.announce(st)?; // its first header, durable
        }
        self.write_header_sized(st, st.size, false)?;
        Ok(self.write_gathered(st)?)
    }

    /// `first`: the lower file may be empty (announcing a new file): its first header is written.
    /// Returns the header written (as it was already, if nothing changed).
    pub(super) fn write_header_sized(&self, st: &mut StoreState, size: u64, first: bool) -> FsResult<Header> {
        if size == st.persisted_size && !st.header_stale {
            return Ok(self.header(st, size, st.header_seq));
        }
        debug_assert!(st.header_on_disk || first, "BUG: a new file's first header goes through announce");
        if size != st.persisted_size && st.size_hint_may_exist {
            // The hint names the size the header is about to stop recording.
            crate::core::hints::drop_size_hint(&self.lower)?;
            st.size_hint_may_exist = false;
            st.size_hint_on_lower = None;
        }
        st.touch();
        let sequence = st.header_seq + 1;
        let header = self.header(st, size, sequence);
        let encoded = header.encode();
        if st.header_on_disk {
            self.write_meta(st, &encoded, Header::copy_offset(sequence))?;
        } else {
            // A new file's first header fills both copies: each write after it replaces one.
            self.write_meta(st, &[encoded.as_slice(), encoded.as_slice()].concat(), 0)?;
        }
        st.header_seq = sequence;
        st.persisted_size = size;
        st.header_stale = false;
        st.header_on_disk = true;
        Ok(header)
    }

    fn header(&self, st: &StoreState, size: u64, sequence: u64) -> Header {
        Header {
            layout: self.layout,
            checksum: self.checksum,
            setting: st.compression,
            size,
            sequence,
            durable_below: st.epochs.durable_below,
            heal_from: st.persisted_heal_from(),
        }
    }

    /// (its first copy or size); then writes the tables healed so far.
    ///
    /// A new or emptied file (an empty lower file) gets its first header here, before any data:
    /// a power cut can undo any write not covered by a sync while the lower file keeps the
    /// length later writes gave it, and a lower file whose block 0 went back to zeros with data
    /// behind it would be taken for a plain file, its slots served as its bytes. So the header
    /// is also recorded as the lower file's birth header (an xattr: metadata, which the lower
    /// file system journals ahead of the data blocks written after it), which stands in for a
    /// zeroed block 0; only where the lower keeps no xattrs is the header synced instead.
    pub(super) fn announce(&self, st: &mut StoreState) -> FsResult<()> {
        if st.announced {
            return Ok(());
        }
        st.header_stale = true;
        let birth = !st.header_on_disk;
        // The size stays what the last header said: records of this run may still be dirty
        // (say, a tail zeroed before the file grew), and a larger size must not reach the disk
        // before they have landed, or a crash would show what they held before.
        let header = self.write_header_sized(st, st.persisted_size, true)?;
        if !(birth && self.record_birth(&header)) {
            self.write_gathered(st)?;
            lower::fdatasync(&self.lower)?;
            st.epochs.announced();
        }
        st.announced = true;
        for group in std::mem::take(&mut st.unpersisted) {
            if let Some(table) = st.tables.get(&group).cloned() {
                self.write_table(st, group, &table)?;
            }
        }
        if st.all_healed() && st.epochs.heal_from != 0 {
            st.header_stale = true;
        }
        Ok(())
    }

    pub(super) fn birth_header(fd: BorrowedFd<'_>) -> Option<Header> {
        let name = std::ffi::CString::new(BIRTH_HEADER_XATTR).expect("no NUL in the name");
        let mut value = [0u8; BIRTH_HEADER_SIZE + 1];
        let n = lower::getxattr_on(lower::XattrOn::Fd(fd), &name, &mut value).ok()?;
        Header::decode_birth(&value[..n])
    }

    /// Drops the lower file's birth header, if it has one.
    pub(super) fn forget_birth(&self) -> std::io::Result<()> {
        let name = std::ffi::CString::new(BIRTH_HEADER_XATTR).expect("no NUL in the name");
        match lower::removexattr_on(lower::XattrOn::Fd(self.lower.as_fd()), &name) {
            Err(e) if e.raw_os_error() != Some(libc::ENODATA) && e.raw_os_error() != Some(libc::ENOTSUP) => Err(e),
            _ => Ok(()),
        }
    }

    /// Records `header` (a new file's first) as the lower file's birth header. False where the
    /// lower file system keeps no user xattrs (or refuses this one): the header must then be
    /// synced before anything else is written.
    fn record_birth(&self, header: &Header) -> bool {
        let name = std::ffi::CString::new(BIRTH_HEADER_XATTR).expect("no NUL in the name");
        match lower::fsetxattr(&self.lower, &name, &header.encode_birth(), 0) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(file = %self.label(), "no birth header ({e}): the first header is synced instead");
                false
            }
        }
    }

    // ---- block 0 of a new file -----------------------------------------------------------

    /// Starts gathering block 0 if the lower file has none yet (a new or emptied file whose
    /// first header is still to come); returns whether block 0 is being gathered. A landing
    /// gathers: its first header (both copies), an inline record, its descriptor and, when
    /// the landing completes the file, the header recording the size all go into one write
    /// ([`Store::write_gathered`]) instead of four — each a round trip on a network lower.
    ///
    /// Crash-safe as the separate writes were: the birth header (an xattr) is still recorded
    /// before any data, so a crash before block 0 is written leaves the empty container it
    /// stands for; a power cut sees the same block either way (the separate writes fell in one
    /// page of the lower's page cache, which reaches the disk as a whole, or not). Nothing
    /// reads the lower file's block 0 meanwhile: the landing holds `slot_io` exclusively.
    pub fn gather_block_0(&self, st: &mut StoreState) -> bool {
        if !st.header_on_disk && st.gathered.is_none() {
            st.gathered = Some(GatheredBlock { bytes: vec![0; HEADER_BLOCK as usize].into_boxed_slice(), end: 0 });
        }
        st.gathered.is_some()
    }

    /// Writes the gathered block 0 in one piece, if one is being gathered. On failure it stays
    /// gathered (what it holds is the file's truth; the next landing, flush or sync writes it).
    pub fn write_gathered(&self, st: &mut StoreState) -> std::io::Result<()> {
        let Some(g) = &st.gathered else { return Ok(()) };
        if g.end > 0 {
            lower::pwrite_all(&self.lower, &g.bytes[..g.end], 0)?;
            st.touch();
        }
        st.gathered = None;
        Ok(())
    }

    /// Writes metadata (a header, descriptors, an inline record) at `off`: into block 0 while
    /// it is being gathered, else to the lower file.
    pub(super) fn write_meta(&self, st: &mut StoreState, bytes: &[u8], off: u64) -> std::io::Result<()> {
        let end = off + bytes.len() as u64;
        if let Some(g) = st.gathered.as_mut().filter(|_| off < HEADER_BLOCK) {
            if end <= HEADER_BLOCK {
                g.bytes[off as usize..end as usize].copy_from_slice(bytes);
                g.end = g.end.max(end as usize);
                return Ok(());
            }
            self.write_gathered(st)?; // a write reaching past block 0 (none does): block 0 first
        }
        lower::pwrite_all(&self.lower, bytes, off)
    }

    /// fdatasync (`datasync`) or fsync of the lower file. (A block 0 being gathered is not in
    /// it: [`Store::write_gathered`] first.)
    pub fn sync_lower(&self, datasync: bool) -> std::io::Result<()> {
        if datasync {
            lower::fdatasync(&self.lower)
        } else {
            lower::fsync(&self.lower)
        }
    }
}

//! Size hints: a closed container's logical size kept beside it as an extended attribute, so
//! that listing a cold directory (`ls -l`, `du`, rsync's scan) reads no headers, only the
//! lower inodes it stats anyway. docs/FORMAT.md, "Size hints and runs", is the specification.
//!
//! A hint is only ever a shortcut for the header's size: it is trusted when the run that wrote
//! it ended cleanly (or is the daemon's own), which the lower root's *run record* tells. A run
//! that ends any other way (a kill, a power cut) makes every hint written up to it untrusted,
//! since a power cut can keep a hint and undo the header write it describes; the files then
//! read their headers as before, until a clean run writes them again.
//!
//! Both values are small so that ext4 keeps them inside the inode beside the birth header
//! (a 256-byte inode has about 90 bytes for attributes): a hint takes no block of its own.

/// The lower file's size hint.
pub const SIZE_HINT_XATTR: &str = "user.densefs.size";
/// The lower root directory's run record.
pub const RUN_RECORD_XATTR: &str = "user.densefs.runs";

const HINT_VERSION: u8 = 1;
const RECORD_VERSION: u8 = 1;
pub const SIZE_HINT_LEN: usize = 20;
pub const RUN_RECORD_LEN: usize = 12;
/// Sizes are stored in 48 bits (256 TiB); a larger file gets no hint.
const MAX_48: u64 = (1 << 48) - 1;

/// What a size hint says of its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeHint {
    /// The tree (run record) and run that wrote it.
    pub tree: u16,
    pub run: u32,
    /// The header's logical size and record shift.
    pub size: u64,
    pub record_shift: u8,
    /// The lower file's own length when the hint was written: a file changed behind densefs's
    /// back (against its rules) most likely has another, and then its header is read.
    pub lower_len: u64,
}

impl SizeHint {
    /// `None` for sizes beyond 48 bits.
    pub fn encode(&self) -> Option<[u8; SIZE_HINT_LEN]> {
        if self.size > MAX_48 || self.lower_len > MAX_48 {
            return None;
        }
        let mut b = [0u8; SIZE_HINT_LEN];
        b[0] = HINT_VERSION;
        b[1] = self.record_shift;
        b[2..4].copy_from_slice(&self.tree.to_le_bytes());
        b[4..8].copy_from_slice(&self.run.to_le_bytes());
        b[8..14].copy_from_slice(&self.size.to_le_bytes()[..6]);
        b[14..20].copy_from_slice(&self.lower_len.to_le_bytes()[..6]);
        Some(b)
    }

    pub fn decode(value: &[u8]) -> Option<SizeHint> {
        if value.len() != SIZE_HINT_LEN || value[0] != HINT_VERSION || !(12..=20).contains(&value[1]) {
            return None;
        }
        let u48 = |at: usize| {
            let mut w = [0u8; 8];
            w[..6].copy_from_slice(&value[at..at + 6]);
            u64::from_le_bytes(w)
        };
        Some(SizeHint {
            record_shift: value[1],
            tree: u16::from_le_bytes([value[2], value[3]]),
            run: u32::from_le_bytes(value[4..8].try_into().expect("4 bytes")),
            size: u48(8),
            lower_len: u48(14),
        })
    }
}

/// The lower root's record of the runs that wrote hints in its tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunRecord {
    /// Random, chosen with the first record: hints carried in from another tree (a copy of its
    /// files, a lower nested in another) are not this tree's.
    pub tree: u16,
    /// The last run begun.
    pub run: u32,
    /// The first run whose hints are trusted: every run before it may have been cut short.
    pub trusted_from: u32,
    /// The last run begun has not ended cleanly (yet).
    pub running: bool,
}

impl RunRecord {
    pub fn encode(&self) -> [u8; RUN_RECORD_LEN] {
        let mut b = [0u8; RUN_RECORD_LEN];
        b[0] = RECORD_VERSION;
        b[1] = u8::from(self.running);
        b[2..4].copy_from_slice(&self.tree.to_le_bytes());
        b[4..8].copy_from_slice(&self.run.to_le_bytes());
        b[8..12].copy_from_slice(&self.trusted_from.to_le_bytes());
        b
    }

    pub fn decode(value: &[u8]) -> Option<RunRecord> {
        if value.len() != RUN_RECORD_LEN || value[0] != RECORD_VERSION || value[1] > 1 {
            return None;
        }
        Some(RunRecord {
            running: value[1] == 1,
            tree: u16::from_le_bytes([value[2], value[3]]),
            run: u32::from_le_bytes(value[4..8].try_into().expect("4 bytes")),
            trusted_from: u32::from_le_bytes(value[8..12].try_into().expect("4 bytes")),
        })
    }

    /// The record a writing run begins with, after `previous` (`None`: the tree has none, or
    /// one this densefs cannot read; `new_tree` names it then). A previous run still marked
    /// running did not end cleanly: nothing written up to it is trusted from now on.
    pub fn begin(previous: Option<RunRecord>, new_tree: u16) -> RunRecord {
        match previous {
            Some(p) if p.run < u32::MAX => {
                RunRecord { tree: p.tree, run: p.run + 1, trusted_from: if p.running { p.run + 1 } else { p.trusted_from }, running: true }
            }
            _ => RunRecord { tree: new_tree, run: 1, trusted_from: 1, running: true },
        }
    }

    /// The run ended cleanly: everything it wrote is on stable storage.
    pub fn end(self) -> RunRecord {
        RunRecord { running: false, ..self }
    }

    /// What a run reading this record may trust. `writing`: the run is this record's last
    /// (begun by `begin`), whose own hints it trusts. A read-only run that finds the last run
    /// still marked running (it was cut short: the lower's lock keeps two daemons apart) trusts
    /// none, as the next writing run will.
    pub fn trust(&self, writing: bool) -> HintTrust {
        let from = if self.running && !writing { self.run.saturating_add(1) } else { self.trusted_from };
        HintTrust { tree: self.tree, runs: from..=self.run }
    }
}

/// The hints a run may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HintTrust {
    pub tree: u16,
    pub runs: std::ops::RangeInclusive<u32>,
}

impl HintTrust {
    pub fn trusts(&self, hint: &SizeHint) -> bool {
        hint.tree == self.tree && self.runs.contains(&hint.run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(run: u32) -> SizeHint {
        SizeHint { tree: 7, run, size: 123_456_789, record_shift: 17, lower_len: 40_960 }
    }

    #[test]
    fn a_hint_reads_back_as_written_and_nothing_else_passes_for_one() {
        let h = hint(3);
        let bytes = h.encode().unwrap();
        assert_eq!(SizeHint::decode(&bytes), Some(h));
        assert_eq!(SizeHint::decode(&bytes[..19]), None, "short");
        let mut bad = bytes;
        bad[0] = 2;
        assert_eq!(SizeHint::decode(&bad), None, "another version");
        let mut bad = bytes;
        bad[1] = 11;
        assert_eq!(SizeHint::decode(&bad), None, "record shift out of range");
        let huge = SizeHint { size: 1 << 48, ..h };
        assert_eq!(huge.encode(), None, "beyond 48 bits: no hint");
        let top = SizeHint { size: (1 << 48) - 1, lower_len: (1 << 48) - 1, ..h };
        assert_eq!(SizeHint::decode(&top.encode().unwrap()), Some(top));
    }

    #[test]
    fn a_run_record_reads_back_as_written() {
        let r = RunRecord { tree: 0xbeef, run: 9, trusted_from: 4, running: true };
        assert_eq!(RunRecord::decode(&r.encode()), Some(r));
        assert_eq!(RunRecord::decode(&r.end().encode()), Some(RunRecord { running: false, ..r }));
        assert_eq!(RunRecord::decode(&[0u8; RUN_RECORD_LEN]), None);
    }

    #[test]
    fn clean_runs_keep_their_hints_and_a_run_cut_short_loses_every_hint_up_to_it() {
        let first = RunRecord::begin(None, 7);
        assert_eq!((first.run, first.trusted_from), (1, 1));
        assert!(first.trust(true).trusts(&hint(1)), "a run trusts its own hints");
        let second = RunRecord::begin(Some(first.end()), 99);
        assert_eq!(second.tree, 7, "the tree keeps its id");
        assert!(second.trust(true).trusts(&hint(1)) && second.trust(true).trusts(&hint(2)));
        assert!(!second.trust(true).trusts(&hint(3)), "no hint of a run to come");
        assert!(!second.trust(true).trusts(&SizeHint { tree: 8, ..hint(2) }), "another tree's");
        // The second run is killed: the third trusts none of the hints up to it.
        let third = RunRecord::begin(Some(second), 99);
        assert_eq!((third.run, third.trusted_from), (3, 3));
        assert!(!third.trust(true).trusts(&hint(1)) && !third.trust(true).trusts(&hint(2)));
        assert!(third.trust(true).trusts(&hint(3)));
        // Read-only runs: a record still running (cut short) trusts nothing.
        let fourth = RunRecord::begin(Some(third.end()), 99);
        assert!(fourth.trust(true).trusts(&hint(3)));
        assert!(!fourth.trust(false).trusts(&hint(3)) && !fourth.trust(false).trusts(&hint(4)));
        assert!(fourth.end().trust(false).trusts(&hint(3)) && fourth.end().trust(false).trusts(&hint(4)));
        // A record this densefs cannot read starts a new tree.
        let fresh = RunRecord::begin(None, 42);
        assert!(!fresh.trust(true).trusts(&hint(1)), "hints of the old tree id");
    }
}

//! Which copies are durable (docs/FORMAT.md, "Epochs" and "Writing a record"), as pure rules:
//! where a run's epochs start, which epochs are durable or suspect, which slot a write targets,
//! which copies healing must check, and what a sync changes. The container applies them; the
//! exhaustive tests below are the specification's cases.
//!
//! A run's *run base* is `max(durable_below, heal_from) + EPOCH_GAP`; it treats the copies in
//! `[heal_from or durable_below, run base)` as suspect: written after the last sync the header
//! recorded, possibly torn. Healing re-stamps the intact ones with the run base itself, and the
//! run writes its own copies from the run base + 1 on. Durable are copies below the suspect
//! range, the healed ones once the run has announced itself (its synced header also made
//! durable whatever the previous run left unsynced), and this run's copies below
//! `durable_below`.

use super::{newest_first, Header, Pair, SlotState};

/// How far a new run's epochs start past the last durable header: a run's copies can carry
/// epochs up to this many past it (syncs that failed after advancing the epoch are capped).
pub const EPOCH_GAP: u64 = 1024;

/// One run's view of the epochs of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Epochs {
    /// Copies written now carry this epoch.
    pub epoch: u64,
    /// This run's copies below this are durable (a sync completed after them).
    pub durable_below: u64,
    /// `heal_from..run_base` is the suspect range; healed copies carry the run base, and the
    /// run's own copies the epochs after it.
    pub run_base: u64,
    pub heal_from: u64,
}

impl Epochs {
    /// The epochs of a run that opens a file with this header.
    pub fn for_run(header: &Header) -> Epochs {
        // Copies from `heal_from` (an earlier unhealed range, or the last sync of the previous
        // run) up to the run base are suspect; this run counts from past anything that run used.
        let heal_from = if header.heal_from != 0 { header.heal_from.min(header.durable_below) } else { header.durable_below };
        let run_base = header.durable_below.max(header.heal_from) + EPOCH_GAP;
        Epochs { epoch: run_base + 1, durable_below: run_base, run_base, heal_from }
    }

    /// The run's first synced write (its announcing header) completed. That flush also made
    /// durable every byte the previous run had left on the lower file unsynced, so a suspect copy
    /// found intact, then or later, is durable: healed copies (the run base) are.
    pub fn announced(&mut self) {
        self.durable_below = self.durable_below.max(self.run_base + 1);
    }

    /// The `durable_below` a new file's header starts with: the run that creates it starts past
    /// it, so no earlier run's epochs can be reused. (Its first header is still synced before its
    /// first data, so that a power cut cannot leave the data without it: the store's `announce`.)
    pub const NEW_FILE_DURABLE_BELOW: u64 = EPOCH_GAP;

    pub fn is_durable(&self, epoch: u64) -> bool {
        epoch < self.heal_from || (self.run_base..self.durable_below).contains(&epoch)
    }

    pub fn is_suspect(&self, epoch: u64) -> bool {
        (self.heal_from..self.run_base).contains(&epoch)
    }

    /// A sync begins: copies written from here on belong to the next epoch. Returns the epoch
    /// the sync closes. Capped (syncs failing over and over), so a later run, starting
    /// `EPOCH_GAP` past the header, still starts past every epoch used.
    pub fn begin_sync(&mut self) -> u64 {
        let closing = self.epoch;
        if self.epoch + 1 < self.durable_below + EPOCH_GAP / 2 {
            self.epoch += 1;
        }
        closing
    }

    /// The sync's flush completed: every copy of the closed epoch is durable.
    pub fn synced(&mut self, closing: u64) {
        self.durable_below = self.durable_below.max(closing + 1);
    }

    /// The slot a new copy of a record goes to: the one not holding the current copy, unless the
    /// current copy is not durable and the other slot holds a copy (the last durable one, or a
    /// damaged one that may be): then the current copy is overwritten in place.
    ///
    /// A write announces the run before it writes anything, so healed copies count as durable
    /// here even while the run has not announced yet.
    pub fn target_slot(&self, pair: &Pair) -> usize {
        match newest_first(pair).first() {
            None => 0,
            Some(&(current, d)) => {
                let other_used = pair[1 - current] != SlotState::Empty;
                let durable_when_written = d.epoch == self.run_base || self.is_durable(d.epoch);
                if other_used && !durable_when_written {
                    current
                } else {
                    1 - current
                }
            }
        }
    }

    /// The slots healing must read and checksum: only where two copies compete does a torn
    /// suspect one matter (a single copy is re-stamped without reading; holes store nothing).
    pub fn slots_to_check(&self, pair: &Pair) -> [bool; 2] {
        let both = pair.iter().all(|s| matches!(s, SlotState::Valid(_)));
        let mut check = [false; 2];
        for (slot, s) in pair.iter().enumerate() {
            if let SlotState::Valid(d) = s {
                check[slot] = both && self.is_suspect(d.epoch) && !d.is_hole();
            }
        }
        check
    }

    /// A healed pair: suspect copies found intact are re-stamped with the run base (durable once
    /// the run has announced itself), torn ones dropped. Returns which slots were dropped, or
    /// `None` if nothing changed.
    ///
    /// An intact copy must not count as this run's unsynced copy: a user's fsync makes its
    /// copies durable with one flush, recorded in the header only later, so a suspect copy may be
    /// one an fsync acknowledged, and the next write must not overwrite it in place.
    pub fn heal(&self, pair: &mut Pair, intact: [bool; 2]) -> Option<[bool; 2]> {
        let mut changed = false;
        let mut dropped = [false; 2];
        for slot in 0..2 {
            let SlotState::Valid(d) = pair[slot] else { continue };
            if !self.is_suspect(d.epoch) {
                continue;
            }
            changed = true;
            if intact[slot] {
                pair[slot] = SlotState::Valid(super::Descriptor { epoch: self.run_base, ..d });
            } else {
                pair[slot] = SlotState::Empty;
                dropped[slot] = true;
            }
        }
        changed.then_some(dropped)
    }

    /// After a sync: may the older copy of a record be freed?
    pub fn reclaimable(&self, pair: &Pair) -> Reclaim {
        let Some(&(current, d)) = newest_first(pair).first() else { return Reclaim::Nothing };
        if !self.is_durable(d.epoch) {
            return Reclaim::NotYetDurable;
        }
        let other = 1 - current;
        if pair[other] != SlotState::Empty {
            Reclaim::Free(other)
        } else {
            Reclaim::Nothing
        }
    }
}

/// What a sync may free of one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reclaim {
    /// No older copy to free.
    Nothing,
    /// The current copy is durable: this slot's older copy can go.
    Free(usize),
    /// The current copy was rewritten since the sync began: keep the record for the next sync.
    NotYetDurable,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Descriptor, Layout};

    fn header(durable_below: u64, heal_from: u64) -> Header {
        Header {
            layout: Layout::from_shift(12).unwrap(),
            checksum: crate::checksum::ChecksumKind::Crc32c,
            setting: crate::codec::Setting::LZ4,
            size: 0,
            sequence: 1,
            durable_below,
            heal_from,
        }
    }

    fn copy(generation: u32, epoch: u64) -> SlotState {
        SlotState::Valid(Descriptor { generation, stored_len: 10, logical_len: 4096, codec_id: 1, epoch, ..Descriptor::default() })
    }

    /// Epochs of every kind relative to a run: older durable, suspect, this run's durable,
    /// this run's current.
    fn epochs_of(e: &Epochs) -> [u64; 5] {
        [0, e.heal_from.saturating_sub(1), e.heal_from, e.run_base, e.epoch]
    }

    #[test]
    fn a_run_starts_past_everything_the_previous_one_used() {
        for (durable, heal) in [(0, 0), (1024, 0), (5000, 0), (5000, 3000), (5000, 7000)] {
            let e = Epochs::for_run(&header(durable, heal));
            assert_eq!(e.run_base, durable.max(heal) + EPOCH_GAP);
            assert_eq!(e.epoch, e.run_base + 1, "the run base is for healed copies");
            assert_eq!(e.durable_below, e.run_base, "nothing of this run is durable yet");
            let suspect_from = if heal != 0 { heal.min(durable) } else { durable };
            assert_eq!(e.heal_from, suspect_from);
            // Exhaustive over the epochs around the boundaries: durable and suspect never meet.
            for epoch in 0..e.run_base + 2 {
                assert!(!(e.is_durable(epoch) && e.is_suspect(epoch)), "{epoch} both durable and suspect");
                assert_eq!(e.is_suspect(epoch), (suspect_from..e.run_base).contains(&epoch));
                assert_eq!(e.is_durable(epoch), epoch < suspect_from);
            }
        }
    }

    #[test]
    fn a_sync_makes_the_closed_epoch_durable_and_only_it() {
        let mut e = Epochs::for_run(&header(2048, 0));
        let first = e.epoch;
        let closing = e.begin_sync();
        assert_eq!(closing, first);
        assert_eq!(e.epoch, first + 1);
        assert!(!e.is_durable(first), "not before the flush completed");
        e.synced(closing);
        assert!(e.is_durable(first));
        assert!(!e.is_durable(e.epoch), "copies written during the sync are not covered");
        assert!(e.is_durable(100), "older runs' synced copies stay durable");
    }

    #[test]
    fn failing_syncs_cap_the_epoch_below_the_next_runs_start() {
        let mut e = Epochs::for_run(&header(2048, 0));
        for _ in 0..10 * EPOCH_GAP {
            e.begin_sync(); // never completed
        }
        assert!(e.epoch < e.durable_below + EPOCH_GAP / 2);
        // A later run reads the header of the last completed sync (durable_below unchanged).
        let next = Epochs::for_run(&header(e.durable_below, e.heal_from));
        assert!(next.run_base > e.epoch);
    }

    #[test]
    fn the_target_slot_keeps_the_last_durable_copy() {
        let mut e = Epochs::for_run(&header(2048, 1024));
        let closing = e.begin_sync();
        e.synced(closing); // this run has a durable epoch and a current one
        let states = |e: &Epochs| {
            let mut v = vec![SlotState::Empty, SlotState::Damaged];
            for epoch in epochs_of(e) {
                v.push(copy(1, epoch));
                v.push(copy(2, epoch));
            }
            v
        };
        for a in states(&e) {
            for b in states(&e) {
                let pair = [a, b];
                let target = e.target_slot(&pair);
                match newest_first(&pair).first() {
                    None => assert_eq!(target, 0, "{pair:?}"),
                    Some(&(current, d)) => {
                        let other = 1 - current;
                        if pair[other] == SlotState::Empty {
                            assert_eq!(target, other, "a free slot is used: {pair:?}");
                        } else if e.is_durable(d.epoch) || d.epoch == e.run_base {
                            assert_eq!(target, other, "the current durable (or healed) copy survives: {pair:?}");
                        } else {
                            assert_eq!(target, current, "the other (older) copy survives: {pair:?}");
                        }
                        // Whatever the case, a durable current copy is never the target.
                        if e.is_durable(d.epoch) {
                            assert_ne!(target, current);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn healing_checks_only_competing_suspect_copies_and_restamps_intact_ones() {
        let mut e = Epochs::for_run(&header(4096, 2048));
        let (old, suspect) = (100, 3000);
        assert!(e.is_suspect(suspect) && e.is_durable(old));
        assert_eq!(e.slots_to_check(&[copy(1, old), copy(2, suspect)]), [false, true]);
        assert_eq!(e.slots_to_check(&[SlotState::Empty, copy(2, suspect)]), [false, false], "a single copy is not read");
        assert_eq!(e.slots_to_check(&[SlotState::Damaged, copy(2, suspect)]), [false, false]);
        let hole = SlotState::Valid(Descriptor { generation: 2, logical_len: 4096, epoch: suspect, ..Descriptor::default() });
        assert_eq!(e.slots_to_check(&[copy(1, old), hole]), [false, false], "a hole stores nothing to tear");

        let mut torn = [copy(1, old), copy(2, suspect)];
        assert_eq!(e.heal(&mut torn, [true, false]), Some([false, true]));
        assert_eq!(torn, [copy(1, old), SlotState::Empty]);

        let mut intact = [copy(1, old), copy(2, suspect)];
        assert_eq!(e.heal(&mut intact, [true, true]), Some([false, false]));
        assert_eq!(intact, [copy(1, old), copy(2, e.run_base)]);
        assert!(!e.is_durable(e.run_base), "healed copies wait for the run's announcing flush");
        // A suspect copy an fsync acknowledged (one flush, not yet in the header) and an older
        // copy beside it: the next write (which announces the run first) must not overwrite it.
        assert_eq!(e.target_slot(&intact), 0, "the healed copy survives the next write");
        e.announced();
        assert!(e.is_durable(e.run_base), "that flush made them durable");
        assert!(!e.is_durable(e.epoch), "but not the run's own copies");
        assert_eq!(e.target_slot(&intact), 0);
        assert_eq!(e.reclaimable(&intact), Reclaim::Free(0));

        let mut clean = [copy(1, old), SlotState::Empty];
        assert_eq!(e.heal(&mut clean, [true, true]), None);
    }

    #[test]
    fn reclaim_frees_the_other_slot_only_behind_a_durable_copy() {
        let mut e = Epochs::for_run(&header(2048, 0));
        let written = e.epoch;
        let closing = e.begin_sync();
        e.synced(closing);
        assert_eq!(e.reclaimable(&[copy(1, 5), copy(2, written)]), Reclaim::Free(0));
        assert_eq!(e.reclaimable(&[copy(1, written), SlotState::Empty]), Reclaim::Nothing);
        assert_eq!(e.reclaimable(&[SlotState::Empty, SlotState::Empty]), Reclaim::Nothing);
        assert_eq!(e.reclaimable(&[copy(1, 5), copy(2, e.epoch)]), Reclaim::NotYetDurable, "rewritten since the sync began");
    }
}

//! Counters per dataset (a directory with local properties, as `densefs list` shows them), so
//! that `densefs get` on one answers without a walk, as on the mount root.
//!
//! A dataset's counters are the totals of its whole subtree, as a walk of it counts them (each
//! hard-linked file once). Every change is applied to the datasets that hold the place where it
//! happened (`Within`: the datasets above a directory, found up its parent chain). A dataset
//! has counters only once a walk of it counted them with nothing changing meanwhile, or a clean
//! run saved them; where a change cannot be followed exactly, the datasets it touches lose
//! theirs and the next report on them walks again:
//! - a directory moved from one dataset to another (its subtree's totals are not kept);
//! - a hard-linked file changed, given a name in another dataset, or losing one (which
//!   datasets hold its other names is not known);
//! - a place whose parent chain the daemon does not know.
//!
//! A directory that becomes a dataset, or stops being one, starts without counters.

use super::Usage;
use std::collections::HashMap;
use std::sync::Arc;

/// A lower directory: (device, inode number).
pub type Key = (u64, u64);

/// The datasets (the mount root excluded) that hold a place, innermost first; `None` where the
/// daemon cannot tell (every dataset loses its counters on a change there).
pub type Within = Option<Arc<[Key]>>;

/// A place in no dataset but the root.
pub fn nowhere() -> Within {
    Some(Arc::from([]))
}

#[derive(Default)]
pub struct DatasetCounters {
    known: HashMap<Key, Usage>,
}

impl DatasetCounters {
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    pub fn has(&self, key: Key) -> bool {
        self.known.contains_key(&key)
    }

    pub fn get(&self, key: Key) -> Option<&Usage> {
        self.known.get(&key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Key, &Usage)> {
        self.known.iter()
    }

    pub fn set(&mut self, key: Key, usage: Usage) {
        self.known.insert(key, usage);
    }

    /// Moves the counters of the datasets holding `within` by `after - before`.
    pub fn apply(&mut self, within: &Within, after: &Usage, before: &Usage) {
        let Some(keys) = within else { return self.known.clear() };
        for key in keys.iter() {
            if let Some(u) = self.known.get_mut(key) {
                u.add(after);
                u.sub(before);
            }
        }
    }

    /// `usage` leaves the datasets of `from` that are not in `to`, and joins those of `to` that
    /// are not in `from`.
    pub fn moved(&mut self, from: &Within, to: &Within, usage: &Usage) {
        let (Some(from), Some(to)) = (from, to) else { return self.known.clear() };
        for key in from.iter().filter(|k| !to.contains(k)) {
            if let Some(u) = self.known.get_mut(key) {
                u.sub(usage);
            }
        }
        for key in to.iter().filter(|k| !from.contains(k)) {
            if let Some(u) = self.known.get_mut(key) {
                u.add(usage);
            }
        }
    }

    /// The datasets of `within` lose their counters (every one, where it is not known).
    pub fn forget(&mut self, within: &Within) {
        match within {
            Some(keys) => keys.iter().for_each(|k| {
                self.known.remove(k);
            }),
            None => self.known.clear(),
        }
    }

    /// The datasets in one of `a` and `b` but not the other lose their counters: what moved
    /// between them is not known.
    pub fn forget_difference(&mut self, a: &Within, b: &Within) {
        let (Some(a), Some(b)) = (a, b) else { return self.known.clear() };
        for key in a.iter().filter(|k| !b.contains(k)).chain(b.iter().filter(|k| !a.contains(k))) {
            self.known.remove(key);
        }
    }

    /// The datasets of `to` that are not in `from` lose their counters: a name came into them,
    /// of a file they may not have held yet.
    pub fn forget_gained(&mut self, from: &Within, to: &Within) {
        let (Some(from), Some(to)) = (from, to) else { return self.known.clear() };
        for key in to.iter().filter(|k| !from.contains(k)) {
            self.known.remove(key);
        }
    }

    pub fn forget_all(&mut self) {
        self.known.clear();
    }

    /// The saved form: each dataset by inode number (the lower root's device is this run's).
    pub fn encode(&self, dev: u64) -> serde_json::Value {
        let list: Vec<_> = self
            .known
            .iter()
            .filter(|((d, _), _)| *d == dev)
            .map(|((_, ino), u)| serde_json::json!({"ino": ino, "usage": u.to_json()}))
            .collect();
        serde_json::Value::Array(list)
    }

    pub fn decode(value: &serde_json::Value, dev: u64) -> Option<DatasetCounters> {
        let mut known = HashMap::new();
        for d in value.as_array()? {
            known.insert((dev, d["ino"].as_u64()?), Usage::from_json(&d["usage"])?);
        }
        Some(DatasetCounters { known })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within(keys: &[Key]) -> Within {
        Some(Arc::from(keys))
    }

    #[test]
    fn changes_reach_the_datasets_holding_them_and_moves_only_the_ones_that_differ() {
        let mut d = DatasetCounters::default();
        d.set((1, 10), Usage::default());
        d.set((1, 20), Usage::default());
        let dir = Usage::directory();
        d.apply(&within(&[(1, 20), (1, 10)]), &dir, &Usage::default());
        assert_eq!(d.get((1, 10)).unwrap().directories, 1);
        assert_eq!(d.get((1, 20)).unwrap().directories, 1);
        // From 20 (inside 10) to 10 itself: only 20 loses it.
        d.moved(&within(&[(1, 20), (1, 10)]), &within(&[(1, 10)]), &dir);
        assert_eq!(d.get((1, 10)).unwrap().directories, 1);
        assert_eq!(d.get((1, 20)).unwrap().directories, 0);
        d.forget_difference(&within(&[(1, 10)]), &within(&[(1, 10), (1, 30)]));
        assert!(d.get((1, 10)).is_some(), "in both");
        d.apply(&None, &dir, &Usage::default());
        assert!(d.is_empty(), "a change nobody can place forgets every dataset");
    }

    #[test]
    fn the_saved_form_reads_back() {
        let mut d = DatasetCounters::default();
        d.set((7, 10), Usage { files: 3, directories: 2, ..Usage::default() });
        d.set((8, 11), Usage::default());
        let back = DatasetCounters::decode(&d.encode(7), 7).unwrap();
        assert_eq!(back.get((7, 10)), d.get((7, 10)));
        assert!(back.get((8, 11)).is_none(), "another device's");
    }
}

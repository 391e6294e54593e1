//! A batch of records to decode (one READ's) that its caller works through itself, helped by
//! CPU workers only on cores where nobody is decoding yet.
//!
//! Handing every record to the pool cost each READ two thread switches per worker and left the
//! caller asleep. A sequential reader's read-ahead keeps a READ in flight on each core: there
//! each caller decoding its own records uses both cores with no switch (a cold 1 GiB zstd-3 read
//! took 0.75-0.81 s instead of 0.83-0.95 s). A lone READ (`O_DIRECT`, random reads) still gets
//! the idle cores' workers beside its caller.

use super::{DecompressRequest, EngineError};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

type Decoded = Result<Vec<u8>, EngineError>;

pub(super) struct SharedBatch {
    requests: Vec<DecompressRequest>,
    /// The next request nobody has taken.
    next: AtomicUsize,
    results: Mutex<Results>,
    all_done: Condvar,
}

struct Results {
    slots: Vec<Option<Decoded>>,
    done: usize,
}

impl SharedBatch {
    pub(super) fn new(requests: Vec<DecompressRequest>) -> SharedBatch {
        let slots = (0..requests.len()).map(|_| None).collect();
        SharedBatch { requests, next: AtomicUsize::new(0), results: Mutex::new(Results { slots, done: 0 }), all_done: Condvar::new() }
    }

    pub(super) fn len(&self) -> usize {
        self.requests.len()
    }

    /// Decodes requests nobody has taken until none is left.
    pub(super) fn work(&self, decode: impl Fn(&DecompressRequest) -> Decoded) {
        loop {
            let i = self.next.fetch_add(1, Relaxed);
            let Some(request) = self.requests.get(i) else { return };
            let decoded = decode(request);
            let mut results = self.results.lock();
            results.slots[i] = Some(decoded);
            results.done += 1;
            if results.done == self.requests.len() {
                self.all_done.notify_all();
            }
        }
    }

    /// Waits until every request is decoded (after `work` returned: the rest are being
    /// decoded by helpers); the results in request order.
    pub(super) fn wait(&self) -> Vec<Decoded> {
        let mut results = self.results.lock();
        while results.done < self.requests.len() {
            self.all_done.wait(&mut results);
        }
        results.slots.iter_mut().map(|slot| slot.take().expect("BUG: a decoded slot is empty")).collect()
    }
}

/// How many threads decode batches right now (callers, and workers asked to help): a batch
/// asks for helpers only while this is below the pool's size.
#[derive(Default)]
pub(super) struct Decoders(AtomicUsize);

impl Decoders {
    /// Counts the caller in; returns how many helpers (counted in too) to ask for.
    pub(super) fn join(&self, records: usize, cores: usize) -> usize {
        let busy = self.0.fetch_add(1, Relaxed) + 1;
        let helpers = records.saturating_sub(1).min(cores.saturating_sub(busy));
        self.0.fetch_add(helpers, Relaxed);
        helpers
    }

    pub(super) fn leave(&self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

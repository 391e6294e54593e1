//! The background pass's work on one file (`core/background.rs` decides which files and when):
//! each stored record not yet in the background codec is re-encoded with it, on the calling
//! thread, through the same rewrite path `recompress` takes: it lands only if smaller, a user's
//! change of the record meanwhile wins, and a crash leaves each record at its old or its new
//! copy. The header keeps the file's own codec, so that later writes stay fast.

use super::{Container, EncodeWith, Load};
use crate::codec::Compression;
use crate::core::error::FsResult;
use crate::format::newest_first;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What re-encoding one record did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Densified {
    /// Nothing to do: a hole, already in the codec, or being changed by a user.
    Skipped,
    /// Handed to the engine's workers (an accelerator is in play): it lands on their side.
    Submitted { logical: u64 },
    /// Compressed here and landed (or kept as it was, where the new copy was not smaller).
    Landed { logical: u64, encoded: u64 },
}

impl Container {
    /// The records the file has now.
    pub fn record_count(&self) -> u64 {
        self.layout().plain_size_to_records(self.size())
    }

    /// Re-encodes `record` with `target`, compressing on the calling thread (the background's,
    /// which the kernel schedules after everything else) where no accelerator is in play, else
    /// through the engine, which sends it to the accelerator first. `submitted_out` counts the
    /// encoded bytes of records the engine compresses.
    pub fn densify_record(self: &Arc<Self>, record: u64, target: Compression, submitted_out: &Arc<AtomicU64>) -> FsResult<Densified> {
        {
            let _io = self.slot_io.read();
            let mut st = self.state.lock();
            if st.buffers.is_pending(record) {
                return Ok(Densified::Skipped);
            }
            let newest = newest_first(&self.store.pair(&mut st.store, record)?).first().map(|(_, d)| *d);
            match newest {
                None => return Ok(Densified::Skipped),
                Some(d) if d.is_hole() || (d.codec() == target.codec && d.level as i32 == target.level) => return Ok(Densified::Skipped),
                Some(_) => {}
            }
        }
        self.load(record, Load::Rewrite { densify: Some(target) })?;
        let sent = {
            let mut st = self.state.lock();
            self.send(&mut st, &[record], EncodeWith::Background(target))
        };
        let Some(sent) = sent.into_iter().next() else { return Ok(Densified::Skipped) };
        let logical = sent.request.data.len() as u64;
        if let Some(encoded) = self.engine.compress_here(&sent.request) {
            let encoded_len = encoded.bytes.len() as u64;
            self.land(sent.record, sent.seq, Ok(encoded));
            if let Some(e) = self.state.lock().write_error.take() {
                return Err(e);
            }
            return Ok(Densified::Landed { logical, encoded: encoded_len });
        }
        let mut job = self.job(sent);
        let counter = submitted_out.clone();
        let done = job.done;
        job.done = Box::new(move |result| {
            if let Ok(encoded) = &result {
                counter.fetch_add(encoded.bytes.len() as u64, Ordering::Relaxed);
            }
            done(result)
        });
        self.engine.submit(vec![job]);
        self.wait_for_room();
        Ok(Densified::Submitted { logical })
    }

    /// After a pass: waits for what it handed to the engine, syncs (the old copies are freed)
    /// and moves the last copies down so that the lower file does not grow.
    pub fn finish_densify(self: &Arc<Self>, target: Compression) -> FsResult<()> {
        self.sync(true)?;
        self.compact_tail(EncodeWith::Background(target))
    }
}

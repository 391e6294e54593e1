//! The background pass's work on one file (`core/background.rs` decides which files and when):
//! each stored record not yet in the background codec is re-encoded with it, on the calling
//! thread, through the same rewrite path `recompress` takes: it lands only if smaller, a user's
//! change of the record meanwhile wins, and a crash leaves each record at its old or its new
//! copy. The header keeps the file's own codec, so that later writes stay fast.

use super::{Container, EncodeWith, Load};
use crate::codec::Compression;
use crate::core::error::FsResult;
use crate::format::newest_first;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// A record the background pass marks for re-encoding: with what, and where the bytes it
/// encodes to are counted, by whoever sends it first (the pass, or a writeback of the file).
#[derive(Clone, Debug)]
pub struct Densify {
    pub target: Compression,
    pub encoded: Arc<AtomicU64>,
}

/// What re-encoding one record did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Densified {
    /// Nothing to do: a hole, already in the codec, or being changed by a user.
    Skipped,
    /// Read for re-encoding (`logical` bytes) and sent: compressed and landed here, handed to
    /// the engine (an accelerator is in play), or sent first by a writeback of the file, with
    /// the pass's codec. A copy lands only where it is smaller than the `stored` bytes of the
    /// copy read.
    Sent { logical: u64, stored: u64 },
}

impl Container {
    /// The records the file has now.
    pub fn record_count(&self) -> u64 {
        self.layout().plain_size_to_records(self.size())
    }

    /// Re-encodes `record` with `densify.target`, compressing on the calling thread (the
    /// background's, which the kernel schedules after everything else) where no accelerator is
    /// in play, else through the engine, which sends it to the accelerator first.
    pub fn densify_record(self: &Arc<Self>, record: u64, densify: &Densify) -> FsResult<Densified> {
        let target = densify.target;
        let stored = {
            let _io = self.slot_io.read();
            let mut st = self.state.lock();
            if st.buffers.is_pending(record) {
                return Ok(Densified::Skipped);
            }
            let newest = newest_first(&self.store.pair(&mut st.store, record)?).first().map(|(_, d)| *d);
            match newest {
                None => return Ok(Densified::Skipped),
                Some(d) if d.is_hole() || (d.codec() == target.codec && d.level as i32 == target.level) => return Ok(Densified::Skipped),
                Some(d) => d.stored_len as u64,
            }
        };
        if !self.load(record, Load::Rewrite { densify: Some(densify.clone()) })? {
            return Ok(Densified::Skipped);
        }
        let (logical, sent) = {
            let mut st = self.state.lock();
            let logical = self.layout().record_len_in_size(record, st.store.size) as u64;
            (logical, self.send(&mut st, &[record], EncodeWith::Background(target)))
        };
        // Nothing sent: a writeback took the record first (it carries the mark), or a user's
        // write replaced it.
        let Some(sent) = sent.into_iter().next() else { return Ok(Densified::Sent { logical, stored }) };
        if self.compress_and_land_here(&sent) {
            if let Some(e) = self.state.lock().write_error.take() {
                return Err(e);
            }
            return Ok(Densified::Sent { logical, stored });
        }
        self.engine.submit(vec![self.job(sent)]);
        self.wait_for_room();
        Ok(Densified::Sent { logical, stored })
    }

    /// After a pass: waits for what it handed to the engine, syncs (the old copies are freed)
    /// and moves the last copies down so that the lower file does not grow.
    pub fn finish_densify(self: &Arc<Self>, target: Compression) -> FsResult<()> {
        self.sync(true)?;
        self.compact_tail(EncodeWith::Background(target))
    }
}

//! Size changes (truncate, zero_range) and SEEK_DATA / SEEK_HOLE.

use super::{Container, Load, State};
use crate::core::error::{FsError, FsResult};
use crate::format::layout::GROUP_RECORDS;
use std::sync::Arc;

impl Container {
    /// Zeroes the bytes of the record holding `size` that lie past `size`, so that growing the
    /// file never shows what an earlier, longer version held there.
    pub(super) fn zero_tail_past(&self, size: u64) -> FsResult<()> {
        let layout = self.layout();
        if size % layout.record_size() == 0 {
            return Ok(());
        }
        self.load(layout.plain_off_to_record(size), Load::Edit)?; // trims to the size
        Ok(())
    }

    pub fn set_size(self: &Arc<Self>, new_size: u64) -> FsResult<()> {
        let old = self.size();
        {
            // ext4 moves mtime and ctime on every truncate, even to the same size.
            let mut st = self.state.lock();
            self.store.check_lower_can_hold(&mut st.store, new_size)?;
            st.store.user_changed();
        }
        let layout = self.layout();
        if new_size > old {
            self.zero_tail_past(old)?;
            self.state.lock().store.size = new_size;
        } else if new_size < old {
            let boundary = layout.plain_off_to_record(new_size);
            if new_size % layout.record_size() != 0 {
                drop(self.lock_for_edit(boundary, true)?);
            }
            let _io = self.slot_io.write();
            let mut st = self.state.lock();
            st.store.size = new_size;
            let keep = layout.record_len_in_size(boundary, new_size);
            st.rewriting.remove(&boundary);
            if let Some(mut buf) = st.buffers.take_dirty(boundary) {
                buf.truncate(keep);
                // The trimmed copy replaces any longer one still in the engine.
                st.buffers.take_inflight(boundary);
                st.buffers.put_dirty(boundary, buf);
            }
            self.discard_from(&mut st, layout.plain_size_to_records(new_size))?;
        }
        Ok(())
    }

    /// Drops every record from `first` on, in memory and on the lower file.
    /// Caller holds `slot_io` exclusively.
    pub(super) fn discard_from(&self, st: &mut State, first: u64) -> FsResult<()> {
        st.buffers.drop_from(first);
        st.rewriting.retain(|&r, _| r < first);
        let result = self.store.discard_from(&mut st.store, first);
        self.landed.notify_all();
        result
    }

    /// Sets `[offset, offset + len)` to zeros (records wholly inside become holes). Records that
    /// are holes already are skipped, found as SEEK_DATA finds data: punching a sparse file's
    /// holes (`cp --sparse=always` punches up to the end) costs nothing and writes nothing.
    pub fn zero_range(self: &Arc<Self>, offset: u64, len: u64) -> FsResult<()> {
        let size = self.size();
        let end = offset.saturating_add(len).min(size);
        if offset >= end {
            return Ok(());
        }
        self.state.lock().store.user_changed();
        let layout = self.layout();
        let rs = layout.record_size() as usize;
        let last = layout.plain_off_to_record(end - 1);
        let mut record = layout.plain_off_to_record(offset);
        while record <= last {
            let from = offset.max(layout.record_to_plain_off(record));
            let piece = layout.split(from, end - from).next().expect("record below the range's end");
            let keep = layout.record_len_in_size(record, size);
            let whole = piece.skip == 0 && piece.len >= keep;
            if whole {
                let next = {
                    let _io = self.slot_io.read();
                    self.next_data_record(&mut self.state.lock(), record, last + 1)?
                };
                match next {
                    Some(data) if data > record => {
                        record = data;
                        continue;
                    }
                    Some(_) => {}
                    None => break,
                }
            }
            let (io, mut st) = self.lock_for_edit(record, piece.is_partial(rs) && !whole)?;
            st.rewriting.remove(&record);
            let mut buf = st.buffers.take_dirty(record).unwrap_or_default();
            if whole {
                buf = vec![0u8; keep];
            } else if buf.len() > piece.skip {
                let stop = (piece.skip + piece.len).min(buf.len());
                buf[piece.skip..stop].fill(0);
            }
            st.buffers.put_dirty(record, buf);
            // Zeroed records are compressed (to holes) as written ones are: a punch across
            // gigabytes of data holds no more of them in memory than writes would.
            if self.dirty_over_limit(&st) {
                drop(io);
                let dirty = st.buffers.dirty_records();
                let jobs = self.prepare(&mut st, &dirty);
                drop(st);
                self.engine.submit(jobs);
                self.wait_for_room();
            }
            record += 1;
        }
        Ok(())
    }

    /// The first record in `from..end` holding data: in memory, or stored (groups with nothing on
    /// the lower are skipped without reading them). A record whose pending version is all zeros
    /// is a hole whatever is stored for it.
    fn next_data_record(&self, st: &mut State, from: u64, end: u64) -> FsResult<Option<u64>> {
        let layout = self.layout();
        let in_memory = st.buffers.first_pending_data_from(from);
        let limit = in_memory.unwrap_or(end).min(end);
        let mut record = from;
        while record < limit {
            let group = layout.record_to_group(record);
            let Some(found) = self.store.next_stored_group(group)? else { break };
            if found > group {
                record = found * GROUP_RECORDS;
                continue;
            }
            let group_end = ((group + 1) * GROUP_RECORDS).min(limit);
            for r in record..group_end {
                if !st.buffers.is_pending(r) && self.store.stored_data(&mut st.store, r)? {
                    return Ok(Some(r));
                }
            }
            record = group_end;
        }
        Ok(in_memory.filter(|&r| r < end))
    }

    /// The first record in `from..end` that is a hole (or `end`); data records are visited once each.
    fn next_hole_record(&self, st: &mut State, from: u64, end: u64) -> FsResult<u64> {
        let mut record = from;
        while record < end {
            match st.buffers.pending_data(record) {
                Some(true) => {}
                Some(false) => return Ok(record),
                None => {
                    let group = self.layout().record_to_group(record);
                    let group_stored = self.store.table_cached(&st.store, group) || self.store.next_stored_group(group)? == Some(group);
                    if !group_stored || !self.store.stored_data(&mut st.store, record)? {
                        return Ok(record);
                    }
                }
            }
            record += 1;
        }
        Ok(end)
    }

    /// SEEK_DATA / SEEK_HOLE at record granularity: a record is a hole when nothing or only an
    /// all-zero record is stored for it, or its version in memory is all zeros (it will be
    /// stored as a hole). Costs in proportion to the data, never to the offset.
    pub fn seek(&self, offset: u64, want_data: bool) -> FsResult<u64> {
        let _io = self.slot_io.read();
        let mut st = self.state.lock();
        let st = &mut *st;
        let size = st.store.size;
        if offset >= size {
            return Err(FsError::errno(libc::ENXIO));
        }
        let layout = self.layout();
        let records = layout.plain_size_to_records(size);
        let from = layout.plain_off_to_record(offset);
        if want_data {
            match self.next_data_record(st, from, records)? {
                Some(record) => Ok(offset.max(layout.record_to_plain_off(record))),
                None => Err(FsError::errno(libc::ENXIO)),
            }
        } else {
            let record = self.next_hole_record(st, from, records)?;
            Ok(offset.max(layout.record_to_plain_off(record)).min(size))
        }
    }
}

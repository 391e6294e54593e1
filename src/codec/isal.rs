//! Raw deflate (RFC 1951) through Intel's ISA-L (igzip: hand-written AVX2/AVX-512 Deflate with
//! run-time CPU dispatch), bound by the `isal-sys` crate, which builds ISA-L from source and links
//! it statically (so the binary needs no libisal at run time).
//!
//! Only the stateless calls are used: one call compresses or decompresses a whole record. The
//! state they need is per thread: a `isal_zstream` (~80 KiB) and, for levels 1..3, the level
//! buffer of the size ISA-L documents (`ISAL_DEF_LVLn_DEFAULT`, 276..340 KiB), built once per
//! thread and level, as `deflate.rs` keeps one libdeflate compressor per thread and level. The
//! stateless calls reset everything else they read (`isal_deflate_stateless` re-initialises the
//! hash tables in the level buffer for every call).

use super::CodecError;
use isal_sys::igzip_lib as ffi;
use std::cell::RefCell;

/// ISA-L's levels: 0 (static Huffman tables, no lazy matching) up to 3.
pub const MAX_LEVEL: u32 = ffi::ISAL_DEF_MAX_LEVEL;

/// The level buffer ISA-L documents for each level (0 needs none).
const LEVEL_BUF_SIZE: [usize; 4] = [
    ffi::ISAL_DEF_LVL0_DEFAULT as usize,
    ffi::ISAL_DEF_LVL1_DEFAULT as usize,
    ffi::ISAL_DEF_LVL2_DEFAULT as usize,
    ffi::ISAL_DEF_LVL3_DEFAULT as usize,
];

struct Deflater {
    stream: Box<ffi::isal_zstream>,
    level_bufs: [Vec<u8>; 4],
}

struct Inflater {
    state: Box<ffi::inflate_state>,
}

/// A zeroed value on the heap (ISA-L's states are too large for the stack).
///
/// # Safety
/// All zeros must be a valid `T` (a plain C struct of integers, raw pointers and arrays).
unsafe fn boxed_zeroed<T>() -> Box<T> {
    let layout = std::alloc::Layout::new::<T>();
    let p = std::alloc::alloc_zeroed(layout).cast::<T>();
    if p.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    Box::from_raw(p)
}

thread_local! {
    static DEFLATER: RefCell<Option<Deflater>> = const { RefCell::new(None) };
    static INFLATER: RefCell<Option<Inflater>> = const { RefCell::new(None) };
}

/// Compresses `src` into `dst` at ISA-L level `level` (0..=3) as one final raw-deflate block
/// sequence; `None` when the stream does not fit in `dst` (ISA-L's `STATELESS_OVERFLOW`: it
/// writes nothing usable then, and never past `dst.len()`). ISA-L wants up to 8 bytes of room
/// beyond the stream (its bit buffer stores 8 bytes at a time) and stops early without it, which
/// the codec contract allows: a record that would only just fit is stored raw.
pub fn compress(src: &[u8], dst: &mut [u8], level: u32) -> Option<usize> {
    assert!(level <= MAX_LEVEL, "BUG: ISA-L level {level} out of 0..={MAX_LEVEL}");
    let avail_in = u32::try_from(src.len()).ok()?;
    // A larger buffer than 4 GiB cannot be needed for an input under 4 GiB.
    let avail_out = u32::try_from(dst.len()).unwrap_or(u32::MAX);
    DEFLATER.with(|cell| {
        let mut slot = cell.borrow_mut();
        let d = slot.get_or_insert_with(|| Deflater {
            // SAFETY: isal_zstream is a plain C struct (integers, pointers, arrays): all zeros is
            // a valid value, and isal_deflate_stateless_init sets what the call reads.
            stream: unsafe { boxed_zeroed::<ffi::isal_zstream>() },
            level_bufs: Default::default(),
        });
        let buf = &mut d.level_bufs[level as usize];
        if buf.len() < LEVEL_BUF_SIZE[level as usize] {
            *buf = vec![0u8; LEVEL_BUF_SIZE[level as usize]];
        }
        let s = &mut *d.stream;
        // SAFETY: `s` is a valid, exclusively borrowed stream; the pointers handed to ISA-L
        // (input, output, level buffer) stay valid for the call and their lengths are the ones
        // given. ISA-L only reads `next_in`, and writes at most `avail_out` bytes at `next_out`.
        let ret = unsafe {
            ffi::isal_deflate_stateless_init(s);
            s.level = level;
            s.level_buf = if buf.is_empty() { std::ptr::null_mut() } else { buf.as_mut_ptr() };
            s.level_buf_size = buf.len() as u32;
            s.gzip_flag = ffi::IGZIP_DEFLATE as u16;
            s.flush = ffi::NO_FLUSH as u16;
            s.end_of_stream = 1;
            s.next_in = src.as_ptr().cast_mut();
            s.avail_in = avail_in;
            s.next_out = dst.as_mut_ptr();
            s.avail_out = avail_out;
            ffi::isal_deflate_stateless(s)
        };
        let out = s.total_out as usize;
        let consumed = s.avail_in == 0;
        s.next_in = std::ptr::null_mut();
        s.next_out = std::ptr::null_mut();
        (ret == ffi::COMP_OK as i32 && consumed && out <= dst.len()).then_some(out)
    })
}

/// Decodes a raw-deflate stream that must produce exactly `dst.len()` bytes.
pub fn decompress(src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    let avail_in = u32::try_from(src.len()).map_err(|_| CodecError::Corrupt("deflate stream longer than 4 GiB"))?;
    let avail_out = u32::try_from(dst.len()).map_err(|_| CodecError::Corrupt("deflate record longer than 4 GiB"))?;
    INFLATER.with(|cell| {
        let mut slot = cell.borrow_mut();
        // SAFETY: inflate_state is a plain C struct; all zeros is valid and isal_inflate_init
        // sets what the stateless call reads.
        let i = slot.get_or_insert_with(|| Inflater { state: unsafe { boxed_zeroed::<ffi::inflate_state>() } });
        let st = &mut *i.state;
        // SAFETY: as for compress: valid pointers and lengths for the duration of the call.
        let ret = unsafe {
            ffi::isal_inflate_init(st);
            st.crc_flag = ffi::ISAL_DEFLATE;
            st.next_in = src.as_ptr().cast_mut();
            st.avail_in = avail_in;
            st.next_out = dst.as_mut_ptr();
            st.avail_out = avail_out;
            ffi::isal_inflate_stateless(st)
        };
        let (total_out, finished) = (st.total_out, st.block_state == ffi::isal_block_state_ISAL_BLOCK_FINISH);
        st.next_in = std::ptr::null_mut();
        st.next_out = std::ptr::null_mut();
        match ret {
            r if r == ffi::ISAL_DECOMP_OK as i32 && finished && total_out == avail_out => Ok(()),
            r if r == ffi::ISAL_DECOMP_OK as i32 => Err(CodecError::Corrupt("deflate stream decodes to the wrong length")),
            r if r == ffi::ISAL_OUT_OVERFLOW as i32 => Err(CodecError::Corrupt("deflate stream decodes past the record length")),
            _ => Err(CodecError::Corrupt("invalid deflate stream")),
        }
    })
}

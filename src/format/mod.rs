//! The container format, version 6: byte maps and their encoders/decoders (see docs/FORMAT.md).
//!
//! Header copy (HEADER_COPY_SIZE bytes; two copies, at 0 and 64; the valid copy with the higher
//! sequence number wins):
//! ```text
//!  0  8  magic "DENSEFS\0"
//!  8  2  format version (u16 LE): 6 (files of version 5 too), 4 (copies placed, tables at
//!        version 3's offsets), or 3 for files of versions 1 to 3 (copies in slots)
//! 10  1  record shift (12..=20: record size 4 KiB..1 MiB)
//! 11  1  checksum kind (1 = crc32c, 2 = xxh3-64)
//! 12  1  codec id new records get, or 255 = auto (the engine picks per record)
//! 13  1  codec level (i8, informational)
//! 14  2  reserved, zero
//! 16  8  logical file size (u64 LE)
//! 24  8  sequence number (u64 LE; the copy with the higher one is current)
//! 32  8  durable_below: sync epoch below which copies are durable (u64 LE)
//! 40  8  heal_from: start of the epochs a crash left unverified, 0 = none (u64 LE)
//! 48 12  reserved, zero
//! 60  4  crc32c of bytes 0..60 (u32 LE)
//! ```
//! Slot descriptor of versions 1 to 3 (DESCRIPTOR_SIZE = 32 bytes; all zero = empty slot; the
//! copy lies in its record's slot):
//! ```text
//!  0  4  generation (u32 LE; 0 = empty; the valid slot with the higher one is current)
//!  4  4  stored length in the slot (u32 LE; 0 = an all-zero record kept as a hole)
//!  8  4  logical length (u32 LE; the record's decoded length, 1..=record size)
//! 12  1  codec id (0 = stored raw)
//! 13  1  codec level (i8, informational)
//! 14  1  flags: bit 0 = inline (record 0, slot 0 only: the bytes sit in block 0, see layout)
//! 15  1  epoch, bits 32..40
//! 16  8  checksum of the stored bytes (crc32c zero-extended, or xxh3-64), u64 LE
//! 24  4  epoch, bits 0..32: the file's sync epoch when this copy was written
//! 28  4  crc32c of bytes 0..28 (u32 LE)
//! ```
//! Slot descriptor of versions 4 to 6 (the copy lies where `place` says):
//! ```text
//!  0  4  generation (u32 LE; 0 = empty)
//!  4  4  place: the copy's first byte on the lower file in 4 KiB blocks (u32 LE; 0 = none:
//!        a hole or an inline copy)
//!  8  8  checksum of the stored bytes, u64 LE
//! 16  7  u56 LE: stored length (bits 0..21), logical length - 1 (21..41), epoch bits 32..40
//!        (41..49), codec level (49..56, 7-bit two's complement, informational)
//! 23  1  codec id (bits 0..4), flags (bits 4..8: bit 4 = inline)
//! 24  4  epoch, bits 0..32
//! 28  4  crc32c of bytes 0..28 (u32 LE)
//! ```

pub mod durability;
pub mod hints;
pub mod layout;
pub mod record;

pub use crate::checksum::ChecksumKind;
use crate::codec::{Codec, CodecError, Setting};
pub use layout::{Layout, Piece};
use layout::{GROUP0_TABLE_OFF, MAX_RECORD_SHIFT, TABLE_SIZE};

pub const MAGIC: [u8; 8] = *b"DENSEFS\0";
/// Version 6: version 5's bytes; what changed is a writer's duty: the lower file may carry a
/// size hint (`hints`) naming the header's size, which a writer removes before a header records
/// another size (a densefs of version 5 would leave it stale, so it must refuse these files).
/// A header write makes a file of version 5 version 6. Version 5: version 4's bytes with a table every 8 records' worth of lower bytes instead of
/// every 64 slots (`Layout`), so a file's lower length follows its stored bytes. Version 4:
/// each descriptor says where its copy lies (`Descriptor::place`), so a file's copies are
/// packed in the order written instead of one per fixed slot. Version 3: version 2's bytes;
/// a user's fsync takes one flush, so a header's `durable_below` may lag behind copies an fsync
/// made durable, and a run keeps the suspect copies it finds intact as durable. Files of
/// versions 1 to 3 are read and written too (docs/FORMAT.md, "Version history"); a header
/// write makes them version 3, and a file of version 4 stays version 4. An older densefs
/// refuses the versions after its own.
pub const FORMAT_VERSION: u16 = 6;
/// What a header write makes a file of versions 1 to 3: its copies stay in their slots.
pub const SLOTS_FORMAT_VERSION: u16 = 3;
/// What a file of version 4 stays: copies placed, its tables at version 3's offsets.
pub const PLACED_WIDE_FORMAT_VERSION: u16 = 4;
pub const HEADER_COPY_SIZE: usize = 64;
pub const HEADER_COPY_STRIDE: usize = 64;
/// Where the first densefs (format 1, before the inline area) kept header copy B.
const FIRST_LAYOUT_COPY_B: usize = 512;
pub const DESCRIPTOR_SIZE: usize = layout::DESCRIPTOR_SIZE as usize;
/// The lower file's extended attribute holding its first header (docs/FORMAT.md, "The birth
/// header"): it stands in for block 0 while no header there is durable yet, so a new file's
/// first header needs no sync of its own. In densefs's own namespace, which users never see.
pub const BIRTH_HEADER_XATTR: &str = "user.densefs.birth";
pub const BIRTH_HEADER_SIZE: usize = 8;
/// The codec `chattr +c`/`+m` asked of an empty lower file (no header yet), as text
/// (`zstd-3`, `off`): its first write makes it a container of that codec instead of its
/// directory's (docs/FORMAT.md, "File attributes").
pub const CODEC_WISH_XATTR: &str = "user.densefs.codec";

/// Why a container's metadata could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// Both header copies are damaged (the magic is there, the checksums are not).
    BadHeader,
    /// Neither copy has the magic, yet block 0 holds a valid record table: a container whose
    /// header was overwritten (zeroed or garbage), not a plain file.
    HeaderLost,
    /// Written by a newer densefs.
    FutureVersion(u16),
    /// A field holds a value this version does not know.
    BadField(&'static str),
    /// A record's stored bytes do not match their checksum.
    ChecksumMismatch,
    /// A record passed its checksum but did not decode.
    Codec(CodecError),
}

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FormatError::BadHeader => f.write_str("both header copies are damaged"),
            FormatError::HeaderLost => f.write_str("the header is gone (overwritten) but the record table is there: a damaged container"),
            FormatError::FutureVersion(v) => {
                write!(f, "format version {v} is newer than this densefs reads ({FORMAT_VERSION})")
            }
            FormatError::BadField(what) => write!(f, "invalid {what}"),
            FormatError::ChecksumMismatch => f.write_str("checksum mismatch"),
            FormatError::Codec(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for FormatError {}

impl From<CodecError> for FormatError {
    fn from(e: CodecError) -> FormatError {
        FormatError::Codec(e)
    }
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("BUG: slice of 2"))
}
fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("BUG: slice of 4"))
}
fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("BUG: slice of 8"))
}

/// The file-level header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub layout: Layout,
    pub checksum: ChecksumKind,
    /// What new records get (docs/FORMAT.md: a codec id and level, or 255 for `auto`).
    pub setting: Setting,
    pub size: u64,
    pub sequence: u64,
    /// Sync epochs (docs/FORMAT.md, "Epochs"): copies with an epoch below `durable_below` were
    /// made durable by a completed sync, unless they lie in the range a crash left unverified
    /// (from `heal_from`, 0 = none, up to wherever the next run starts counting). Since version
    /// 3 it may lag: later copies may be durable too (a user's fsync flushes once).
    pub durable_below: u64,
    pub heal_from: u64,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_COPY_SIZE] {
        let mut b = [0u8; HEADER_COPY_SIZE];
        b[0..8].copy_from_slice(&MAGIC);
        let version = self.layout.format_version();
        b[8..10].copy_from_slice(&version.to_le_bytes());
        b[10] = self.layout.record_shift();
        b[11] = self.checksum as u8;
        let (codec_id, level) = self.setting.to_header();
        b[12] = codec_id;
        b[13] = level as u8;
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        b[24..32].copy_from_slice(&self.sequence.to_le_bytes());
        b[32..40].copy_from_slice(&self.durable_below.to_le_bytes());
        b[40..48].copy_from_slice(&self.heal_from.to_le_bytes());
        let crc = crc32c::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Offset of the copy that a header with this sequence number is written to: copies
    /// alternate, so a torn write leaves the other, older copy intact.
    pub fn copy_offset(sequence: u64) -> u64 {
        (sequence % 2) * HEADER_COPY_STRIDE as u64
    }

    fn decode_copy(b: &[u8]) -> Option<Result<Header, FormatError>> {
        if b[0..8] != MAGIC {
            return None;
        }
        if crc32c::crc32c(&b[..60]) != le_u32(b, 60) {
            return Some(Err(FormatError::BadHeader));
        }
        let version = le_u16(b, 8);
        if version > FORMAT_VERSION {
            return Some(Err(FormatError::FutureVersion(version)));
        }
        if version == 0 {
            return Some(Err(FormatError::BadField("format version 0")));
        }
        let parsed = (|| {
            Ok(Header {
                layout: Layout::from_shift(b[10]).map(|l| l.of_version(version)).ok_or(FormatError::BadField("record size"))?,
                checksum: ChecksumKind::from_id(b[11]).ok_or(FormatError::BadField("checksum kind"))?,
                setting: Setting::from_header(b[12], b[13] as i8).map_err(|_| FormatError::BadField("codec"))?,
                size: le_u64(b, 16),
                sequence: le_u64(b, 24),
                durable_below: le_u64(b, 32),
                heal_from: le_u64(b, 40),
            })
        })();
        Some(parsed)
    }

    /// The birth header ([`BIRTH_HEADER_XATTR`]'s value): what a new file's first header says
    /// besides its size, sequence and epochs — header bytes 8..16 (version, record shift,
    /// checksum kind, codec and level, reserved). Small, so ext4 keeps it inside the inode.
    pub fn encode_birth(&self) -> [u8; BIRTH_HEADER_SIZE] {
        self.encode()[8..16].try_into().expect("BUG: 8 bytes")
    }

    /// The header a birth header stands for: that of an empty new file (size 0, no sync yet).
    /// `None` unless the value is one this densefs wrote.
    pub fn decode_birth(value: &[u8]) -> Option<Header> {
        if value.len() != BIRTH_HEADER_SIZE {
            return None;
        }
        let mut copy = [0u8; HEADER_COPY_SIZE];
        copy[0..8].copy_from_slice(&MAGIC);
        copy[8..16].copy_from_slice(value);
        copy[32..40].copy_from_slice(&durability::Epochs::NEW_FILE_DURABLE_BELOW.to_le_bytes());
        let crc = crc32c::crc32c(&copy[..60]);
        copy[60..64].copy_from_slice(&crc.to_le_bytes());
        Header::decode_copy(&copy).and_then(Result::ok)
    }

    /// Decodes the header block (its first `HEADER_COPY_STRIDE + HEADER_COPY_SIZE` bytes or
    /// more). `Ok(None)`: not a container (no magic in either copy) — a plain file.
    pub fn decode(block: &[u8]) -> Result<Option<Header>, FormatError> {
        let copy = |at: usize| block.get(at..at + HEADER_COPY_SIZE).and_then(Header::decode_copy);
        // A version-1 file of the first layout may hold its newest copy at 512 (inside today's
        // inline area: only a valid version-1 copy counts there).
        let version_1 = block.get(FIRST_LAYOUT_COPY_B + 8..FIRST_LAYOUT_COPY_B + 10) == Some(&1u16.to_le_bytes()[..]);
        let first_layout = copy(FIRST_LAYOUT_COPY_B).filter(|c| version_1 && c.is_ok());
        let copies: Vec<Result<Header, FormatError>> = [copy(0), copy(HEADER_COPY_STRIDE), first_layout].into_iter().flatten().collect();
        if let Some(newest) = copies.iter().filter_map(|c| c.as_ref().ok()).max_by_key(|h| h.sequence) {
            return Ok(Some(*newest));
        }
        // No valid copy. A future version wins over a torn copy: say what is really wrong.
        if let Some(e) = copies.iter().find_map(|c| c.clone().err().filter(|e| matches!(e, FormatError::FutureVersion(_)))) {
            return Err(e);
        }
        match copies.into_iter().next() {
            Some(Err(e)) => Err(e),
            _ if has_record_table(block) => Err(FormatError::HeaderLost),
            _ => Ok(None),
        }
    }
}

/// Whether block 0 holds at least one valid slot descriptor in group 0's table: the mark of a
/// container even when both header copies are gone (a plain file passes a descriptor's crc32c
/// by chance with odds of about 2^-26 over the 64 places).
fn has_record_table(block: &[u8]) -> bool {
    let table = GROUP0_TABLE_OFF as usize;
    let Some(bytes) = block.get(table..table + TABLE_SIZE as usize) else { return false };
    bytes
        .chunks_exact(DESCRIPTOR_SIZE)
        .any(|d| [false, true].iter().any(|&placed| matches!(Descriptor::decode(d, 1 << MAX_RECORD_SHIFT, placed), SlotState::Valid(_))))
}

/// One slot's descriptor: which bytes the slot holds and how to check and decode them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Descriptor {
    pub generation: u32,
    pub stored_len: u32,
    pub logical_len: u32,
    pub codec_id: u8,
    pub level: i8,
    pub flags: u8,
    pub checksum: u64,
    /// The container's sync epoch when this copy was written (40 bits; see [`Header`]).
    pub epoch: u64,
    /// Format 4: the copy's first byte on the lower file, in 4 KiB blocks (0: nothing there, a
    /// hole or an inline copy). Formats 1 to 3: 0, the copy lies in its record's slot.
    pub place: u32,
}

/// Descriptor flag: the stored bytes are in block 0's inline area, not in the slot.
pub const FLAG_INLINE: u8 = 1;

/// What a descriptor's 32 bytes say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    Empty,
    Valid(Descriptor),
    /// Torn or damaged: ignored, as if the slot were empty, but reported.
    Damaged,
}

impl SlotState {
    /// The bytes written for this state: a damaged slot is rewritten as empty. `placed`: the
    /// file's layout is format 4's.
    pub fn encode(&self, placed: bool) -> [u8; DESCRIPTOR_SIZE] {
        match self {
            SlotState::Valid(d) => d.encode(placed),
            _ => [0u8; DESCRIPTOR_SIZE],
        }
    }
}

/// Format 4's packed u56 (bytes 16..23 of a descriptor): stored length (21 bits, up to 1 MiB),
/// logical length - 1 (20 bits), epoch bits 32..40 (8), codec level (7, signed).
const STORED_BITS: u32 = 21;
const LOGICAL_BITS: u32 = 20;
const EPOCH_HIGH_AT: u32 = STORED_BITS + LOGICAL_BITS;
const LEVEL_AT: u32 = EPOCH_HIGH_AT + 8;
/// Format 4 keeps levels -64..=63 (every codec's are within -10..=19).
const LEVEL_BITS: u32 = 56 - LEVEL_AT;

impl Descriptor {
    /// The descriptor's bytes in format 4 (`placed`) or in formats 1 to 3.
    pub fn encode(&self, placed: bool) -> [u8; DESCRIPTOR_SIZE] {
        if placed {
            return self.encode_placed();
        }
        let mut b = [0u8; DESCRIPTOR_SIZE];
        b[0..4].copy_from_slice(&self.generation.to_le_bytes());
        b[4..8].copy_from_slice(&self.stored_len.to_le_bytes());
        b[8..12].copy_from_slice(&self.logical_len.to_le_bytes());
        b[12] = self.codec_id;
        b[13] = self.level as u8;
        b[14] = self.flags;
        b[16..24].copy_from_slice(&self.checksum.to_le_bytes());
        b[24..28].copy_from_slice(&(self.epoch as u32).to_le_bytes());
        b[15] = (self.epoch >> 32) as u8;
        let crc = crc32c::crc32c(&b[..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn encode_placed(&self) -> [u8; DESCRIPTOR_SIZE] {
        let mut b = [0u8; DESCRIPTOR_SIZE];
        b[0..4].copy_from_slice(&self.generation.to_le_bytes());
        b[4..8].copy_from_slice(&self.place.to_le_bytes());
        b[8..16].copy_from_slice(&self.checksum.to_le_bytes());
        let level = (self.level as i64).clamp(-(1 << (LEVEL_BITS - 1)), (1 << (LEVEL_BITS - 1)) - 1) as u64;
        let packed = (self.stored_len as u64 & ((1 << STORED_BITS) - 1))
            | ((self.logical_len as u64).wrapping_sub(1) & ((1 << LOGICAL_BITS) - 1)) << STORED_BITS
            | (self.epoch >> 32 & 0xff) << EPOCH_HIGH_AT
            | (level & ((1 << LEVEL_BITS) - 1)) << LEVEL_AT;
        b[16..23].copy_from_slice(&packed.to_le_bytes()[..7]);
        b[23] = (self.codec_id & 0x0f) | self.flags << 4;
        b[24..28].copy_from_slice(&(self.epoch as u32).to_le_bytes());
        let crc = crc32c::crc32c(&b[..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Reads a descriptor of format 4 (`placed`) or of formats 1 to 3.
    pub fn decode(b: &[u8], record_size: u64, placed: bool) -> SlotState {
        debug_assert_eq!(b.len(), DESCRIPTOR_SIZE);
        if b.iter().all(|&x| x == 0) {
            return SlotState::Empty;
        }
        if crc32c::crc32c(&b[..28]) != le_u32(b, 28) {
            return SlotState::Damaged;
        }
        let d = if placed {
            let mut packed = [0u8; 8];
            packed[..7].copy_from_slice(&b[16..23]);
            let packed = u64::from_le_bytes(packed);
            Descriptor {
                generation: le_u32(b, 0),
                stored_len: (packed & ((1 << STORED_BITS) - 1)) as u32,
                logical_len: (packed >> STORED_BITS & ((1 << LOGICAL_BITS) - 1)) as u32 + 1,
                codec_id: b[23] & 0x0f,
                // Sign-extended from its 7 bits.
                level: ((packed >> LEVEL_AT << (64 - LEVEL_BITS)) as i64 >> (64 - LEVEL_BITS)) as i8,
                flags: b[23] >> 4,
                checksum: le_u64(b, 8),
                epoch: le_u32(b, 24) as u64 | (packed >> EPOCH_HIGH_AT & 0xff) << 32,
                place: le_u32(b, 4),
            }
        } else {
            Descriptor {
                generation: le_u32(b, 0),
                stored_len: le_u32(b, 4),
                logical_len: le_u32(b, 8),
                codec_id: b[12],
                level: b[13] as i8,
                flags: b[14],
                checksum: le_u64(b, 16),
                epoch: le_u32(b, 24) as u64 | (b[15] as u64) << 32,
                place: 0,
            }
        };
        // Format 4: a stored copy outside block 0 says where it is, nothing else does.
        let placed_right = !placed || ((d.place != 0) == (d.stored_len > 0 && !d.is_inline()));
        let sane = d.generation != 0
            && placed_right
            && d.logical_len >= 1
            && d.logical_len as u64 <= record_size
            && d.stored_len as u64 <= record_size
            && Codec::from_id(d.codec_id).is_ok()
            && (d.codec_id != Codec::Off as u8 || d.stored_len == 0 || d.stored_len == d.logical_len)
            && d.flags & !FLAG_INLINE == 0
            && (!d.is_inline() || (d.stored_len > 0 && d.stored_len as u64 <= layout::INLINE_CAPACITY));
        if sane {
            SlotState::Valid(d)
        } else {
            SlotState::Damaged
        }
    }

    pub fn is_inline(&self) -> bool {
        self.flags & FLAG_INLINE != 0
    }

    /// An all-zero record: nothing stored, reads as `logical_len` zeros.
    pub fn is_hole(&self) -> bool {
        self.stored_len == 0
    }

    pub fn codec(&self) -> Codec {
        Codec::from_id(self.codec_id).expect("BUG: descriptor codec checked at decode")
    }
}

/// The two slot descriptors of one record.
pub type Pair = [SlotState; 2];

/// Decodes a group's table (TABLE_SIZE bytes). Descriptors that break a rule only the table's
/// position reveals (inline anywhere but record 0's slot 0) are damaged too.
pub fn decode_table(block: &[u8], group: u64, layout: Layout) -> Box<[Pair]> {
    let (rs, placed) = (layout.record_size(), layout.placed());
    let mut table: Box<[Pair]> = block
        .chunks_exact(2 * DESCRIPTOR_SIZE)
        .map(|e| [Descriptor::decode(&e[..DESCRIPTOR_SIZE], rs, placed), Descriptor::decode(&e[DESCRIPTOR_SIZE..], rs, placed)])
        .collect();
    for (i, pair) in table.iter_mut().enumerate() {
        for (slot, s) in pair.iter_mut().enumerate() {
            if matches!(s, SlotState::Valid(d) if d.is_inline()) && (group, i, slot) != (0, 0, 0) {
                *s = SlotState::Damaged;
            }
        }
    }
    table
}

/// A record's valid copies, newest (current) first.
pub fn newest_first(pair: &Pair) -> Vec<(usize, Descriptor)> {
    let mut valid: Vec<(usize, Descriptor)> = pair
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            SlotState::Valid(d) => Some((i, *d)),
            _ => None,
        })
        .collect();
    valid.sort_by_key(|(_, d)| std::cmp::Reverse(d.generation));
    valid
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            layout: Layout::new(128 * 1024).unwrap(),
            checksum: ChecksumKind::Crc32c,
            setting: Setting::Fixed(crate::codec::Compression { codec: Codec::Zstd, level: -3 }),
            durable_below: 4,
            heal_from: 2,
            size: 123_456_789,
            sequence: 7,
        }
    }

    fn block_with(copies: &[(usize, [u8; HEADER_COPY_SIZE])]) -> Vec<u8> {
        let mut block = vec![0u8; 4096];
        for (at, bytes) in copies {
            block[*at..*at + HEADER_COPY_SIZE].copy_from_slice(bytes);
        }
        block
    }

    #[test]
    fn a_first_layout_copy_at_512_is_read_only_as_version_1() {
        let old = header();
        let newer = Header { size: 9, sequence: 8, ..old };
        let mut at_512 = newer.encode();
        at_512[8..10].copy_from_slice(&1u16.to_le_bytes());
        let crc = crc32c::crc32c(&at_512[..60]);
        at_512[60..64].copy_from_slice(&crc.to_le_bytes());
        // The first layout: copy A at 0 (older), copy B at 512 (newest): the newest wins.
        let block = block_with(&[(0, old.encode()), (FIRST_LAYOUT_COPY_B, at_512)]);
        assert_eq!(Header::decode(&block).unwrap().unwrap().size, 9);
        // Alone at 512, it is still a container (an empty file of the first densefs).
        assert_eq!(Header::decode(&block_with(&[(FIRST_LAYOUT_COPY_B, at_512)])).unwrap().unwrap().sequence, 8);
        // A version-2 copy at 512 is inline data, not a header.
        let block = block_with(&[(0, old.encode()), (FIRST_LAYOUT_COPY_B, newer.encode())]);
        assert_eq!(Header::decode(&block).unwrap().unwrap(), old);
    }

    #[test]
    fn a_birth_header_stands_for_the_empty_new_file_it_began_as() {
        let h = Header { sequence: 1, size: 0, ..header() };
        let born = Header::decode_birth(&h.encode_birth()).unwrap();
        assert_eq!((born.layout, born.checksum, born.setting, born.size), (h.layout, h.checksum, h.setting, 0));
        assert_eq!(born.durable_below, durability::Epochs::NEW_FILE_DURABLE_BELOW);
        assert!(Header::decode_birth(&h.encode()).is_none(), "a whole header copy is no birth header");
        assert!(Header::decode_birth(&[0u8; BIRTH_HEADER_SIZE]).is_none(), "format version 0");
        let mut bad = h.encode_birth();
        bad[2] = 40; // record shift
        assert!(Header::decode_birth(&bad).is_none());
        assert!(BIRTH_HEADER_XATTR.starts_with(crate::core::props::XATTR_PREFIX), "hidden from users");
    }

    #[test]
    fn header_round_trips_and_newest_copy_wins() {
        let old = header();
        let new = Header { size: 5, sequence: 8, ..old };
        let block = block_with(&[(0, new.encode()), (HEADER_COPY_STRIDE, old.encode())]);
        assert_eq!(Header::decode(&block), Ok(Some(new)));
        let block = block_with(&[(0, old.encode()), (HEADER_COPY_STRIDE, new.encode())]);
        assert_eq!(Header::decode(&block), Ok(Some(new)));
    }

    #[test]
    fn a_torn_copy_falls_back_to_the_other() {
        let old = header();
        let mut torn = Header { size: 99, sequence: 8, ..old }.encode();
        torn[20] ^= 1;
        let block = block_with(&[(0, torn), (HEADER_COPY_STRIDE, old.encode())]);
        assert_eq!(Header::decode(&block), Ok(Some(old)));
        let block = block_with(&[(0, torn)]);
        assert_eq!(Header::decode(&block), Err(FormatError::BadHeader));
    }

    #[test]
    fn plain_data_is_not_a_container_and_future_versions_are_refused() {
        assert_eq!(Header::decode(&vec![b'A'; 4096]), Ok(None));
        assert_eq!(Header::decode(&[]), Ok(None));
        let mut future = header().encode();
        future[8..10].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        let crc = crc32c::crc32c(&future[..60]);
        future[60..64].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(Header::decode(&block_with(&[(0, future)])), Err(FormatError::FutureVersion(FORMAT_VERSION + 1)));
    }

    #[test]
    fn a_container_whose_headers_were_overwritten_is_not_taken_for_a_plain_file() {
        let d = Descriptor {
            generation: 1,
            stored_len: 100,
            logical_len: 4096,
            codec_id: 1,
            level: 0,
            flags: 0,
            checksum: 7,
            epoch: 0,
            place: 0,
        };
        let mut block = vec![0u8; 4096];
        block[2048 + 5 * 64..2048 + 5 * 64 + 32].copy_from_slice(&d.encode(false));
        assert_eq!(Header::decode(&block), Err(FormatError::HeaderLost));
        block[..128].iter_mut().enumerate().for_each(|(i, b)| *b = i as u8 ^ 0x5a); // garbage, no magic
        assert_eq!(Header::decode(&block), Err(FormatError::HeaderLost));
        // A damaged descriptor alone does not make a container of a plain file.
        block[2048 + 5 * 64 + 3] ^= 1;
        assert_eq!(Header::decode(&block), Ok(None));
    }

    #[test]
    fn descriptors_round_trip_and_detect_damage() {
        let d = Descriptor {
            generation: 3,
            stored_len: 1000,
            logical_len: 4096,
            codec_id: 2,
            level: 6,
            flags: 0,
            checksum: 0xdead_beef,
            epoch: (7 << 32) | 2,
            place: 0,
        };
        // Format 4 also says where the copy lies.
        let placed = Descriptor { place: 9, ..d };
        for (placed_layout, d) in [(false, d), (true, placed)] {
            let b = d.encode(placed_layout);
            assert_eq!(Descriptor::decode(&b, 4096, placed_layout), SlotState::Valid(d));
            assert_eq!(Descriptor::decode(&[0u8; 32], 4096, placed_layout), SlotState::Empty);
            for i in 0..32 {
                let mut bad = b;
                bad[i] ^= 0x10;
                assert_eq!(Descriptor::decode(&bad, 4096, placed_layout), SlotState::Damaged, "byte {i}");
            }
            // Lengths beyond the record size are damage even with a good crc.
            assert_eq!(Descriptor::decode(&d.encode(placed_layout), 2048, placed_layout), SlotState::Damaged);
            let unknown = Descriptor { codec_id: 77, ..d }.encode(placed_layout);
            assert_eq!(Descriptor::decode(&unknown, 4096, placed_layout), SlotState::Damaged);
            let inline = Descriptor { flags: FLAG_INLINE, place: 0, ..d };
            assert_eq!(Descriptor::decode(&inline.encode(placed_layout), 4096, placed_layout), SlotState::Valid(inline));
            let too_big = Descriptor { flags: FLAG_INLINE, stored_len: 3000, place: 0, ..d };
            assert_eq!(Descriptor::decode(&too_big.encode(placed_layout), 4096, placed_layout), SlotState::Damaged);
            let unknown_flag = Descriptor { flags: 2, ..d };
            assert_eq!(Descriptor::decode(&unknown_flag.encode(placed_layout), 4096, placed_layout), SlotState::Damaged);
        }
        // Format 4: a stored copy without a place, or a hole or inline copy with one, is damage.
        let nowhere = Descriptor { place: 0, ..placed };
        assert_eq!(Descriptor::decode(&nowhere.encode(true), 4096, true), SlotState::Damaged);
        let hole_somewhere = Descriptor { stored_len: 0, ..placed };
        assert_eq!(Descriptor::decode(&hole_somewhere.encode(true), 4096, true), SlotState::Damaged);
        let hole = Descriptor { stored_len: 0, place: 0, ..placed };
        assert_eq!(Descriptor::decode(&hole.encode(true), 4096, true), SlotState::Valid(hole));
        // The largest values each field takes survive the packing.
        let widest = Descriptor {
            generation: u32::MAX,
            stored_len: 1 << 20,
            logical_len: 1 << 20,
            codec_id: 5,
            level: -64,
            flags: 0,
            checksum: u64::MAX,
            epoch: (1 << 40) - 1,
            place: u32::MAX,
        };
        assert_eq!(Descriptor::decode(&widest.encode(true), 1 << 20, true), SlotState::Valid(widest));
        let fast = Descriptor { level: -10, ..placed };
        assert_eq!(Descriptor::decode(&fast.encode(true), 4096, true), SlotState::Valid(fast));
        let strong = Descriptor { level: 19, logical_len: 1, ..placed };
        assert_eq!(Descriptor::decode(&strong.encode(true), 4096, true), SlotState::Valid(strong));
    }

    #[test]
    fn format_5_headers_say_so_and_older_ones_keep_their_layout() {
        let h = header();
        assert!(h.layout.placed());
        let b = h.encode();
        assert_eq!(le_u16(&b, 8), FORMAT_VERSION);
        let wide = Header { layout: h.layout.of_version(4), ..h };
        let b = wide.encode();
        assert_eq!(le_u16(&b, 8), 4);
        assert_eq!(Header::decode(&block_with(&[(0, b)])), Ok(Some(wide)));
        assert_eq!(Header::decode_birth(&wide.encode_birth()).unwrap().layout, wide.layout);
        assert_ne!(wide.layout, h.layout);
        let slots = Header { layout: h.layout.in_slots(), ..h };
        let b = slots.encode();
        assert_eq!(le_u16(&b, 8), SLOTS_FORMAT_VERSION);
        assert_eq!(Header::decode(&block_with(&[(0, b)])), Ok(Some(slots)));
        assert!(!Header::decode_birth(&slots.encode_birth()).unwrap().layout.placed());
        assert!(Header::decode_birth(&h.encode_birth()).unwrap().layout.placed());
    }

    #[test]
    fn checksums_differ_by_kind() {
        let data = b"densefs";
        assert_eq!(ChecksumKind::Crc32c.compute(data), crc32c::crc32c(data) as u64);
        assert_ne!(ChecksumKind::Xxh3.compute(data), ChecksumKind::Crc32c.compute(data));
    }
}

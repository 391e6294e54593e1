//! Record checksums: crc32c (hardware-accelerated on x86 and ARM, and computable on the GPU by
//! nvCOMP) or xxh3-64.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ChecksumKind {
    Crc32c = 1,
    Xxh3 = 2,
}

impl ChecksumKind {
    pub fn from_id(id: u8) -> Option<ChecksumKind> {
        match id {
            1 => Some(ChecksumKind::Crc32c),
            2 => Some(ChecksumKind::Xxh3),
            _ => None,
        }
    }

    pub fn parse(name: &str) -> Result<ChecksumKind, String> {
        match name {
            "crc32c" => Ok(ChecksumKind::Crc32c),
            "xxh3" => Ok(ChecksumKind::Xxh3),
            _ => Err(format!("unknown checksum '{name}' (expected crc32c or xxh3)")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ChecksumKind::Crc32c => "crc32c",
            ChecksumKind::Xxh3 => "xxh3",
        }
    }

    pub fn compute(self, data: &[u8]) -> u64 {
        match self {
            ChecksumKind::Crc32c => crc32c::crc32c(data) as u64,
            ChecksumKind::Xxh3 => xxhash_rust::xxh3::xxh3_64(data),
        }
    }
}

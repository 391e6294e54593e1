//! Record checksums: crc32c (hardware-accelerated on x86 and ARM, and computable on the GPU by
//! nvCOMP) or xxh3-64.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ChecksumKind {
    Crc32c = 1,
    Xxh3 = 2,
}

impl ChecksumKind {
    pub const ALL: [ChecksumKind; 2] = [ChecksumKind::Crc32c, ChecksumKind::Xxh3];

    pub fn from_id(id: u8) -> Option<ChecksumKind> {
        ChecksumKind::ALL.into_iter().find(|k| *k as u8 == id)
    }

    pub fn parse(name: &str) -> Result<ChecksumKind, String> {
        ChecksumKind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| format!("unknown checksum '{name}' (expected {})", ChecksumKind::names()))
    }

    /// `crc32c or xxh3`, for messages and help.
    pub fn names() -> String {
        let names: Vec<&str> = ChecksumKind::ALL.iter().map(|k| k.name()).collect();
        let (last, rest) = names.split_last().expect("BUG: there are checksums");
        format!("{} or {last}", rest.join(", "))
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

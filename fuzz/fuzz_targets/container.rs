//! The container parser: header copies, descriptor tables, slot choice. Never panics, whatever
//! block 0 or a table holds.
#![no_main]
use densefs::format::{decode_table, newest_first, Header, Layout};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Header::decode(data);
    if let Some((&sel, table)) = data.split_first() {
        let layout = Layout::from_shift(12 + sel % 9).expect("shifts 12..=20 are valid");
        // Both descriptor maps: format 4's (copies placed) and earlier formats' (slots).
        let layout = if sel & 0x80 != 0 { layout.in_slots() } else { layout };
        let pairs = decode_table(table, (sel % 128 / 9) as u64, layout);
        for pair in pairs.iter() {
            let _ = newest_first(pair);
        }
    }
});

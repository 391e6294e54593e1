//! The container parser: header copies, descriptor tables, slot choice. Never panics, whatever
//! block 0 or a table holds.
#![no_main]
use densefs::format::{decode_table, newest_first, Header, Layout};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Header::decode(data);
    if let Some((&sel, table)) = data.split_first() {
        let layout = Layout::from_shift(12 + sel % 9).expect("shifts 12..=20 are valid");
        let pairs = decode_table(table, (sel / 9) as u64, layout);
        for pair in pairs.iter() {
            let _ = newest_first(pair);
        }
    }
});

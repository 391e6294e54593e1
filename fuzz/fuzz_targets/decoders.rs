//! Every decoder on arbitrary input and output length: an error or bytes, never a panic, a hang
//! or an allocation beyond the output buffer.
#![no_main]
use densefs::codec::{Codec, CODECS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let codec = Codec::from_id(data[0] % CODECS.len() as u8).expect("ids below CODECS.len() exist");
    let out_len = u16::from_le_bytes([data[1], data[2]]) as usize * 16; // up to 1 MiB
    let _ = codec.decompress(&data[3..], out_len);
});

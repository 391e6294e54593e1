//! A whole lower file as scrub reads it (header, tables, slots, checksums, decoding), from an
//! arbitrary image: problems are listed, nothing panics or runs away with a bogus size.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::io::Write;
use std::os::fd::FromRawFd;

fuzz_target!(|data: &[u8]| {
    let fd = unsafe { libc::memfd_create(c"densefs-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.write_all(data).unwrap();
    let _ = densefs::inspect::inspect(&file, true);
});

//! The core's boundary error: an errno for the kernel plus what happened, for the log.

use std::fmt;
use std::io;

#[derive(Debug)]
pub struct FsError {
    pub errno: i32,
    pub message: String,
}

pub type FsResult<T> = Result<T, FsError>;

impl FsError {
    pub fn new(errno: i32, message: impl Into<String>) -> FsError {
        FsError { errno, message: message.into() }
    }

    pub fn errno(errno: i32) -> FsError {
        FsError { errno, message: String::new() }
    }

    /// Damaged on-disk data: EIO, with the reason kept for the log.
    pub fn corrupt(message: impl Into<String>) -> FsError {
        FsError::new(libc::EIO, message)
    }
}

impl From<io::Error> for FsError {
    fn from(e: io::Error) -> FsError {
        FsError { errno: e.raw_os_error().unwrap_or(libc::EIO), message: e.to_string() }
    }
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = io::Error::from_raw_os_error(self.errno);
        if self.message.is_empty() {
            write!(f, "{name}")
        } else {
            write!(f, "{}: {name}", self.message)
        }
    }
}

impl std::error::Error for FsError {}

/// Turns a libc return value into a result, reading errno on -1.
pub fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

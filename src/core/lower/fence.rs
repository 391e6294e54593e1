//! The shutdown fence (FS_IOC_SHUTDOWN, `DenseFs::shut_down`): once raised, nothing the daemon
//! does changes the lower tree any more, whichever thread tries (a landing, a background pass,
//! a size hint, the run record at unmount), as nothing changes a disk after a crash. Every
//! changing wrapper in this module asks [`check`] first and fails with EIO once it is up; reads
//! still work. It is the process's, as the daemon serves one mount; it comes down only with the
//! process (a remount starts a new daemon).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

static RAISED: AtomicBool = AtomicBool::new(false);

/// Raises the fence for good.
pub fn raise() {
    RAISED.store(true, Ordering::SeqCst);
}

/// Whether the fence is up.
pub fn raised() -> bool {
    RAISED.load(Ordering::SeqCst)
}

/// EIO once the fence is up: what every change to the lower asks before it is made.
pub(super) fn check() -> io::Result<()> {
    if raised() {
        Err(io::Error::other(FencedError))
    } else {
        Ok(())
    }
}

/// The error a fenced change fails with: EIO to the kernel, "shut down" in the log.
#[derive(Debug)]
pub struct FencedError;

impl std::fmt::Display for FencedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the file system was shut down (FS_IOC_SHUTDOWN): the lower is no longer changed")
    }
}

impl std::error::Error for FencedError {}

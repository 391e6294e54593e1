//! /dev/fuse readers that step aside when their answers wake programs on other CPUs.
//!
//! Every /dev/fuse reader waits on one queue, and the kernel hands each request to the reader
//! that has waited longest, wherever it runs. A program that makes one request after another
//! (`tar x`: about 12 per file) and readers asleep on another, idle CPU then pay two wake-ups of
//! an idle CPU per request: the request wakes the reader there, the answer wakes the program
//! back. Where waking another CPU is expensive (a VM whose host exits to the hypervisor for each
//! inter-processor interrupt: 10-15 µs of the waker's CPU, on the machine this was measured on)
//! that costs more than the request's own work. Readers that run on the program's CPU answer
//! it with a local wake-up instead.
//!
//! So a reader times the CPU its answer's write took (the wake-up of the caller is part of it).
//! After a few answers in a row that each took longer than a wake-up on the same CPU ever does,
//! the reader was most likely answering a program on another CPU: it stops reading for a while
//! (`STEP_ASIDE`), leaving the queue to the readers that do not pay that, as long as another
//! reader is waiting in read(2) to take the next request. Programs running in parallel keep
//! every CPU busy, their readers are woken where they run and rarely answer across CPUs several
//! times in a row, so they keep all readers. Where wake-ups are cheap no answer crosses the
//! threshold and nothing changes. Measured (2-CPU VM, `io_uring=off`, 26,925-file untar, lz4):
//! 13.0-15.4 s -> 7.0-8.0 s (`bench/results/stepaside-2026-11-28`, docs/PERFORMANCE.md); two
//! untars in parallel unchanged (9.3-10.3 s -> 8.7-9.9 s).

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Longer than the CPU any answer's write takes when it wakes nothing or wakes its caller on
/// the same CPU (under 6 µs in 99.9% of 100,000 answers measured), shorter than one that sends
/// another CPU an interrupt on a VM that exits for it (10-15 µs).
const CROSS_CPU_ANSWER: Duration = Duration::from_micros(6);

/// Answers larger than this are data (READs): their write is a copy, whose time says nothing
/// about where the caller runs.
const SMALL_ANSWER_BYTES: usize = 4096 + 16;

/// Answers across CPUs in a row before a reader steps aside. One or two would also happen to
/// the readers of programs running in parallel, which then lost readers they needed (two
/// parallel untars: 9.4 s -> 12.4-19 s); three in a row are rare there.
const STREAK: u32 = 3;

/// How long a reader that steps aside stops reading. Shorter brings the readers of the other
/// CPUs back into the queue more often, each costing a few answers across CPUs before it
/// steps aside again (measured: 5 ms 9.8 s, 20 ms 7.2-8.3 s for the untar); a reader that
/// comes back also brings the queue its CPU when the program moves there.
const STEP_ASIDE: Duration = Duration::from_millis(20);

thread_local! {
    /// The CPU time and size of the last answer this thread wrote to /dev/fuse; None where the
    /// thread does not measure them (see `ChannelSender::send`).
    static LAST_ANSWER: Cell<Option<(Duration, usize)>> = const { Cell::new(None) };
}

/// The calling thread's CPU time.
pub(crate) fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, which lives across the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Whether the calling thread measures its answers (a reader where `StepAside` is on).
pub(crate) fn measuring() -> bool {
    LAST_ANSWER.with(|last| last.get().is_some())
}

/// Records an answer's write, on a thread that measures them.
pub(crate) fn answered(cpu: Duration, bytes: usize) {
    LAST_ANSWER.with(|last| last.set(Some((cpu, bytes))));
}

/// What the readers of one session share: how many wait in read(2) now.
#[derive(Debug, Default)]
pub(crate) struct StepAside {
    waiting: AtomicUsize,
}

/// One reader's side: its answers across CPUs in a row.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    shared: &'a StepAside,
    streak: u32,
}

impl StepAside {
    /// Starts measuring the calling reader thread's answers.
    pub(crate) fn reader(&self) -> Reader<'_> {
        LAST_ANSWER.with(|last| last.set(Some((Duration::ZERO, 0))));
        Reader { shared: self, streak: 0 }
    }
}

impl Reader<'_> {
    /// Runs `read`, a wait in read(2) for the next request, counted as waiting.
    pub(crate) fn wait<T>(&self, read: impl FnOnce() -> T) -> T {
        self.shared.waiting.fetch_add(1, Ordering::Relaxed);
        let result = read();
        self.shared.waiting.fetch_sub(1, Ordering::Relaxed);
        result
    }

    /// Handles a request (`dispatch`), then steps aside where its answer was the last of
    /// `STREAK` across CPUs and another reader waits for the next request.
    pub(crate) fn handle(&mut self, dispatch: impl FnOnce()) {
        // Forgotten first: a request may answer nothing (FORGET) or answer from another thread.
        LAST_ANSWER.with(|last| last.set(Some((Duration::ZERO, 0))));
        dispatch();
        let (cpu, bytes) = LAST_ANSWER.with(|last| last.get()).unwrap_or_default();
        if bytes == 0 || bytes > SMALL_ANSWER_BYTES {
            return;
        }
        if cpu <= CROSS_CPU_ANSWER {
            self.streak = 0;
            return;
        }
        self.streak += 1;
        if self.streak >= STREAK && self.shared.waiting.load(Ordering::Relaxed) > 0 {
            self.streak = 0;
            std::thread::sleep(STEP_ASIDE);
        }
    }
}

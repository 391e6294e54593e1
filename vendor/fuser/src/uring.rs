//! FUSE over io_uring (Linux 6.14 and later, with `/sys/module/fuse/parameters/enable_uring`
//! set): the kernel hands each request to a queue of the CPU its caller runs on, and the daemon
//! thread that serves that queue, pinned to the same CPU, answers it there. Through /dev/fuse a
//! request wakes a daemon thread on whichever core is idle and the answer wakes the caller back:
//! two cross-core wake-ups per request, which on a VM without halt polling cost more than the
//! request's own work.
//!
//! The protocol (the kernel's fs/fuse/dev_uring.c and include/uapi/linux/fuse.h): every ring
//! entry is a pair of buffers registered with `FUSE_IO_URING_CMD_REGISTER` through an
//! `IORING_OP_URING_CMD` on the /dev/fuse descriptor (128-byte SQEs). A request completes that
//! command with the `fuse_in_header` and the operation's own header in the header buffer and the
//! rest of its arguments in the payload buffer. The answer goes back in the same buffers with
//! `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also waits for the entry's next request. FORGET
//! and INTERRUPT still arrive through /dev/fuse, as does everything before every CPU's queue has
//! an entry, so the /dev/fuse threads keep running beside these.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types::Fd;
use log::debug;
use log::error;
use log::warn;
use parking_lot::Condvar;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::Channel;
use crate::ll;
use crate::ll::fuse_abi as abi;
use crate::ll::reply::Response;
use crate::request::RequestWithSender;
use crate::session::FilesystemHolder;
use crate::session::PollWindow;
use crate::session::SessionACL;
use crate::session::SessionEventLoop;

const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_ent_in_out`.
#[repr(C)]
#[derive(Default)]
struct EntInOut {
    flags: u64,
    /// The request's `unique`, to name it in the commit.
    commit_id: u64,
    /// Bytes of arguments in the payload buffer (in both directions).
    payload_sz: u32,
    padding: u32,
    reserved: u64,
}

/// `struct fuse_uring_req_header`: the header buffer of a ring entry.
#[repr(C, align(8))]
struct ReqHeader {
    /// `fuse_in_header` of the request; the answer's `fuse_out_header`.
    in_out: [u8; 128],
    /// The operation's own header (`fuse_write_in`, `fuse_getattr_in`...), when it has one.
    op_in: [u8; 128],
    ring: EntInOut,
}

/// A FUSE ring command for entry `iov` of queue `qid`: `struct fuse_uring_cmd_req` in the
/// SQE's command area, the entry's two iovecs in `addr` and `len`.
fn fuse_command(
    fd: i32,
    op: u32,
    qid: u16,
    commit_id: u64,
    iov: &[libc::iovec; 2],
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    // flags (u64) stay 0
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    with_iovecs(
        opcode::UringCmd80::new(Fd(fd), op)
            .cmd(cmd)
            .addr(Some(iov.as_ptr() as u64))
            .build(),
    )
}

/// Room in front of the payload for the in-header and the operation header, so that a request
/// is parsed where it lies, as one contiguous message the way /dev/fuse delivers it.
const PREFIX: usize = 256;
const IN_HEADER: usize = size_of::<abi::fuse_in_header>();
const OUT_HEADER: usize = size_of::<abi::fuse_out_header>();

fn payload_of(message: &mut [u64]) -> *mut u8 {
    message.as_mut_ptr().cast::<u8>().wrapping_add(PREFIX)
}

/// One ring entry's buffers. They stay where they are from REGISTER until the ring ends: the
/// kernel writes requests into them from this thread's context.
struct EntryBuffers {
    header: Box<ReqHeader>,
    /// `PREFIX` bytes, then the payload the kernel sees (u64s, so a request starts aligned).
    message: Vec<u64>,
    payload_size: usize,
    iov: Box<[libc::iovec; 2]>,
}

impl EntryBuffers {
    fn new(payload_size: usize) -> Self {
        let mut header = Box::new(ReqHeader {
            in_out: [0; 128],
            op_in: [0; 128],
            ring: EntInOut::default(),
        });
        let mut message = vec![0u64; (PREFIX + payload_size).div_ceil(8)];
        let payload = payload_of(&mut message);
        let iov = Box::new([
            libc::iovec {
                iov_base: std::ptr::from_mut(&mut *header).cast(),
                iov_len: size_of::<ReqHeader>(),
            },
            libc::iovec {
                iov_base: payload.cast(),
                iov_len: payload_size,
            },
        ]);
        EntryBuffers {
            header,
            message,
            payload_size,
            iov,
        }
    }

    /// Where the payload the kernel sees starts.
    fn payload(&mut self) -> *mut u8 {
        payload_of(&mut self.message)
    }

    fn message_bytes(&mut self) -> &mut [u8] {
        let len = self.message.len() * 8;
        // SAFETY: a u64 vector viewed as its bytes.
        unsafe { std::slice::from_raw_parts_mut(self.message.as_mut_ptr().cast::<u8>(), len) }
    }

    /// Where the request lies as one message (header, operation header, payload), or None if
    /// the kernel's sizes do not add up.
    fn assemble_request(&mut self) -> Option<std::ops::Range<usize>> {
        let in_header = &self.header.in_out[..IN_HEADER];
        let total = u32::from_ne_bytes(in_header[0..4].try_into().unwrap()) as usize;
        let payload = self.header.ring.payload_sz as usize;
        let op_size = total.checked_sub(IN_HEADER + payload)?;
        if op_size > self.header.op_in.len() || payload > self.payload_size {
            return None;
        }
        let start = PREFIX - IN_HEADER - op_size;
        let (in_out, op_in) = (self.header.in_out, self.header.op_in);
        let bytes = self.message_bytes();
        bytes[start..start + IN_HEADER].copy_from_slice(&in_out[..IN_HEADER]);
        bytes[start + IN_HEADER..PREFIX].copy_from_slice(&op_in[..op_size]);
        Some(start..PREFIX + payload)
    }
}

/// Where a reply goes: the entry's buffers while its request is being answered. Replies are
/// normally sent before the dispatch returns; one sent later from another thread is waited for.
#[derive(Clone, Debug)]
pub(crate) struct UringSender(Arc<ReplySlot>);

#[derive(Debug)]
struct ReplySlot {
    state: Mutex<SlotState>,
    replied: Condvar,
}

#[derive(Debug)]
struct SlotState {
    header: *mut ReqHeader,
    payload: *mut u8,
    payload_size: usize,
    answered: bool,
    /// The request has arguments in the payload buffer, which the dispatch may still read: the
    /// answer waits here until it returns (answers to such requests are small).
    deferred: Option<Vec<u8>>,
}

// SAFETY: the pointers are only followed under the slot's lock, while the entry is in this
// process's hands (between the request's arrival and its commit, which waits for the answer).
unsafe impl Send for SlotState {}

impl UringSender {
    fn new(entry: &mut EntryBuffers) -> Self {
        UringSender(Arc::new(ReplySlot {
            state: Mutex::new(SlotState {
                header: std::ptr::from_mut(&mut *entry.header),
                payload: entry.payload(),
                payload_size: entry.payload_size,
                answered: false,
                deferred: None,
            }),
            replied: Condvar::new(),
        }))
    }

    /// Writes an answer (`fuse_out_header` first, as for /dev/fuse) into the entry's buffers.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let mut state = self.0.state.lock();
        if state.answered {
            return Err(io::Error::other("request already answered"));
        }
        let mut header_bytes = [0u8; OUT_HEADER];
        let mut header_at = 0;
        let mut payload_at = 0;
        for slice in data {
            let mut bytes: &[u8] = slice;
            if header_at < OUT_HEADER {
                let n = bytes.len().min(OUT_HEADER - header_at);
                header_bytes[header_at..header_at + n].copy_from_slice(&bytes[..n]);
                header_at += n;
                bytes = &bytes[n..];
            }
            if payload_at + bytes.len() > state.payload_size {
                return Err(io::Error::other("answer larger than the ring's payload buffer"));
            }
            match &mut state.deferred {
                Some(deferred) => deferred.extend_from_slice(bytes),
                // SAFETY: the payload buffer holds payload_size bytes, is ours until the commit,
                // and holds no part of the request.
                None => unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        state.payload.add(payload_at),
                        bytes.len(),
                    );
                },
            }
            payload_at += bytes.len();
        }
        if header_at < OUT_HEADER {
            return Err(io::Error::other("answer without a header"));
        }
        // SAFETY: as above, for the header buffer.
        let header = unsafe { &mut *state.header };
        header.in_out[..OUT_HEADER].copy_from_slice(&header_bytes);
        header.ring.payload_sz = payload_at as u32;
        state.answered = true;
        self.0.replied.notify_all();
        Ok(())
    }

    /// Ready for a request; `request_has_payload`: see `SlotState::deferred`.
    fn reset(&self, request_has_payload: bool) {
        let mut state = self.0.state.lock();
        state.answered = false;
        state.deferred = request_has_payload.then(Vec::new);
    }

    /// Waits for the answer and puts a deferred one in place, once the dispatch has returned.
    fn wait_for_answer(&self) {
        let mut state = self.0.state.lock();
        while !state.answered {
            self.0.replied.wait(&mut state);
        }
        if let Some(deferred) = state.deferred.take() {
            // SAFETY: `send` checked the size; the request is no longer read.
            unsafe {
                std::ptr::copy_nonoverlapping(deferred.as_ptr(), state.payload, deferred.len());
            }
        }
    }
}

/// Whether this process may set up the rings (io_uring may be disabled by sysctl, limited to a
/// group, or filtered by seccomp). Asked before INIT agrees on io_uring: once it has, the kernel
/// holds every request until each CPU's queue has an entry, so a daemon that then cannot set up
/// its rings would hang its mount.
pub(crate) fn rings_available() -> io::Result<()> {
    new_ring().map(drop)
}

/// A ring for one thread's entry: 128-byte SQEs (FUSE's command needs them), submitted and
/// reaped by that thread alone.
fn new_ring() -> io::Result<IoUring<squeue::Entry128, cqueue::Entry>> {
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(4)
}

/// What the /dev/fuse session hands each ring thread.
pub(crate) struct UringQueues<FS: Filesystem> {
    pub(crate) ch: Channel,
    pub(crate) filesystem: Arc<FilesystemHolder<FS>>,
    pub(crate) allowed: SessionACL,
    pub(crate) session_owner: nix::unistd::Uid,
    pub(crate) payload_size: usize,
    pub(crate) threads_per_queue: usize,
}

/// The kernel makes one queue per possible CPU and uses the ring once every queue has an entry.
fn possible_cpus() -> usize {
    // "0-3" or "0,2-5": the highest number plus one.
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            s.trim()
                .rsplit([',', '-'])
                .next()
                .and_then(|n| n.parse::<usize>().ok())
        })
        .map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            |n| n + 1,
        )
}

/// A READ at least this large is served with the thread free to run on any CPU (see
/// `Affinity`): decoding it takes far longer than the wake-ups that pinning saves.
const WIDE_READ_BYTES: u32 = 256 * 1024;

/// Where a ring thread may run. Pinned to its queue's CPU, a small request is answered where its
/// caller runs. A large READ (a sequential reader's read-ahead) is different: the kernel queues
/// all of a reader's READs on the reader's CPU, so pinned ring threads would copy and reply to
/// every one of them on that CPU beside the reader itself, while the other CPUs wait for work
/// (measured: a quarter of two CPUs idle on a cold 1 GiB read). Such a READ is served with the
/// thread's affinity widened, and the thread stays free until it takes a request that is not
/// one: pinned again after each commit, it would wait for the stream's next READ on the
/// reader's CPU and serve it there (measured: most of the gain lost).
struct Affinity {
    cpu: usize,
    /// The CPUs the process may use (as started, e.g. under `taskset`).
    allowed: Option<libc::cpu_set_t>,
    wide: bool,
}

impl Affinity {
    /// Pins the calling thread to `cpu`.
    fn pin(cpu: usize) -> Affinity {
        // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity fills it.
        let allowed = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            (libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) == 0).then_some(set)
        };
        let mut affinity = Affinity {
            cpu,
            allowed,
            wide: true,
        };
        affinity.narrow();
        affinity
    }

    /// Lets the thread run on any CPU the process may use.
    fn widen(&mut self) {
        if let Some(set) = &self.allowed {
            if !self.wide && set_affinity(set).is_ok() {
                self.wide = true;
            }
        }
    }

    /// Back on the queue's CPU.
    fn narrow(&mut self) {
        if !self.wide {
            return;
        }
        self.wide = false;
        // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET ignores a CPU past its end.
        let set = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(self.cpu, &mut set);
            set
        };
        if let Err(e) = set_affinity(&set) {
            // An offline CPU: the queue is still served, from wherever the thread runs.
            debug!("cannot pin the ring thread to CPU {}: {e}", self.cpu);
        }
    }
}

fn set_affinity(set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: sched_setaffinity reads a whole cpu_set_t.
    if unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl<FS: Filesystem> UringQueues<FS> {
    /// Starts the ring threads: `threads_per_queue` for each CPU's queue, each pinned to its CPU.
    /// Each thread drops a `Started` (sent on `started`) once its entry is registered.
    pub(crate) fn spawn(
        self,
        started: &std::sync::mpsc::Sender<()>,
    ) -> io::Result<Vec<std::thread::JoinHandle<io::Result<()>>>> {
        let queues = Arc::new(self);
        let mut threads = Vec::new();
        for qid in 0..possible_cpus() {
            for t in 0..queues.threads_per_queue {
                let queues = queues.clone();
                let started = crate::session::Started(Some(started.clone()));
                let name = format!("fuser-ring-{qid}.{t}");
                threads.push(
                    std::thread::Builder::new()
                        .name(name.clone())
                        .spawn(move || {
                            let affinity = Affinity::pin(qid);
                            let result = queues.serve(qid as u16, name, affinity, started);
                            if let Err(e) = &result {
                                error!("io_uring queue {qid}: {e}");
                            }
                            result
                        })?,
                );
            }
        }
        Ok(threads)
    }

    /// Serves one ring entry of queue `qid` until the connection ends.
    fn serve(
        &self,
        qid: u16,
        thread_name: String,
        mut affinity: Affinity,
        started: crate::session::Started,
    ) -> io::Result<()> {
        let mut entry = EntryBuffers::new(self.payload_size);
        let sender = UringSender::new(&mut entry);
        // Declared after the buffers, so dropped (closed, cancelling the entry) before them.
        let mut ring = new_ring()?;
        let event_loop = SessionEventLoop {
            thread_name,
            ch: self.ch.clone(),
            filesystem: self.filesystem.clone(),
            allowed: self.allowed,
            session_owner: self.session_owner,
            // Its own loop; the fields are the /dev/fuse readers'.
            linger_after_forget: false,
            step_aside: None,
        };
        let fd = self.ch.as_fd().as_raw_fd();
        let register = fuse_command(fd, FUSE_IO_URING_CMD_REGISTER, qid, 0, &entry.iov);
        // SAFETY: the entry's buffers and iovecs outlive the ring (dropped after it, below).
        unsafe { ring.submission().push(&register) }
            .map_err(|_| io::Error::other("ring full"))?;
        // Submitted: the kernel has the entry (a URING_CMD is issued inside the submit).
        loop {
            match ring.submit() {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
        drop(started);
        let mut failures = 0;
        // After each answer the thread looks for its next request (yielding its CPU to any other
        // work) before it sleeps. A program that makes one request after another (`tar x`:
        // about 12 per file) otherwise finds both CPUs' ring threads asleep and their CPUs idle
        // after each answer, and the kernel wakes the program on the idle CPU instead of its own
        // (it remembers the CPU it used before): once a disk read has moved the program, each
        // request and answer hands over between CPUs, and waking an idle CPU costs more than the
        // request (on a VM whose host turned guest halt polling off). Measured: an untar whose
        // tar file was not cached took 8-17 s instead of 4.2-4.6 s, `tar` migrating 83,000 times
        // instead of 2,500; looking, 4.8-5.6 s and 6,900 (`bench/results/requestpoll-2026-11-27`).
        let mut poll = PollWindow::default();
        // A request found while looking is already in the completion queue.
        let mut found = false;
        loop {
            if !std::mem::take(&mut found) {
                let start = std::time::Instant::now();
                match ring.submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    Err(e) => return Err(e),
                }
                poll.waited(start.elapsed());
            }
            let Some(completion) = ring.completion().next() else {
                continue;
            };
            let result = completion.result();
            if result < 0 {
                match -result {
                    // The connection ended (unmount) or the ring is being torn down.
                    libc::ENOTCONN | libc::ECANCELED | libc::ENODEV | libc::ECONNABORTED => return Ok(()),
                    errno => {
                        // A commit the kernel refused (its request gone) leaves the entry
                        // unusable: register the buffers again rather than leave the CPU's queue
                        // a thread short, unless the kernel keeps refusing.
                        failures += 1;
                        let error = io::Error::from_raw_os_error(errno);
                        if failures > 100 {
                            return Err(error);
                        }
                        warn!("io_uring queue {qid}: {error}; registering the entry again");
                        // SAFETY: as for the first registration.
                        unsafe { ring.submission().push(&register) }
                            .map_err(|_| io::Error::other("ring full"))?;
                        continue;
                    }
                }
            }
            failures = 0;
            let commit_id = entry.header.ring.commit_id;
            sender.reset(entry.header.ring.payload_sz > 0);
            match entry.assemble_request() {
                Some(range) => {
                    let message = &entry.message_bytes()[range];
                    // SAFETY: the message is read by the dispatch, which ends before the entry is
                    // touched again; answers go through `sender` into the other parts.
                    let message: &[u8] =
                        unsafe { std::slice::from_raw_parts(message.as_ptr(), message.len()) };
                    match RequestWithSender::new_uring(event_loop.ch.sender(), sender.clone(), message)
                    {
                        Some(req) => {
                            let operation = req.request.operation();
                            match &operation {
                                Ok(ll::Operation::Read(read)) if read.size() >= WIDE_READ_BYTES => {
                                    affinity.widen()
                                }
                                _ => affinity.narrow(),
                            }
                            if let Ok(ll::Operation::Destroy(_)) = operation {
                                req.reply::<crate::ReplyEmpty>().ok();
                            } else if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                req.dispatch(&event_loop)
                            }))
                            .is_err()
                            {
                                // The reply's drop answered EIO, as through /dev/fuse; the entry
                                // must still be committed, or its caller would wait forever.
                                error!("io_uring queue {qid}: a request's handler panicked");
                            }
                        }
                        None => answer_eio(&sender, commit_id),
                    }
                }
                None => {
                    warn!("io_uring queue {qid}: a request whose sizes do not add up");
                    answer_eio(&sender, commit_id);
                }
            }
            sender.wait_for_answer();
            let commit = fuse_command(fd, FUSE_IO_URING_CMD_COMMIT_AND_FETCH, qid, commit_id, &entry.iov);
            // SAFETY: as for the registration.
            unsafe { ring.submission().push(&commit) }
                .map_err(|_| io::Error::other("ring full"))?;
            if let Some(until) = poll.look() {
                // The answer, which wakes its caller (interrupted: the wait below sends it).
                match ring.submit() {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    Err(e) => return Err(e),
                }
                found = loop {
                    // A new request reaches the ring as deferred task work, which only an enter
                    // asking for events runs.
                    let submitter = ring.submitter();
                    // SAFETY: no argument is passed (null, size 0).
                    match unsafe { submitter.enter::<libc::sigset_t>(0, 0, IORING_ENTER_GETEVENTS, None) } {
                        Ok(_) => {}
                        Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                        Err(e) => return Err(e),
                    }
                    if !ring.completion().is_empty() {
                        break true;
                    }
                    if std::time::Instant::now() >= until {
                        break false;
                    }
                    std::thread::yield_now(); // any other work on this CPU goes first
                };
            }
        }
    }
}

/// `io_uring_enter`'s flag to wait for (and run the work that posts) completions.
const IORING_ENTER_GETEVENTS: u32 = 1;

fn answer_eio(sender: &UringSender, unique: u64) {
    let _ = ll::ResponseErrno(ll::Errno::EIO).with_iovec(ll::RequestId(unique), |iov| sender.send(iov));
}

/// io-uring's UringCmd80 sets `addr` but not `len`; FUSE reads `len` as the number of iovecs.
fn with_iovecs(entry: squeue::Entry128) -> squeue::Entry128 {
    const LEN_OFFSET: usize = 24; // struct io_uring_sqe: opcode..off (16), addr (8), len (4)
    // SAFETY: Entry128 is a repr(C) struct io_uring_sqe plus 64 command bytes.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(entry) };
    raw[LEN_OFFSET..LEN_OFFSET + 4].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: back to the same type, with only `len` changed.
    unsafe { std::mem::transmute(raw) }
}

//! The few CUDA driver calls the GPU backend needs, through cudarc's dynamically loaded raw
//! bindings, each owned by a small RAII type. The primary context is used, because nvCOMP (built
//! on the CUDA runtime) works in it too.

use cudarc::driver::sys::{self, CUcontext, CUdevice, CUdeviceptr, CUresult, CUstream};
use std::ffi::{c_void, CStr};
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct CudaError(pub String);

impl std::fmt::Display for CudaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub type CudaResult<T> = Result<T, CudaError>;

pub fn check(result: CUresult, what: &str) -> CudaResult<()> {
    if result == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName only writes a pointer into `name` (left null for an unknown code).
    unsafe { sys::cuGetErrorName(result, &mut name) };
    let name = if name.is_null() {
        format!("{result:?}")
    } else {
        // SAFETY: a name the driver returns is a static NUL-terminated string.
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    };
    Err(CudaError(format!("{what}: {name}")))
}

/// Whether the NVIDIA driver library can be loaded at all (cudarc panics on first use otherwise).
pub fn driver_present() -> bool {
    // SAFETY: only tries to load the driver library; nothing is called through it.
    unsafe { sys::is_culib_present() }
}

/// One GPU's primary context, retained while this lives.
pub struct Gpu {
    pub device: CUdevice,
    pub ctx: CUcontext,
    pub name: String,
    pub driver_version: i32,
}

// SAFETY: a primary context is a process-wide driver object, usable from any thread (each
// binds it with cuCtxSetCurrent); `Gpu` only holds its handle and the device number.
unsafe impl Send for Gpu {}
// SAFETY: as above; no method mutates the handle.
unsafe impl Sync for Gpu {}

impl Gpu {
    pub fn open(ordinal: i32) -> CudaResult<Arc<Gpu>> {
        // SAFETY: every out-parameter is a live local of the type the driver writes; the name
        // buffer's length is passed and the driver NUL-terminates the name within it.
        unsafe {
            check(sys::cuInit(0), "cuInit")?;
            let mut count = 0;
            check(sys::cuDeviceGetCount(&mut count), "cuDeviceGetCount")?;
            if ordinal >= count {
                return Err(CudaError(format!("no GPU {ordinal} ({count} found)")));
            }
            let mut device = 0;
            check(sys::cuDeviceGet(&mut device, ordinal), "cuDeviceGet")?;
            let mut raw = [0 as std::ffi::c_char; 128];
            check(sys::cuDeviceGetName(raw.as_mut_ptr(), raw.len() as i32, device), "cuDeviceGetName")?;
            let name = CStr::from_ptr(raw.as_ptr()).to_string_lossy().into_owned();
            let mut driver_version = 0;
            check(sys::cuDriverGetVersion(&mut driver_version), "cuDriverGetVersion")?;
            // A waiting lane sleeps instead of spinning (the default with few contexts): on an
            // H200 eight spinning lanes cost more CPU than gzip-6 on the CPU itself. The call
            // fails where another library made the context active first; then it spins.
            let _ = sys::cuDevicePrimaryCtxSetFlags_v2(device, sys::CUctx_flags::CU_CTX_SCHED_BLOCKING_SYNC as u32);
            let mut ctx = std::ptr::null_mut();
            check(sys::cuDevicePrimaryCtxRetain(&mut ctx, device), "cuDevicePrimaryCtxRetain")?;
            Ok(Arc::new(Gpu { device, ctx, name, driver_version }))
        }
    }

    /// Makes the context current on the calling thread (each worker thread calls it once).
    pub fn bind_thread(&self) -> CudaResult<()> {
        // SAFETY: the context is retained for as long as `self` lives.
        check(unsafe { sys::cuCtxSetCurrent(self.ctx) }, "cuCtxSetCurrent")
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: releases the one retain `open` made, once.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

/// Free and total memory of the GPU whose context the calling thread has bound.
pub fn memory_info() -> CudaResult<(usize, usize)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: cuMemGetInfo writes two sizes into live locals.
    check(unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) }, "cuMemGetInfo")?;
    Ok((free, total))
}

pub struct Stream {
    pub raw: CUstream,
}

// SAFETY: a CUDA stream may be used from any thread bound to its context; `Stream` is only
// moved, never shared.
unsafe impl Send for Stream {}

impl Stream {
    pub fn new() -> CudaResult<Stream> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: cuStreamCreate writes the new stream's handle into `raw`.
        check(unsafe { sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) }, "cuStreamCreate")?;
        Ok(Stream { raw })
    }

    pub fn synchronize(&self) -> CudaResult<()> {
        // SAFETY: the stream lives until `self` is dropped.
        check(unsafe { sys::cuStreamSynchronize(self.raw) }, "cuStreamSynchronize")
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the stream was created by `new` and is destroyed once, here.
        unsafe { sys::cuStreamDestroy_v2(self.raw) };
    }
}

/// Device memory.
pub struct DeviceBuffer {
    pub ptr: CUdeviceptr,
    pub len: usize,
}

// SAFETY: device memory is addressed by a plain number valid in every thread of the context;
// `DeviceBuffer` is only moved, never shared.
unsafe impl Send for DeviceBuffer {}

impl DeviceBuffer {
    pub fn new(len: usize) -> CudaResult<DeviceBuffer> {
        let mut ptr = 0;
        // SAFETY: cuMemAlloc writes the new allocation's address into `ptr`.
        check(unsafe { sys::cuMemAlloc_v2(&mut ptr, len.max(1)) }, "cuMemAlloc")?;
        Ok(DeviceBuffer { ptr, len })
    }

    pub fn at(&self, offset: usize) -> CUdeviceptr {
        debug_assert!(offset <= self.len);
        self.ptr + offset as u64
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: the allocation was made by `new` and is freed once, here.
        unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// Page-locked host memory (flags 0: cached, not write-combined, so the CPU reads results back
/// at full speed), the only kind copies overlap with compute from.
pub struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer exclusively owns its page-locked allocation (no other pointer to it
// escapes), like a Box<[u8]>; it is only moved, never shared.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    pub fn new(len: usize) -> CudaResult<PinnedBuffer> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: cuMemHostAlloc writes the new allocation's address into `ptr`.
        check(unsafe { sys::cuMemHostAlloc(&mut ptr, len.max(1), 0) }, "cuMemHostAlloc")?;
        Ok(PinnedBuffer { ptr: ptr as *mut u8, len })
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation of `len` bytes (at least 1 allocated) owned by self,
        // borrowed mutably here.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is a live allocation of `len` bytes (at least 1 allocated) owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Host → device, queued on `stream`.
    pub fn upload(&self, range: std::ops::Range<usize>, to: CUdeviceptr, stream: &Stream) -> CudaResult<()> {
        assert!(range.end <= self.len);
        // SAFETY: range.start <= range.end <= len (asserted), so the pointer stays within the
        // allocation.
        let src = unsafe { self.ptr.add(range.start) } as *const c_void;
        // SAFETY: the copy reads range.len() bytes within the allocation; the lane writes
        // them again only after synchronizing the stream (run_batch).
        check(unsafe { sys::cuMemcpyHtoDAsync_v2(to, src, range.len(), stream.raw) }, "cuMemcpyHtoDAsync")
    }

    /// Device → host, queued on `stream`.
    pub fn download(&mut self, from: CUdeviceptr, range: std::ops::Range<usize>, stream: &Stream) -> CudaResult<()> {
        assert!(range.end <= self.len);
        // SAFETY: range.start <= range.end <= len (asserted), so the pointer stays within the
        // allocation.
        let dst = unsafe { self.ptr.add(range.start) } as *mut c_void;
        // SAFETY: the copy writes range.len() bytes within the allocation; the lane reads them
        // only after synchronizing the stream (run_batch).
        check(unsafe { sys::cuMemcpyDtoHAsync_v2(dst, from, range.len(), stream.raw) }, "cuMemcpyDtoHAsync")
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: the allocation was made by `new` and is freed once, here.
        unsafe { sys::cuMemFreeHost(self.ptr as *mut c_void) };
    }
}

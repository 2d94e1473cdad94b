//! A small safe layer over the CUDA driver API, loaded at run time:
//! availability, devices and their primary contexts, streams, pooled events,
//! capture status, pointer kinds, pinned host memory and asynchronous copies.
//!
//! cudarc finds and loads `libcuda` (its `culib`) and provides the handle
//! and enum types, but its `sys` functions are not called: they return
//! `CUresult`, a Rust enum listing the codes of the CUDA version the
//! bindings were generated for (13.0), and a driver newer than that may
//! return a code the enum lacks — receiving one is undefined behaviour, not
//! an error. The entry points used here are resolved from cudarc's library
//! handle into [`drv`] and declared with a plain `i32` result (and plain
//! integers for enum out-parameters), so any code the driver returns is a
//! value we can print. Enum *arguments* are only ever built from known
//! constants. An entry point the driver lacks yields [`MISSING_ENTRY_POINT`]
//! instead of cudarc's panic.
//!
//! [`available`] checks for the library first; every other function here
//! fails cleanly (CUDA_ERROR_NOT_INITIALIZED) when it did not succeed.

// Stream, event and comm handles are opaque: passed to the driver or NCCL,
// never dereferenced here.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use crate::error::{Error, ErrorKind, Result};
use cudarc::driver::sys::{self, CUcontext, CUdevice, CUevent, CUstream};
use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex, OnceLock};

/// A CUDA stream handle as passed through the C API (NULL: legacy default).
pub type RawStream = CUstream;

/// A driver result code as the driver returns it (a C enum, int-sized).
/// Crate-private, like the constants, to stay out of the C header.
pub(crate) type CuResult = i32;

pub(crate) const CUDA_SUCCESS: CuResult = 0;
pub(crate) const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
pub(crate) const CUDA_ERROR_NOT_INITIALIZED: CuResult = 3;
pub(crate) const CUDA_ERROR_STUB_LIBRARY: CuResult = 34;
pub(crate) const CUDA_ERROR_NO_DEVICE: CuResult = 100;
pub(crate) const CUDA_ERROR_INVALID_DEVICE: CuResult = 101;
pub(crate) const CUDA_ERROR_NOT_READY: CuResult = 600;
pub(crate) const CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: CuResult = 803;
/// Ours, not CUDA's: the loaded driver does not export the entry point.
pub(crate) const MISSING_ENTRY_POINT: CuResult = -1;

/// The driver entry points, as `drv::cuX(...) -> CuResult` functions over a
/// table resolved once from cudarc's library handle. Each is `None` when the
/// driver lacks it; calling it then returns [`MISSING_ENTRY_POINT`], and
/// calling anything before [`available`] loaded the table returns
/// CUDA_ERROR_NOT_INITIALIZED.
macro_rules! driver_api {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* ); )*) => {
        #[allow(non_snake_case)]
        pub(crate) mod drv {
            use super::*;
            use cudarc::driver::sys::*;
            use std::ffi::{c_char, c_int, c_uint, c_ulonglong};

            pub(crate) struct Table {
                $( $name: Option<unsafe extern "C" fn($($ty),*) -> CuResult>, )*
            }

            pub(crate) static TABLE: OnceLock<Table> = OnceLock::new();

            /// # Safety
            /// `lib` must be the CUDA driver library.
            pub(crate) unsafe fn resolve(lib: &'static libloading::Library) -> Table {
                Table {
                    $( $name: lib
                        .get::<unsafe extern "C" fn($($ty),*) -> CuResult>(concat!(stringify!($name), "\0").as_bytes())
                        .ok()
                        .map(|f| *f), )*
                }
            }

            $(
                /// The driver entry point of this name, with a plain int result.
                ///
                /// # Safety
                /// As the CUDA driver API documents for it.
                pub(crate) unsafe fn $name($($arg: $ty),*) -> CuResult {
                    match TABLE.get() {
                        Some(t) => match t.$name {
                            Some(f) => f($($arg),*),
                            None => MISSING_ENTRY_POINT,
                        },
                        None => CUDA_ERROR_NOT_INITIALIZED,
                    }
                }
            )*
        }
    };
}

driver_api! {
    fn cuGetErrorName(error: CuResult, p_str: *mut *const c_char);
    fn cuInit(flags: c_uint);
    fn cuDeviceGetCount(count: *mut c_int);
    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int);
    fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice);
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice);
    fn cuCtxGetCurrent(ctx: *mut CUcontext);
    fn cuCtxSetCurrent(ctx: CUcontext);
    fn cuCtxPushCurrent_v2(ctx: CUcontext);
    fn cuCtxPopCurrent_v2(ctx: *mut CUcontext);
    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int);
    fn cuStreamCreateWithPriority(stream: *mut CUstream, flags: c_uint, priority: c_int);
    fn cuStreamDestroy_v2(stream: CUstream);
    fn cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint);
    fn cuStreamSynchronize(stream: CUstream);
    // CUstreamCaptureStatus written as a plain integer.
    fn cuStreamIsCapturing(stream: CUstream, status: *mut c_uint);
    // CUstreamCaptureMode passed as a plain integer.
    fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_uint);
    fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph);
    // CUstreamCaptureMode read and written as a plain integer.
    fn cuThreadExchangeStreamCaptureMode(mode: *mut c_uint);
    fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: c_ulonglong);
    fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream);
    fn cuGraphExecDestroy(exec: CUgraphExec);
    fn cuGraphDestroy(graph: CUgraph);
    // CUpointer_attribute passed as a plain integer.
    fn cuPointerGetAttribute(data: *mut c_void, attribute: c_uint, ptr: CUdeviceptr);
    fn cuMemAlloc_v2(ptr: *mut CUdeviceptr, bytes: usize);
    fn cuMemFree_v2(ptr: CUdeviceptr);
    fn cuMemsetD8_v2(ptr: CUdeviceptr, value: u8, n: usize);
    fn cuMemHostAlloc(ptr: *mut *mut c_void, bytes: usize, flags: c_uint);
    fn cuMemFreeHost(ptr: *mut c_void);
    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream);
    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize);
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize);
    fn cuLaunchHostFunc(stream: CUstream, f: CUhostFn, user_data: *mut c_void);
    fn cuEventCreate(event: *mut CUevent, flags: c_uint);
    fn cuEventDestroy_v2(event: CUevent);
    fn cuEventRecord(event: CUevent, stream: CUstream);
    fn cuEventQuery(event: CUevent);
    fn cuEventSynchronize(event: CUevent);
    fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent);
    // Drivers before CUDA 12.8 have only this one.
    fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent);
}

/// The name CUDA gives an error code ("CUDA_ERROR_INVALID_VALUE"), or its
/// number when the library does not know it.
fn error_name(r: CuResult) -> String {
    if r == MISSING_ENTRY_POINT {
        return "the loaded CUDA driver does not export this entry point (too old?)".into();
    }
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a static string or fails (any code may
    // be passed: it takes a plain int here).
    let rc = unsafe { drv::cuGetErrorName(r, &mut p) };
    if rc == CUDA_SUCCESS && !p.is_null() {
        // SAFETY: a static NUL-terminated string owned by the driver.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    } else {
        format!("CUDA error {r}")
    }
}

/// Turns a driver result into `TC_ERR_CUDA` naming the call and the error
/// (`TC_ERR_UNAVAILABLE` for a missing device or driver).
pub fn check(r: CuResult, what: &str) -> Result<()> {
    if r == CUDA_SUCCESS {
        return Ok(());
    }
    let kind = match r {
        CUDA_ERROR_NO_DEVICE | CUDA_ERROR_SYSTEM_DRIVER_MISMATCH | CUDA_ERROR_STUB_LIBRARY => {
            ErrorKind::Unavailable
        }
        CUDA_ERROR_INVALID_DEVICE => ErrorKind::InvalidArgument,
        _ => ErrorKind::Cuda,
    };
    Err(Error::new(
        kind,
        format!("{what} failed: {}", error_name(r)),
    ))
}

/// The driver library: `libcuda.so.1` first, the soname under which the
/// CUDA runtime and NCCL load it (so this process uses the same driver they
/// do, also when it is already loaded), then cudarc's list of names. cudarc
/// alone tries `libcuda.so` first, which can be another file: the toolkit's
/// link-time stub when `.../lib64/stubs` is on LD_LIBRARY_PATH, whose cuInit
/// fails with CUDA_ERROR_STUB_LIBRARY, so the GPU looked absent.
fn driver_library() -> Option<&'static libloading::Library> {
    static OWN: OnceLock<Option<libloading::Library>> = OnceLock::new();
    // SAFETY: loading the driver runs only its initializers.
    if let Some(lib) = OWN.get_or_init(|| unsafe { libloading::Library::new("libcuda.so.1") }.ok())
    {
        return Some(lib);
    }
    // SAFETY: probing with dlopen; nothing is called yet.
    if !unsafe { sys::is_culib_present() } {
        return None;
    }
    // SAFETY: the library is present (cudarc's loader found it).
    std::panic::catch_unwind(|| unsafe { sys::culib() }).ok()
}

/// Ok when the CUDA driver library loads and `cuInit` succeeds; otherwise
/// `TC_ERR_UNAVAILABLE` saying what was looked for. Checked once per process.
pub fn available() -> Result<()> {
    static STATE: OnceLock<Result<()>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            let lib = match driver_library() {
                Some(lib) => lib,
                None => {
                    return Err(Error::unavailable(
                        "the CUDA driver library was not found (looked for libcuda.so.1, libcuda.so and other \
                         versioned names on the loader's path): no NVIDIA driver on this machine",
                    ))
                }
            };
            // SAFETY: `lib` is the driver library, never unloaded.
            drv::TABLE.get_or_init(|| unsafe { drv::resolve(lib) });
            // SAFETY: cuInit is the driver's first call.
            match unsafe { drv::cuInit(0) } {
                MISSING_ENTRY_POINT => Err(Error::unavailable("the CUDA driver library lacks cuInit (not a usable libcuda)")),
                r => check(r, "cuInit")
                    .map_err(|e| Error::new(ErrorKind::Unavailable, format!("CUDA driver present but unusable: {}", e.message))),
            }
        })
        .clone()
}

/// Number of visible CUDA devices (after [`available`]).
pub fn device_count() -> Result<i32> {
    available()?;
    let mut n = 0;
    // SAFETY: the library is loaded; `n` is a valid out-pointer.
    check(unsafe { drv::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n)
}

/// A device with its retained primary context (the one the CUDA runtime and
/// PyTorch use). Released on drop.
pub struct Device {
    pub ordinal: i32,
    dev: CUdevice,
    ctx: CUcontext,
}

// SAFETY: driver handles are usable from any thread.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

impl Device {
    /// Retains device `ordinal`'s primary context.
    pub fn open(ordinal: i32) -> Result<Arc<Device>> {
        available()?;
        let mut dev: CUdevice = 0;
        // SAFETY: valid out-pointers; the library is loaded.
        check(
            unsafe { drv::cuDeviceGet(&mut dev, ordinal) },
            &format!("cuDeviceGet({ordinal})"),
        )?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        check(
            unsafe { drv::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        Ok(Arc::new(Device { ordinal, dev, ctx }))
    }

    /// Makes the device's context current on this thread until the guard is
    /// dropped; the thread's previous context is restored then. Costs one
    /// driver call when the context is already current.
    pub fn scoped(&self) -> Result<CtxGuard> {
        let mut cur: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(unsafe { drv::cuCtxGetCurrent(&mut cur) }, "cuCtxGetCurrent")?;
        if cur == self.ctx {
            return Ok(CtxGuard { pushed: false });
        }
        // SAFETY: the context is retained for as long as `self` lives.
        check(
            unsafe { drv::cuCtxPushCurrent_v2(self.ctx) },
            "cuCtxPushCurrent",
        )?;
        Ok(CtxGuard { pushed: true })
    }

    /// Makes the device's context current on this thread (for threads the
    /// library owns, or where the caller expects the runtime's behaviour).
    pub fn make_current(&self) -> Result<()> {
        // SAFETY: the context is retained.
        check(unsafe { drv::cuCtxSetCurrent(self.ctx) }, "cuCtxSetCurrent")
    }

    /// (least, greatest) stream priority; greatest is the numerically lowest.
    pub fn stream_priority_range(&self) -> Result<(i32, i32)> {
        let _g = self.scoped()?;
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: valid out-pointers, context current.
        check(
            unsafe { drv::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) },
            "cuCtxGetStreamPriorityRange",
        )?;
        Ok((least, greatest))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `open`.
        let _ = unsafe { drv::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// Restores the thread's previous context when dropped.
pub struct CtxGuard {
    pushed: bool,
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if self.pushed {
            let mut old: CUcontext = std::ptr::null_mut();
            // SAFETY: pops the context pushed by `Device::scoped`.
            let _ = unsafe { drv::cuCtxPopCurrent_v2(&mut old) };
        }
    }
}

/// A non-blocking stream owned by the library, destroyed on drop.
pub struct Stream {
    raw: CUstream,
    device: Arc<Device>,
}

unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a stream that does not synchronize with the legacy default
    /// stream, with `priority` (see [`Device::stream_priority_range`]).
    pub fn new(device: &Arc<Device>, priority: i32) -> Result<Stream> {
        let _g = device.scoped()?;
        let mut raw: CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: valid out-pointer, context current.
        check(
            unsafe { drv::cuStreamCreateWithPriority(&mut raw, flags, priority) },
            "cuStreamCreateWithPriority",
        )?;
        Ok(Stream {
            raw,
            device: device.clone(),
        })
    }

    pub fn raw(&self) -> CUstream {
        self.raw
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(_g) = self.device.scoped() {
            // SAFETY: created by `new`, destroyed once.
            let _ = unsafe { drv::cuStreamDestroy_v2(self.raw) };
        }
    }
}

/// Makes `stream` wait for the latest record of `event` (as of this call)
/// without blocking the host.
pub fn stream_wait_event(stream: CUstream, event: &Event) -> Result<()> {
    // SAFETY: the event is alive; the stream is the caller's responsibility.
    check(
        unsafe { drv::cuStreamWaitEvent(stream, event.raw, 0) },
        "cuStreamWaitEvent",
    )
}

/// Capture state of a stream (CUDA graphs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    None,
    Active,
    /// The capture was invalidated by an earlier error; anything enqueued
    /// now fails.
    Invalidated,
}

pub fn capture_status(stream: CUstream) -> Result<Capture> {
    let mut st: u32 = 0;
    // SAFETY: valid out-pointer (the status enum is int-sized).
    check(
        unsafe { drv::cuStreamIsCapturing(stream, &mut st) },
        "cuStreamIsCapturing",
    )?;
    Ok(match st {
        x if x == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE as u32 => Capture::None,
        x if x == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE as u32 => {
            Capture::Active
        }
        // INVALIDATED, or a status newer than the bindings: not usable.
        _ => Capture::Invalidated,
    })
}

/// Where an address lives, from `cuPointerGetAttribute(MEMORY_TYPE)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryType {
    /// Plain host memory unknown to CUDA, or pinned/registered host memory.
    Host,
    Device,
    /// Managed memory or an array; treated as device-accessible.
    Other,
}

pub fn memory_type(ptr: *const c_void) -> Result<MemoryType> {
    let mut t: u32 = 0;
    let attr = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    // SAFETY: the attribute is a 32-bit value; `ptr` is only inspected.
    let r = unsafe {
        drv::cuPointerGetAttribute(
            &mut t as *mut u32 as *mut c_void,
            attr as u32,
            ptr as sys::CUdeviceptr,
        )
    };
    if r == CUDA_ERROR_INVALID_VALUE {
        return Ok(MemoryType::Host); // memory CUDA never saw
    }
    check(r, "cuPointerGetAttribute(MEMORY_TYPE)")?;
    Ok(match t {
        x if x == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32 => MemoryType::Host,
        x if x == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 => MemoryType::Device,
        _ => MemoryType::Other,
    })
}

/// Whether device code can reach `ptr`: device or managed memory, or host
/// memory CUDA pinned or registered (mapped into the device's address space
/// under unified addressing). False for plain host memory CUDA never saw,
/// which a kernel (an NCCL collective) would fault on.
pub fn device_accessible(ptr: *const c_void) -> Result<bool> {
    let mut t: u32 = 0;
    let attr = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    // SAFETY: the attribute is a 32-bit value; `ptr` is only inspected.
    let r = unsafe {
        drv::cuPointerGetAttribute(
            &mut t as *mut u32 as *mut c_void,
            attr as u32,
            ptr as sys::CUdeviceptr,
        )
    };
    if r == CUDA_ERROR_INVALID_VALUE {
        return Ok(false);
    }
    check(r, "cuPointerGetAttribute(MEMORY_TYPE)").map(|()| true)
}

/// Device-to-device (or any unified-address) copy of `bytes` on `stream`.
pub fn memcpy_async(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    if bytes == 0 || std::ptr::eq(dst as *const c_void, src) {
        return Ok(());
    }
    // SAFETY: the caller guarantees both ranges are valid until the stream
    // reaches the copy.
    check(
        unsafe {
            drv::cuMemcpyAsync(
                dst as sys::CUdeviceptr,
                src as sys::CUdeviceptr,
                bytes,
                stream,
            )
        },
        "cuMemcpyAsync",
    )
}

/// Device memory owned by the library, freed on drop.
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    pub bytes: usize,
    device: Arc<Device>,
}

unsafe impl Send for DeviceBuffer {}
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// `bytes` of zeroed device memory.
    pub fn zeroed(device: &Arc<Device>, bytes: usize) -> Result<DeviceBuffer> {
        let _g = device.scoped()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer, context current.
        check(
            unsafe { drv::cuMemAlloc_v2(&mut ptr, bytes.max(1)) },
            "cuMemAlloc",
        )?;
        let buf = DeviceBuffer {
            ptr,
            bytes,
            device: device.clone(),
        };
        // SAFETY: `ptr` holds at least `bytes` bytes.
        check(
            unsafe { drv::cuMemsetD8_v2(ptr, 0, bytes.max(1)) },
            "cuMemsetD8",
        )?;
        // cuMemsetD8 may return before the device ran it, on the legacy
        // stream, which the non-blocking streams that use this buffer do not
        // wait for: wait here so that "zeroed" holds on every stream.
        stream_synchronize(std::ptr::null_mut())?;
        Ok(buf)
    }
    /// `bytes` of device memory, not initialized, for the device's own use
    /// (e.g. a staging copy). The allocation runs in the relaxed capture
    /// interaction mode: cuMemAlloc is a "potentially unsafe" call that, in
    /// the default global mode, fails and invalidates a global-mode capture
    /// another thread may be making (see [`Event::query`]).
    pub fn uninit(device: &Arc<Device>, bytes: usize) -> Result<DeviceBuffer> {
        let _g = device.scoped()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer, context current.
        check(
            with_relaxed_capture_mode(|| unsafe { drv::cuMemAlloc_v2(&mut ptr, bytes.max(1)) }),
            "cuMemAlloc",
        )?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            device: device.clone(),
        })
    }
    pub fn ptr(&self) -> *mut c_void {
        self.ptr as *mut c_void
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Ok(_g) = self.device.scoped() {
            // SAFETY: allocated by `zeroed` or `uninit`, freed once. In the
            // relaxed capture mode, as the allocation in `uninit`.
            let _ = with_relaxed_capture_mode(|| unsafe { drv::cuMemFree_v2(self.ptr) });
        }
    }
}

/// `bytes` of device memory handed out raw (the caller frees it with
/// [`device_free`]); the device's context must be current.
pub fn device_alloc(bytes: usize) -> Result<*mut c_void> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: valid out-pointer.
    check(unsafe { drv::cuMemAlloc_v2(&mut ptr, bytes) }, "cuMemAlloc")?;
    Ok(ptr as *mut c_void)
}

/// Frees memory from [`device_alloc`].
pub fn device_free(ptr: *mut c_void) -> Result<()> {
    // SAFETY: the caller passes a pointer from `device_alloc`, once.
    check(
        unsafe { drv::cuMemFree_v2(ptr as sys::CUdeviceptr) },
        "cuMemFree",
    )
}

/// Page-locked host memory, freed on drop.
pub struct PinnedBuffer {
    ptr: *mut c_void,
    pub bytes: usize,
    device: Arc<Device>,
}

unsafe impl Send for PinnedBuffer {}
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    pub fn new(device: &Arc<Device>, bytes: usize) -> Result<PinnedBuffer> {
        let _g = device.scoped()?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer, context current; flags 0 = portable off.
        check(
            unsafe { drv::cuMemHostAlloc(&mut ptr, bytes.max(1), 0) },
            "cuMemHostAlloc",
        )?;
        Ok(PinnedBuffer {
            ptr,
            bytes,
            device: device.clone(),
        })
    }
    pub fn ptr(&self) -> *mut c_void {
        self.ptr
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if let Ok(_g) = self.device.scoped() {
            // SAFETY: allocated by `new`, freed once.
            let _ = unsafe { drv::cuMemFreeHost(self.ptr) };
        }
    }
}

/// Host callback signature for [`launch_host_func`].
pub type HostFn = unsafe extern "C" fn(user_data: *mut c_void);

/// Runs `f(user_data)` on a driver thread once `stream` reaches this point.
/// `f` must not call CUDA.
pub fn launch_host_func(stream: CUstream, f: HostFn, user_data: *mut c_void) -> Result<()> {
    // SAFETY: the caller keeps `user_data` valid until `f` ran.
    check(
        unsafe { drv::cuLaunchHostFunc(stream, Some(f), user_data) },
        "cuLaunchHostFunc",
    )
}

/// Events created with timing disabled, reused across operations so that
/// issuing an operation creates none.
pub struct EventPool {
    device: Arc<Device>,
    free: Mutex<Vec<usize>>,
}

impl EventPool {
    pub fn new(device: &Arc<Device>) -> Arc<EventPool> {
        Arc::new(EventPool {
            device: device.clone(),
            free: Mutex::new(Vec::new()),
        })
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// An event from the pool (created when the pool is empty). The device's
    /// context must be current.
    pub fn get(self: &Arc<Self>) -> Result<Event> {
        let reused = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let raw = match reused {
            Some(raw) => raw as CUevent,
            None => {
                let mut raw: CUevent = std::ptr::null_mut();
                let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
                // SAFETY: valid out-pointer.
                check(
                    unsafe { drv::cuEventCreate(&mut raw, flags) },
                    "cuEventCreate",
                )?;
                raw
            }
        };
        Ok(Event {
            raw,
            pool: self.clone(),
        })
    }
}

impl Drop for EventPool {
    fn drop(&mut self) {
        let free = std::mem::take(&mut *self.free.lock().unwrap_or_else(|e| e.into_inner()));
        if let Ok(_g) = self.device.scoped() {
            for raw in free {
                // SAFETY: each pooled event is destroyed once, here.
                let _ = unsafe { drv::cuEventDestroy_v2(raw as CUevent) };
            }
        }
    }
}

/// A pooled event; goes back to its pool on drop.
pub struct Event {
    raw: CUevent,
    pool: Arc<EventPool>,
}

unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    pub fn record(&self, stream: CUstream) -> Result<()> {
        // SAFETY: the event is alive; the stream is the caller's.
        check(
            unsafe { drv::cuEventRecord(self.raw, stream) },
            "cuEventRecord",
        )
    }

    /// True once all work captured by the latest record completed (or the
    /// event was never recorded). NOT_READY is not an error.
    ///
    /// The query runs in the relaxed capture interaction mode: in the
    /// default (global) mode, an event query from any thread while another
    /// thread captures a graph in global mode (the default of
    /// cuStreamBeginCapture and of torch.cuda.graph), or from a thread with a
    /// capture of its own, is a prohibited "unsafe" call that fails and
    /// invalidates that capture, so a comm's watchdog polling its works
    /// would break the user's graph and fail the work. Querying an event
    /// recorded outside any capture does not touch the capture; one recorded
    /// during a capture is still refused (CUDA_ERROR_CAPTURED_EVENT).
    pub fn query(&self) -> Result<bool> {
        // SAFETY: the event is alive.
        let r = with_relaxed_capture_mode(|| unsafe { drv::cuEventQuery(self.raw) });
        if r == CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check(r, "cuEventQuery").map(|()| true)
    }

    /// Blocks the host until the event completed. Like [`Event::query`], in
    /// the relaxed capture interaction mode (a synchronization is a
    /// "potentially unsafe" call that would otherwise break another thread's
    /// global-mode capture).
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the event is alive.
        check(
            with_relaxed_capture_mode(|| unsafe { drv::cuEventSynchronize(self.raw) }),
            "cuEventSynchronize",
        )
    }

    pub fn raw(&self) -> CUevent {
        self.raw
    }

    /// The device whose context the event belongs to.
    pub fn pool_device(&self) -> &Arc<Device> {
        &self.pool.device
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        self.pool
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.raw as usize);
    }
}

/// Runs `f` with this thread's stream-capture interaction mode set to
/// relaxed, then restores the thread's mode (see [`Event::query`]).
fn with_relaxed_capture_mode<T>(f: impl FnOnce() -> T) -> T {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED as u32;
    // SAFETY: valid in/out pointer to a mode value.
    let swapped = unsafe { drv::cuThreadExchangeStreamCaptureMode(&mut mode) } == CUDA_SUCCESS;
    let out = f();
    if swapped {
        // SAFETY: puts back the mode the exchange above returned.
        let _ = unsafe { drv::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
    out
}

/// Blocks the host until everything enqueued on `stream` so far completed.
pub fn stream_synchronize(stream: CUstream) -> Result<()> {
    // SAFETY: the stream is the caller's responsibility.
    check(
        unsafe { drv::cuStreamSynchronize(stream) },
        "cuStreamSynchronize",
    )
}

/// Copy of `src` (host memory) into device memory at `dst`, complete on the
/// device when this returns (visible to work on any stream issued later).
pub fn copy_to_device(dst: *mut c_void, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    // SAFETY: the caller guarantees `dst` holds `src.len()` bytes.
    check(
        unsafe {
            drv::cuMemcpyHtoD_v2(
                dst as sys::CUdeviceptr,
                src.as_ptr() as *const c_void,
                src.len(),
            )
        },
        "cuMemcpyHtoD",
    )?;
    // From pageable memory cuMemcpyHtoD may return once the data is staged,
    // before the legacy stream wrote it to the device, and non-blocking
    // streams do not wait for the legacy stream: without this, a collective
    // issued next on such a stream could read (or be overwritten by) the
    // copy still in flight.
    stream_synchronize(std::ptr::null_mut())
}

/// Synchronous copy of device memory at `src` into `dst` (host memory).
pub fn copy_to_host(dst: &mut [u8], src: *const c_void) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    // SAFETY: the caller guarantees `src` holds `dst.len()` bytes.
    check(
        unsafe {
            drv::cuMemcpyDtoH_v2(
                dst.as_mut_ptr() as *mut c_void,
                src as sys::CUdeviceptr,
                dst.len(),
            )
        },
        "cuMemcpyDtoH",
    )
}

/// An event with timing enabled (for measurements; the pooled events of
/// the backends have timing disabled). Destroyed on drop.
pub struct TimingEvent {
    raw: CUevent,
    device: Arc<Device>,
}

unsafe impl Send for TimingEvent {}
unsafe impl Sync for TimingEvent {}

impl TimingEvent {
    pub fn new(device: &Arc<Device>) -> Result<TimingEvent> {
        let _g = device.scoped()?;
        let mut raw: CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT as u32;
        // SAFETY: valid out-pointer, context current.
        check(
            unsafe { drv::cuEventCreate(&mut raw, flags) },
            "cuEventCreate",
        )?;
        Ok(TimingEvent {
            raw,
            device: device.clone(),
        })
    }

    pub fn record(&self, stream: CUstream) -> Result<()> {
        // SAFETY: the event is alive; the stream is the caller's.
        check(
            unsafe { drv::cuEventRecord(self.raw, stream) },
            "cuEventRecord",
        )
    }

    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the event is alive.
        check(
            unsafe { drv::cuEventSynchronize(self.raw) },
            "cuEventSynchronize",
        )
    }

    /// Milliseconds from `self` to `end` on the device; both recorded and
    /// completed.
    pub fn elapsed_ms(&self, end: &TimingEvent) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: valid out-pointer; both events alive.
        let mut r = unsafe { drv::cuEventElapsedTime_v2(&mut ms, self.raw, end.raw) };
        if r == MISSING_ENTRY_POINT {
            // SAFETY: as above (the pre-12.8 entry point, same contract).
            r = unsafe { drv::cuEventElapsedTime(&mut ms, self.raw, end.raw) };
        }
        check(r, "cuEventElapsedTime")?;
        Ok(ms)
    }
}

impl Drop for TimingEvent {
    fn drop(&mut self) {
        if let Ok(_g) = self.device.scoped() {
            // SAFETY: created by `new`, destroyed once.
            let _ = unsafe { drv::cuEventDestroy_v2(self.raw) };
        }
    }
}

/// Starts capturing `stream` into a CUDA graph. Thread-local mode: other
/// threads (a comm's watchdog querying events) are not disturbed.
pub fn begin_capture(stream: CUstream) -> Result<()> {
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    // SAFETY: the stream is the caller's.
    check(
        unsafe { drv::cuStreamBeginCapture_v2(stream, mode as u32) },
        "cuStreamBeginCapture",
    )
}

/// An instantiated CUDA graph, destroyed (with its graph) on drop.
pub struct GraphExec {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    device: Arc<Device>,
}

unsafe impl Send for GraphExec {}
unsafe impl Sync for GraphExec {}

impl GraphExec {
    /// Ends the capture begun by [`begin_capture`] on `stream` and
    /// instantiates the graph.
    pub fn end_capture(device: &Arc<Device>, stream: CUstream) -> Result<GraphExec> {
        let _g = device.scoped()?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(
            unsafe { drv::cuStreamEndCapture(stream, &mut graph) },
            "cuStreamEndCapture",
        )?;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `graph` was just captured; valid out-pointer.
        let r = unsafe { drv::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if let Err(e) = check(r, "cuGraphInstantiateWithFlags") {
            // SAFETY: destroyed once, here.
            let _ = unsafe { drv::cuGraphDestroy(graph) };
            return Err(e);
        }
        Ok(GraphExec {
            graph,
            exec,
            device: device.clone(),
        })
    }

    /// Enqueues one replay of the graph on `stream`.
    pub fn launch(&self, stream: CUstream) -> Result<()> {
        // SAFETY: the graph is instantiated and alive.
        check(
            unsafe { drv::cuGraphLaunch(self.exec, stream) },
            "cuGraphLaunch",
        )
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        if let Ok(_g) = self.device.scoped() {
            // SAFETY: created by `end_capture`, destroyed once.
            unsafe {
                let _ = drv::cuGraphExecDestroy(self.exec);
                let _ = drv::cuGraphDestroy(self.graph);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_result_codes_are_plain_numbers() {
        // A code no CUDA version defines: with the `CUresult` enum this
        // value could not even be received; here it is reported.
        let e = check(987_654, "cuTest").expect_err("non-zero is an error");
        assert_eq!(e.kind, ErrorKind::Cuda);
        assert!(
            e.message.contains("cuTest failed") && e.message.contains("987654"),
            "{}",
            e.message
        );
        let e = check(MISSING_ENTRY_POINT, "cuTest").expect_err("missing entry point");
        assert!(e.message.contains("does not export"), "{}", e.message);
        if available().is_err() {
            // Without a driver the table is never loaded: calls fail cleanly.
            assert_eq!(
                unsafe { drv::cuEventQuery(std::ptr::null_mut()) },
                CUDA_ERROR_NOT_INITIALIZED
            );
        }
    }

    /// With a driver (a GPU, or the simulated one of `make sim-gpu-test`):
    /// data put on the device by `DeviceBuffer::zeroed` and `copy_to_device`
    /// is there for work issued next on a non-blocking stream. Both used to
    /// return with the legacy stream's memset/copy possibly still in flight.
    #[test]
    fn device_writes_are_visible_on_a_non_blocking_stream() {
        if available().is_err() || device_count().map_or(true, |n| n < 1) {
            return;
        }
        let dev = Device::open(0).unwrap();
        let _g = dev.scoped().unwrap();
        let stream = Stream::new(&dev, 0).unwrap();
        let bytes = 1 << 16;
        let buf = DeviceBuffer::zeroed(&dev, bytes).unwrap();
        let pinned = PinnedBuffer::new(&dev, bytes).unwrap();
        let read_back = || -> Vec<u8> {
            memcpy_async(pinned.ptr(), buf.ptr(), bytes, stream.raw()).unwrap();
            stream_synchronize(stream.raw()).unwrap();
            // SAFETY: pinned host memory of `bytes` bytes, the copy completed.
            unsafe { std::slice::from_raw_parts(pinned.ptr() as *const u8, bytes) }.to_vec()
        };
        assert!(
            read_back().iter().all(|&b| b == 0),
            "zeroed buffer not zero on another stream"
        );
        let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
        copy_to_device(buf.ptr(), &data).unwrap();
        assert!(
            read_back() == data,
            "copy_to_device data not on the device for another stream"
        );
    }

    /// With a driver: plain host memory is not device-accessible; device
    /// and pinned memory are.
    #[test]
    fn device_accessibility_of_pointers() {
        if available().is_err() || device_count().map_or(true, |n| n < 1) {
            return;
        }
        let dev = Device::open(0).unwrap();
        let _g = dev.scoped().unwrap();
        let plain = [0u8; 64];
        assert!(!device_accessible(plain.as_ptr().cast()).unwrap());
        let d = DeviceBuffer::zeroed(&dev, 64).unwrap();
        assert!(device_accessible(d.ptr()).unwrap());
        // SAFETY: an interior address of the allocation.
        assert!(device_accessible(unsafe { d.ptr().cast::<u8>().add(32) }.cast()).unwrap());
        let p = PinnedBuffer::new(&dev, 64).unwrap();
        assert!(device_accessible(p.ptr()).unwrap());
    }

    /// With a driver: querying an event recorded outside a capture, from a
    /// thread that is capturing another stream, neither fails nor
    /// invalidates that capture (the query runs in relaxed mode).
    #[test]
    fn event_query_does_not_disturb_a_capture() {
        if available().is_err() || device_count().map_or(true, |n| n < 1) {
            return;
        }
        let dev = Device::open(0).unwrap();
        let _g = dev.scoped().unwrap();
        let (a, b) = (Stream::new(&dev, 0).unwrap(), Stream::new(&dev, 0).unwrap());
        let pool = EventPool::new(&dev);
        let e = pool.get().unwrap();
        e.record(a.raw()).unwrap();
        stream_synchronize(a.raw()).unwrap();
        begin_capture(b.raw()).unwrap();
        let q = e.query();
        let end = GraphExec::end_capture(&dev, b.raw());
        assert!(
            q.as_ref().is_ok_and(|done| *done),
            "query during a capture: {:?}",
            q.err().map(|e| e.message)
        );
        assert!(
            end.is_ok(),
            "the capture was invalidated: {:?}",
            end.err().map(|e| e.message)
        );
    }

    #[test]
    fn missing_driver_is_unavailable_not_a_panic() {
        // On machines without a driver this is the path under test; with a
        // driver it must simply succeed.
        match available() {
            Ok(()) => assert!(device_count().is_ok()),
            Err(e) => {
                assert_eq!(e.kind, ErrorKind::Unavailable, "{}", e.message);
                assert!(e.message.contains("libcuda"), "{}", e.message);
                assert!(device_count().is_err());
            }
        }
    }
}

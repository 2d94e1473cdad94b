//! The driver library, loaded at run time: its entry points as a table of
//! plain-int functions (`drv`), result codes turned into errors, and the
//! availability check every other function relies on.

// Stream, event and comm handles are opaque: passed to the driver or NCCL,
// never dereferenced here.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use crate::error::{Error, ErrorKind, Result};
use cudarc::driver::sys::{self, CUcontext, CUdevice, CUevent, CUstream};
use std::ffi::{c_void, CStr};
use std::sync::OnceLock;

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
                // The driver's own signatures (cuLaunchKernel has 11).
                #[allow(clippy::too_many_arguments)]
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
    // The library's own PTX kernels (kernels.rs).
    fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void);
    fn cuModuleGetFunction(func: *mut CUfunction, module: CUmodule, name: *const c_char);
    fn cuModuleUnload(module: CUmodule);
    fn cuLaunchKernel(
        func: CUfunction,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_bytes: c_uint,
        stream: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void
    );
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
    driver_state().clone()
}

/// Whether [`available`] succeeds, without building its error (loading
/// the driver on the first ask; host operations ask
/// [`may_hold_device_memory`] instead, which loads nothing).
pub fn is_available() -> bool {
    driver_state().is_ok()
}

/// Whether any pointer of this process can be device memory: [`is_available`]
/// once the driver was set up, else only when the driver library is already
/// loaded in the process (by the CUDA runtime, NCCL, torch or this library).
/// Device memory needs the driver in the process that uses it, so without
/// it every buffer is host memory, and host operations skip the driver's
/// set-up: looking for the library under every name it may have costs about
/// a millisecond on a machine without a driver, which the first host call
/// of a process used to pay (its first 4-byte all_reduce through shared
/// memory took 0.8 to 2.4 ms on the 2-CPU build machine, warm ones 0.5 µs).
pub fn may_hold_device_memory() -> bool {
    match STATE.get() {
        Some(state) => state.is_ok(),
        None => driver_loaded() && is_available(),
    }
}

/// Whether the driver library (`libcuda.so.1`, or `libcuda.so` and its
/// versioned file) is loaded in this process, found among the loaded
/// objects by file name: no file system search (a `dlopen` with
/// RTLD_NOLOAD still searches the loader's path when the library is not
/// loaded). Looks only when an object was loaded since it last answered
/// no (the loader counts them), so a host call pays tens of nanoseconds.
fn driver_loaded() -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    /// The loader's count of loaded objects when the driver was last found
    /// absent (`u64::MAX`: never looked).
    static ABSENT_AT: AtomicU64 = AtomicU64::new(u64::MAX);
    struct Look {
        absent_at: u64,
        /// The loader's count (None: it does not say).
        adds: Option<u64>,
        found: bool,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        size: usize,
        out: *mut c_void,
    ) -> i32 {
        // SAFETY: `out` is the Look below; `info` the loader's record of
        // at least `size` bytes, its name a C string or NULL.
        let (look, info) = unsafe { (&mut *(out as *mut Look), &*info) };
        if look.adds.is_none() && size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) {
            look.adds = Some(info.dlpi_adds);
            if info.dlpi_adds == look.absent_at {
                return 1; // nothing loaded since the last look
            }
        }
        if !info.dlpi_name.is_null() {
            // SAFETY: see above.
            let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
            let file = name.rsplit(|b| *b == b'/').next().unwrap_or(name);
            if file.starts_with(b"libcuda.so") {
                look.found = true;
                return 1;
            }
        }
        0
    }
    let mut look = Look {
        absent_at: ABSENT_AT.load(Ordering::Relaxed),
        adds: None,
        found: false,
    };
    // SAFETY: the callback only reads the records and writes `look`.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut look as *mut Look as *mut c_void) };
    if !look.found {
        if let Some(adds) = look.adds {
            ABSENT_AT.store(adds, Ordering::Relaxed);
        }
    }
    look.found
}

static STATE: OnceLock<Result<()>> = OnceLock::new();

/// The outcome of loading and initialising the driver, once per process.
fn driver_state() -> &'static Result<()> {
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
}

/// Number of visible CUDA devices (after [`available`]).
pub fn device_count() -> Result<i32> {
    available()?;
    let mut n = 0;
    // SAFETY: the library is loaded; `n` is a valid out-pointer.
    check(unsafe { drv::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n)
}

/// Runs `f` with this thread's stream-capture interaction mode set to
/// relaxed, then restores the thread's mode (see
/// [`Event::query`](super::Event::query)), also when `f` unwinds. Costs one
/// pair of `cuThreadExchangeStreamCaptureMode` calls.
pub(crate) fn with_relaxed_capture_mode<T>(f: impl FnOnce() -> T) -> T {
    /// The mode to put back (None: the exchange failed, nothing to undo).
    struct Restore(Option<u32>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(mut mode) = self.0 {
                // SAFETY: puts back the mode the exchange below returned.
                let _ = unsafe { drv::cuThreadExchangeStreamCaptureMode(&mut mode) };
            }
        }
    }
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED as u32;
    // SAFETY: valid in/out pointer to a mode value.
    let swapped = unsafe { drv::cuThreadExchangeStreamCaptureMode(&mut mode) } == CUDA_SUCCESS;
    let _restore = Restore(swapped.then_some(mode));
    f()
}

#[cfg(test)]
mod loaded_tests {
    use super::*;

    /// The loader's answer agrees with the process's own map of files:
    /// the driver counts as loaded exactly when a `libcuda.so*` file is
    /// mapped, and asking twice (the second time from the cached count)
    /// answers the same.
    #[test]
    fn driver_loaded_agrees_with_the_mapped_files() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let mapped = maps.lines().any(|l| {
            l.rsplit('/')
                .next()
                .is_some_and(|f| f.starts_with("libcuda.so"))
        });
        assert_eq!(driver_loaded(), mapped);
        assert_eq!(driver_loaded(), mapped);
        if !mapped {
            assert!(!may_hold_device_memory() || STATE.get().is_some_and(|s| s.is_ok()));
        }
    }
}

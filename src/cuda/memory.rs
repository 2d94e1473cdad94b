//! Memory: where a pointer lives, device and pinned host buffers, raw
//! allocations, and copies between host and device.

// Stream, event and comm handles are opaque: passed to the driver or NCCL,
// never dereferenced here.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use super::device::{stream_synchronize, Device};
use super::driver::{check, drv, with_relaxed_capture_mode, CUDA_ERROR_INVALID_VALUE};
use crate::error::Result;
use cudarc::driver::sys::{self, CUstream};
use std::ffi::c_void;
use std::sync::Arc;

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

/// Whether the `bytes` at `ptr` lie in the calling thread's stack, between
/// this frame and the stack's top: the live frames of its callers, so host
/// memory whatever the process loads (the driver maps device memory
/// elsewhere). Exact and about 20 instructions, where the look for a
/// loaded driver ([`super::may_hold_device_memory`]) takes the loader's
/// lock: the scalar a caller reduces is often on its stack. False when
/// unsure (on an alternate signal stack, or stack bounds unknown).
#[inline]
pub fn on_callers_stack(ptr: *const c_void, bytes: usize) -> bool {
    use std::cell::Cell;
    thread_local! {
        /// This thread's stack, [lowest, top) (None: not read yet).
        static STACK: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
    }
    // An address in this frame: the stack grows down, so the callers'
    // frames lie above it, up to the top.
    let marker = 0u8;
    let here = std::hint::black_box(&marker) as *const u8 as usize;
    let p = ptr as usize;
    // Below this frame (the heap, most mappings): no need for the bounds.
    if p < here {
        return false;
    }
    let (low, top) = STACK.with(|s| {
        s.get().unwrap_or_else(|| {
            let bounds = stack_bounds();
            s.set(Some(bounds));
            bounds
        })
    });
    low <= here && p.checked_add(bytes).is_some_and(|end| end <= top)
}

/// The calling thread's stack as [lowest, top) addresses; (0, 0) when the
/// C library does not say. For the main thread glibc reads the top from
/// the process's map of its stack.
fn stack_bounds() -> (usize, usize) {
    // SAFETY: `attr` is initialized by pthread_getattr_np before it is read
    // and destroyed once.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return (0, 0);
        }
        let (mut addr, mut size) = (std::ptr::null_mut(), 0usize);
        let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        match rc {
            0 => (addr as usize, addr as usize + size),
            _ => (0, 0),
        }
    }
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
    /// another thread may be making (see
    /// [`Event::query`](super::Event::query)).
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

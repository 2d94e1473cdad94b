//! Devices and their primary contexts, streams, stream ordering and CUDA
//! graph capture.

// Stream, event and comm handles are opaque: passed to the driver or NCCL,
// never dereferenced here.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use super::driver::{available, check, drv};
use super::event::Event;
use crate::error::Result;
use cudarc::driver::sys::{self, CUcontext, CUdevice, CUstream};
use std::ffi::c_void;
use std::sync::Arc;

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
        unsafe { drv::cuStreamWaitEvent(stream, event.raw(), 0) },
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

/// Blocks the host until everything enqueued on `stream` so far completed.
pub fn stream_synchronize(stream: CUstream) -> Result<()> {
    // SAFETY: the stream is the caller's responsibility.
    check(
        unsafe { drv::cuStreamSynchronize(stream) },
        "cuStreamSynchronize",
    )
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

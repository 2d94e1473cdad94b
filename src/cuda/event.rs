//! Events: the pooled, timing-disabled events of the backends' works and
//! the timing events of measurements.

// Stream, event and comm handles are opaque: passed to the driver or NCCL,
// never dereferenced here.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use super::device::Device;
use super::driver::{
    check, drv, with_relaxed_capture_mode, CUDA_ERROR_NOT_READY, MISSING_ENTRY_POINT,
};
use crate::error::Result;
use crate::util::lock;
use cudarc::driver::sys::{self, CUevent, CUstream};
use std::sync::{Arc, Mutex};

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

    /// An event from the pool (created when the pool is empty). The device's
    /// context must be current.
    pub fn get(self: &Arc<Self>) -> Result<Event> {
        let reused = lock(&self.free).pop();
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
        let free = std::mem::take(&mut *lock(&self.free));
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
        lock(&self.pool.free).push(self.raw as usize);
    }
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

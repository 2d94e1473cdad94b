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
//! constants. An entry point the driver lacks yields
//! [`MISSING_ENTRY_POINT`](driver::MISSING_ENTRY_POINT)
//! instead of cudarc's panic.
//!
//! [`available`] checks for the library first; every other function here
//! fails cleanly (CUDA_ERROR_NOT_INITIALIZED) when it did not succeed.
//!
//! `driver.rs` loads the library and its entry points; `device.rs` has
//! devices, contexts, streams and graph capture; `memory.rs` pointer kinds,
//! buffers and copies; `event.rs` pooled and timing events; `kernels.rs`
//! the library's own PTX kernels (`kernels.ptx`), loaded with
//! `cuModuleLoadData` and launched on the caller's stream.

mod device;
mod driver;
mod event;
mod kernels;
mod memory;
#[cfg(test)]
mod tests;

// Public (the tools time operations on a GPU with them): devices, streams,
// timing events, graph capture, device buffers and copies, availability.
pub use device::{begin_capture, stream_synchronize, Device, GraphExec, Stream};
pub use driver::{available, device_count};
pub use event::TimingEvent;
pub use memory::{copy_to_device, copy_to_host, DeviceBuffer};

pub(crate) use device::{capture_status, launch_host_func, stream_wait_event, Capture};
pub(crate) use driver::{
    check, drv, is_available, may_hold_device_memory, with_relaxed_capture_mode,
    CUDA_ERROR_INVALID_VALUE,
};
pub(crate) use event::{Event, EventPool};
pub(crate) use kernels::{Elem, Kernels};
pub(crate) use memory::{
    device_accessible, device_alloc, device_free, memcpy_async, memory_type, on_callers_stack,
    MemoryType, PinnedBuffer,
};

use cudarc::driver::sys::CUstream;

/// A CUDA stream handle as passed through the C API (NULL: legacy default).
pub type RawStream = CUstream;

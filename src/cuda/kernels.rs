//! The library's own device kernels: small element-wise casts and a
//! division, written by hand in PTX (`kernels.ptx`, text shipped inside the
//! library) and JIT-compiled by the driver at run time
//! (`cuModuleLoadData`), so that no CUDA toolkit is needed to build.
//!
//! A [`Kernels`] is the module loaded into one device's primary context and
//! its functions; launches go on the caller's stream, in its order. A
//! driver without the module entry points gives a clear error (see
//! [`MISSING_ENTRY_POINT`](super::driver::MISSING_ENTRY_POINT)), never a
//! crash.
//!
//! What the kernels compute (round to nearest even, as PyTorch's casts;
//! NaNs as the host conversions of `crate::kernels::half`, so device and host give the
//! same bits) is documented at the head of `kernels.ptx`.

// Stream handles are opaque: passed to the driver, never dereferenced here.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use super::device::Device;
use super::driver::{check, drv, CUDA_SUCCESS};
use crate::error::{Error, Result};
use cudarc::driver::sys::{CUfunction, CUmodule, CUstream};
use std::ffi::{c_void, CStr};
use std::sync::Arc;

/// The PTX text, NUL-terminated as `cuModuleLoadData` reads it.
const PTX: &str = concat!(include_str!("kernels.ptx"), "\0");

/// Threads per block of every launch.
const BLOCK: usize = 256;
/// At most this many blocks; the kernels' grid-stride loops cover the rest.
const MAX_GRID: usize = 65535;

/// An element type the kernels handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F32,
    F16,
    Bf16,
}

impl Elem {
    fn name(self) -> &'static str {
        match self {
            Elem::F32 => "float32",
            Elem::F16 => "float16",
            Elem::Bf16 => "bfloat16",
        }
    }
}

/// The cast kernels, by (source, destination).
const CASTS: [(Elem, Elem, &CStr); 6] = [
    (Elem::F32, Elem::F16, c"tc_cast_f32_f16"),
    (Elem::F32, Elem::Bf16, c"tc_cast_f32_bf16"),
    (Elem::F16, Elem::F32, c"tc_cast_f16_f32"),
    (Elem::Bf16, Elem::F32, c"tc_cast_bf16_f32"),
    (Elem::F16, Elem::Bf16, c"tc_cast_f16_bf16"),
    (Elem::Bf16, Elem::F16, c"tc_cast_bf16_f16"),
];

/// The in-place division kernels, by element type.
const DIVS: [(Elem, &CStr); 2] = [(Elem::F16, c"tc_div_f16"), (Elem::Bf16, c"tc_div_bf16")];

/// The kernels module loaded on one device; unloaded on drop. The owner
/// must make sure no launch is still pending on a stream when it drops it
/// (the reducer synchronizes its stream first).
pub struct Kernels {
    device: Arc<Device>,
    module: CUmodule,
    casts: [CUfunction; 6],
    divs: [CUfunction; 2],
}

// SAFETY: module and function handles are usable from any thread.
unsafe impl Send for Kernels {}
unsafe impl Sync for Kernels {}

impl Kernels {
    /// Loads the PTX into `device`'s primary context (the driver compiles it
    /// for the device) and looks up every kernel.
    pub fn load(device: &Arc<Device>) -> Result<Kernels> {
        let _current = device.scoped()?;
        let mut module: CUmodule = std::ptr::null_mut();
        // SAFETY: `PTX` is NUL-terminated text; valid out-pointer; the
        // device's context is current.
        check(
            unsafe { drv::cuModuleLoadData(&mut module, PTX.as_ptr().cast()) },
            "cuModuleLoadData (the library's PTX kernels)",
        )?;
        let mut k = Kernels {
            device: device.clone(),
            module,
            casts: [std::ptr::null_mut(); 6],
            divs: [std::ptr::null_mut(); 2],
        };
        // On an error `k` is dropped, which unloads the module.
        for (i, (_, _, name)) in CASTS.iter().enumerate() {
            k.casts[i] = k.function(name)?;
        }
        for (i, (_, name)) in DIVS.iter().enumerate() {
            k.divs[i] = k.function(name)?;
        }
        Ok(k)
    }

    fn function(&self, name: &CStr) -> Result<CUfunction> {
        let mut f: CUfunction = std::ptr::null_mut();
        // SAFETY: valid out-pointer, loaded module, NUL-terminated name.
        check(
            unsafe { drv::cuModuleGetFunction(&mut f, self.module, name.as_ptr()) },
            &format!("cuModuleGetFunction({})", name.to_string_lossy()),
        )?;
        Ok(f)
    }

    /// Enqueues `dst[i] = (to) src[i]` for `n` elements on `stream`. Both
    /// buffers are device memory of this device, valid until the stream has
    /// run the kernel, and do not overlap.
    pub fn cast(
        &self,
        src: *const c_void,
        from: Elem,
        dst: *mut c_void,
        to: Elem,
        n: usize,
        stream: CUstream,
    ) -> Result<()> {
        let Some(i) = CASTS.iter().position(|c| c.0 == from && c.1 == to) else {
            return Err(Error::invalid_argument(format!(
                "no device cast from {} to {} (a copy, not a cast)",
                from.name(),
                to.name()
            )));
        };
        let (mut s, mut d, mut count) = (src as u64, dst as u64, n as u64);
        let mut params = [
            (&mut s as *mut u64).cast::<c_void>(),
            (&mut d as *mut u64).cast(),
            (&mut count as *mut u64).cast(),
            std::ptr::null_mut(),
        ];
        self.launch(self.casts[i], &mut params, n, stream, CASTS[i].2)
    }

    /// Enqueues `buf[i] = (elem) ((float) buf[i] / divisor)` for `n`
    /// elements on `stream` (float16 or bfloat16; the division in float32,
    /// rounded once).
    pub fn divide(
        &self,
        buf: *mut c_void,
        elem: Elem,
        n: usize,
        divisor: f32,
        stream: CUstream,
    ) -> Result<()> {
        let Some(i) = DIVS.iter().position(|d| d.0 == elem) else {
            return Err(Error::invalid_argument(format!(
                "no device division kernel for {}",
                elem.name()
            )));
        };
        let (mut b, mut count, mut div) = (buf as u64, n as u64, divisor);
        let mut params = [
            (&mut b as *mut u64).cast::<c_void>(),
            (&mut count as *mut u64).cast(),
            (&mut div as *mut f32).cast(),
            std::ptr::null_mut(),
        ];
        self.launch(self.divs[i], &mut params, n, stream, DIVS[i].1)
    }

    /// Launches `f` over `n` elements. `params` points at each argument and
    /// ends with NULL: the driver reads as many entries as the kernel has
    /// parameters and ignores the rest (the simulated driver counts them by
    /// it). The driver copies the arguments at the launch.
    fn launch(
        &self,
        f: CUfunction,
        params: &mut [*mut c_void],
        n: usize,
        stream: CUstream,
        name: &CStr,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let grid = n.div_ceil(BLOCK).min(MAX_GRID) as u32;
        let _current = self.device.scoped()?;
        // SAFETY: `f` belongs to this module, whose context is current; the
        // argument pointers are valid for the call, which copies them; the
        // caller guarantees the buffers.
        let r = unsafe {
            drv::cuLaunchKernel(
                f,
                grid,
                1,
                1,
                BLOCK as u32,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        // The call's name is formatted only for an error: launches are per
        // bucket and iteration.
        if r == CUDA_SUCCESS {
            return Ok(());
        }
        check(r, &format!("cuLaunchKernel({})", name.to_string_lossy()))
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        if let Ok(_current) = self.device.scoped() {
            // SAFETY: loaded by `load`, unloaded once, its context current.
            let _ = unsafe { drv::cuModuleUnload(self.module) };
        }
    }
}

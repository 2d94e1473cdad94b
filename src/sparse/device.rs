//! Sparse all-reduce with CUDA memory.
//!
//! Inputs in device memory are copied to the host on the caller's stream
//! (synchronized) before the local checks and coalesce; the exchange and the
//! merge then run as on the host (on an nccl comm every exchange goes
//! through device scratch memory, see [`crate::device_ops::host_collective`]).
//! The result's `indices` and `values` are device memory when the comm is an
//! nccl comm (from the comm's allocator, `tc_mem_alloc`) or the input was
//! device memory on a gloo comm (whose allocator gives host memory: then
//! `cuMemAlloc` on the input's device), written by copies on the caller's
//! stream that complete before the result is handed over; `shape` stays
//! host memory.

use super::{CooInput, MAX_DIMS};
use crate::comm::{Comm, Ptr};
use crate::cuda;
use crate::device_ops::{device_of, is_device};
use crate::error::Result;
use crate::types::{DType, Device};
use crate::util::try_filled;
use std::ffi::c_void;
use std::sync::Arc;

/// Host copies of an input's device arrays.
pub struct HostInput {
    input: CooInput,
    _shape: Vec<i64>,
    _indices: Vec<i64>,
    _values: Vec<u64>,
}

impl HostInput {
    pub fn input(&self) -> &CooInput {
        &self.input
    }
}

/// Where the result goes.
#[derive(Clone)]
pub enum Placement {
    Host,
    /// Device memory from this comm's allocator, written on this stream.
    CommMemory(Arc<Comm>, Ptr),
    /// `cuMemAlloc` memory of this device, written on this stream.
    CudaMemory(Arc<cuda::Device>, Ptr),
}

// SAFETY: the stream handle is only passed to the driver.
unsafe impl Send for Placement {}

fn on_device(p: *const c_void) -> bool {
    is_device(Ptr(p as *mut c_void)).unwrap_or(false)
}

/// The result's placement for `input` on `comm` (see the module's doc).
pub fn placement(comm: &Arc<Comm>, input: &CooInput, stream: *mut c_void) -> Result<Placement> {
    if comm.device() != Device::Cpu {
        return Ok(Placement::CommMemory(comm.clone(), Ptr(stream)));
    }
    let arrays = [input.values, input.indices.cast()];
    match arrays.into_iter().find(|p| on_device(*p)) {
        Some(p) => Ok(Placement::CudaMemory(
            device_of(Ptr(p as *mut c_void))?,
            Ptr(stream),
        )),
        None => Ok(Placement::Host),
    }
}

/// Copies `bytes` of device memory at `src` into a host vector of `T`.
fn to_host<T: Copy + Default>(
    src: *const c_void,
    n: usize,
    stream: cuda::RawStream,
) -> Result<Vec<T>> {
    let mut v = try_filled(
        T::default(),
        n,
        "argument 'input.nnz': the input's host copy",
    )?;
    let bytes = n * std::mem::size_of::<T>();
    cuda::memcpy_async(v.as_mut_ptr().cast(), src, bytes, stream)?;
    Ok(v)
}

/// Copies the device arrays of `input` to the host on `stream` (then
/// synchronized). `None` when nothing is device memory; only the shape when
/// the sizes are out of range (the local checks then refuse the input, on
/// every rank, before they read the arrays).
pub fn stage_input(input: &CooInput, stream: *mut c_void) -> Result<Option<HostInput>> {
    let (shape_dev, idx_dev, val_dev) = (
        on_device(input.shape.cast()),
        on_device(input.indices.cast()),
        on_device(input.values),
    );
    if !(shape_dev || idx_dev || val_dev) {
        return Ok(None);
    }
    let Some(ndims) = input
        .sparse_dim
        .checked_add(input.dense_dim)
        .filter(|n| *n <= MAX_DIMS)
    else {
        return Ok(None);
    };
    let any = [input.shape.cast(), input.indices.cast(), input.values]
        .into_iter()
        .find(|p| on_device(*p))
        .unwrap_or(input.values);
    let device = device_of(Ptr(any as *mut c_void))?;
    let _current = device.scoped()?;
    let s = stream as cuda::RawStream;
    let shape: Vec<i64> = if shape_dev {
        let v = to_host(input.shape.cast(), ndims, s)?;
        cuda::stream_synchronize(s)?;
        v
    } else {
        // SAFETY: the caller's shape holds `ndims` sizes.
        unsafe { std::slice::from_raw_parts(input.shape, ndims) }.to_vec()
    };
    // Sizes the local checks will refuse: only the shape is needed (those
    // checks come before the arrays are read).
    let (idx_dev, val_dev, (index_count, value_bytes)) = match sizes(input, &shape) {
        Some(sizes) => (idx_dev, val_dev, sizes),
        None => (false, false, (0, 0)),
    };
    let indices: Vec<i64> = match idx_dev {
        true => to_host(input.indices.cast(), index_count, s)?,
        false => Vec::new(),
    };
    let values: Vec<u64> = match val_dev {
        true => {
            let words = value_bytes.div_ceil(8);
            let mut v = try_filled(0u64, words, "argument 'input.nnz': the input's host copy")?;
            cuda::memcpy_async(v.as_mut_ptr().cast(), input.values, value_bytes, s)?;
            v
        }
        false => Vec::new(),
    };
    cuda::stream_synchronize(s)?;
    let mut host = *input;
    host.shape = shape.as_ptr();
    if idx_dev {
        host.indices = indices.as_ptr();
    }
    if val_dev {
        host.values = values.as_ptr().cast();
    }
    Ok(Some(HostInput {
        input: host,
        _shape: shape,
        _indices: indices,
        _values: values,
    }))
}

/// (indices, value bytes) of `input`, None on overflow or a bad size.
fn sizes(input: &CooInput, shape: &[i64]) -> Option<(usize, usize)> {
    if shape.iter().any(|s| *s < 0) {
        return None;
    }
    let dtype = DType::from_c(input.dtype, "dtype").ok()?;
    let row = shape[input.sparse_dim..]
        .iter()
        .try_fold(1usize, |a, s| a.checked_mul(*s as usize))?;
    let value_bytes = row
        .checked_mul(dtype.size())?
        .checked_mul(input.nnz)
        .filter(|b| *b <= isize::MAX as usize)?;
    let index_count = input
        .nnz
        .checked_mul(input.sparse_dim)
        .filter(|n| *n <= isize::MAX as usize / 8)?;
    Some((index_count, value_bytes))
}

/// Device memory holding `src` (from the placement's allocator), copied
/// on its stream (synchronized: `src` is freed by the caller). Never NULL.
pub fn to_device(place: &Placement, src: &[u8]) -> Result<*mut c_void> {
    let (dst, device, stream, free): (_, _, _, Box<dyn Fn(*mut c_void)>) = match place {
        Placement::Host => {
            return Err(crate::error::Error::internal("to_device for a host result"))
        }
        Placement::CommMemory(comm, stream) => {
            let dst = comm.alloc_memory(src.len().max(1))?;
            let device = device_of(Ptr(dst));
            let comm = comm.clone();
            let free = Box::new(move |p| drop(comm.free_memory(p)));
            (dst, device, *stream, free)
        }
        Placement::CudaMemory(device, stream) => {
            let _current = device.scoped()?;
            let dst = cuda::device_alloc(src.len().max(1))?;
            let (d, d2) = (device.clone(), device.clone());
            let free = Box::new(move |p| drop(d.scoped().and_then(|_g| cuda::device_free(p))));
            (dst, Ok(d2), *stream, free)
        }
    };
    let copied = device.and_then(|device| {
        let _current = device.scoped()?;
        let s = stream.0 as cuda::RawStream;
        cuda::memcpy_async(dst, src.as_ptr().cast(), src.len(), s)?;
        cuda::stream_synchronize(s)
    });
    match copied {
        Ok(()) => Ok(dst),
        Err(e) => {
            free(dst);
            Err(e)
        }
    }
}

/// Frees a result array placed by [`to_device`] (on a failure after it).
pub fn free_device(place: &Placement, p: *mut c_void) {
    match place {
        Placement::Host => {}
        Placement::CommMemory(comm, _) => drop(comm.free_memory(p)),
        Placement::CudaMemory(device, _) => {
            drop(device.scoped().and_then(|_g| cuda::device_free(p)))
        }
    }
}

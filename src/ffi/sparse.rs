//! `tc_sparse_all_reduce`: COO sparse tensors summed across ranks.

use crate::error::{tc_result_t, Error, Result};
use crate::ffi::comm::tc_comm_t;
use crate::ffi::comm_ops::{collective_boundary, hand_out_work, op_options};
use crate::ffi::work::tc_work_t;
use crate::ffi::{arg_out, arg_ref, malloc_copy};
use crate::options::tc_op_options_t;
use crate::sparse::device::{free_device, placement, to_device, Placement};
use crate::sparse::{CooInput, CooOutput};
use crate::types::{tc_dtype_t, tc_reduce_op_t};
use std::ffi::c_void;

/// A sparse COO tensor, torch's layout: `shape` has `sparse_dim + dense_dim`
/// sizes; `indices` holds `sparse_dim` rows of `nnz` indices (row-major, as
/// torch's `indices()`); `values` holds `nnz` rows of prod(dense sizes)
/// elements of `dtype` (row-major, as torch's `values()`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_sparse_coo_t {
    /// Number of sparse dimensions.
    pub sparse_dim: usize,
    /// Number of dense dimensions.
    pub dense_dim: usize,
    /// `sparse_dim + dense_dim` sizes.
    pub shape: *const i64,
    /// Number of stored entries.
    pub nnz: usize,
    /// `sparse_dim x nnz` indices, row-major.
    pub indices: *const i64,
    /// `nnz x prod(dense sizes)` values, row-major.
    pub values: *const c_void,
    /// Element type of `values`.
    pub dtype: tc_dtype_t,
}

/// The output's address, written by the delivering thread.
struct OutPtr(*mut tc_sparse_coo_t);
// The caller keeps `*output` valid and untouched until the work completes.
unsafe impl Send for OutPtr {}

/// Copies `out` into memory from `malloc` (indices and values: device
/// memory from the comm's allocator for a device placement) and fills
/// `*dst`; on failure nothing is left allocated and `*dst` is untouched.
fn write_output(dst: OutPtr, out: CooOutput, place: Placement) -> Result<()> {
    let bytes =
        |v: &[i64]| unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len() * 8) };
    let shape = malloc_copy(bytes(&out.shape), "argument 'out': the result's shape")?;
    let free_shape = |_: &Error| unsafe { libc::free(shape) };
    let (indices, values) = match place {
        Placement::Host => {
            let indices = malloc_copy(
                bytes(&out.indices),
                "argument 'input.nnz': the result's indices",
            )
            .inspect_err(free_shape)?;
            (indices, out.values.into_raw())
        }
        place => {
            let indices = to_device(&place, bytes(&out.indices)).inspect_err(free_shape)?;
            let values = to_device(&place, &out.values).inspect_err(|e| {
                free_shape(e);
                free_device(&place, indices);
            })?;
            (indices, values)
        }
    };
    // SAFETY: checked non-NULL by the caller; kept valid until completion.
    unsafe {
        *dst.0 = tc_sparse_coo_t {
            sparse_dim: out.sparse_dim,
            dense_dim: out.dense_dim,
            shape: shape as *const i64,
            nnz: out.nnz,
            indices: indices as *const i64,
            values,
            dtype: out.dtype.to_c(),
        }
    };
    Ok(())
}

/// Sums the sparse tensor `input` across the ranks of `comm` with `op`
/// (`TC_SUM`, or `TC_AVG`: the sum divided by the world size, integers
/// truncated); every other op gives `TC_ERR_UNSUPPORTED`. Collective, on
/// gloo and nccl comms. Algorithm of PyTorch's Gloo sparse all-reduce:
/// each rank coalesces its input, the ranks all-gather their metadata, then
/// their coalesced indices and values (each entry sent once), and every rank
/// merges them into the same coalesced result: indices sorted
/// lexicographically and unique, duplicates summed in input order within a
/// rank and then in rank order; float16/bfloat16 are summed in float32 and
/// rounded once per stage; integers wrap on overflow. Every dtype except
/// bool and float8.
///
/// Checks before anything is sent: every index within its dimension's size,
/// no count overflows; then, across ranks, sparse_dim, dense_dim, every size,
/// dtype and op must agree: a refusal or a mismatch fails the call on every
/// rank with a message naming the rank (and the dimension), `*output`
/// untouched and nothing allocated.
///
/// `input` and its arrays are read during the call only. On success
/// `*output` receives the result, its `shape`, `indices` and `values` arrays
/// allocated by the library (never NULL, even when `nnz` is 0), each to
/// release with `tc_free` (cast away `const`). Blocking call: written on
/// return. `opts->async_op = 1`: the metadata exchange completes during the
/// call, the rest runs in the background and `*output` (which must stay
/// valid) is written before `*work` completes (a NULL `work` is then
/// refused). `opts` may be NULL (defaults). Thread safety and ordering as
/// the other operations of `comm`.
///
/// CUDA memory: `indices`, `values` (and `shape`) may be device memory;
/// they are copied to the host on `opts->stream`, which the call
/// synchronizes. On an nccl comm the result's `indices` and `values` are
/// device memory from the comm's allocator, to release with
/// `tc_mem_free(comm, ...)`; on a gloo comm whose input `indices` or
/// `values` are device memory, they are device memory from `cuMemAlloc` on
/// that device (gloo's allocator gives host memory), to release with
/// `cuMemFree` (or `cudaFree`). `shape` is host memory for `tc_free` in
/// every case. The device arrays are written by copies on `opts->stream`
/// that completed when the result is handed over.
/// On an nccl comm the metadata, indices and values are all-gathered
/// through device memory and coalesced on the host, and the call completes
/// before it returns even with `async_op = 1` (the work is then complete).
#[no_mangle]
pub extern "C" fn tc_sparse_all_reduce(
    comm: *mut tc_comm_t,
    input: *const tc_sparse_coo_t,
    op: tc_reduce_op_t,
    output: *mut tc_sparse_coo_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    collective_boundary("tc_sparse_all_reduce", comm, |comm| {
        let input = unsafe { arg_ref(input, "input")? };
        unsafe { arg_out(output, "output")? };
        let opts = unsafe { op_options(opts)? };
        if opts.async_op && work.is_null() {
            return Err(Error::invalid_argument(
                "argument 'work' is NULL with async_op: the caller could not tell when 'output' is written",
            ));
        }
        let coo = CooInput {
            sparse_dim: input.sparse_dim,
            dense_dim: input.dense_dim,
            shape: input.shape,
            nnz: input.nnz,
            indices: input.indices,
            values: input.values,
            dtype: input.dtype,
        };
        let dst = OutPtr(output);
        let comm = comm.inner()?;
        let place = placement(comm, &coo, opts.stream)?;
        let deliver = Box::new(move |out: CooOutput| write_output(dst, out, place));
        let w = unsafe { crate::sparse::sparse_all_reduce(comm, &coo, op.kind, &opts, deliver)? };
        hand_out_work(work, w, comm);
        Ok(())
    })
}

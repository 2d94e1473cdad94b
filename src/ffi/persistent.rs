//! `tc_all_gather_p_*`: a persistent all-gather, set up once and executed
//! many times.

use crate::comm::{PersistentAllGather, Ptr};
use crate::error::tc_result_t;
use crate::ffi::comm::tc_comm_t;
use crate::ffi::comm_ops::{collective_boundary, hand_out_work, op_options};
use crate::ffi::handle::{Handle, HandleType};
use crate::ffi::work::tc_work_t;
use crate::ffi::{arg_out, boundary, boundary_void, handle_ref, into_handle, take_handle};
use crate::options::tc_op_options_t;
use crate::types::{tc_dtype_t, DType};
use std::ffi::c_void;

/// A persistent all-gather made by `tc_all_gather_p_init`.
pub struct tc_all_gather_p {
    inner: PersistentAllGather,
}

pub type tc_all_gather_p_t = tc_all_gather_p;

impl Handle for tc_all_gather_p {
    const TYPE: HandleType = HandleType::AllGatherP;
}

/// Sets up a persistent all-gather of `count` elements of `dt` per rank into
/// `output` (`count * size` elements, rank r's at `r * count`, as
/// `tc_all_gather_single`); the output is validated once here. Every rank
/// calls it with the same `count` and `dt`: on `gloo` the call is
/// collective and blocking and checks that (a rank that differs makes it
/// fail on every rank with `TC_ERR_INVALID_USAGE` naming one); on `nccl`
/// it is local, and, as for the plain call, counts must agree unchecked. `output` must stay valid until the handle is freed
/// and its last execution completed. `opts` may be NULL; its `async_op` is
/// ignored (the set-up completes before the call returns). On success
/// `*handle` receives a handle to free with `tc_all_gather_p_free`; it
/// keeps the comm alive. On `gloo` each execution skips the per-call
/// validation and backend checks of `tc_all_gather_single` and, in a
/// process without a CUDA driver, its look for device buffers (see
/// docs/performance.md); on `nccl` an execution is the plain call on the
/// stored arguments. Not thread-safe against `tc_all_gather_p_free` of the
/// same handle.
#[no_mangle]
pub extern "C" fn tc_all_gather_p_init(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    count: usize,
    dt: tc_dtype_t,
    opts: *const tc_op_options_t,
    handle: *mut *mut tc_all_gather_p_t,
) -> tc_result_t {
    collective_boundary("tc_all_gather_p_init", comm, |comm| {
        let out = unsafe { arg_out(handle, "handle")? };
        unsafe { op_options(opts)? };
        let dtype = DType::from_c(dt, "dtype")?;
        let inner = PersistentAllGather::new(comm.inner()?.clone(), Ptr(output), count, dtype)?;
        *out = into_handle(tc_all_gather_p { inner });
        Ok(())
    })
}

/// Runs the persistent all-gather with this rank's `count` elements at
/// `input` (which may be this rank's own block of the output: in place).
/// Same contract as `tc_all_gather_single` otherwise: every rank executes
/// it, in the same order relative to the comm's other operations; `opts`
/// may be NULL; `work` may be NULL. The same handle may be executed again
/// once the previous execution completed (executions of one comm run in
/// issue order). Thread-safe as the comm's operations are.
#[no_mangle]
pub extern "C" fn tc_all_gather_p_exec(
    handle: *mut tc_all_gather_p_t,
    input: *const c_void,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    boundary("tc_all_gather_p_exec", || {
        let handle = unsafe { handle_ref(handle, "handle")? };
        let w = handle.inner.comm().refusing("tc_all_gather_p_exec", || {
            let opts = unsafe { op_options(opts)? };
            handle
                .inner
                .exec(Ptr(input as *mut c_void), &opts)
                .map_err(|e| e.context("all_gather_p_exec"))
        })?;
        hand_out_work(work, w, handle.inner.comm());
        Ok(())
    })
}

/// Frees a persistent all-gather. Executions already issued complete on
/// their own (their works stay valid). NULL is ignored; a handle that is not
/// live is left alone with a warning and `tc_last_error` set.
#[no_mangle]
pub extern "C" fn tc_all_gather_p_free(handle: *mut tc_all_gather_p_t) {
    boundary_void("tc_all_gather_p_free", || {
        drop(unsafe { take_handle(handle, "handle")? });
        Ok(())
    })
}

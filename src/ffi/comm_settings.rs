//! `tc_comm_get_ranks`, `tc_comm_get_backend_version`, `tc_comm_set_timeout`
//! and `tc_comm_set_hints`: reading and changing a live comm's settings.

use crate::error::{tc_result_t, Error};
use crate::ffi::comm::tc_comm_t;
use crate::ffi::{arg_out, boundary, handle_ref};
use crate::types::{hints_from_c, tc_hint_t};
use std::ffi::{c_char, c_int};
use std::time::Duration;

/// Writes this comm's ranks in the root comm's numbering: entry i is the
/// rank, in the comm made by `tc_comm_new` that this comm descends from, of
/// this comm's rank i. A comm made by `tc_comm_new` gives 0..size-1; a comm
/// made by `tc_comm_split` gives its parent's entries for the ranks it was
/// split from, so the numbering is the root's through every level of splits.
///
/// `*count` is in/out, as NCCL-style size queries: on entry the capacity of
/// `ranks` (in elements), on return the comm's size. `ranks` NULL: only the
/// size is written (`TC_SUCCESS`). A capacity smaller than the size: nothing
/// is written to `ranks`, `*count` gets the size needed, and the call fails
/// with `TC_ERR_INVALID_ARGUMENT`. The caller owns `ranks`. `count` must
/// not be NULL. Works in every state of the comm; thread-safe.
#[no_mangle]
pub extern "C" fn tc_comm_get_ranks(
    comm: *const tc_comm_t,
    ranks: *mut c_int,
    count: *mut usize,
) -> tc_result_t {
    boundary("tc_comm_get_ranks", || {
        let (comm, count) = unsafe { (handle_ref(comm, "comm")?, arg_out(count, "count")?) };
        let root_ranks = comm.inner()?.root_ranks();
        let capacity = *count;
        *count = root_ranks.len();
        if ranks.is_null() {
            return Ok(());
        }
        if capacity < root_ranks.len() {
            return Err(Error::invalid_argument(format!(
                "argument 'count': capacity {capacity} is smaller than the comm's {} ranks \
                 (*count now holds the size needed)",
                root_ranks.len()
            )));
        }
        // SAFETY: the caller gives room for `capacity` >= len elements.
        unsafe { std::ptr::copy_nonoverlapping(root_ranks.as_ptr(), ranks, root_ranks.len()) };
        Ok(())
    })
}

/// Writes the version of the comm's backend, NUL-terminated: "gloo X.Y.Z
/// (torchcomm A.B.C)" with Gloo's version from the headers its module was
/// built with ("unknown" for a module without that call), "nccl X.Y.Z"
/// with the version the loaded NCCL reports (`ncclGetVersion`). The string
/// is owned by the comm, valid until `tc_comm_destroy`. `version` must not
/// be NULL. Works in every state of the comm; thread-safe.
#[no_mangle]
pub extern "C" fn tc_comm_get_backend_version(
    comm: *const tc_comm_t,
    version: *mut *const c_char,
) -> tc_result_t {
    boundary("tc_comm_get_backend_version", || {
        let (comm, version) = unsafe { (handle_ref(comm, "comm")?, arg_out(version, "version")?) };
        *version = comm.inner()?.backend_version().as_ptr();
        Ok(())
    })
}

/// Sets the comm's default timeout to `timeout_ms` milliseconds (> 0) for
/// operations issued after the call (those whose options leave `timeout_ms`
/// unset) and for window calls made after it; operations already issued,
/// queued or running, keep the deadline they were issued with. Splits made
/// later inherit the new value. Local: other ranks keep theirs. The comm
/// must be active (`TC_ERR_INVALID_USAGE` after finalize, `TC_ERR_ABORTED`
/// after an abort). Thread-safe.
#[no_mangle]
pub extern "C" fn tc_comm_set_timeout(comm: *mut tc_comm_t, timeout_ms: i64) -> tc_result_t {
    boundary("tc_comm_set_timeout", || {
        let comm = unsafe { handle_ref(comm, "comm")? };
        if timeout_ms <= 0 {
            return Err(Error::invalid_argument(format!(
                "argument 'timeout_ms': {timeout_ms} is not a positive number of milliseconds"
            )));
        }
        comm.inner()?
            .set_timeout(Duration::from_millis(timeout_ms as u64))
    })
}

/// Changes hints of a live comm, all or nothing. Hints a live comm can
/// change: "timeout_ms" (positive integer; as `tc_comm_set_timeout`) and
/// "abort_on_error" ("0" or "1"; whether a failure found from now on aborts
/// the process or only the comm). Hints read only at creation ("gloo.iface",
/// "gloo.hostname", NCCL's config hints such as "nccl.min_ctas",
/// "high_priority_stream") are refused with `TC_ERR_UNSUPPORTED`, unknown
/// hints with `TC_ERR_INVALID_ARGUMENT`; either way `tc_last_error` names
/// the hint and no hint of the call is applied. `hints` (copied during the
/// call) may be NULL when `num_hints` is 0. Local to this rank. The comm
/// must be active. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_comm_set_hints(
    comm: *mut tc_comm_t,
    hints: *const tc_hint_t,
    num_hints: usize,
) -> tc_result_t {
    boundary("tc_comm_set_hints", || {
        let comm = unsafe { handle_ref(comm, "comm")? };
        let hints = unsafe { hints_from_c(hints, num_hints, "hints")? };
        comm.inner()?.set_hints(&hints)
    })
}

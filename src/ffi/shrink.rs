//! `tc_comm_shrink`: the comm of the ranks that remain after excluding some
//! (see `crate::comm::Comm::shrink`).

use crate::error::tc_result_t;
use crate::ffi::comm::{comm_handle, comm_options, tc_comm_t};
use crate::ffi::comm_names;
use crate::ffi::{arg_out, arg_slice, boundary, handle_ref};
use crate::options::tc_comm_options_t;
use crate::types::c_string;
use std::ffi::{c_char, c_int};

/// Creates the comm of the ranks of `comm` not listed in `exclude_ranks`
/// (`n` parent ranks, in any order, no duplicates; `exclude_ranks` may be
/// NULL when `n == 0`), ranked in their old order. Collective over the
/// remaining ranks only: the excluded ones (dead, say) take no part, and
/// every remaining rank must pass the same ranks, or every rank that sees a
/// different list fails with `TC_ERR_INVALID_USAGE` naming the rank that
/// differs (a remaining rank that never calls makes the others fail with
/// `TC_ERR_TIMEOUT` after the timeout). A rank that lists itself (an
/// excluded rank calling) gets `TC_ERR_INVALID_USAGE`; a rank outside
/// `[0, size)` or listed twice is `TC_ERR_INVALID_ARGUMENT`.
///
/// `comm` may be active or aborted (after an operation failed with
/// `TC_ERR_REMOTE` or `TC_ERR_TIMEOUT`, or `tc_comm_abort`), not finalized
/// (`TC_ERR_INVALID_USAGE`); it is left as it was (finalize or destroy it
/// as usual). With abort-on-error on (the default) a failure ends the
/// process before it can shrink: ranks meant to survive a peer's death
/// create their comms with `abort_on_error = 0` (or run with
/// `TORCHCOMM_ABORT_ON_ERROR=0`). Shrinks of one comm into one name are
/// counted: the remaining ranks make them alike, in the same order.
///
/// On gloo the remaining ranks meet afresh in the comm's store, which must
/// still be reachable: when a rank hosts it (rank 0 under the `MASTER_ADDR`
/// bootstrap) that rank cannot be excluded, and the shrink fails with the
/// store's error, saying so. On nccl it is `ncclCommShrink` (NCCL 2.27+;
/// `TC_ERR_UNSUPPORTED` naming the loaded version otherwise) and needs the
/// comm's NCCL comm. Where the loaded NCCL has `ncclCommRevoke` (2.28+), a
/// failure the comm detects revokes its NCCL comm instead of aborting it
/// (its operations stop; the comm is aborted as usual, or the process with
/// abort-on-error), so the survivors can shrink it (`NCCL_SHRINK_ABORT`);
/// with an older NCCL a failure aborts the NCCL comm and the shrink is
/// `TC_ERR_UNSUPPORTED` naming `ncclCommRevoke` and the version. After
/// `tc_comm_abort` of a comm with no failure, nothing is left to shrink
/// either (`TC_ERR_UNSUPPORTED`, saying so).
///
/// `name` must be unique among the live comms of this process
/// (`TC_ERR_INVALID_ARGUMENT` otherwise, before any communication). `opts`
/// may be NULL (inherit timeout and abort-on-error from `comm`); its `name`
/// is ignored. On success `*out` is a new comm owned by the caller (destroy
/// it with `tc_comm_destroy`); on failure `*out` is untouched. Thread-safe
/// with respect to other comms; not to be called concurrently with other
/// calls on `comm` that rendezvous (split, shrink, window creation).
#[no_mangle]
pub extern "C" fn tc_comm_shrink(
    comm: *mut tc_comm_t,
    exclude_ranks: *const c_int,
    n: usize,
    name: *const c_char,
    opts: *const tc_comm_options_t,
    out: *mut *mut tc_comm_t,
) -> tc_result_t {
    boundary("tc_comm_shrink", || {
        let (comm, out) = unsafe { (handle_ref(comm, "comm")?, arg_out(out, "out")?) };
        let exclude = unsafe { arg_slice(exclude_ranks, n, "exclude_ranks")? };
        let name = unsafe { c_string(name, "name")? };
        let opts = unsafe { comm_options(opts)? };
        let lease = comm_names::lease(name, "name")?;
        *out = comm_handle(comm.inner()?.shrink(exclude, name, opts)?, lease);
        Ok(())
    })
}

//! `tc_comm_get_init_handle`, `tc_comm_reconfigure`: re-forming a comm
//! created with `enable_reconfigure` (see `crate::comm::Reconfigurable`).

use crate::error::{tc_result_t, Error};
use crate::ffi::comm::tc_comm_t;
use crate::ffi::comm_ops::{hand_out_work, op_options};
use crate::ffi::work::tc_work_t;
use crate::ffi::{arg_out, arg_slice, boundary, handle_ref};
use crate::options::tc_op_options_t;
use crate::types::c_string;
use crate::work::DoneWork;
use std::ffi::{c_char, c_int};
use std::sync::Arc;

/// `form` of `tc_comm_reconfigure`: the handles are a list, ranked in
/// their order.
pub const TC_INIT_HANDLES_LIST: i32 = 0;
/// `form` of `tc_comm_reconfigure`: the handles are a set, ranked in the
/// byte order of their text (the same on every member whatever order each
/// passed).
pub const TC_INIT_HANDLES_SET: i32 = 1;

/// Writes to `*handle` the init handle of a comm created with
/// `enable_reconfigure`: a NUL-terminated ASCII string naming the job (an
/// id kept in the comm's store), the comm's name and a random id of this
/// process's comm. It is the same for the comm's lifetime, before and after
/// reconfigures, is owned by the comm and valid until `tc_comm_destroy`.
/// Publish it to the other processes (through a store, say) for their
/// `tc_comm_reconfigure`. A comm created without `enable_reconfigure`:
/// `TC_ERR_INVALID_USAGE`. `handle` must not be NULL; untouched on failure.
/// Thread-safe; never blocks.
#[no_mangle]
pub extern "C" fn tc_comm_get_init_handle(
    comm: *const tc_comm_t,
    handle: *mut *const c_char,
) -> tc_result_t {
    boundary("tc_comm_get_init_handle", || {
        let (comm, handle) = unsafe { (handle_ref(comm, "comm")?, arg_out(handle, "handle")?) };
        *handle = comm
            .slot()
            .reconfigurable("tc_comm_get_init_handle")?
            .init_handle()
            .as_ptr();
        Ok(())
    })
}

/// Re-forms `comm` (created with `enable_reconfigure`) in place from the
/// processes whose init handles are `init_handles` (`n` NUL-terminated
/// strings from `tc_comm_get_init_handle`, copied during the call): their
/// comms become one comm of `n` ranks, ranked in list order with
/// `form = TC_INIT_HANDLES_LIST`, in the byte order of the handles' text
/// with `TC_INIT_HANDLES_SET`. It shrinks (a member left out takes no part:
/// it finalizes its comm), grows (a newcomer's comm, created with
/// `enable_reconfigure` and never formed, joins), reorders, or forms a comm
/// for the first time, as torchcomms' `reconfigure` does.
///
/// Collective over the listed members only: each calls it with the same
/// `uuid` (an integer >= 0 naming this reconfigure: the new comm meets in
/// the store under `<name>/reconfigure/<uuid>`, so a comm's reconfigures
/// need distinct uuids; one this comm already took part in is
/// `TC_ERR_INVALID_USAGE`) and the same handles. A member that passed other
/// handles, or the same in another order, makes the members that see it
/// fail with `TC_ERR_INVALID_USAGE` naming it; a member that does not call
/// within the timeout makes the others fail with `TC_ERR_TIMEOUT` naming
/// its rank and handle.
///
/// Blocks until the new comm is formed or the timeout passed:
/// `opts->timeout_ms` (0 or `TC_UNSET`: the comm's timeout, for a comm
/// never formed its creation's). `opts->hints` are the new backend's
/// (none: the creation's). `opts` may be NULL; `opts->async_op` must be 0.
/// If `work` is not NULL, `*work` receives a completed work handle
/// (torchcomms returns one; destroy it with `tc_work_free`).
///
/// On success the handle's rank and size are the new ones; the comm it
/// held before is stopped: its outstanding works and window calls fail
/// with `TC_ERR_ABORTED` (wait for those that matter first; free its
/// windows), while comms split or shrunk from it are separate comms and
/// keep working. Its timeout, abort-on-error setting and abort hook carry
/// over; operation hooks (`tc_comm_add_hook`) do not. The comm may be
/// aborted (after a failure), not finalized. On failure the comm is left as
/// it was.
///
/// Refused before any communication, naming the argument: NULL
/// `init_handles` (with `n > 0`) or a NULL handle, `TC_ERR_NULL_ARGUMENT`;
/// with `TC_ERR_INVALID_ARGUMENT`, `n == 0`, a malformed handle, a handle
/// of another job (another store) or of a comm of another name, a handle
/// listed twice, this comm's own handle missing, a negative `uuid`, a
/// `form` other than the two above. A comm created without
/// `enable_reconfigure`: `TC_ERR_INVALID_USAGE`.
///
/// Not to be called concurrently with other calls on `comm` (a call that
/// races with it goes to the old comm or the new one).
#[no_mangle]
pub extern "C" fn tc_comm_reconfigure(
    comm: *mut tc_comm_t,
    uuid: i64,
    init_handles: *const *const c_char,
    n: usize,
    form: c_int,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    boundary("tc_comm_reconfigure", || {
        let comm = unsafe { handle_ref(comm, "comm")? };
        let pointers = unsafe { arg_slice(init_handles, n, "init_handles")? };
        let handles = pointers
            .iter()
            .enumerate()
            .map(|(i, p)| unsafe { c_string(*p, &format!("init_handles[{i}]")) })
            .collect::<crate::error::Result<Vec<&str>>>()?;
        let as_set = match form {
            TC_INIT_HANDLES_LIST => false,
            TC_INIT_HANDLES_SET => true,
            v => {
                return Err(Error::invalid_argument(format!(
                    "argument 'form': {v} is not TC_INIT_HANDLES_LIST or TC_INIT_HANDLES_SET"
                )))
            }
        };
        let opts = unsafe { op_options(opts)? };
        if opts.async_op {
            return Err(Error::invalid_argument(
                "argument 'opts.async_op': tc_comm_reconfigure blocks; pass 0 (its work is \
                 complete when it returns)",
            ));
        }
        let r = comm.slot().reconfigurable("tc_comm_reconfigure")?;
        r.reconfigure(uuid, &handles, as_set, opts.timeout, opts.hints)?;
        hand_out_work(work, Arc::new(DoneWork(Ok(()))), comm.inner()?);
        Ok(())
    })
}

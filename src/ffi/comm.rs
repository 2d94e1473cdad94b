//! `tc_comm_*`: creating, querying, splitting and ending communicators
//! (the operations on them are in `comm_ops`).

use crate::comm::hooks::refuse_inside_hook;
use crate::comm::{Comm, CommOptions, CommSlot, Reconfigurable};
use crate::error::{tc_result_t, Error, Result};
use crate::ffi::comm_names::{self, NameLease};
use crate::ffi::handle::{Handle, HandleType};
use crate::ffi::{
    arg_out, arg_slice, boundary, boundary_void, handle_ref, into_handle, malloc_copy, take_handle,
};
use crate::options::{read_versioned, tc_comm_options_t, timeout_from_ms};
use crate::types::{c_string, hints_from_c, tc_device_t, Device};
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Arc;

/// A communicator. Operations on one comm may be issued from several threads;
/// they run in the order the library received them, so ranks must agree on
/// that order (as with NCCL, serialize issuing if threads race).
pub struct tc_comm {
    slot: CommSlot,
    name: CString,
    backend: CString,
    /// Keeps the name taken until `tc_comm_destroy`.
    _name_lease: NameLease,
}

pub type tc_comm_t = tc_comm;

impl Handle for tc_comm {
    const TYPE: HandleType = HandleType::Comm;
}

impl tc_comm {
    /// The comm its calls go to; an error for a comm created with
    /// `enable_reconfigure` and not reconfigured yet.
    #[inline]
    pub(crate) fn inner(&self) -> Result<&Arc<Comm>> {
        self.slot.get()
    }

    pub(crate) fn slot(&self) -> &CommSlot {
        &self.slot
    }
}

/// The options of `tc_comm_split` and `tc_comm_shrink`, which refuse
/// `enable_reconfigure`.
pub(crate) unsafe fn comm_options(p: *const tc_comm_options_t) -> Result<CommOptions> {
    let (opts, enable_reconfigure) = comm_options_and_reconfigure(p)?;
    if enable_reconfigure {
        return Err(Error::invalid_argument(
            "argument 'opts.enable_reconfigure': only tc_comm_new makes reconfigurable comms",
        ));
    }
    Ok(opts)
}

/// The options, and whether `enable_reconfigure` is set.
unsafe fn comm_options_and_reconfigure(p: *const tc_comm_options_t) -> Result<(CommOptions, bool)> {
    let o = read_versioned(p, "opts")?;
    let enable_reconfigure = match o.enable_reconfigure {
        0 => false,
        1 => true,
        v => {
            return Err(Error::invalid_argument(format!(
                "argument 'opts.enable_reconfigure': {v} is not 0 or 1"
            )))
        }
    };
    let name = if o.name.is_null() {
        None
    } else {
        Some(c_string(o.name, "opts.name")?.to_string())
    };
    let store = if o.store.is_null() {
        None
    } else {
        Some(handle_ref(o.store, "opts.store")?.inner.clone())
    };
    let abort_on_error = match o.abort_on_error {
        v if v < 0 => None,
        0 => Some(false),
        1 => Some(true),
        v => {
            return Err(Error::invalid_argument(format!(
                "argument 'opts.abort_on_error': {v} is not 0, 1 or TC_UNSET"
            )))
        }
    };
    let explicit = |v: i32, arg: &str| -> Result<Option<i32>> {
        match v {
            -1 => Ok(None),
            v if v < -1 => Err(Error::invalid_argument(format!(
                "argument '{arg}': {v} is negative"
            ))),
            v => Ok(Some(v)),
        }
    };
    let opts = CommOptions {
        name,
        timeout: timeout_from_ms(o.timeout_ms),
        abort_on_error,
        rank: explicit(o.rank, "opts.rank")?,
        world_size: explicit(o.world_size, "opts.world_size")?,
        store,
        hints: hints_from_c(o.hints, o.num_hints, "opts.hints")?,
    };
    Ok((opts, enable_reconfigure))
}

pub(crate) fn comm_handle(inner: Arc<Comm>, name_lease: NameLease) -> *mut tc_comm_t {
    let (name, backend) = (inner.name().to_string(), inner.backend_name().to_string());
    slot_handle(CommSlot::Fixed(inner), &name, &backend, name_lease)
}

fn slot_handle(slot: CommSlot, name: &str, backend: &str, lease: NameLease) -> *mut tc_comm_t {
    into_handle(tc_comm {
        slot,
        name: CString::new(name).unwrap_or_default(),
        backend: CString::new(backend).unwrap_or_default(),
        _name_lease: lease,
    })
}

/// Creates a communicator over `backend` ("gloo" for host memory, "nccl" for
/// CUDA memory) on `device`. Collective: every rank of the job calls it.
/// Rank, size and store come from `opts` or, when unset, from the
/// environment (TORCHCOMM_RANK/SIZE, Open MPI, PMI, torchrun, Slurm; store
/// at MASTER_ADDR:MASTER_PORT, under Slurm by default the step's first node).
/// `opts` may be NULL (defaults) and is copied.
/// On success `*comm` receives a handle to destroy with `tc_comm_destroy`;
/// on failure it is left untouched.
///
/// With `opts->enable_reconfigure = 1` the call is not collective and the
/// comm has no members yet: only the store is resolved (`opts->store`, else
/// the environment as above, which may need the launcher's rank to know who
/// hosts it); the comm takes part in nothing until `tc_comm_reconfigure`
/// forms it (see there), and until then every call on it but
/// `tc_comm_get_name`, `tc_comm_get_backend`, `tc_comm_get_device`,
/// `tc_comm_get_async_error` (`TC_SUCCESS`), `tc_comm_get_init_handle`,
/// `tc_comm_reconfigure`, `tc_comm_finalize`, `tc_comm_abort` and
/// `tc_comm_destroy` fails with `TC_ERR_INVALID_USAGE`. The backend must
/// be able to run here (`TC_ERR_UNAVAILABLE` saying what is missing, e.g.
/// NCCL or the CUDA driver for `nccl`).
#[no_mangle]
pub extern "C" fn tc_comm_new(
    backend: *const c_char,
    device: tc_device_t,
    opts: *const tc_comm_options_t,
    comm: *mut *mut tc_comm_t,
) -> tc_result_t {
    boundary("tc_comm_new", || {
        let out = unsafe { arg_out(comm, "comm")? };
        let backend = unsafe { c_string(backend, "backend")? };
        let device = Device::from_c(device, "device")?;
        let (mut opts, enable_reconfigure) = unsafe { comm_options_and_reconfigure(opts)? };
        let lease = match &opts.name {
            Some(name) => comm_names::lease(name, "opts.name")?,
            None => comm_names::lease_generated(),
        };
        opts.name = Some(lease.name().to_string());
        *out = if enable_reconfigure {
            let r = Reconfigurable::new(backend, device, opts)?;
            let name = r.name().to_string();
            slot_handle(CommSlot::Reconfigurable(Box::new(r)), &name, backend, lease)
        } else {
            comm_handle(Comm::new(backend, device, opts)?, lease)
        };
        Ok(())
    })
}

/// Writes this process's rank in the comm. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_comm_get_rank(comm: *const tc_comm_t, rank: *mut c_int) -> tc_result_t {
    boundary("tc_comm_get_rank", || {
        let (comm, rank) = unsafe { (handle_ref(comm, "comm")?, arg_out(rank, "rank")?) };
        *rank = comm.inner()?.rank();
        Ok(())
    })
}

/// Writes the number of ranks of the comm. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_comm_get_size(comm: *const tc_comm_t, size: *mut c_int) -> tc_result_t {
    boundary("tc_comm_get_size", || {
        let (comm, size) = unsafe { (handle_ref(comm, "comm")?, arg_out(size, "size")?) };
        *size = comm.inner()?.size();
        Ok(())
    })
}

/// Writes the comm's name; the string is owned by the comm and valid until
/// `tc_comm_destroy`. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_comm_get_name(
    comm: *const tc_comm_t,
    name: *mut *const c_char,
) -> tc_result_t {
    boundary("tc_comm_get_name", || {
        let (comm, name) = unsafe { (handle_ref(comm, "comm")?, arg_out(name, "name")?) };
        *name = comm.name.as_ptr();
        Ok(())
    })
}

/// Writes the comm's backend name ("gloo", "nccl"); owned by the comm, valid
/// until `tc_comm_destroy`. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_comm_get_backend(
    comm: *const tc_comm_t,
    backend: *mut *const c_char,
) -> tc_result_t {
    boundary("tc_comm_get_backend", || {
        let (comm, backend) = unsafe { (handle_ref(comm, "comm")?, arg_out(backend, "backend")?) };
        *backend = comm.backend.as_ptr();
        Ok(())
    })
}

/// Writes the comm's device. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_comm_get_device(
    comm: *const tc_comm_t,
    device: *mut tc_device_t,
) -> tc_result_t {
    boundary("tc_comm_get_device", || {
        let (comm, device) = unsafe { (handle_ref(comm, "comm")?, arg_out(device, "device")?) };
        *device = comm.slot.device().to_c();
        Ok(())
    })
}

/// Returns `TC_SUCCESS` while the comm is healthy, else the code of the
/// failure that aborted it (found by a background thread), with its detail in
/// `tc_last_error`. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_comm_get_async_error(comm: *const tc_comm_t) -> tc_result_t {
    boundary("tc_comm_get_async_error", || {
        let comm = unsafe { handle_ref(comm, "comm")? };
        // A comm not formed yet has nothing that could have failed.
        match comm.slot.formed() {
            Some(comm) => comm.async_error().map_or(Ok(()), Err),
            None => Ok(()),
        }
    })
}

/// Writes to `*text` the comm's flight recorder: a NUL-terminated table of
/// its most recent operations, oldest first (sequence number, operation,
/// dtype, elements, root or peer, async, time issued since the comm's
/// creation, status now, age). Collectives get the same sequence numbers on
/// every rank, so the dumps of a stuck job's ranks show which rank is behind
/// and where. How many operations are kept: `TORCHCOMM_FLIGHT_RECORDER`
/// (default 64; 0 turns recording off, and the text says so). The comm also
/// logs this table when an operation fails or times out.
///
/// `*text` is allocated: release it with `tc_free`. Works in every state of
/// the comm, after an abort or finalize included (until `tc_comm_destroy`).
/// `text` must not be NULL; untouched on failure. Thread-safe; the status
/// of each operation is read at the call, without waiting for any.
#[no_mangle]
pub extern "C" fn tc_comm_dump_flight_recorder(
    comm: *const tc_comm_t,
    text: *mut *mut c_char,
) -> tc_result_t {
    boundary("tc_comm_dump_flight_recorder", || {
        let (comm, out) = unsafe { (handle_ref(comm, "comm")?, arg_out(text, "text")?) };
        let mut bytes = comm.inner()?.dump_flight_recorder().into_bytes();
        bytes.push(0);
        *out =
            malloc_copy(&bytes, "argument 'text': the flight recorder's table")?.cast::<c_char>();
        Ok(())
    })
}

/// Function called when a comm becomes aborted: `code` is the failure's
/// result code (`TC_ERR_TIMEOUT`, `TC_ERR_REMOTE`, ... or `TC_ERR_ABORTED`
/// for `tc_comm_abort`), `message` its detail, valid only during the call.
pub type tc_abort_hook_t =
    Option<extern "C" fn(code: tc_result_t, message: *const c_char, user_data: *mut c_void)>;

/// The application's hook and its data, called from the comm's threads.
struct CAbortHook {
    hook: extern "C" fn(tc_result_t, *const c_char, *mut c_void),
    user_data: *mut c_void,
}
// The caller promised in tc_comm_set_abort_hook's contract that the hook and
// its data may be used from any thread.
unsafe impl Send for CAbortHook {}
unsafe impl Sync for CAbortHook {}

impl CAbortHook {
    fn call(&self, e: &Error) {
        let message = CString::new(e.message.replace('\0', " ")).unwrap_or_default();
        (self.hook)(e.code(), message.as_ptr(), self.user_data)
    }
}

/// Sets `hook`, called once when the comm becomes aborted: by an operation
/// that failed or timed out (before the process aborts, when abort-on-error
/// is on: the place to flush logs or checkpoints), or by `tc_comm_abort`.
/// It is not called for the abort of a comm destroyed without finalize, and
/// never after `tc_comm_destroy` returned. A NULL `hook` removes it; a new
/// one replaces the old. It runs on the thread that found the failure (the
/// comm's background threads, or the thread of the failing or aborting
/// call) with no lock of the comm held; it may query the comm (e.g.
/// `tc_comm_dump_flight_recorder`) but must not destroy it. `user_data` is
/// passed through untouched. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_comm_set_abort_hook(
    comm: *mut tc_comm_t,
    hook: tc_abort_hook_t,
    user_data: *mut c_void,
) -> tc_result_t {
    boundary("tc_comm_set_abort_hook", || {
        let comm = unsafe { handle_ref(comm, "comm")? };
        comm.inner()?.set_abort_hook(hook.map(|hook| {
            let c = CAbortHook { hook, user_data };
            Box::new(move |e: &Error| c.call(e)) as crate::comm::AbortHook
        }));
        Ok(())
    })
}

/// Creates a sub-communicator of the ranks listed in `ranks` (parent ranks,
/// no duplicates); the new rank is the caller's index in the list.
/// Collective: every rank of `comm` calls it with the same list and name.
/// An empty list (`n == 0`, `ranks` may be NULL) opts out: `*out = NULL`.
/// A non-empty list without the caller is `TC_ERR_INVALID_ARGUMENT`. `name`
/// must be unique among the live comms of this process (parent included):
/// a name in use is `TC_ERR_INVALID_ARGUMENT`, refused before any
/// communication. `opts` may be NULL (inherit timeout and abort-on-error
/// from the parent); its `name` is ignored.
#[no_mangle]
pub extern "C" fn tc_comm_split(
    comm: *mut tc_comm_t,
    ranks: *const c_int,
    n: usize,
    name: *const c_char,
    opts: *const tc_comm_options_t,
    out: *mut *mut tc_comm_t,
) -> tc_result_t {
    boundary("tc_comm_split", || {
        let (comm, out) = unsafe { (handle_ref(comm, "comm")?, arg_out(out, "out")?) };
        let ranks = unsafe { arg_slice(ranks, n, "ranks")? };
        let name = unsafe { c_string(name, "name")? };
        let opts = unsafe { comm_options(opts)? };
        if ranks.is_empty() {
            comm.inner()?.split(ranks, name, opts)?;
            *out = std::ptr::null_mut();
            return Ok(());
        }
        let lease = comm_names::lease(name, "name")?;
        *out = match comm.inner()?.split(ranks, name, opts)? {
            Some(child) => comm_handle(child, lease),
            None => std::ptr::null_mut(),
        };
        Ok(())
    })
}

/// Waits for every operation issued on the comm, and for the asynchronous
/// calls (put, signal, wait_signal) of its windows not yet freed (a pending
/// `tc_window_wait_signal` up to its timeout), then releases its backend
/// resources. Later operations fail with `TC_ERR_INVALID_USAGE`, window
/// calls included (such a window can only be freed: deregister windows
/// before finalize). Returns `TC_ERR_ABORTED` if the comm was aborted, else
/// the first failure of any operation, else the first failure of an
/// asynchronous call of a window not yet freed (a window freed earlier is
/// not reported). Call `tc_comm_destroy` afterwards. From inside an
/// operation hook (`tc_comm_add_pre_hook` / `tc_comm_add_post_hook`; a post
/// hook may run on the comm's progress thread, which finalize would wait
/// for) it fails with `TC_ERR_INVALID_USAGE` and changes nothing.
#[no_mangle]
pub extern "C" fn tc_comm_finalize(comm: *mut tc_comm_t) -> tc_result_t {
    boundary("tc_comm_finalize", || {
        let comm = unsafe { handle_ref(comm, "comm")? };
        refuse_inside_hook("tc_comm_finalize")?;
        match comm.slot() {
            CommSlot::Fixed(comm) => comm.finalize(),
            CommSlot::Reconfigurable(r) => r.finalize(),
        }
    })
}

/// Aborts the comm without waiting for peers: running and pending operations
/// fail with `TC_ERR_ABORTED`, as do later ones. So do the outstanding
/// asynchronous calls of its windows: queued ones at once, the running put,
/// signal or wait by the window being closed as `tc_window_free` closes it
/// (the window then only accepts `tc_window_free`). Thread-safe.
#[no_mangle]
pub extern "C" fn tc_comm_abort(comm: *mut tc_comm_t) -> tc_result_t {
    boundary("tc_comm_abort", || {
        match unsafe { handle_ref(comm, "comm")? }.slot() {
            CommSlot::Fixed(comm) => comm.abort(),
            CommSlot::Reconfigurable(r) => r.abort(),
        }
        Ok(())
    })
}

/// Destroys the handle. NULL is ignored. A comm that was not finalized is
/// aborted first, with a warning. Outstanding work handles stay valid. No
/// other call may use the handle during or after this one; one that does
/// anyway (a second destroy, say) gets `TC_ERR_INVALID_ARGUMENT` ("not a
/// live tc_comm_t"), here a warning with `tc_last_error` set. Its name is
/// free for a new comm once this returns. From inside an operation hook it
/// is refused (`TC_ERR_INVALID_USAGE` in `tc_last_error`, a warning) and the
/// comm stays as it was.
#[no_mangle]
pub extern "C" fn tc_comm_destroy(comm: *mut tc_comm_t) {
    boundary_void("tc_comm_destroy", || {
        if !comm.is_null() {
            refuse_inside_hook("tc_comm_destroy")?;
        }
        if let Some(comm) = unsafe { take_handle(comm, "comm")? } {
            if let Some(current) = comm.slot.formed() {
                current.release();
            }
        }
        Ok(())
    })
}

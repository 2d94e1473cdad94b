//! `tc_comm_register`, `tc_comm_deregister`, `tc_mem_alloc`, `tc_mem_free`:
//! memory registration and the backend's allocator.
//!
//! The `nccl` backend has both (over ncclCommRegister and ncclMemAlloc);
//! `gloo` has the allocator (shared host memory, which same-host peers map
//! for windows) and answers `TC_ERR_UNSUPPORTED` to registration. Arguments are checked
//! in order: NULL pointers, zero sizes, then the comm's state, then the
//! backend.

use crate::error::{tc_result_t, Error};
use crate::ffi::comm::tc_comm_t;
use crate::ffi::{arg_out, boundary, handle_ref};
use std::ffi::c_void;

fn nonzero(bytes: usize) -> crate::error::Result<()> {
    if bytes == 0 {
        return Err(Error::invalid_argument(
            "argument 'bytes': must be greater than 0",
        ));
    }
    Ok(())
}

/// Registers `bytes` bytes of device memory at `buf` with the comm, so that
/// the backend can transfer from and to it without staging copies (nccl:
/// `ncclCommRegister`, NCCL 2.19 or newer). On success `*handle` receives
/// the registration; it may be NULL when the backend registered nothing
/// (e.g. `NCCL_LOCAL_REGISTER=0`), which `tc_comm_deregister` accepts.
///
/// `buf` stays owned by the caller and must stay allocated until it is
/// deregistered. Errors: `TC_ERR_NULL_ARGUMENT` (`comm`, `buf`, `handle`),
/// `TC_ERR_INVALID_ARGUMENT` (`bytes` = 0), `TC_ERR_INVALID_USAGE` after
/// `tc_comm_finalize`, `TC_ERR_ABORTED` after an abort,
/// `TC_ERR_UNSUPPORTED` for a backend or NCCL without registration.
/// `*handle` is written only on success. Thread-safe: serialized with the
/// comm's operations. Not stream-ordered: call it outside graph capture,
/// before the operations that use the buffer.
#[no_mangle]
pub extern "C" fn tc_comm_register(
    comm: *mut tc_comm_t,
    buf: *mut c_void,
    bytes: usize,
    handle: *mut *mut c_void,
) -> tc_result_t {
    boundary("tc_comm_register", || {
        let (comm, handle) = unsafe { (handle_ref(comm, "comm")?, arg_out(handle, "handle")?) };
        if buf.is_null() {
            return Err(Error::null_argument("buf"));
        }
        nonzero(bytes)?;
        *handle = comm.inner()?.register_memory(buf, bytes)?;
        Ok(())
    })
}

/// Releases a registration made by `tc_comm_register` on this comm. NULL
/// is a no-op. After `tc_comm_finalize` or an abort it only forgets the
/// handle (the backend released its registrations with the comm); call it
/// before `tc_comm_destroy` and before freeing the buffer. A handle that is
/// not a live registration of this comm is `TC_ERR_INVALID_ARGUMENT`
/// (nothing is passed to the backend). Thread-safe: serialized with the
/// comm's operations; every operation using the buffer must have completed.
#[no_mangle]
pub extern "C" fn tc_comm_deregister(comm: *mut tc_comm_t, handle: *mut c_void) -> tc_result_t {
    boundary("tc_comm_deregister", || {
        let comm = unsafe { handle_ref(comm, "comm")? };
        if handle.is_null() {
            return Ok(());
        }
        comm.inner()?.deregister_memory(handle)
    })
}

/// Allocates `bytes` bytes from the backend's allocator. nccl: device memory
/// on the comm's device from `ncclMemAlloc` (suited to NVLink SHARP and
/// zero-copy transfers; with an NCCL older than 2.19, plain `cuMemAlloc`),
/// not initialized, freed with a warning by `tc_comm_destroy` if
/// `tc_mem_free` was not called. gloo: zeroed host memory in a shared
/// mapping (memfd) that the comm's ranks on the same host map when it holds
/// a window's buffer (`tc_window_map_remote` then works, and puts are
/// memory copies); left mapped, with a warning, by `tc_comm_destroy` if not
/// freed. On success `*ptr` receives the address. Free it with
/// `tc_mem_free` on the same comm.
///
/// Errors: `TC_ERR_NULL_ARGUMENT` (`comm`, `ptr`), `TC_ERR_INVALID_ARGUMENT`
/// (`bytes` = 0), `TC_ERR_INVALID_USAGE` after `tc_comm_finalize`,
/// `TC_ERR_ABORTED` after an abort, `TC_ERR_UNSUPPORTED` for a backend
/// without an allocator, `TC_ERR_NCCL`/`TC_ERR_CUDA` when allocation fails.
/// `*ptr` is written only on success. Thread-safe. Synchronous: the memory
/// is usable on any stream once this returns.
#[no_mangle]
pub extern "C" fn tc_mem_alloc(
    comm: *mut tc_comm_t,
    bytes: usize,
    ptr: *mut *mut c_void,
) -> tc_result_t {
    boundary("tc_mem_alloc", || {
        let (comm, ptr) = unsafe { (handle_ref(comm, "comm")?, arg_out(ptr, "ptr")?) };
        nonzero(bytes)?;
        *ptr = comm.inner()?.alloc_memory(bytes)?;
        Ok(())
    })
}

/// Frees memory from `tc_mem_alloc` on this comm. NULL is a no-op. Works
/// after `tc_comm_finalize` or an abort, until `tc_comm_destroy`. A pointer
/// that is not a live allocation of this comm is `TC_ERR_INVALID_ARGUMENT`
/// (nothing is freed). Thread-safe. Not stream-ordered: every operation
/// using the memory must have completed (synchronize its streams first).
#[no_mangle]
pub extern "C" fn tc_mem_free(comm: *mut tc_comm_t, ptr: *mut c_void) -> tc_result_t {
    boundary("tc_mem_free", || {
        let comm = unsafe { handle_ref(comm, "comm")? };
        if ptr.is_null() {
            return Ok(());
        }
        comm.inner()?.free_memory(ptr)
    })
}

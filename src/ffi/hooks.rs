//! `tc_comm_add_pre_hook`, `tc_comm_add_post_hook`, `tc_comm_remove_hook`:
//! the application's functions called around every operation of a comm
//! (see [`crate::comm::hooks`] for when and on which thread).

use crate::comm::hooks::{tc_op_buffer_t, HookEvent, HookFn};
use crate::error::{tc_result_t, Error, TC_SUCCESS};
use crate::ffi::comm::tc_comm_t;
use crate::ffi::{boundary, handle_ref};
use crate::types::{tc_dtype_t, tc_reduce_op_t, PremulFactor};
use std::ffi::{c_char, c_int, c_void, CString};

/// `tc_op_info_t.phase` of a pre hook's call.
pub const TC_HOOK_PRE: c_int = 0;
/// `tc_op_info_t.phase` of a post hook's call.
pub const TC_HOOK_POST: c_int = 1;
/// The `tc_op_info_t.version` this library writes. Later versions only add
/// fields at the end (`struct_size` grows); read a field only when
/// `struct_size` covers it. Version 2 added `tag`, `input_tags`,
/// `output_tags` and `window_offset`.
pub const TC_OP_INFO_VERSION: u32 = 2;

/// The description of one operation given to a hook. It and everything it
/// points to are valid only during the hook's call (copy what you keep).
/// Buffers are the caller's addresses (device addresses for CUDA buffers);
/// a hook may read a pre hook's inputs and a completed post hook's outputs
/// if they are host memory; it must not write them.
#[repr(C)]
pub struct tc_op_info_t {
    /// `sizeof(tc_op_info_t)` of the library that wrote it.
    pub struct_size: usize,
    /// `TC_OP_INFO_VERSION` of the library that wrote it.
    pub version: u32,
    /// `TC_HOOK_PRE` or `TC_HOOK_POST`.
    pub phase: c_int,
    /// The operation's name without `tc_` ("all_reduce", "send",
    /// "batch_p2p", ...); a static string.
    pub op_name: *const c_char,
    /// The comm's name.
    pub comm_name: *const c_char,
    /// The operation's sequence number on this comm: the number the flight
    /// recorder shows (`tc_comm_dump_flight_recorder`), from 1; collectives
    /// issued in the same order have the same numbers on every rank. A
    /// window call: its number among the comm's window calls, from 1 (not
    /// in the flight recorder).
    pub seq: u64,
    pub rank: c_int,
    pub size: c_int,
    /// The element type, or -1 (a barrier; a batch mixing types).
    pub dtype: tc_dtype_t,
    /// The root of a rooted collective, else -1.
    pub root: c_int,
    /// The peer of a send or recv, else -1 (a batch's peers are in its
    /// buffers); `TC_ANY_SOURCE` (also -1) on a receive from any source
    /// (a pre hook runs before its sender is known).
    pub peer: c_int,
    /// The reduction of a reducing operation; `kind` -1 otherwise.
    pub reduce_op: tc_reduce_op_t,
    /// 1 when issued with `async_op = 1`.
    pub async_op: c_int,
    /// The buffers the operation reads on this rank (in-place buffers are
    /// listed as inputs and outputs).
    pub inputs: *const tc_op_buffer_t,
    pub num_inputs: usize,
    /// The buffers it writes on this rank.
    pub outputs: *const tc_op_buffer_t,
    pub num_outputs: usize,
    /// Post hooks: `TC_SUCCESS` or the operation's error code. Pre: 0.
    pub status: tc_result_t,
    /// Post hooks: the error's detail (as `tc_last_error` would give it),
    /// or NULL on success. Pre: NULL.
    pub message: *const c_char,
    /// Post hooks: 1 when the operation finished; 0 when it is a device
    /// operation only enqueued on its stream. Pre: 0.
    pub completed: c_int,
    /// Version 2. The tag of a send or recv (`opts->tag`, 0 when untagged);
    /// 0 for other operations (a batch's tags are in `input_tags` /
    /// `output_tags`).
    pub tag: u32,
    /// Version 2. Send, recv and batch: `input_tags[i]` is the tag of
    /// `inputs[i]` (a send) and `output_tags[i]` that of `outputs[i]` (a
    /// receive). NULL for other operations.
    pub input_tags: *const u32,
    pub output_tags: *const u32,
    /// Version 2. A window put or get: the byte offset in the target's
    /// window (the rank is `peer`, the local buffer and its size in bytes
    /// the one input of a put or output of a get); 0 otherwise.
    pub window_offset: usize,
}

/// An operation hook: called with the operation's description and the
/// `user_data` given at registration; returns nothing.
pub type tc_op_hook_t = Option<extern "C" fn(info: *const tc_op_info_t, user_data: *mut c_void)>;

struct CHook {
    hook: extern "C" fn(*const tc_op_info_t, *mut c_void),
    user_data: *mut c_void,
    comm_name: CString,
    rank: c_int,
    size: c_int,
}
// The registration's contract: the hook and its data may be used from any
// thread (the comm's progress thread among them).
unsafe impl Send for CHook {}
unsafe impl Sync for CHook {}

fn reduce_op_to_c(event: &HookEvent) -> tc_reduce_op_t {
    let Some(op) = event.record.reduce_op else {
        return tc_reduce_op_t {
            kind: -1,
            premul_factor: 0.0,
            premul_factor_ptr: std::ptr::null(),
        };
    };
    let kind = crate::types::RedKind::ALL
        .iter()
        .position(|k| *k == op.kind)
        .map_or(-1, |i| i as c_int);
    let (premul_factor, premul_factor_ptr) = match op.factor {
        PremulFactor::Host(f) => (f, std::ptr::null()),
        PremulFactor::Pointer(p) => (0.0, p),
    };
    tc_reduce_op_t {
        kind,
        premul_factor,
        premul_factor_ptr,
    }
}

/// NULL for an operation without tags.
fn tags_ptr(tags: &[u32]) -> *const u32 {
    if tags.is_empty() {
        std::ptr::null()
    } else {
        tags.as_ptr()
    }
}

impl CHook {
    fn call(&self, event: &HookEvent) {
        let r = event.record;
        let name = crate::comm::hooks::c_op_name(r.name);
        let (status, message) = match event.outcome {
            None | Some(Ok(())) => (TC_SUCCESS, None),
            Some(Err(e)) => (e.code(), CString::new(e.message.replace('\0', " ")).ok()),
        };
        let info = tc_op_info_t {
            struct_size: std::mem::size_of::<tc_op_info_t>(),
            version: TC_OP_INFO_VERSION,
            phase: if event.outcome.is_some() {
                TC_HOOK_POST
            } else {
                TC_HOOK_PRE
            },
            op_name: name.as_ptr(),
            comm_name: self.comm_name.as_ptr(),
            seq: r.seq,
            rank: self.rank,
            size: self.size,
            dtype: r.dtype.map_or(-1, |d| d.to_c()),
            root: r.root,
            peer: r.peer,
            reduce_op: reduce_op_to_c(event),
            async_op: r.async_op as c_int,
            inputs: r.inputs.as_ptr(),
            num_inputs: r.inputs.len(),
            outputs: r.outputs.as_ptr(),
            num_outputs: r.outputs.len(),
            status,
            message: message.as_ref().map_or(std::ptr::null(), |m| m.as_ptr()),
            completed: event.completed as c_int,
            tag: r.tag,
            input_tags: tags_ptr(&r.input_tags),
            output_tags: tags_ptr(&r.output_tags),
            window_offset: r.window_offset,
        };
        (self.hook)(&info, self.user_data)
    }
}

fn add(
    func: &'static str,
    post: bool,
    comm: *mut tc_comm_t,
    hook: tc_op_hook_t,
    user_data: *mut c_void,
    id: *mut u64,
) -> tc_result_t {
    boundary(func, || {
        let comm = unsafe { handle_ref(comm, "comm")? }.inner()?;
        let hook = hook.ok_or_else(|| Error::null_argument("hook"))?;
        let c = CHook {
            hook,
            user_data,
            comm_name: CString::new(comm.name()).unwrap_or_default(),
            rank: comm.rank(),
            size: comm.size(),
        };
        let f: HookFn = Box::new(move |event: &HookEvent| c.call(event));
        let new_id = comm.hooks().add(post, f)?;
        if !id.is_null() {
            unsafe { *id = new_id };
        }
        Ok(())
    })
}

/// Registers `hook`, called with `user_data` before every operation that
/// `comm` issues after this returns: collectives, send/recv, batches, and
/// the operations of the coalesced, reducer and sparse APIs on this comm,
/// and the calls of its windows (`tc_window_put`, `_get`, `_signal`,
/// `_wait_signal`: `op_name` "window_put", ..., the target rank in `peer`,
/// a put's source or a get's destination as its one buffer with `count` in
/// bytes, `window_offset`; `seq` counts the comm's window calls apart from
/// its operations, from 1; a zero-byte put or get does nothing and runs no
/// hook). It runs on the calling thread after the
/// operation's arguments were validated (a call refused by validation runs
/// no hook) and before anything is sent. Hooks run in registration order.
/// `*id` (if `id` is not NULL) receives the id for `tc_comm_remove_hook`.
/// A hook must not issue operations or window calls on `comm` nor register or remove hooks
/// of any comm (such calls fail with `TC_ERR_INVALID_USAGE`), must not
/// destroy `comm`, and should not issue operations on other comms (not
/// checked; it would stall the thread running the hook, which may be the
/// comm's progress thread); it may query (`tc_comm_get_rank`,
/// `tc_comm_dump_flight_recorder`, ...). `hook` and
/// `user_data` must be usable from any thread until the hook is removed or
/// the comm destroyed. Thread-safe. NULL `hook`: `TC_ERR_NULL_ARGUMENT`.
#[no_mangle]
pub extern "C" fn tc_comm_add_pre_hook(
    comm: *mut tc_comm_t,
    hook: tc_op_hook_t,
    user_data: *mut c_void,
    id: *mut u64,
) -> tc_result_t {
    add("tc_comm_add_pre_hook", false, comm, hook, user_data, id)
}

/// Registers `hook`, called once with the outcome (`status`, `message`,
/// `completed`) of every operation issued after this returns whose pre
/// hooks ran (same operations as `tc_comm_add_pre_hook`). Host operations
/// (gloo): when the operation finished, on the thread that ran it (for
/// `async_op = 1` the comm's progress thread, or the calling thread when
/// a point-to-point call completed at once there, or a thread in
/// `tc_work_wait` or a blocking call that ran the queued operations ahead
/// of its own while nothing else ran; for a blocking call the calling
/// thread, or the progress thread when the call queued behind earlier
/// asynchronous operations), before its work reports completion:
/// once `tc_work_wait`
/// returned or a blocking call returned, its post hooks have run (for
/// CUDA buffers staged through host memory, before the outputs are copied
/// back to the device). Device operations (nccl): on the calling thread
/// once enqueued on the stream, with `completed` = 0. An operation failed
/// before issue (by the NaN check, on a comm shutting down): on the calling
/// thread with the failure. A work that times out gets its post hooks when
/// the operation's run ends (after the comm's abort at the latest). Window
/// calls: when the call ended, on the thread that ran it (the caller's for
/// a blocking call, the window's worker thread for `async_op = 1`), before
/// its work completes; a call discarded before it ran (window freed, comm
/// aborted) gets them with `TC_ERR_ABORTED` on the thread that discarded
/// it. Same
/// rules as pre hooks for `id`, reentry, lifetime and threads.
#[no_mangle]
pub extern "C" fn tc_comm_add_post_hook(
    comm: *mut tc_comm_t,
    hook: tc_op_hook_t,
    user_data: *mut c_void,
    id: *mut u64,
) -> tc_result_t {
    add("tc_comm_add_post_hook", true, comm, hook, user_data, id)
}

/// Removes the pre or post hook `id` of `comm`. When this returns, the hook
/// is not running and will not be called again, so its `user_data` may be
/// freed (it waits for calls in progress on other threads). An id not
/// registered on `comm` (never, or already removed): `TC_ERR_NOT_FOUND`.
/// Must not be called from inside a hook (`TC_ERR_INVALID_USAGE`).
/// `tc_comm_destroy` removes every hook. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_comm_remove_hook(comm: *mut tc_comm_t, id: u64) -> tc_result_t {
    boundary("tc_comm_remove_hook", || {
        let comm = unsafe { handle_ref(comm, "comm")? };
        comm.inner()?.hooks().remove(id)
    })
}

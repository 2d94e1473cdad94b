//! `tc_comm_*` and the operations (`tc_send`, `tc_all_reduce`, ...).
//!
//! Every operation returns when it is enqueued (`async_op = 1`) or, with
//! `async_op = 0`, when host buffers are complete / device work is on the
//! caller's stream. Buffers must stay valid until the work completes.

use crate::comm::{Comm, CommOptions, Op, OpOptions, P2p, Ptr};
use crate::error::{tc_result_t, Error, Result};
use crate::ffi::work::tc_work_t;
use crate::ffi::{
    arg_out, arg_ref, arg_slice, boundary, boundary_void, into_handle, malloc_copy, take_handle,
};
use crate::options::{read_versioned, tc_comm_options_t, tc_op_options_t, timeout_from_ms};
use crate::types::{
    c_string, hints_from_c, tc_device_t, tc_dtype_t, tc_reduce_op_t, DType, Device, ReduceOp,
};
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Arc;

/// A communicator. Operations on one comm may be issued from several threads;
/// they run in the order the library received them, so ranks must agree on
/// that order (as with NCCL, serialize issuing if threads race).
pub struct tc_comm {
    pub(crate) inner: Arc<Comm>,
    name: CString,
    backend: CString,
}

pub type tc_comm_t = tc_comm;

/// A batch of sends and receives issued together by `tc_batch_issue`.
/// Not thread-safe: build a batch from one thread.
pub struct tc_batch {
    comm: Arc<Comm>,
    ops: Vec<P2p>,
}

pub type tc_batch_t = tc_batch;

unsafe fn comm_options(p: *const tc_comm_options_t) -> Result<CommOptions> {
    let o = read_versioned(p, "opts")?;
    let name = if o.name.is_null() {
        None
    } else {
        Some(c_string(o.name, "opts.name")?.to_string())
    };
    let store = if o.store.is_null() {
        None
    } else {
        Some((*o.store).inner.clone())
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
    Ok(CommOptions {
        name,
        timeout: timeout_from_ms(o.timeout_ms),
        abort_on_error,
        rank: explicit(o.rank, "opts.rank")?,
        world_size: explicit(o.world_size, "opts.world_size")?,
        store,
        hints: hints_from_c(o.hints, o.num_hints, "opts.hints")?,
    })
}

pub(crate) unsafe fn op_options(p: *const tc_op_options_t) -> Result<OpOptions> {
    let o = read_versioned(p, "opts")?;
    let async_op = match o.async_op {
        0 => false,
        1 => true,
        v => {
            return Err(Error::invalid_argument(format!(
                "argument 'opts.async_op': {v} is not 0 or 1"
            )))
        }
    };
    Ok(OpOptions {
        async_op,
        timeout: timeout_from_ms(o.timeout_ms),
        stream: o.stream,
        hints: hints_from_c(o.hints, o.num_hints, "opts.hints")?,
    })
}

fn comm_handle(inner: Arc<Comm>) -> *mut tc_comm_t {
    let name = CString::new(inner.name()).unwrap_or_default();
    let backend = CString::new(inner.backend_name()).unwrap_or_default();
    into_handle(tc_comm {
        inner,
        name,
        backend,
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
        let opts = unsafe { comm_options(opts)? };
        *out = comm_handle(Comm::new(backend, device, opts)?);
        Ok(())
    })
}

/// Writes this process's rank in the comm. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_comm_get_rank(comm: *const tc_comm_t, rank: *mut c_int) -> tc_result_t {
    boundary("tc_comm_get_rank", || {
        let (comm, rank) = unsafe { (arg_ref(comm, "comm")?, arg_out(rank, "rank")?) };
        *rank = comm.inner.rank();
        Ok(())
    })
}

/// Writes the number of ranks of the comm. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_comm_get_size(comm: *const tc_comm_t, size: *mut c_int) -> tc_result_t {
    boundary("tc_comm_get_size", || {
        let (comm, size) = unsafe { (arg_ref(comm, "comm")?, arg_out(size, "size")?) };
        *size = comm.inner.size();
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
        let (comm, name) = unsafe { (arg_ref(comm, "comm")?, arg_out(name, "name")?) };
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
        let (comm, backend) = unsafe { (arg_ref(comm, "comm")?, arg_out(backend, "backend")?) };
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
        let (comm, device) = unsafe { (arg_ref(comm, "comm")?, arg_out(device, "device")?) };
        *device = comm.inner.device().to_c();
        Ok(())
    })
}

/// Returns `TC_SUCCESS` while the comm is healthy, else the code of the
/// failure that aborted it (found by a background thread), with its detail in
/// `tc_last_error`. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_comm_get_async_error(comm: *const tc_comm_t) -> tc_result_t {
    boundary("tc_comm_get_async_error", || {
        let comm = unsafe { arg_ref(comm, "comm")? };
        comm.inner.async_error().map_or(Ok(()), Err)
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
        let (comm, out) = unsafe { (arg_ref(comm, "comm")?, arg_out(text, "text")?) };
        let mut bytes = comm.inner.dump_flight_recorder().into_bytes();
        bytes.push(0);
        *out = malloc_copy(&bytes)?.cast::<c_char>();
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
        let comm = unsafe { arg_ref(comm, "comm")? };
        comm.inner.set_abort_hook(hook.map(|hook| {
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
/// must be unique among live comms; `opts` may be NULL (inherit timeout and
/// abort-on-error from the parent).
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
        let (comm, out) = unsafe { (arg_ref(comm, "comm")?, arg_out(out, "out")?) };
        let ranks = unsafe { arg_slice(ranks, n, "ranks")? };
        let name = unsafe { c_string(name, "name")? };
        let opts = unsafe { comm_options(opts)? };
        *out = match comm.inner.split(ranks, name, opts)? {
            Some(child) => comm_handle(child),
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
/// not reported). Call `tc_comm_destroy` afterwards.
#[no_mangle]
pub extern "C" fn tc_comm_finalize(comm: *mut tc_comm_t) -> tc_result_t {
    boundary("tc_comm_finalize", || {
        unsafe { arg_ref(comm, "comm")? }.inner.finalize()
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
        unsafe { arg_ref(comm, "comm")? }.inner.abort();
        Ok(())
    })
}

/// Destroys the handle. NULL is ignored. A comm that was not finalized is
/// aborted first, with a warning. Outstanding work handles stay valid. No
/// other call may use the handle during or after this one.
#[no_mangle]
pub extern "C" fn tc_comm_destroy(comm: *mut tc_comm_t) {
    boundary_void("tc_comm_destroy", || {
        if let Some(comm) = unsafe { take_handle(comm) } {
            comm.inner.release();
        }
        Ok(())
    })
}

/// Shared body of every operation: reads the options, builds and submits
/// the operation, hands out the work handle if asked.
fn issue(
    func: &'static str,
    comm: *mut tc_comm_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
    build: impl FnOnce(&Comm) -> Result<Op>,
) -> tc_result_t {
    boundary(func, || {
        let comm = unsafe { arg_ref(comm, "comm")? };
        let opts = unsafe { op_options(opts)? };
        let op = build(&comm.inner)?;
        let w = comm.inner.submit(op, &opts)?;
        hand_out_work(work, w, &comm.inner);
        Ok(())
    })
}

/// Gives the caller a handle to `w` when it asked for one (`out` non-NULL);
/// the handle keeps `comm` alive.
pub(crate) fn hand_out_work(
    out: *mut *mut tc_work_t,
    w: Arc<dyn crate::work::Work>,
    comm: &Arc<Comm>,
) {
    if !out.is_null() {
        unsafe {
            *out = into_handle(crate::ffi::work::tc_work {
                inner: w,
                _comm: comm.clone(),
            })
        };
    }
}

fn dtype(dt: tc_dtype_t) -> Result<DType> {
    DType::from_c(dt, "dtype")
}

fn reduce_op(op: &tc_reduce_op_t) -> Result<ReduceOp> {
    ReduceOp::from_c(op, "op")
}

/// Reads one pointer per rank.
unsafe fn ptr_list<T>(p: *const *mut T, n: usize, arg: &str) -> Result<Vec<Ptr>> {
    Ok(arg_slice(p, n, arg)?
        .iter()
        .map(|b| Ptr(*b as *mut c_void))
        .collect())
}

unsafe fn count_list(p: *const usize, n: usize, arg: &str) -> Result<Vec<usize>> {
    Ok(arg_slice(p, n, arg)?.to_vec())
}

/// Sends `count` elements at `buf` to rank `peer`; pairs with its `tc_recv`.
/// `work` may be NULL. `opts` may be NULL (defaults).
#[no_mangle]
pub extern "C" fn tc_send(
    comm: *mut tc_comm_t,
    buf: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_send", comm, opts, work, |_| {
        Ok(Op::Send {
            buf: Ptr(buf as *mut c_void),
            count,
            dtype: dtype(dt)?,
            peer,
        })
    })
}

/// Receives `count` elements from rank `peer` into `buf`. The sizes of a
/// send/recv pair must agree (`TC_ERR_INVALID_USAGE` otherwise).
#[no_mangle]
pub extern "C" fn tc_recv(
    comm: *mut tc_comm_t,
    buf: *mut c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_recv", comm, opts, work, |_| {
        Ok(Op::Recv {
            buf: Ptr(buf),
            count,
            dtype: dtype(dt)?,
            peer,
        })
    })
}

/// Starts an empty batch of point-to-point operations on `comm`. Free it with
/// `tc_batch_free` (after `tc_batch_issue` or instead of it).
#[no_mangle]
pub extern "C" fn tc_batch_begin(comm: *mut tc_comm_t, batch: *mut *mut tc_batch_t) -> tc_result_t {
    boundary("tc_batch_begin", || {
        let (comm, out) = unsafe { (arg_ref(comm, "comm")?, arg_out(batch, "batch")?) };
        *out = into_handle(tc_batch {
            comm: comm.inner.clone(),
            ops: Vec::new(),
        });
        Ok(())
    })
}

fn batch_add(
    func: &'static str,
    batch: *mut tc_batch_t,
    is_send: bool,
    buf: *mut c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
) -> tc_result_t {
    boundary(func, || {
        let batch = unsafe { batch.as_mut() }.ok_or_else(|| Error::null_argument("batch"))?;
        batch.ops.push(P2p {
            is_send,
            buf: Ptr(buf),
            count,
            dtype: dtype(dt)?,
            peer,
        });
        Ok(())
    })
}

/// Adds a send of `count` elements at `buf` to `peer` to the batch.
#[no_mangle]
pub extern "C" fn tc_batch_send(
    batch: *mut tc_batch_t,
    buf: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
) -> tc_result_t {
    batch_add(
        "tc_batch_send",
        batch,
        true,
        buf as *mut c_void,
        count,
        dt,
        peer,
    )
}

/// Adds a receive of `count` elements from `peer` into `buf` to the batch.
#[no_mangle]
pub extern "C" fn tc_batch_recv(
    batch: *mut tc_batch_t,
    buf: *mut c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
) -> tc_result_t {
    batch_add("tc_batch_recv", batch, false, buf, count, dt, peer)
}

/// Issues every operation of the batch as one operation with one work. The
/// batch stays owned by the caller (free it with `tc_batch_free`) and is
/// emptied.
#[no_mangle]
pub extern "C" fn tc_batch_issue(
    batch: *mut tc_batch_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    boundary("tc_batch_issue", || {
        let batch = unsafe { batch.as_mut() }.ok_or_else(|| Error::null_argument("batch"))?;
        let op_opts = unsafe { op_options(opts)? };
        let w = batch.comm.submit(
            Op::Batch {
                ops: std::mem::take(&mut batch.ops),
            },
            &op_opts,
        )?;
        hand_out_work(work, w, &batch.comm);
        Ok(())
    })
}

/// Frees a batch. NULL is ignored.
#[no_mangle]
pub extern "C" fn tc_batch_free(batch: *mut tc_batch_t) {
    boundary_void("tc_batch_free", || {
        drop(unsafe { take_handle(batch) });
        Ok(())
    })
}

/// Broadcasts `count` elements of `buf` from `root` to every rank, in place.
#[no_mangle]
pub extern "C" fn tc_broadcast(
    comm: *mut tc_comm_t,
    buf: *mut c_void,
    count: usize,
    dt: tc_dtype_t,
    root: c_int,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_broadcast", comm, opts, work, |_| {
        Ok(Op::Broadcast {
            buf: Ptr(buf),
            count,
            dtype: dtype(dt)?,
            root,
        })
    })
}

/// Reduces `buf` across ranks with `op`, in place; the result is defined on
/// `root` only.
#[no_mangle]
pub extern "C" fn tc_reduce(
    comm: *mut tc_comm_t,
    buf: *mut c_void,
    count: usize,
    dt: tc_dtype_t,
    root: c_int,
    op: tc_reduce_op_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_reduce", comm, opts, work, |_| {
        Ok(Op::Reduce {
            buf: Ptr(buf),
            count,
            dtype: dtype(dt)?,
            root,
            op: reduce_op(&op)?,
        })
    })
}

/// Reduces `buf` across ranks with `op`, in place, on every rank.
#[no_mangle]
pub extern "C" fn tc_all_reduce(
    comm: *mut tc_comm_t,
    buf: *mut c_void,
    count: usize,
    dt: tc_dtype_t,
    op: tc_reduce_op_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_all_reduce", comm, opts, work, |_| {
        Ok(Op::AllReduce {
            buf: Ptr(buf),
            count,
            dtype: dtype(dt)?,
            op: reduce_op(&op)?,
        })
    })
}

/// Gathers `count` elements of `input` from every rank into `outputs[r]`
/// (an array of size-of-comm buffers of `count` elements each).
#[no_mangle]
pub extern "C" fn tc_all_gather(
    comm: *mut tc_comm_t,
    outputs: *const *mut c_void,
    input: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_all_gather", comm, opts, work, |c| {
        let outputs = unsafe { ptr_list(outputs, c.size() as usize, "outputs")? };
        Ok(Op::AllGather {
            outputs,
            input: Ptr(input as *mut c_void),
            count,
            dtype: dtype(dt)?,
        })
    })
}

/// Gathers `count` elements of `input` from every rank into `output`
/// (`count * size` elements, rank r's at offset `r * count`).
#[no_mangle]
pub extern "C" fn tc_all_gather_single(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    input: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_all_gather_single", comm, opts, work, |_| {
        Ok(Op::AllGatherSingle {
            output: Ptr(output),
            input: Ptr(input as *mut c_void),
            count,
            dtype: dtype(dt)?,
        })
    })
}

/// Gathers `counts[r]` elements from each rank r into `output`, in rank order
/// (`sum(counts)` elements). `counts` has one entry per rank and must be the
/// same on every rank; this rank's `input` has `counts[rank]` elements.
#[no_mangle]
pub extern "C" fn tc_all_gather_v(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    counts: *const usize,
    input: *const c_void,
    dt: tc_dtype_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_all_gather_v", comm, opts, work, |c| {
        let counts = unsafe { count_list(counts, c.size() as usize, "counts")? };
        Ok(Op::AllGatherV {
            output: Ptr(output),
            input: Ptr(input as *mut c_void),
            counts,
            dtype: dtype(dt)?,
        })
    })
}

/// Reduces `inputs[r]` (one buffer of `count` elements per rank) across
/// ranks with `op`; rank r receives block r in `output`.
#[no_mangle]
pub extern "C" fn tc_reduce_scatter(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    inputs: *const *const c_void,
    count: usize,
    dt: tc_dtype_t,
    op: tc_reduce_op_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_reduce_scatter", comm, opts, work, |c| {
        let inputs =
            unsafe { ptr_list(inputs as *const *mut c_void, c.size() as usize, "inputs")? };
        Ok(Op::ReduceScatter {
            output: Ptr(output),
            inputs,
            count,
            dtype: dtype(dt)?,
            op: reduce_op(&op)?,
        })
    })
}

/// Reduces `input` (`count * size` elements) across ranks with `op`; rank r
/// receives the `count` elements of block r in `output`.
#[no_mangle]
pub extern "C" fn tc_reduce_scatter_single(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    input: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    op: tc_reduce_op_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_reduce_scatter_single", comm, opts, work, |_| {
        Ok(Op::ReduceScatterSingle {
            output: Ptr(output),
            input: Ptr(input as *mut c_void),
            count,
            dtype: dtype(dt)?,
            op: reduce_op(&op)?,
        })
    })
}

/// Reduces `input` (`sum(counts)` elements, block r `counts[r]` long) across
/// ranks with `op`; rank r receives block r (`counts[r]` elements) in
/// `output`. `counts` must be the same on every rank.
#[no_mangle]
pub extern "C" fn tc_reduce_scatter_v(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    input: *const c_void,
    counts: *const usize,
    dt: tc_dtype_t,
    op: tc_reduce_op_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_reduce_scatter_v", comm, opts, work, |c| {
        let counts = unsafe { count_list(counts, c.size() as usize, "counts")? };
        Ok(Op::ReduceScatterV {
            output: Ptr(output),
            input: Ptr(input as *mut c_void),
            counts,
            dtype: dtype(dt)?,
            op: reduce_op(&op)?,
        })
    })
}

/// Sends `inputs[r]` to rank r and receives rank r's block into `outputs[r]`
/// (`count` elements each; one buffer per rank in each list).
#[no_mangle]
pub extern "C" fn tc_all_to_all(
    comm: *mut tc_comm_t,
    outputs: *const *mut c_void,
    inputs: *const *const c_void,
    count: usize,
    dt: tc_dtype_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_all_to_all", comm, opts, work, |c| {
        let n = c.size() as usize;
        let outputs = unsafe { ptr_list(outputs, n, "outputs")? };
        let inputs = unsafe { ptr_list(inputs as *const *mut c_void, n, "inputs")? };
        Ok(Op::AllToAll {
            outputs,
            inputs,
            count,
            dtype: dtype(dt)?,
        })
    })
}

/// All-to-all on contiguous buffers: block r of `input` (`count` elements)
/// goes to rank r; block r of `output` comes from rank r.
#[no_mangle]
pub extern "C" fn tc_all_to_all_single(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    input: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_all_to_all_single", comm, opts, work, |_| {
        Ok(Op::AllToAllSingle {
            output: Ptr(output),
            input: Ptr(input as *mut c_void),
            count,
            dtype: dtype(dt)?,
        })
    })
}

/// All-to-all with per-rank counts (elements): `input_counts[r]` elements of
/// `input` go to rank r, `output_counts[r]` elements from rank r land in
/// `output`; blocks are contiguous in rank order. Each pair of counts must
/// agree between sender and receiver.
#[no_mangle]
pub extern "C" fn tc_all_to_all_v_single(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    output_counts: *const usize,
    input: *const c_void,
    input_counts: *const usize,
    dt: tc_dtype_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_all_to_all_v_single", comm, opts, work, |c| {
        let n = c.size() as usize;
        Ok(Op::AllToAllVSingle {
            output: Ptr(output),
            output_counts: unsafe { count_list(output_counts, n, "output_counts")? },
            input: Ptr(input as *mut c_void),
            input_counts: unsafe { count_list(input_counts, n, "input_counts")? },
            dtype: dtype(dt)?,
        })
    })
}

/// Returns (or completes its work) when every rank has entered the barrier.
#[no_mangle]
pub extern "C" fn tc_barrier(
    comm: *mut tc_comm_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_barrier", comm, opts, work, |_| Ok(Op::Barrier))
}

/// Sends `inputs[r]` (on `root`: one buffer of `count` elements per rank) to
/// rank r's `output`. `inputs` is ignored and may be NULL on other ranks.
#[no_mangle]
pub extern "C" fn tc_scatter(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    inputs: *const *const c_void,
    count: usize,
    dt: tc_dtype_t,
    root: c_int,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_scatter", comm, opts, work, |c| {
        let inputs = if c.rank() == root {
            unsafe { ptr_list(inputs as *const *mut c_void, c.size() as usize, "inputs")? }
        } else {
            Vec::new()
        };
        Ok(Op::Scatter {
            output: Ptr(output),
            inputs,
            count,
            dtype: dtype(dt)?,
            root,
        })
    })
}

/// Gathers `count` elements of `input` from every rank into `outputs[r]` on
/// `root`. `outputs` is ignored and may be NULL on other ranks.
#[no_mangle]
pub extern "C" fn tc_gather(
    comm: *mut tc_comm_t,
    outputs: *const *mut c_void,
    input: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    root: c_int,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_gather", comm, opts, work, |c| {
        let outputs = if c.rank() == root {
            unsafe { ptr_list(outputs, c.size() as usize, "outputs")? }
        } else {
            Vec::new()
        };
        Ok(Op::Gather {
            outputs,
            input: Ptr(input as *mut c_void),
            count,
            dtype: dtype(dt)?,
            root,
        })
    })
}

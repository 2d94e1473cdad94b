//! Point-to-point operations: `tc_send`, `tc_recv` and batches of sends
//! and receives (`tc_batch_*`).

use super::*;

const _: () = assert!(crate::options::TC_ANY_SOURCE == crate::op::ANY_SOURCE);

/// Sends `count` elements at `buf` to rank `peer`; pairs with the receive
/// of `peer` with the same tag (`opts->tag`, version 2 of the options; 0
/// when unset). Matching is by (peer, tag); sends and receives of one
/// (peer, tag) pair up in issue order. Operations of a comm run in issue
/// order (as on NCCL), so a receive waits for the send of its tag even if
/// the peer issues that send after others: a tag selects among transfers in
/// flight together (a batch), and never lets a receive take the data of a
/// send with another tag. On `nccl`, a non-zero tag is refused
/// (`TC_ERR_UNSUPPORTED`: NCCL matches by peer and order only). A send
/// refused here (a bad argument) fails only this rank: the peer's receive
/// waits until its timeout, or takes this rank's next send to it.
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
        Ok(Op::send(
            Ptr(buf as *mut c_void),
            count,
            dtype(dt)?,
            peer,
            0,
        ))
    })
}

/// Receives `count` elements from rank `peer` into `buf`, from the send of
/// `peer` with the same tag (`opts->tag`; see `tc_send`). The sizes of a
/// send/recv pair must agree (`TC_ERR_INVALID_USAGE` otherwise, naming
/// both).
///
/// `peer` may be `TC_ANY_SOURCE`: the receive then takes the first message
/// with its tag from whichever other rank's send comes first (never from
/// this rank itself: a send to self pairs only with a receive naming this
/// rank). Messages of one sender with one tag are still taken in that
/// sender's issue order (non-overtaking, as MPI), and the receive runs in
/// this comm's issue order like every operation. `tc_work_source` on its
/// work gives the sender (ask for the work, also with `async_op = 0`). A
/// size mismatch fails it with `TC_ERR_INVALID_USAGE` naming the sender;
/// that message is consumed. Waiting for it, the loss of any other rank
/// (its process exited, it destroyed the comm) fails it with
/// `TC_ERR_REMOTE` naming that rank, the comm's timeout with
/// `TC_ERR_TIMEOUT`. Host comms only: on `nccl` it fails with
/// `TC_ERR_UNSUPPORTED`; a comm of one rank refuses it
/// (`TC_ERR_INVALID_USAGE`); batches do not take it (see
/// `tc_batch_recv`).
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
        Ok(Op::recv(Ptr(buf), count, dtype(dt)?, peer, 0))
    })
}

/// Starts an empty batch of point-to-point operations on `comm`. Free it with
/// `tc_batch_free` (after `tc_batch_issue` or instead of it).
#[no_mangle]
pub extern "C" fn tc_batch_begin(comm: *mut tc_comm_t, batch: *mut *mut tc_batch_t) -> tc_result_t {
    boundary("tc_batch_begin", || {
        let (comm, out) = unsafe { (handle_ref(comm, "comm")?, arg_out(batch, "batch")?) };
        *out = into_handle(tc_batch {
            comm: comm.inner()?.clone(),
            ops: Vec::new(),
        });
        Ok(())
    })
}

/// Adds the entry `build` makes to the batch (its errors leave it as it was).
fn batch_add(
    func: &'static str,
    batch: *mut tc_batch_t,
    build: impl FnOnce() -> Result<P2p>,
) -> tc_result_t {
    boundary(func, || {
        let batch = unsafe { handle_mut(batch, "batch")? };
        batch.ops.push(build()?);
        Ok(())
    })
}

/// One batch entry.
fn entry(
    is_send: bool,
    buf: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
    tag: u32,
) -> Result<P2p> {
    Ok(P2p {
        is_send,
        buf: Ptr(buf as *mut c_void),
        count,
        dtype: dtype(dt)?,
        peer,
        tag,
        source: None,
    })
}

/// Adds a send of `count` elements at `buf` to `peer` to the batch (tag 0).
#[no_mangle]
pub extern "C" fn tc_batch_send(
    batch: *mut tc_batch_t,
    buf: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
) -> tc_result_t {
    batch_add("tc_batch_send", batch, || {
        entry(true, buf, count, dt, peer, 0)
    })
}

/// Adds a receive of `count` elements from `peer` into `buf` to the batch
/// (tag 0). `peer` must name a rank: `TC_ANY_SOURCE` makes `tc_batch_issue`
/// fail with `TC_ERR_UNSUPPORTED` naming `batch[i].peer` (its match would
/// depend on which of the batch's other receives matched first).
#[no_mangle]
pub extern "C" fn tc_batch_recv(
    batch: *mut tc_batch_t,
    buf: *mut c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
) -> tc_result_t {
    batch_add("tc_batch_recv", batch, || {
        entry(false, buf, count, dt, peer, 0)
    })
}

/// Adds a send of `count` elements at `buf` to `peer` with tag `tag` to the
/// batch: it matches the receive of `peer` with the same tag, whatever the
/// order of the entries in either rank's batch (the entries of a batch are
/// in flight together). Entries of one (peer, tag) pair up in order. On
/// `nccl`, a non-zero tag makes `tc_batch_issue` fail with
/// `TC_ERR_UNSUPPORTED`. `tc_batch_send` is this with tag 0.
#[no_mangle]
pub extern "C" fn tc_batch_send_tagged(
    batch: *mut tc_batch_t,
    buf: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
    tag: u32,
) -> tc_result_t {
    batch_add("tc_batch_send_tagged", batch, || {
        entry(true, buf, count, dt, peer, tag)
    })
}

/// Adds a receive of `count` elements from `peer` into `buf`, matching the
/// send of `peer` with tag `tag` (see `tc_batch_send_tagged`).
/// `tc_batch_recv` is this with tag 0.
#[no_mangle]
pub extern "C" fn tc_batch_recv_tagged(
    batch: *mut tc_batch_t,
    buf: *mut c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
    tag: u32,
) -> tc_result_t {
    batch_add("tc_batch_recv_tagged", batch, || {
        entry(false, buf, count, dt, peer, tag)
    })
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
        let batch = unsafe { handle_mut(batch, "batch")? };
        let op_opts = unsafe { op_options(opts)? };
        let w = batch
            .comm
            .submit(Op::batch(std::mem::take(&mut batch.ops)), &op_opts)?;
        hand_out_work(work, w, &batch.comm);
        Ok(())
    })
}

/// Frees a batch. NULL is ignored; a handle that is not a live batch (freed
/// already) is left alone with a warning and `tc_last_error` set.
#[no_mangle]
pub extern "C" fn tc_batch_free(batch: *mut tc_batch_t) {
    boundary_void("tc_batch_free", || {
        drop(unsafe { take_handle(batch, "batch")? });
        Ok(())
    })
}

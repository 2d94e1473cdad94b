//! The collectives: `tc_broadcast`, `tc_reduce`, `tc_all_reduce`, the
//! all-gathers, reduce-scatters and all-to-alls, `tc_barrier`, `tc_scatter`
//! and the gathers.

use super::*;

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
        Ok(Op::broadcast(Ptr(buf), count, dtype(dt)?, root))
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
        Ok(Op::reduce(
            Ptr(buf),
            count,
            dtype(dt)?,
            root,
            reduce_op(&op)?,
        ))
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
        Ok(Op::all_reduce(Ptr(buf), count, dtype(dt)?, reduce_op(&op)?))
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
        Ok(Op::all_gather(
            outputs,
            Ptr(input as *mut c_void),
            count,
            dtype(dt)?,
        ))
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
        Ok(Op::all_gather_single(
            Ptr(output),
            Ptr(input as *mut c_void),
            count,
            dtype(dt)?,
        ))
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
        Ok(Op::all_gather_v(
            Ptr(output),
            Ptr(input as *mut c_void),
            counts,
            dtype(dt)?,
        ))
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
        Ok(Op::reduce_scatter(
            Ptr(output),
            inputs,
            count,
            dtype(dt)?,
            reduce_op(&op)?,
        ))
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
        Ok(Op::reduce_scatter_single(
            Ptr(output),
            Ptr(input as *mut c_void),
            count,
            dtype(dt)?,
            reduce_op(&op)?,
        ))
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
        Ok(Op::reduce_scatter_v(
            Ptr(output),
            Ptr(input as *mut c_void),
            counts,
            dtype(dt)?,
            reduce_op(&op)?,
        ))
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
        Ok(Op::all_to_all(outputs, inputs, count, dtype(dt)?))
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
        Ok(Op::all_to_all_single(
            Ptr(output),
            Ptr(input as *mut c_void),
            count,
            dtype(dt)?,
        ))
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
        Ok(Op::all_to_all_v_single(
            Ptr(output),
            unsafe { count_list(output_counts, n, "output_counts")? },
            Ptr(input as *mut c_void),
            unsafe { count_list(input_counts, n, "input_counts")? },
            dtype(dt)?,
        ))
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
        Ok(Op::scatter(Ptr(output), inputs, count, dtype(dt)?, root))
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
        Ok(Op::gather(
            outputs,
            Ptr(input as *mut c_void),
            count,
            dtype(dt)?,
            root,
        ))
    })
}

/// Gathers `count` elements of `input` from every rank into `output` on
/// `root`: `count * size` elements, rank r's at offset `r * count` (rank
/// order, as `tc_all_gather_single` lays them out). `output` is ignored and
/// may be NULL on other ranks. In place on the root: `input` may be the
/// root's own block of `output` (`output + root * count`). On `nccl` it
/// runs as grouped sends and receives (NCCL has no gather).
#[no_mangle]
pub extern "C" fn tc_gather_single(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    input: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    root: c_int,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_gather_single", comm, opts, work, |_| {
        Ok(Op::gather_single(
            Ptr(output),
            Ptr(input as *mut c_void),
            count,
            dtype(dt)?,
            root,
        ))
    })
}

//! `tc_reducer_*`: bucketed gradient exchange with communication hooks.

use crate::coalesced::Buffer;
use crate::comm::Ptr;
use crate::error::TC_SUCCESS;
use crate::error::{clear_last_error, last_error_ptr, tc_result_t, Error, ErrorKind, Result};
use crate::ffi::comm::tc_comm_t;
use crate::ffi::comm_ops::collective_boundary;
use crate::ffi::handle::{Handle, HandleType};
use crate::ffi::work::{tc_work, tc_work_t};
use crate::ffi::{
    arg_out, arg_slice, boundary, boundary_void, handle_mut, into_handle, take_handle,
};
use crate::options::{read_versioned, Versioned};
use crate::reducer::hooks::{builtin_from_c, tc_grad_bucket_t, BuiltinHook, CommHook};
use crate::reducer::powersgd::{PowerSgdHook, PowerSgdOptions};
use crate::reducer::{Reducer, ReducerOptions};
use crate::types::{tc_dtype_t, DType};
use crate::util::lock;
use crate::work::{HostWork, Work};
use std::cell::Cell;
use std::ffi::{c_void, CStr};
use std::mem::size_of;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

pub const TC_REDUCER_OPTIONS_MAGIC: u32 = 0x5443_5244;
pub const TC_REDUCER_OPTIONS_VERSION: u32 = 2;

/// Built-in communication hook (`tc_reducer_set_builtin_hook`).
pub type tc_hook_kind_t = i32;
/// Divide by the world size, then all-reduce (sum): DDP's default.
pub const TC_HOOK_ALLREDUCE: tc_hook_kind_t = 0;
/// Cast the bucket to float16, divide by the world size in float16,
/// all-reduce (sum), cast back: PyTorch's `fp16_compress_hook`.
pub const TC_HOOK_FP16_COMPRESS: tc_hook_kind_t = 1;
/// As `TC_HOOK_FP16_COMPRESS` with bfloat16 (`bf16_compress_hook`).
pub const TC_HOOK_BF16_COMPRESS: tc_hook_kind_t = 2;
/// No communication: the gradients keep their local values.
pub const TC_HOOK_NOOP: tc_hook_kind_t = 3;
/// PowerSGD low-rank compression with error feedback (PyTorch's
/// `powerSGD_hook`) with the default `tc_powersgd_options_t`; see
/// `tc_reducer_set_powersgd` for the algorithm and its parameters.
pub const TC_HOOK_POWERSGD: tc_hook_kind_t = 4;

pub const TC_POWERSGD_OPTIONS_MAGIC: u32 = 0x5443_5053;
pub const TC_POWERSGD_OPTIONS_VERSION: u32 = 1;

/// Parameters of `TC_HOOK_POWERSGD` (`tc_reducer_set_powersgd`), named as
/// PyTorch's `PowerSGDState`. Initialize with `TC_POWERSGD_OPTIONS_INIT`,
/// which holds PyTorch's defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_powersgd_options_t {
    /// `sizeof(tc_powersgd_options_t)` as the caller compiled it.
    pub size: usize,
    /// Must be `TC_POWERSGD_OPTIONS_MAGIC`.
    pub magic: u32,
    /// `TC_POWERSGD_OPTIONS_VERSION` as the caller compiled it.
    pub version: u32,
    /// Rank r of the approximation (at least 1; per gradient at most its
    /// rows and columns). Default 1.
    pub matrix_approximation_rank: usize,
    /// Iterations exchanged with the plain all-reduce (`TC_HOOK_ALLREDUCE`)
    /// before compression starts (`start_powerSGD_iter`). Default 1000.
    /// 0 compresses from the first iteration (PyTorch requires at least 2
    /// with error feedback or warm start, for DDP's bucket rebuild, which
    /// this reducer does not do).
    pub start_iter: u64,
    /// A rows x cols gradient is compressed only when
    /// (rows + cols) * r * `min_compression_rate` < rows * cols; the others
    /// are all-reduced as they are. Finite, >= 0. Default 2.
    pub min_compression_rate: f64,
    /// Added to each column's norm in Gram-Schmidt, in float32: 0, or a
    /// finite value between float32's smallest (1.4e-45) and largest
    /// (3.4e38); others are `TC_ERR_INVALID_ARGUMENT`, never rounded to 0
    /// or inf. Default 0 (a zero column then stays zeros).
    pub orthogonalization_epsilon: f64,
    /// 1: each rank adds its previous compression error to the bucket
    /// before compressing. Default 1.
    pub use_error_feedback: i32,
    /// 1: Q starts from the previous iteration's Q; 0: from fresh values
    /// every iteration. Default 1.
    pub warm_start: i32,
    /// Seed of the starting values of Q, the same on every rank. Default 0.
    pub seed: u64,
    /// Leading dimension of each gradient (its shape[0]): gradient i is
    /// viewed as a `rows[i]` x (counts[i] / `rows[i]`) matrix, so `rows[i]`
    /// must divide counts[i] (anything for an empty gradient). NULL: every
    /// gradient is a column (count x 1), as a 1-D tensor is for PyTorch,
    /// and with the default `min_compression_rate` nothing is compressed.
    /// Copied during the call. Default NULL.
    pub rows: *const usize,
    /// Entries of `rows`: the reducer's gradient count (0 with NULL).
    pub num_rows: usize,
}

impl Versioned for tc_powersgd_options_t {
    const MAGIC: u32 = TC_POWERSGD_OPTIONS_MAGIC;
    const NAME: &'static str = "tc_powersgd_options_t";
    fn defaults() -> Self {
        tc_powersgd_options_t {
            size: size_of::<Self>(),
            magic: TC_POWERSGD_OPTIONS_MAGIC,
            version: TC_POWERSGD_OPTIONS_VERSION,
            matrix_approximation_rank: 1,
            start_iter: 1000,
            min_compression_rate: 2.0,
            orthogonalization_epsilon: 0.0,
            use_error_feedback: 1,
            warm_start: 1,
            seed: 0,
            rows: std::ptr::null(),
            num_rows: 0,
        }
    }
}

/// Options of `tc_reducer_new`. Initialize with `TC_REDUCER_OPTIONS_INIT`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_reducer_options_t {
    /// `sizeof(tc_reducer_options_t)` as the caller compiled it.
    pub size: usize,
    /// Must be `TC_REDUCER_OPTIONS_MAGIC`.
    pub magic: u32,
    /// `TC_REDUCER_OPTIONS_VERSION` as the caller compiled it.
    pub version: u32,
    /// Size at which a bucket is closed, in bytes; 0: 25 MiB (DDP's default).
    pub bucket_cap_bytes: usize,
    /// Size at which each dtype's first bucket (the first gradients a
    /// backward pass produces) is closed; 0: 1 MiB (DDP's default).
    pub first_bucket_bytes: usize,
    /// 1: the gradients live in the reducer's buckets (no copy in or out);
    /// `grads` must then be NULL and `tc_reducer_get_grad` gives each
    /// gradient's address. 0 (default): the caller's gradient buffers.
    pub gradient_as_bucket_view: i32,
    /// (Version 2.) CUDA gradients: the stream they are produced on (NULL:
    /// the legacy default stream). The copies into and out of the buckets
    /// and the built-in hooks are ordered on it. Ignored for host memory.
    pub stream: *mut c_void,
}

impl Versioned for tc_reducer_options_t {
    const MAGIC: u32 = TC_REDUCER_OPTIONS_MAGIC;
    const NAME: &'static str = "tc_reducer_options_t";
    fn defaults() -> Self {
        tc_reducer_options_t {
            size: size_of::<Self>(),
            magic: TC_REDUCER_OPTIONS_MAGIC,
            version: TC_REDUCER_OPTIONS_VERSION,
            bucket_cap_bytes: 0,
            first_bucket_bytes: 0,
            gradient_as_bucket_view: 0,
            stream: std::ptr::null_mut(),
        }
    }
    fn size_in_version(version: u32) -> usize {
        match version {
            1 => std::mem::offset_of!(tc_reducer_options_t, stream),
            _ => size_of::<Self>(),
        }
    }
}

/// A communication hook: exchanges `bucket` (see `tc_grad_bucket_t`) over
/// `comm` and returns the exchange's work in `*work` (which the reducer
/// frees). Called from `tc_reducer_mark_ready` or `tc_reducer_finalize`, on
/// their thread; it must not call functions of its own reducer: such a call
/// fails with `TC_ERR_INVALID_USAGE` (`tc_reducer_free` leaves the reducer as
/// it is, with a warning and `tc_last_error` set). Every rank's
/// hook must issue the same operations; a hook returning an error without
/// issuing them on some ranks leaves the others waiting until the comm's
/// timeout.
pub type tc_comm_hook_fn = Option<
    unsafe extern "C" fn(
        state: *mut c_void,
        comm: *mut tc_comm_t,
        bucket: *mut tc_grad_bucket_t,
        work: *mut *mut tc_work_t,
    ) -> tc_result_t,
>;

/// A gradient reducer (see `tc_reducer_new`). Not thread-safe: call its
/// functions from one thread at a time.
pub struct tc_reducer {
    inner: Arc<Mutex<Reducer>>,
    comm: *mut tc_comm_t,
    /// The thread ending an iteration for `tc_reducer_finalize_async`;
    /// every other call waits for it first.
    finishing: Option<JoinHandle<()>>,
}

thread_local! {
    /// The reducer this thread holds locked, running its hooks meanwhile: a
    /// call on it from one of them would wait for itself.
    static HELD: Cell<*const tc_reducer> = const { Cell::new(std::ptr::null()) };
}

/// The locked reducer, noted in [`HELD`] while held.
struct Held<'a> {
    guard: MutexGuard<'a, Reducer>,
    before: *const tc_reducer,
}

impl std::ops::Deref for Held<'_> {
    type Target = Reducer;
    fn deref(&self) -> &Reducer {
        &self.guard
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Reducer {
        &mut self.guard
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        HELD.with(|h| h.set(self.before));
    }
}

impl tc_reducer {
    /// The reducer, once an asynchronous finalize has finished.
    fn get(&mut self) -> Held<'_> {
        if let Some(t) = self.finishing.take() {
            let _ = t.join();
        }
        let before = HELD.with(|h| h.replace(self as *const tc_reducer));
        Held {
            guard: lock(&self.inner),
            before,
        }
    }
}

/// Refuses a call on reducer `p` from inside its own communication hook
/// (`TC_ERR_INVALID_USAGE`): the reducer is locked by the call running it.
fn refuse_from_own_hook(p: *const tc_reducer_t) -> Result<()> {
    if !p.is_null() && HELD.with(Cell::get) == p {
        return Err(Error::invalid_usage(
            "argument 'reducer': called from inside its own communication hook (the reducer is \
             running the hook)",
        ));
    }
    Ok(())
}

unsafe fn reducer_mut<'a>(p: *mut tc_reducer_t) -> Result<&'a mut tc_reducer_t> {
    refuse_from_own_hook(p)?;
    handle_mut(p, "reducer")
}

impl Handle for tc_reducer {
    const TYPE: HandleType = HandleType::Reducer;
}

pub type tc_reducer_t = tc_reducer;

struct CHook {
    func: unsafe extern "C" fn(
        *mut c_void,
        *mut tc_comm_t,
        *mut tc_grad_bucket_t,
        *mut *mut tc_work_t,
    ) -> tc_result_t,
    state: *mut c_void,
    comm: *mut tc_comm_t,
}

// SAFETY: the state belongs to the caller, who passes it to the reducer's
// thread with the reducer.
unsafe impl Send for CHook {}

impl CommHook for CHook {
    fn run(
        &mut self,
        _comm: &Arc<crate::comm::Comm>,
        bucket: &mut tc_grad_bucket_t,
    ) -> Result<Arc<dyn Work>> {
        let mut work: *mut tc_work_t = std::ptr::null_mut();
        clear_last_error();
        let rc = unsafe { (self.func)(self.state, self.comm, bucket, &mut work) };
        if rc != TC_SUCCESS {
            let detail = unsafe { CStr::from_ptr(last_error_ptr()) }.to_string_lossy();
            let kind = ErrorKind::from_code(rc).unwrap_or(ErrorKind::Internal);
            return Err(Error::new(
                kind,
                format!("the hook returned {rc}: {detail}"),
            ));
        }
        match unsafe { take_handle(work, "the hook's work")? } {
            Some(w) => Ok(w.inner.clone()),
            None => Err(Error::invalid_usage(
                "the hook returned TC_SUCCESS without a work",
            )),
        }
    }
}

/// Creates a reducer for `n` gradients: `grads[i]` holds `counts[i]`
/// elements of `dtypes[i]` (float32, float64, float16 or bfloat16).
/// Collective over `comm`: every rank passes the same counts,
/// dtypes and options; a difference fails every rank with
/// `TC_ERR_INVALID_USAGE` naming the first one. Buckets are assigned as
/// DDP does once it knows the backward order: gradients in reverse index
/// order, grouped by dtype, each dtype's first bucket closed at
/// `first_bucket_bytes`, later ones at `bucket_cap_bytes`. `opts` may be
/// NULL (defaults) and is copied; the arrays are read during the call. The
/// gradient buffers must stay valid while the reducer lives; the comm handle
/// must outlive the reducer. The hook is `TC_HOOK_ALLREDUCE` until changed.
/// On success `*out` receives a reducer to free with `tc_reducer_free`.
///
/// Device memory: on an nccl comm the gradients are device memory on the
/// comm's device, the buckets are allocated with the comm's allocator
/// (`tc_mem_alloc`), and the copies into the buckets, the built-in hooks'
/// all-reduces and the copies out are ordered on `opts->stream` (the stream
/// the gradients are produced on); `TC_HOOK_ALLREDUCE` divides through
/// the all-reduce (PREMUL_SUM by 1/world size); the compressing hooks are
/// `TC_ERR_UNSUPPORTED`. On a gloo comm CUDA gradients are copied into host
/// buckets on `opts->stream` (synchronized before each hook and before
/// finalize returns). A capturing stream is `TC_ERR_UNSUPPORTED` on nccl.
#[no_mangle]
pub extern "C" fn tc_reducer_new(
    comm: *mut tc_comm_t,
    grads: *const *mut c_void,
    counts: *const usize,
    dtypes: *const tc_dtype_t,
    n: usize,
    opts: *const tc_reducer_options_t,
    out: *mut *mut tc_reducer_t,
) -> tc_result_t {
    collective_boundary("tc_reducer_new", comm, |handle| {
        let out = unsafe { arg_out(out, "out")? };
        let o = unsafe { read_versioned(opts, "opts")? };
        let as_view = match o.gradient_as_bucket_view {
            0 => false,
            1 => true,
            v => {
                return Err(Error::invalid_argument(format!(
                    "argument 'opts.gradient_as_bucket_view': {v} is not 0 or 1"
                )))
            }
        };
        if as_view && !grads.is_null() {
            return Err(Error::invalid_argument(
                "argument 'grads' must be NULL with opts.gradient_as_bucket_view",
            ));
        }
        // The lists first: they bound `n` to a real array.
        let counts = unsafe { arg_slice(counts, n, "counts")? };
        let dtypes = unsafe { arg_slice(dtypes, n, "dtypes")? };
        let ptrs = match as_view {
            true => &[][..],
            false => unsafe { arg_slice(grads, n, "grads")? },
        };
        let list = (0..n)
            .map(|i| {
                Ok(Buffer {
                    ptr: Ptr(ptrs.get(i).copied().unwrap_or(std::ptr::null_mut())),
                    count: counts[i],
                    dtype: DType::from_c(dtypes[i], &format!("dtypes[{i}]"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let defaults = ReducerOptions::default();
        let options = ReducerOptions {
            bucket_cap_bytes: nonzero_or(o.bucket_cap_bytes, defaults.bucket_cap_bytes),
            first_bucket_bytes: nonzero_or(o.first_bucket_bytes, defaults.first_bucket_bytes),
            gradient_as_bucket_view: as_view,
            stream: o.stream,
        };
        let hook = Box::new(BuiltinHook::new(builtin_from_c(TC_HOOK_ALLREDUCE)?));
        let inner = Reducer::new(handle.inner()?.clone(), &list, options, hook)?;
        *out = into_handle(tc_reducer {
            inner: Arc::new(Mutex::new(inner)),
            comm,
            finishing: None,
        });
        Ok(())
    })
}

fn nonzero_or(v: usize, default: usize) -> usize {
    if v == 0 {
        default
    } else {
        v
    }
}

/// Frees the reducer, waiting for the exchanges of an unfinished iteration
/// first. NULL is ignored.
#[no_mangle]
pub extern "C" fn tc_reducer_free(reducer: *mut tc_reducer_t) {
    boundary_void("tc_reducer_free", || {
        refuse_from_own_hook(reducer)?;
        if let Some(mut r) = unsafe { take_handle(reducer, "reducer")? } {
            r.get().wait_outstanding();
        }
        Ok(())
    })
}

/// Gradient `grad_index` is final for this iteration. When its bucket is
/// complete and every earlier bucket has been launched, the bucket (and any
/// later complete ones) is copied in and its hook runs, in bucket order.
/// With the built-in `TC_HOOK_ALLREDUCE` on host memory the exchange starts
/// earlier, in 2 MiB pieces: each piece goes out once the gradients under
/// it are marked and every earlier piece went out (the same operations, in
/// the same order, with the same results; a bucket's gradients are copied
/// in as its front becomes ready). In both cases the gradient must not
/// change until `tc_reducer_finalize` returns.
/// `TC_ERR_INVALID_ARGUMENT` for an index out of range,
/// `TC_ERR_INVALID_USAGE` for a gradient already marked in this iteration;
/// a failing hook's error is returned here and by `tc_reducer_finalize`.
#[no_mangle]
pub extern "C" fn tc_reducer_mark_ready(
    reducer: *mut tc_reducer_t,
    grad_index: usize,
) -> tc_result_t {
    boundary("tc_reducer_mark_ready", || {
        let r = unsafe { reducer_mut(reducer)? };
        r.get().mark_ready(grad_index)
    })
}

/// Ends the iteration: launches the buckets not yet launched, checks with
/// every rank (one small all-gather) that every gradient was marked and
/// every hook ran, waits for every bucket and writes the results into the
/// gradients. Gradients never marked fail every rank with
/// `TC_ERR_INVALID_USAGE` naming them per rank, a hook's failure fails the
/// ranks that saw it with its error and the others with `TC_ERR_REMOTE`
/// (a bucket the hook left unusable counts as its failure: a changed
/// `count`, or a replaced buffer whose dtype cannot be cast back, is
/// `TC_ERR_INVALID_USAGE`, found before anything is written back),
/// and a failed exchange (a peer died) fails with its error; on failure
/// nothing is written back. Either way the reducer is ready for the next
/// iteration. Blocks until done (with device buckets, until the copies out
/// on the reducer's stream completed).
#[no_mangle]
pub extern "C" fn tc_reducer_finalize(reducer: *mut tc_reducer_t) -> tc_result_t {
    boundary("tc_reducer_finalize", || {
        let r = unsafe { reducer_mut(reducer)? };
        let mut inner = r.get();
        if inner.on_device() {
            return inner.finalize_device()?.wait_blocking();
        }
        inner.finalize()
    })
}

/// As `tc_reducer_finalize`, without blocking: the remaining buckets and the
/// agreement are issued during the call (taking their place in the comm's
/// order), and `*work` receives a work that completes once the results are
/// written back (its error is what `tc_reducer_finalize` would return).
/// Every later call on the reducer waits for it first; the gradients must
/// not be read before it completes. Free the work with `tc_work_free`.
/// With device buckets (an nccl comm) the call checks the iteration with
/// every rank first (the host waits for the reducer's stream to reach that
/// check), then enqueues the copies out on the reducer's stream; the work
/// completes when they are done, and `tc_work_wait(work, stream)` makes
/// `stream` wait for them without blocking the host.
#[no_mangle]
pub extern "C" fn tc_reducer_finalize_async(
    reducer: *mut tc_reducer_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    boundary("tc_reducer_finalize_async", || {
        let (r, out) = unsafe { (reducer_mut(reducer)?, arg_out(work, "work")?) };
        let device_work = {
            let mut inner = r.get();
            match inner.on_device() {
                true => Some((inner.finalize_device()?, inner.comm().clone())),
                false => None,
            }
        };
        if let Some((done, comm)) = device_work {
            *out = into_handle(tc_work {
                inner: done,
                _comm: comm,
                source: Default::default(),
            });
            return Ok(());
        }
        let comm = {
            let mut inner = r.get();
            inner.begin_finalize();
            inner.comm().clone()
        };
        let done = Arc::new(HostWork::new(
            "reducer_finalize",
            comm.label(),
            comm.timeout(),
        ));
        done.start();
        let (finish, inner) = (done.clone(), r.inner.clone());
        let thread = std::thread::Builder::new()
            .name("tc-reducer-finalize".into())
            .spawn(move || {
                let result = lock(&inner).end_finalize();
                finish.complete(result);
            });
        match thread {
            Ok(t) => r.finishing = Some(t),
            Err(e) => {
                let result = r.get().end_finalize();
                done.complete(result.and(Err(Error::system("starting the finalize thread", e))));
            }
        }
        *out = into_handle(tc_work {
            inner: done,
            _comm: comm,
            source: Default::default(),
        });
        Ok(())
    })
}

/// Sets a C communication hook (see `tc_comm_hook_fn`) with its `state`,
/// passed back on every call. Only between iterations.
#[no_mangle]
pub extern "C" fn tc_reducer_set_hook(
    reducer: *mut tc_reducer_t,
    hook: tc_comm_hook_fn,
    state: *mut c_void,
) -> tc_result_t {
    boundary("tc_reducer_set_hook", || {
        let r = unsafe { reducer_mut(reducer)? };
        let func = hook.ok_or_else(|| Error::null_argument("hook"))?;
        let comm = r.comm;
        r.get().set_hook(Box::new(CHook { func, state, comm }))
    })
}

/// Sets a built-in hook (`TC_HOOK_ALLREDUCE`, `TC_HOOK_FP16_COMPRESS`,
/// `TC_HOOK_BF16_COMPRESS`, `TC_HOOK_NOOP`, `TC_HOOK_POWERSGD` with default
/// options, see `tc_reducer_set_powersgd`). Only between iterations. The
/// compressing hooks reject float64 buckets (`TC_ERR_UNSUPPORTED` from the
/// hook); on an nccl comm they cast and divide with the library's own PTX
/// kernels on the reducer's stream (run on a simulated driver only, never
/// on a GPU yet).
#[no_mangle]
pub extern "C" fn tc_reducer_set_builtin_hook(
    reducer: *mut tc_reducer_t,
    kind: tc_hook_kind_t,
) -> tc_result_t {
    boundary("tc_reducer_set_builtin_hook", || {
        let r = unsafe { reducer_mut(reducer)? };
        if kind == TC_HOOK_POWERSGD {
            return set_powersgd(r, &tc_powersgd_options_t::defaults());
        }
        let hook = BuiltinHook::new(builtin_from_c(kind)?);
        r.get().set_hook(Box::new(hook))
    })
}

/// Writes where gradient `grad_index` lives: the caller's buffer, or with
/// `gradient_as_bucket_view` its place in a bucket (NULL for an empty
/// gradient), valid while the reducer lives.
#[no_mangle]
pub extern "C" fn tc_reducer_get_grad(
    reducer: *mut tc_reducer_t,
    grad_index: usize,
    ptr: *mut *mut c_void,
) -> tc_result_t {
    boundary("tc_reducer_get_grad", || {
        let (r, ptr) = unsafe { (reducer_mut(reducer)?, arg_out(ptr, "ptr")?) };
        *ptr = r.get().grad_ptr(grad_index)?.0;
        Ok(())
    })
}

/// Writes the number of buckets.
#[no_mangle]
pub extern "C" fn tc_reducer_num_buckets(
    reducer: *mut tc_reducer_t,
    num_buckets: *mut usize,
) -> tc_result_t {
    boundary("tc_reducer_num_buckets", || {
        let (r, n) = unsafe { (reducer_mut(reducer)?, arg_out(num_buckets, "num_buckets")?) };
        *n = r.get().num_buckets();
        Ok(())
    })
}

/// Sets the PowerSGD hook (`TC_HOOK_POWERSGD`) with `opts` (NULL:
/// `TC_POWERSGD_OPTIONS_INIT`), the algorithm of PyTorch's `powerSGD_hook`.
/// For the first `start_iter` iterations every bucket is exchanged as by
/// `TC_HOOK_ALLREDUCE`. From then on, per float32 bucket: with error
/// feedback the rank's previous compression error is added; each gradient
/// worth compressing (see `min_compression_rate`), viewed as a matrix M
/// (see `rows`), gets P = M Q with Q orthogonalized (the previous Q with
/// warm start, else fresh values from `seed`); one all-reduce (sum) carries
/// every P and the uncompressed gradients; then P is orthogonalized
/// (Gram-Schmidt), Q = M^T P, a second all-reduce (sum) carries every Q,
/// Q /= world size, the bucket gets M = P Q^T and the uncompressed sums /
/// world size; the error becomes the bucket before minus after. The second
/// all-reduce is issued when `tc_reducer_finalize` waits for the bucket;
/// with `tc_reducer_finalize_async` it is issued from the finalize's own
/// thread, so issue no other operation on the comm until that work
/// completes (the ranks' operation orders could differ).
/// Buckets of other dtypes (float16, bfloat16, float64) always take the
/// plain all-reduce. Starting values of Q: about standard normal, from
/// `seed`, the gradient's index and the iteration, computed without the
/// math library so every rank has the same bits (PyTorch draws them from
/// its own generator, so the two differ value by value). Orthogonalization
/// is always Gram-Schmidt (PyTorch uses QR above rank 2: the same span, and
/// the same P Q^T up to rounding). Every rank must pass the same options.
/// The hook's state (errors, Q, copies: about twice the buckets' size) is
/// freed when the hook is replaced or the reducer freed; a new call starts
/// from iteration 0. Only between iterations. `TC_ERR_INVALID_ARGUMENT` for
/// a rank of 0, a negative or non-finite rate or epsilon, an epsilon
/// outside float32's range, `num_rows` other than the gradient count, or a
/// `rows[i]` that does not divide counts[i]; `TC_ERR_UNSUPPORTED` on an nccl comm (device buckets: the
/// products would need device kernels). `opts` and its `rows` array are
/// copied: the caller keeps ownership and may free them after the call. A
/// NULL `reducer`, or NULL `opts.rows` with a non-zero `num_rows`, is
/// `TC_ERR_INVALID_ARGUMENT`. Not thread-safe with other calls on the
/// reducer.
#[no_mangle]
pub extern "C" fn tc_reducer_set_powersgd(
    reducer: *mut tc_reducer_t,
    opts: *const tc_powersgd_options_t,
) -> tc_result_t {
    boundary("tc_reducer_set_powersgd", || {
        let r = unsafe { reducer_mut(reducer)? };
        let o = unsafe { read_versioned(opts, "opts")? };
        set_powersgd(r, &o)
    })
}

fn set_powersgd(r: &mut tc_reducer_t, o: &tc_powersgd_options_t) -> Result<()> {
    let bool_arg = |v: i32, name: &str| match v {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(Error::invalid_argument(format!(
            "argument 'opts.{name}': {v} is not 0 or 1"
        ))),
    };
    let mut inner = r.get();
    PowerSgdHook::check_device(inner.on_device())?;
    let counts = inner.grad_counts();
    let rows = match (o.rows.is_null(), o.num_rows) {
        (true, 0) => Vec::new(),
        (true, _) => return Err(Error::null_argument("opts.rows")),
        (false, n) if n != counts.len() => {
            return Err(Error::invalid_argument(format!(
                "argument 'opts.num_rows': {n} (the reducer has {} gradients)",
                counts.len()
            )))
        }
        (false, n) => unsafe { arg_slice(o.rows, n, "opts.rows")? }.to_vec(),
    };
    let options = PowerSgdOptions {
        rank: o.matrix_approximation_rank,
        start_iter: o.start_iter,
        min_compression_rate: o.min_compression_rate,
        error_feedback: bool_arg(o.use_error_feedback, "use_error_feedback")?,
        warm_start: bool_arg(o.warm_start, "warm_start")?,
        epsilon: o.orthogonalization_epsilon,
        seed: o.seed,
        rows,
    };
    options.validate(&counts)?;
    inner.set_hook(Box::new(PowerSgdHook::new(options)))
}

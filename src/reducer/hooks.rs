//! Communication hooks: what a reducer runs on each complete bucket.
//!
//! A hook receives the bucket (`tc_grad_bucket_t`) and returns the work of
//! its exchange. It may point the bucket's buffer at another one (a
//! compressed copy, say) with its own dtype; once the work completes the
//! reducer casts that buffer back into the bucket.

use super::device::DeviceCompress;
use super::layout::{cast, divide};
use crate::comm::{Comm, Op, OpOptions, Ptr};
use crate::error::{Error, Result};
use crate::types::{tc_dtype_t, DType, PremulFactor, RedKind, ReduceOp};
use crate::util::try_resize;
use crate::work::{DoneWork, Work, WorkStatus};
use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::Instant;

/// The bucket a hook sees, as c10d's `GradBucket`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_grad_bucket_t {
    /// Position of the bucket in launch order, from 0.
    pub index: usize,
    /// Number of buckets of the reducer.
    pub num_buckets: usize,
    /// 1 for the last bucket of an iteration, else 0.
    pub is_last: c_int,
    /// The flat buffer holding the bucket's gradients. A hook may point it at
    /// a buffer of its own (the same element count, any floating-point
    /// dtype, written in `dtype`) that stays valid until
    /// `tc_reducer_finalize` returns; the reducer then casts that buffer's
    /// final contents back into the bucket.
    pub buffer: *mut c_void,
    /// Number of elements of `buffer`.
    pub count: usize,
    /// Element type of `buffer`.
    pub dtype: tc_dtype_t,
    /// Number of gradients in the bucket; the arrays below have this many
    /// entries and are owned by the reducer.
    pub num_grads: usize,
    /// Index of each gradient in the reducer's list.
    pub grad_indices: *const usize,
    /// Offset of each gradient in the buffer, in elements.
    pub offsets: *const usize,
    /// Number of elements of each gradient.
    pub lengths: *const usize,
}

/// A hook, as the reducer calls it.
pub trait CommHook: Send {
    fn run(&mut self, comm: &Arc<Comm>, bucket: &mut tc_grad_bucket_t) -> Result<Arc<dyn Work>>;
    /// The reducer's stream (device memory), which the hook's operations
    /// must follow.
    fn set_stream(&mut self, _stream: *mut c_void) {}
    /// Whether the exchange works element by element in place on the
    /// bucket's own buffer, cut into [`piece_elements`] pieces (the built-in
    /// all-reduce): the reducer may then start each piece of a host bucket
    /// as soon as the gradients under it are ready ([`CommHook::run_part`]).
    fn runs_in_parts(&self) -> bool {
        false
    }
    /// The exchange of one piece, `count` elements at `buf` (host memory,
    /// inside a bucket); called only when [`CommHook::runs_in_parts`].
    fn run_part(
        &mut self,
        _comm: &Arc<Comm>,
        _buf: *mut c_void,
        _count: usize,
        _dtype: DType,
    ) -> Result<Arc<dyn Work>> {
        Err(Error::internal("this hook does not run in parts"))
    }
}

/// The built-in hooks (`TC_HOOK_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    /// Divide by the world size, then sum (DDP's default).
    AllReduce,
    /// Cast to float16, divide by the world size in float16, sum, cast back
    /// (`fp16_compress_hook`).
    Fp16Compress,
    /// As `Fp16Compress` with bfloat16 (`bf16_compress_hook`).
    Bf16Compress,
    /// Leave the bucket as it is.
    Noop,
}

/// A built-in hook with its state: the compressed copies of the buckets
/// (host memory, or device memory with the kernels on a device comm).
pub struct BuiltinHook {
    kind: Builtin,
    compressed: Vec<Vec<u16>>,
    device: Option<DeviceCompress>,
    stream: *mut c_void,
}

// SAFETY: the stream handle is only passed to the driver.
unsafe impl Send for BuiltinHook {}

impl BuiltinHook {
    pub fn new(kind: Builtin) -> BuiltinHook {
        BuiltinHook {
            kind,
            compressed: Vec::new(),
            device: None,
            stream: std::ptr::null_mut(),
        }
    }
}

fn all_reduce_sum(
    comm: &Comm,
    buf: *mut c_void,
    count: usize,
    dtype: DType,
    stream: *mut c_void,
) -> Result<Arc<dyn Work>> {
    all_reduce(comm, buf, count, dtype, ReduceOp::SUM, stream)
}

/// The built-in hooks all-reduce a bucket in pieces of this many bytes, all
/// enqueued at once, so that a piece can stay in cache between its copies.
/// Measured against one message per bucket (`bench/shm_pieces.py`, see
/// docs/performance.md) the difference flips sign between runs and stays
/// within the run-to-run spread on the shared 2-core machine: no gain is
/// shown. The result is the same element by element.
const PIECE_BYTES: usize = 2 << 20;

/// Elements of `dtype` in one piece of a built-in hook's all-reduce.
pub fn piece_elements(dtype: DType) -> usize {
    (PIECE_BYTES / dtype.size()).max(1)
}

fn all_reduce(
    comm: &Comm,
    buf: *mut c_void,
    count: usize,
    dtype: DType,
    op: ReduceOp,
    stream: *mut c_void,
) -> Result<Arc<dyn Work>> {
    let opts = OpOptions {
        async_op: true,
        stream,
        ..OpOptions::default()
    };
    let piece = piece_elements(dtype);
    let mut works = Vec::with_capacity(count.div_ceil(piece));
    for start in (0..count.max(1)).step_by(piece) {
        let op = Op::all_reduce(
            Ptr(unsafe { buf.cast::<u8>().add(start * dtype.size()) }.cast()),
            piece.min(count - start),
            dtype,
            op,
        );
        match comm.submit(op, &opts) {
            Ok(w) => works.push(w),
            Err(e) => {
                // The buffer must outlive what was issued.
                AllOf(works).wait_blocking().ok();
                return Err(e);
            }
        }
    }
    Ok(Arc::new(AllOf(works)))
}

/// The work of several operations: finished when all are, failed when one
/// failed.
struct AllOf(Vec<Arc<dyn Work>>);

impl Work for AllOf {
    fn status(&self) -> WorkStatus {
        let mut all_done = true;
        for w in &self.0 {
            match w.status() {
                s @ (WorkStatus::Error | WorkStatus::TimedOut) => return s,
                WorkStatus::Completed => {}
                _ => all_done = false,
            }
        }
        if all_done {
            WorkStatus::Completed
        } else {
            WorkStatus::InProgress
        }
    }
    fn wait(&self, stream: *mut c_void) -> Result<()> {
        self.0
            .iter()
            .map(|w| w.wait(stream))
            .fold(Ok(()), Result::and)
    }
    fn wait_blocking(&self) -> Result<()> {
        // Last first: host operations finish in issue order, so the others
        // are done by then and the caller is woken once, not once per part.
        // Every part is waited for; the error reported is the first part's.
        let mut first_error = Ok(());
        for w in self.0.iter().rev() {
            let r = w.wait_blocking();
            if r.is_err() {
                first_error = r;
            }
        }
        first_error
    }
    fn check_timeout(&self, _now: Instant) -> Option<Error> {
        // Each part is watched by its comm.
        None
    }
}

impl BuiltinHook {
    /// Points the bucket at its compressed copy: cast to `half`, divided by
    /// `world` in `half` precision (host buffers, or device kernels on the
    /// reducer's stream for device buckets).
    fn compress(
        &mut self,
        comm: &Arc<Comm>,
        bucket: &mut tc_grad_bucket_t,
        dtype: DType,
        half: DType,
        world: f64,
    ) -> Result<()> {
        if comm.device() != crate::types::Device::Cpu {
            // Device buckets: cast and divide with the library's kernels on
            // the reducer's stream, which the all-reduce then follows.
            return self
                .device
                .get_or_insert_with(DeviceCompress::default)
                .compress(comm, bucket, half, world as f32, self.stream);
        }
        if self.compressed.len() <= bucket.index {
            self.compressed.resize(bucket.index + 1, Vec::new());
        }
        let copy = &mut self.compressed[bucket.index];
        try_resize(
            copy,
            bucket.count,
            0,
            "compressed copy of a bucket (argument 'counts')",
        )?;
        // SAFETY: the buffer holds the bucket's `count` elements of `dtype`
        // (the reducer's storage or a hook's replacement); `copy` holds
        // `count` 16-bit elements.
        unsafe {
            cast(
                bucket.buffer.cast(),
                dtype,
                copy.as_mut_ptr().cast(),
                half,
                bucket.count,
            )
        }?;
        unsafe { divide(copy.as_mut_ptr().cast(), half, bucket.count, world) };
        bucket.buffer = copy.as_mut_ptr().cast();
        bucket.dtype = half.to_c();
        Ok(())
    }
}

/// The built-in all-reduce of `count` elements of host memory at `buf`:
/// divided by the world size, then summed (PyTorch's order).
fn mean_all_reduce_host(
    comm: &Comm,
    buf: *mut c_void,
    count: usize,
    dtype: DType,
    stream: *mut c_void,
) -> Result<Arc<dyn Work>> {
    let world = comm.size() as f64;
    // Multiplying by 2^-k rounds exactly as dividing by 2^k, so for
    // float32/float64 the division can ride on the all-reduce's own pass
    // over the data (PREMUL_SUM) with the same bits.
    if matches!(dtype, DType::F32 | DType::F64) && (comm.size() as u32).is_power_of_two() {
        let premul = ReduceOp {
            kind: RedKind::PremulSum,
            factor: PremulFactor::Host(1.0 / world),
        };
        return all_reduce(comm, buf, count, dtype, premul, stream);
    }
    // SAFETY: the caller's buffer holds `count` elements (the reducer's
    // storage, or a hook's replacement of the same count).
    unsafe { divide(buf.cast(), dtype, count, world) };
    all_reduce_sum(comm, buf, count, dtype, stream)
}

impl CommHook for BuiltinHook {
    fn run(&mut self, comm: &Arc<Comm>, bucket: &mut tc_grad_bucket_t) -> Result<Arc<dyn Work>> {
        let dtype = DType::from_c(bucket.dtype, "bucket.dtype")?;
        let world = comm.size() as f64;
        let half = match self.kind {
            Builtin::Noop => return Ok(Arc::new(DoneWork(Ok(())))),
            Builtin::AllReduce if comm.device() != crate::types::Device::Cpu => {
                // Device buckets: the division rides on the all-reduce
                // (PREMUL_SUM by 1/world), as no host pass can touch them.
                // Bit-identical to divide-then-sum for power-of-two world
                // sizes; otherwise within the rounding of the multiplication.
                let premul = ReduceOp {
                    kind: RedKind::PremulSum,
                    factor: PremulFactor::Host(1.0 / world),
                };
                return all_reduce(
                    comm,
                    bucket.buffer,
                    bucket.count,
                    dtype,
                    premul,
                    self.stream,
                );
            }
            Builtin::AllReduce => {
                return mean_all_reduce_host(comm, bucket.buffer, bucket.count, dtype, self.stream)
            }
            Builtin::Fp16Compress => DType::F16,
            Builtin::Bf16Compress => DType::BF16,
        };
        self.compress(comm, bucket, dtype, half, world)
            .map_err(|e| e.context("the compressing hook"))?;
        all_reduce_sum(comm, bucket.buffer, bucket.count, half, self.stream)
    }

    fn set_stream(&mut self, stream: *mut c_void) {
        self.stream = stream;
    }

    fn runs_in_parts(&self) -> bool {
        self.kind == Builtin::AllReduce
    }

    fn run_part(
        &mut self,
        comm: &Arc<Comm>,
        buf: *mut c_void,
        count: usize,
        dtype: DType,
    ) -> Result<Arc<dyn Work>> {
        mean_all_reduce_host(comm, buf, count, dtype, self.stream)
    }
}

/// Reads a `TC_HOOK_*` value.
pub fn builtin_from_c(kind: i32) -> Result<Builtin> {
    match kind {
        0 => Ok(Builtin::AllReduce),
        1 => Ok(Builtin::Fp16Compress),
        2 => Ok(Builtin::Bf16Compress),
        3 => Ok(Builtin::Noop),
        k => Err(Error::invalid_argument(format!(
            "argument 'kind': {k} is not a TC_HOOK_* value"
        ))),
    }
}

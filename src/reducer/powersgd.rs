//! PowerSGD (`TC_HOOK_POWERSGD`): the algorithm of PyTorch's
//! `powerSGD_hook` (Vogels et al., 2019) as a built-in hook with its state.
//!
//! For the first `start_iter` iterations every bucket goes through the plain
//! all-reduce (`TC_HOOK_ALLREDUCE`). Afterwards, per float32 bucket:
//! 1. with error feedback, the bucket gets the error this rank's previous
//!    compressed iteration left, and a copy of it is kept;
//! 2. each gradient is viewed as a rows x cols matrix M (rows = its leading
//!    dimension); those worth compressing get P = M Q (rank r; Q
//!    orthogonalized, either the previous iteration's Q with warm start or
//!    fresh values from the shared seed), the others are sent as they are:
//!    one all-reduce (sum) carries the uncompressed values and every P;
//! 3. when the work is waited for: uncompressed values / world; each P
//!    orthogonalized; Q = M^T P; one all-reduce (sum) of every Q, / world;
//!    M = P Q^T written into the bucket; the error becomes the kept copy
//!    minus the result (over the whole bucket, as PyTorch does).
//!
//! Buckets of other dtypes (float16, bfloat16, float64) take the plain
//! all-reduce in every iteration.

use super::hooks::{tc_grad_bucket_t, Builtin, BuiltinHook, CommHook};
use super::lowrank::{
    initial_factor, orthogonalize, outer_product, times_factor, transposed_times_factor,
    worth_compressing, Matrix,
};
use crate::comm::{Comm, Op, OpOptions, Ptr};
use crate::error::{Error, Result};
use crate::types::{DType, ReduceOp};
use crate::util::{lock, try_filled, try_resize};
use crate::work::{Work, WorkStatus};
use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The hook's parameters (see `tc_powersgd_options_t`).
#[derive(Debug, Clone)]
pub struct PowerSgdOptions {
    pub rank: usize,
    pub start_iter: u64,
    pub min_compression_rate: f64,
    pub error_feedback: bool,
    pub warm_start: bool,
    /// As the caller gave it; the orthogonalization adds it in float32
    /// ([`PowerSgdOptions::validate`] refuses what float32 cannot hold).
    pub epsilon: f64,
    pub seed: u64,
    /// Leading dimension of each gradient; empty: every gradient is a
    /// column (count x 1), as a 1-D tensor is for PyTorch.
    pub rows: Vec<usize>,
}

impl PowerSgdOptions {
    /// Checks the parameters against the reducer's gradient counts (`rows`
    /// is empty or has one entry per gradient).
    pub fn validate(&self, counts: &[usize]) -> Result<()> {
        if self.rank == 0 {
            return Err(Error::invalid_argument(
                "argument 'opts.matrix_approximation_rank' is 0 (must be at least 1)",
            ));
        }
        if !(self.min_compression_rate.is_finite() && self.min_compression_rate >= 0.0) {
            return Err(Error::invalid_argument(format!(
                "argument 'opts.min_compression_rate': {} is not a finite number >= 0",
                self.min_compression_rate
            )));
        }
        let epsilon = self.epsilon;
        if !(epsilon.is_finite() && epsilon >= 0.0) {
            return Err(Error::invalid_argument(format!(
                "argument 'opts.orthogonalization_epsilon': {epsilon} is not a finite number >= 0"
            )));
        }
        // The orthogonalization runs in float32: a value it would turn into
        // inf or 0 is refused rather than changed.
        if epsilon as f32 == f32::INFINITY || (epsilon > 0.0 && epsilon as f32 == 0.0) {
            return Err(Error::invalid_argument(format!(
                "argument 'opts.orthogonalization_epsilon': {epsilon:e} is outside float32's range \
                 (0, or from {:e} to {:e}); the orthogonalization adds it in float32",
                f32::from_bits(1),
                f32::MAX
            )));
        }
        for (i, (&rows, &count)) in self.rows.iter().zip(counts).enumerate() {
            if count > 0 && (rows == 0 || count % rows != 0) {
                return Err(Error::invalid_argument(format!(
                    "argument 'opts.rows[{i}]': {rows} does not divide gradient {i}'s {count} elements"
                )));
            }
        }
        Ok(())
    }
}

/// What the hook's per-bucket memory is named by when it cannot be had.
const WHAT: &str = "PowerSGD state of a bucket (argument 'counts')";

/// How a bucket is split, fixed with the reducer's layout.
#[derive(Debug)]
struct Plan {
    matrices: Vec<Matrix>,
    /// (offset, length) in the bucket of the gradients sent as they are.
    plain: Vec<(usize, usize)>,
    plain_len: usize,
    p_len: usize,
    q_len: usize,
}

fn plan(bucket: &tc_grad_bucket_t, opts: &PowerSgdOptions) -> Plan {
    let n = bucket.num_grads;
    // SAFETY: the reducer's arrays hold `num_grads` entries.
    let (grads, offsets, lengths) = unsafe {
        (
            std::slice::from_raw_parts(bucket.grad_indices, n),
            std::slice::from_raw_parts(bucket.offsets, n),
            std::slice::from_raw_parts(bucket.lengths, n),
        )
    };
    let mut out = Plan {
        matrices: Vec::new(),
        plain: Vec::new(),
        plain_len: 0,
        p_len: 0,
        q_len: 0,
    };
    for k in 0..n {
        let (grad, offset, len) = (grads[k], offsets[k], lengths[k]);
        let rows = opts.rows.get(grad).copied().unwrap_or(len);
        let cols = len / rows.max(1);
        let rank = rows.min(cols).min(opts.rank);
        if worth_compressing(rows, cols, rank, opts.min_compression_rate) {
            out.matrices.push(Matrix {
                grad,
                offset,
                rows,
                cols,
                rank,
                p_offset: out.p_len,
                q_offset: out.q_len,
            });
            out.p_len += rows * rank;
            out.q_len += cols * rank;
        } else {
            out.plain.push((offset, len));
            out.plain_len += len;
        }
    }
    out
}

/// One bucket's memory across iterations.
#[derive(Default)]
struct BucketState {
    plan: Option<Arc<Plan>>,
    /// This rank's compression error of the last compressed iteration.
    error: Vec<f32>,
    /// The bucket as compressed (with the error added).
    input: Vec<f32>,
    /// What the first all-reduce sends: the uncompressed values, then P.
    exchange: Vec<f32>,
    q: Vec<f32>,
    /// `q` holds the previous iteration's Q (warm start).
    warm: bool,
    scratch: Vec<f64>,
}

impl BucketState {
    /// Steps 1 and 2: error feedback, P = M Q, the exchange buffer packed.
    fn compress(&mut self, buf: &mut [f32], opts: &PowerSgdOptions, iteration: u64) -> Result<()> {
        let plan = self.plan.clone().expect("planned before compressing");
        if opts.error_feedback {
            if self.error.len() == buf.len() {
                buf.iter_mut().zip(&self.error).for_each(|(x, e)| *x += e);
            } else {
                self.error = try_filled(0.0, buf.len(), WHAT)?;
            }
            self.input.clear();
            try_resize(&mut self.input, buf.len(), 0.0, WHAT)?;
            self.input.copy_from_slice(buf);
        }
        let fresh = !(opts.warm_start && self.warm);
        try_resize(&mut self.q, plan.q_len, 0.0, WHAT)?;
        for m in &plan.matrices {
            let q = &mut self.q[m.q_offset..m.q_offset + m.cols * m.rank];
            if fresh {
                initial_factor(opts.seed, m.grad, iteration, q);
            }
            orthogonalize(q, m.cols, m.rank, opts.epsilon as f32);
        }
        self.warm = true;
        self.exchange.clear();
        try_resize(&mut self.exchange, plan.plain_len + plan.p_len, 0.0, WHAT)?;
        let mut at = 0;
        for &(offset, len) in &plan.plain {
            self.exchange[at..at + len].copy_from_slice(&buf[offset..offset + len]);
            at += len;
        }
        let p_all = &mut self.exchange[plan.plain_len..];
        for m in &plan.matrices {
            let matrix = &buf[m.offset..m.offset + m.rows * m.cols];
            let q = &self.q[m.q_offset..m.q_offset + m.cols * m.rank];
            let p = &mut p_all[m.p_offset..m.p_offset + m.rows * m.rank];
            times_factor(matrix, q, p, m.rows, m.cols, m.rank);
        }
        Ok(())
    }

    /// Step 3, once the sum of the exchange buffer arrived.
    fn decompress(
        &mut self,
        buf: &mut [f32],
        world: f32,
        opts: &PowerSgdOptions,
        sum_q: impl FnOnce(&mut [f32]) -> Result<()>,
    ) -> Result<()> {
        let plan = self.plan.clone().expect("planned before decompressing");
        let mut at = 0;
        for &(offset, len) in &plan.plain {
            for (x, s) in buf[offset..offset + len]
                .iter_mut()
                .zip(&self.exchange[at..])
            {
                *x = s / world;
            }
            at += len;
        }
        // Room for every product's scratch, so that none allocates.
        let scratch = plan.matrices.iter().map(|m| m.cols * m.rank).max();
        try_resize(&mut self.scratch, scratch.unwrap_or(0), 0.0, WHAT)?;
        let p_all = &mut self.exchange[plan.plain_len..];
        for m in &plan.matrices {
            let p = &mut p_all[m.p_offset..m.p_offset + m.rows * m.rank];
            orthogonalize(p, m.rows, m.rank, opts.epsilon as f32);
            let matrix = &buf[m.offset..m.offset + m.rows * m.cols];
            let q = &mut self.q[m.q_offset..m.q_offset + m.cols * m.rank];
            transposed_times_factor(matrix, p, q, (m.rows, m.cols, m.rank), &mut self.scratch);
        }
        if !self.q.is_empty() {
            sum_q(&mut self.q)?;
            self.q.iter_mut().for_each(|x| *x /= world);
        }
        for m in &plan.matrices {
            let p = &p_all[m.p_offset..m.p_offset + m.rows * m.rank];
            let q = &self.q[m.q_offset..m.q_offset + m.cols * m.rank];
            let matrix = &mut buf[m.offset..m.offset + m.rows * m.cols];
            outer_product(p, q, matrix, m.rows, m.cols, m.rank);
        }
        if opts.error_feedback {
            for ((e, kept), x) in self.error.iter_mut().zip(&self.input).zip(buf.iter()) {
                *e = kept - x;
            }
        }
        if !opts.warm_start {
            self.warm = false;
        }
        Ok(())
    }
}

/// The PowerSGD hook: its parameters, the iteration count, and each
/// bucket's memory (freed with the hook, hence with the reducer).
pub struct PowerSgdHook {
    opts: Arc<PowerSgdOptions>,
    plain: BuiltinHook,
    stream: *mut c_void,
    iteration: u64,
    buckets: Vec<Arc<Mutex<BucketState>>>,
}

// SAFETY: the stream handle is only passed to the driver.
unsafe impl Send for PowerSgdHook {}

impl PowerSgdHook {
    pub fn new(opts: PowerSgdOptions) -> PowerSgdHook {
        PowerSgdHook {
            opts: Arc::new(opts),
            plain: BuiltinHook::new(Builtin::AllReduce),
            stream: std::ptr::null_mut(),
            iteration: 0,
            buckets: Vec::new(),
        }
    }

    /// The products run on the host: device buckets would need kernels.
    pub fn check_device(on_device: bool) -> Result<()> {
        if on_device {
            return Err(Error::unsupported(
                "TC_HOOK_POWERSGD is not available for device buckets (an nccl comm): its matrix products need \
                 device kernels, which the library does not have",
            ));
        }
        Ok(())
    }
}

impl CommHook for PowerSgdHook {
    fn run(&mut self, comm: &Arc<Comm>, bucket: &mut tc_grad_bucket_t) -> Result<Arc<dyn Work>> {
        let iteration = self.iteration;
        if bucket.is_last != 0 {
            self.iteration += 1;
        }
        let dtype = DType::from_c(bucket.dtype, "bucket.dtype")?;
        if iteration < self.opts.start_iter || dtype != DType::F32 {
            return self.plain.run(comm, bucket);
        }
        if self.buckets.len() <= bucket.index {
            self.buckets.resize_with(bucket.index + 1, Default::default);
        }
        let state = self.buckets[bucket.index].clone();
        let mut s = lock(&state);
        if s.plan.is_none() {
            s.plan = Some(Arc::new(plan(bucket, &self.opts)));
        }
        // SAFETY: the bucket's buffer holds `count` float32 values, 8-byte
        // aligned, and stays put until the iteration is finalized.
        let buf =
            unsafe { std::slice::from_raw_parts_mut(bucket.buffer.cast::<f32>(), bucket.count) };
        s.compress(buf, &self.opts, iteration)?;
        let first = sum(comm, s.exchange.as_mut_ptr(), s.exchange.len(), self.stream)?;
        drop(s);
        Ok(Arc::new(PowerSgdWork {
            first,
            state,
            comm: comm.clone(),
            buffer: Ptr(bucket.buffer),
            count: bucket.count,
            opts: self.opts.clone(),
            stream: Ptr(self.stream),
            outcome: Mutex::new(None),
        }))
    }

    fn set_stream(&mut self, stream: *mut c_void) {
        self.stream = stream;
        self.plain.set_stream(stream);
    }
}

/// Sum all-reduce of `count` float32 values at `buf`.
fn sum(comm: &Comm, buf: *mut f32, count: usize, stream: *mut c_void) -> Result<Arc<dyn Work>> {
    let opts = OpOptions {
        async_op: true,
        stream,
        ..OpOptions::default()
    };
    let op = Op::all_reduce(Ptr(buf.cast()), count, DType::F32, ReduceOp::SUM);
    comm.submit(op, &opts)
}

/// A compressed bucket's exchange: the first all-reduce (P and the
/// uncompressed values) is under way; the first wait runs step 3, which
/// issues the second (Q). The reducer waits for its buckets in order on
/// every rank, so every rank issues the Q all-reduces in the same order.
struct PowerSgdWork {
    first: Arc<dyn Work>,
    state: Arc<Mutex<BucketState>>,
    comm: Arc<Comm>,
    buffer: Ptr,
    count: usize,
    opts: Arc<PowerSgdOptions>,
    stream: Ptr,
    outcome: Mutex<Option<Result<()>>>,
}

impl PowerSgdWork {
    fn finish(&self) -> Result<()> {
        self.first.wait_blocking()?;
        let mut s = lock(&self.state);
        // SAFETY: as in `run`: the bucket outlives its iteration's works.
        let buf =
            unsafe { std::slice::from_raw_parts_mut(self.buffer.0.cast::<f32>(), self.count) };
        let world = self.comm.size() as f32;
        s.decompress(buf, world, &self.opts, |q| {
            sum(&self.comm, q.as_mut_ptr(), q.len(), self.stream.0)?.wait_blocking()
        })
    }
}

impl Work for PowerSgdWork {
    fn status(&self) -> WorkStatus {
        match &*lock(&self.outcome) {
            Some(Ok(())) => WorkStatus::Completed,
            Some(Err(_)) => WorkStatus::Error,
            None => match self.first.status() {
                s @ (WorkStatus::Error | WorkStatus::TimedOut) => s,
                _ => WorkStatus::InProgress,
            },
        }
    }
    fn wait(&self, _stream: *mut c_void) -> Result<()> {
        self.wait_blocking()
    }
    fn wait_blocking(&self) -> Result<()> {
        let mut outcome = lock(&self.outcome);
        outcome.get_or_insert_with(|| self.finish()).clone()
    }
    fn check_timeout(&self, _now: Instant) -> Option<Error> {
        // Each all-reduce is watched by its comm.
        None
    }
}

//! The measurement of one case on the host: warm-up, the timed loop, the
//! figures averaged over ranks, and the checked run.

use crate::case::Case;
use crate::die;
use crate::gpu::Gpu;
use crate::options::Args;
use std::sync::Arc;
use std::time::Instant;
use torchcomm::comm::{Comm, Op, OpOptions, Ptr};
use torchcomm::cuda;
use torchcomm::types::{DType, ReduceOp};
use torchcomm::work::Work;

/// One measurement: per call, mean over ranks.
pub(crate) struct Figures {
    /// The reported time (us): device time on a GPU, elapsed on the host,
    /// host issuing time with -C.
    pub(crate) time: f64,
    /// Host time spent issuing (us per call).
    pub(crate) host: f64,
    /// Device time from CUDA events (us per call); GPU backends only.
    pub(crate) device: Option<f64>,
    pub(crate) wrong: Option<u64>,
}

pub(crate) struct Bench {
    pub(crate) comm: Arc<Comm>,
    pub(crate) args: Args,
    pub(crate) n: usize,
    pub(crate) seed: usize,
    pub(crate) gpu: Option<Gpu>,
}

impl Bench {
    pub(crate) fn stream(&self) -> *mut std::ffi::c_void {
        self.gpu
            .as_ref()
            .map_or(std::ptr::null_mut(), |g| g.stream.raw() as *mut _)
    }

    pub(crate) fn submit(&self, op: Op, async_op: bool) -> Arc<dyn Work> {
        let opts = OpOptions {
            async_op,
            stream: self.stream(),
            ..Default::default()
        };
        self.comm
            .submit(op, &opts)
            .unwrap_or_else(|e| die("operation failed", e))
    }

    /// Waits for everything on the benchmark's stream (GPU backends).
    pub(crate) fn sync(&self) {
        if let Some(g) = &self.gpu {
            cuda::stream_synchronize(g.stream.raw())
                .unwrap_or_else(|e| die("synchronizing the stream", e));
        }
    }

    pub(crate) fn barrier(&self) {
        self.submit(Op::Barrier, false);
        self.sync();
    }

    /// Sum over ranks of `v` (float64 all-reduce).
    pub(crate) fn sum_over_ranks(&self, v: f64) -> f64 {
        let mut x = [v];
        let buf = match &self.gpu {
            Some(g) => {
                cuda::copy_to_device(g.scratch.ptr(), &v.to_ne_bytes())
                    .unwrap_or_else(|e| die("copy to the device", e));
                g.scratch.ptr()
            }
            None => x.as_mut_ptr() as *mut _,
        };
        let op = Op::all_reduce(Ptr(buf), 1, DType::F64, ReduceOp::SUM);
        self.submit(op, false);
        if let Some(g) = &self.gpu {
            self.sync();
            let mut b = [0u8; 8];
            cuda::copy_to_host(&mut b, g.scratch.ptr())
                .unwrap_or_else(|e| die("copy from the device", e));
            x[0] = f64::from_ne_bytes(b);
        }
        x[0]
    }

    /// Runs warm-up and timed iterations, then a checked run.
    pub(crate) fn measure(&mut self, case: &mut Case) -> Figures {
        if self.gpu.is_some() {
            return self.measure_gpu(case);
        }
        let a = &self.args;
        let (iters, warmup, async_op, blocking, cpu_time) =
            (a.iters, a.warmup, a.async_op, a.blocking, a.cpu_time);
        self.seed += 1;
        case.fill(self.seed);
        for _ in 0..warmup {
            let w = self.submit(case.op(), async_op);
            w.wait_blocking().unwrap_or_else(|e| die("warm-up", e));
        }
        let ops: Vec<Op> = (0..iters).map(|_| case.op()).collect();
        self.barrier();
        let start = Instant::now();
        let mut works = Vec::with_capacity(if async_op { iters } else { 0 });
        for op in ops {
            let w = self.submit(op, async_op);
            if async_op {
                if blocking {
                    w.wait_blocking()
                        .unwrap_or_else(|e| die("operation failed", e));
                } else {
                    works.push(w);
                }
            }
        }
        let issued = start.elapsed();
        for w in works {
            w.wait_blocking()
                .unwrap_or_else(|e| die("operation failed", e));
        }
        let elapsed = if cpu_time { issued } else { start.elapsed() };
        let us = elapsed.as_secs_f64() * 1e6 / iters as f64;
        let time = self.sum_over_ranks(us) / self.n as f64;
        let host = self.sum_over_ranks(issued.as_secs_f64() * 1e6 / iters as f64) / self.n as f64;
        let wrong = self.checked_run(case);
        Figures {
            time,
            host,
            device: None,
            wrong,
        }
    }

    /// A run on fresh data, every element checked (unless -c 0): wrong
    /// elements over ranks.
    pub(crate) fn checked_run(&mut self, case: &mut Case) -> Option<u64> {
        if !self.args.check {
            return None;
        }
        self.seed += 1;
        case.fill(self.seed);
        self.submit(case.op(), false);
        self.sync();
        let w = case.check(self.seed);
        Some(self.sum_over_ranks(w as f64) as u64)
    }
}

//! The measurement on a GPU backend: every call on the benchmark's own
//! stream, device time from CUDA events, optionally a CUDA graph replayed.

use crate::bench::{Bench, Figures};
use crate::case::Case;
use crate::die;
use std::sync::Arc;
use std::time::{Duration, Instant};
use torchcomm::cuda;
use torchcomm::Op;

/// The benchmark's CUDA state on a GPU backend: its device, its stream and
/// the timing events around the timed loop.
pub(crate) struct Gpu {
    pub(crate) device: Arc<cuda::Device>,
    pub(crate) stream: cuda::Stream,
    pub(crate) start: cuda::TimingEvent,
    pub(crate) end: cuda::TimingEvent,
    /// One float64 for the reductions of the figures over ranks.
    pub(crate) scratch: cuda::DeviceBuffer,
}

impl Gpu {
    pub(crate) fn new(ordinal: i32) -> torchcomm::Result<Gpu> {
        let device = cuda::Device::open(ordinal)?;
        // Current on this thread for good: copies, events and graph calls
        // below run without a scope of their own.
        device.make_current()?;
        let stream = cuda::Stream::new(&device, 0)?;
        let start = cuda::TimingEvent::new(&device)?;
        let end = cuda::TimingEvent::new(&device)?;
        let scratch = cuda::DeviceBuffer::zeroed(&device, 8)?;
        Ok(Gpu {
            device,
            stream,
            start,
            end,
            scratch,
        })
    }
}

impl Bench {
    /// The GPU path: every call on the benchmark's stream, device time from
    /// events recorded there around the timed loop; host time of the loop
    /// alone. With -G the loop is captured once and the graph replayed.
    pub(crate) fn measure_gpu(&mut self, case: &mut Case) -> Figures {
        let a = &self.args;
        let (iters, warmup, async_op, cpu_time, graphs) =
            (a.iters, a.warmup, a.async_op, a.cpu_time, a.graphs);
        let gpu = self.gpu.as_ref().expect("GPU state");
        let s = gpu.stream.raw();
        self.seed += 1;
        case.fill(self.seed);
        let mut works = Vec::with_capacity(warmup);
        for _ in 0..warmup {
            works.push(self.submit(case.op(), async_op));
        }
        for w in works.drain(..) {
            w.wait(s as *mut _).unwrap_or_else(|e| die("warm-up", e));
        }
        self.sync();
        let ops: Vec<Op> = (0..iters).map(|_| case.op()).collect();
        let (issued, calls) = if graphs > 0 {
            (self.timed_graph(ops), iters * graphs)
        } else {
            (self.timed_stream(ops), iters)
        };
        let gpu = self.gpu.as_ref().expect("GPU state");
        let ms = gpu
            .start
            .elapsed_ms(&gpu.end)
            .unwrap_or_else(|e| die("reading the events", e));
        let host = issued.as_secs_f64() * 1e6 / calls as f64;
        let device = ms as f64 * 1e3 / calls as f64;
        let n = self.n as f64;
        let host = self.sum_over_ranks(host) / n;
        let device = self.sum_over_ranks(device) / n;
        let wrong = self.checked_run(case);
        Figures {
            time: if cpu_time { host } else { device },
            host,
            device: Some(device),
            wrong,
        }
    }

    /// -G: `ops` captured into a CUDA graph, replayed -G times between the
    /// timing events; the host time of the replays.
    fn timed_graph(&self, ops: Vec<Op>) -> Duration {
        let gpu = self.gpu.as_ref().expect("GPU state");
        let s = gpu.stream.raw();
        cuda::begin_capture(s).unwrap_or_else(|e| die("starting the graph capture", e));
        for op in ops {
            // Captured work joins the capturing stream: nothing to wait for.
            self.submit(op, self.args.async_op);
        }
        let graph = cuda::GraphExec::end_capture(&gpu.device, s)
            .unwrap_or_else(|e| die("capturing the graph", e));
        // One untimed replay (uploads the graph).
        graph
            .launch(s)
            .unwrap_or_else(|e| die("replaying the graph", e));
        self.barrier();
        gpu.start
            .record(s)
            .unwrap_or_else(|e| die("recording an event", e));
        let t0 = Instant::now();
        for _ in 0..self.args.graphs {
            graph
                .launch(s)
                .unwrap_or_else(|e| die("replaying the graph", e));
        }
        let issued = t0.elapsed();
        gpu.end
            .record(s)
            .unwrap_or_else(|e| die("recording an event", e));
        gpu.end
            .synchronize()
            .unwrap_or_else(|e| die("waiting for the replays", e));
        issued
    }

    /// `ops` issued one by one between the timing events; the host time of
    /// the loop.
    fn timed_stream(&self, ops: Vec<Op>) -> Duration {
        let gpu = self.gpu.as_ref().expect("GPU state");
        let s = gpu.stream.raw();
        let (async_op, blocking) = (self.args.async_op, self.args.blocking);
        let mut works = Vec::with_capacity(ops.len());
        self.barrier();
        gpu.start
            .record(s)
            .unwrap_or_else(|e| die("recording an event", e));
        let t0 = Instant::now();
        for op in ops {
            let w = self.submit(op, async_op);
            if blocking {
                if async_op {
                    w.wait_blocking()
                        .unwrap_or_else(|e| die("operation failed", e));
                } else {
                    cuda::stream_synchronize(s)
                        .unwrap_or_else(|e| die("synchronizing the stream", e));
                }
            } else if async_op {
                works.push(w);
            }
        }
        let issued = t0.elapsed();
        // async_op = 1 ran on the comm's stream: ours waits for it.
        for w in works.drain(..) {
            w.wait(s as *mut _)
                .unwrap_or_else(|e| die("operation failed", e));
        }
        gpu.end
            .record(s)
            .unwrap_or_else(|e| die("recording an event", e));
        gpu.end
            .synchronize()
            .unwrap_or_else(|e| die("waiting for the stream", e));
        issued
    }
}

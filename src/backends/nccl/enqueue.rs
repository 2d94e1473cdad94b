//! Enqueuing one operation on a CUDA stream: the stream it goes on (the
//! caller's, or the comm's internal one after it for an asynchronous call),
//! graph capture, the start and end events its work waits on, and the
//! staging of inputs that overlap outputs in ways NCCL does not allow.
//!
//! Capture interaction mode: an operation whose stream is not capturing is
//! enqueued (our driver calls and every NCCL call, including what NCCL
//! does inside them, such as connecting a pair on its first exchange) with
//! the calling thread's mode set to relaxed, and the thread's own mode put
//! back after. In CUDA's default (global) mode, a thread may not make
//! "potentially unsafe" calls (allocations, frees, synchronous calls,
//! mapping) while any thread has a global-mode capture running: such a call
//! fails and invalidates that other thread's capture, which has nothing to
//! do with this operation. An operation that is itself being captured keeps
//! the thread's mode, so that its capture's rules still apply to it. The
//! cost: one pair of `cuThreadExchangeStreamCaptureMode` calls (each a swap
//! of a per-thread value in the driver) per uncaptured operation, none per
//! captured one.

use super::work::CudaWork;
use super::NcclBackend;
use crate::cuda;
use crate::error::{Error, Result};
use crate::op::{Op, OpOptions};
use crate::util::lock;
use crate::work::Work;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

impl NcclBackend {
    /// Enqueues `op` on the caller's stream (or, asynchronously, on the
    /// comm's internal stream after it) and returns its work.
    pub(super) fn enqueue(
        &self,
        op: &Op,
        opts: &OpOptions,
        timeout: Duration,
    ) -> Result<Arc<dyn Work>> {
        let _serial = lock(&self.issue);
        let _use = self.acquire()?;
        let _ctx = self.device.scoped()?;
        let user = opts.stream as cuda::RawStream;
        let captured = match cuda::capture_status(user)? {
            cuda::Capture::None => false,
            cuda::Capture::Active => true,
            cuda::Capture::Invalidated => {
                return Err(Error::invalid_usage(
                    "the stream's graph capture was invalidated by an earlier error",
                ))
            }
        };
        if captured {
            self.enqueue_on(op, opts, timeout, true)
        } else {
            cuda::with_relaxed_capture_mode(|| self.enqueue_on(op, opts, timeout, false))
        }
    }

    /// The rest of [`Self::enqueue`], with the comm held, its device's
    /// context current and the caller's stream's capture status known, in
    /// the capture interaction mode chosen there.
    fn enqueue_on(
        &self,
        op: &Op,
        opts: &OpOptions,
        timeout: Duration,
        captured: bool,
    ) -> Result<Arc<dyn Work>> {
        let name = op.name();
        let user = opts.stream as cuda::RawStream;
        let end = self.events.get()?;
        let (stream, start) = if captured {
            (user, None)
        } else {
            let start = self.events.get()?;
            let stream = if opts.async_op {
                start.record(user)?;
                cuda::stream_wait_event(self.stream.raw(), &start)?;
                self.stream.raw()
            } else {
                user
            };
            // On the internal stream this re-records the event the stream
            // just waited for: the wait keeps the earlier record.
            start.record(stream)?;
            (stream, Some(start))
        };
        match self.stage_overlapping(op, stream, captured)? {
            Some(staged) => {
                self.issue(&staged, stream as *mut c_void)?;
                // The next user of the staging buffer waits for this record.
                let mut st = lock(&self.staging);
                if st.done.is_none() {
                    st.done = Some(self.events.get()?);
                }
                st.done.as_ref().map(|e| e.record(stream)).transpose()?;
            }
            None => self.issue(op, stream as *mut c_void)?,
        }
        end.record(stream)?;
        Ok(Arc::new(CudaWork::new(
            name,
            self.label.clone(),
            timeout,
            captured,
            start,
            end,
            self.shared.clone(),
        )))
    }
}

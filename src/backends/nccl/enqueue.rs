//! Enqueuing one operation on a CUDA stream: the stream it goes on (the
//! caller's, or the comm's internal one after it for an asynchronous call),
//! graph capture, the start and end events its work waits on, and the
//! staging of inputs that overlap outputs in ways NCCL does not allow.

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
        let name = op.name();
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

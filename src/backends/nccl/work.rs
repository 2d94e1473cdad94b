//! Work of a device operation: a start and an end event from the backend's
//! pool, recorded on the stream the operation ran on.
//!
//! - status comes from event queries: not started until the start event
//!   completed, in progress until the end event completed;
//! - the timeout clock starts when the watchdog first sees the start event
//!   complete (the operation actually began on the device);
//! - `wait` makes a stream wait for the end event; `wait_blocking` polls it
//!   from the host and gives up once the comm failed;
//! - an operation captured into a CUDA graph has no completion of its own
//!   (it runs at every replay): it reports completed at once, and its
//!   events are never queried.

use crate::cuda::{self, Event};
use crate::error::{Error, ErrorKind, Result};
use crate::util::lock;
use crate::work::{Work, WorkStatus};
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// State shared by a backend and its works: the failure that broke the
/// comm, and the comm's refusals (named by a timeout).
#[derive(Default)]
pub struct Shared {
    failure: Mutex<Option<Error>>,
    pub refusals: Option<super::refusal::Refusals>,
}

impl Shared {
    pub fn with_refusals(refusals: super::refusal::Refusals) -> Shared {
        Shared {
            failure: Mutex::new(None),
            refusals: Some(refusals),
        }
    }
    pub fn fail(&self, e: Error) {
        lock(&self.failure).get_or_insert(e);
    }
    pub fn failure(&self) -> Option<Error> {
        lock(&self.failure).clone()
    }
}

struct State {
    status: WorkStatus,
    started: Option<Instant>,
    error: Option<Error>,
}

pub struct CudaWork {
    /// The operation's name and the comm's label: the description is
    /// formatted only for messages, not on every call.
    op_name: &'static str,
    comm_label: Arc<str>,
    timeout: Duration,
    /// Enqueued while the stream was capturing a graph.
    captured: bool,
    /// None for captured work.
    start: Option<Event>,
    end: Event,
    shared: Arc<Shared>,
    state: Mutex<State>,
}

impl CudaWork {
    pub fn new(
        op_name: &'static str,
        comm_label: Arc<str>,
        timeout: Duration,
        captured: bool,
        start: Option<Event>,
        end: Event,
        shared: Arc<Shared>,
    ) -> CudaWork {
        let status = if captured {
            WorkStatus::Completed
        } else {
            WorkStatus::NotStarted
        };
        CudaWork {
            op_name,
            comm_label,
            timeout,
            captured,
            start,
            end,
            shared,
            state: Mutex::new(State {
                status,
                started: None,
                error: None,
            }),
        }
    }

    fn description(&self) -> String {
        format!("{} on {}", self.op_name, self.comm_label)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn finish(s: &mut State, status: WorkStatus, error: Option<Error>) {
        s.status = status;
        s.error = error;
    }

    /// Refreshes the status from the events (never during capture).
    fn poll(&self, s: &mut State, now: Instant) {
        if s.status.is_finished() || self.captured {
            return;
        }
        let g = self.end.pool_device().scoped();
        let r = g.and_then(|_g| {
            if self.end.query()? {
                return Ok(Some(true));
            }
            if s.started.is_none() && self.start.as_ref().map_or(Ok(true), |e| e.query())? {
                s.started = Some(now);
            }
            Ok(None)
        });
        match r {
            Ok(Some(_)) => match self.shared.failure() {
                // Kernels end early when the comm is aborted: what completed
                // after a failure is not trusted.
                Some(f) => Self::finish(s, WorkStatus::Error, Some(f.context(self.description()))),
                None => Self::finish(s, WorkStatus::Completed, None),
            },
            Ok(None) => {
                if s.started.is_some() {
                    s.status = WorkStatus::InProgress;
                }
            }
            Err(e) => Self::finish(s, WorkStatus::Error, Some(e.context(self.description()))),
        }
    }

    fn outcome(s: &State) -> Result<()> {
        s.error.clone().map_or(Ok(()), Err)
    }
}

impl Work for CudaWork {
    fn status(&self) -> WorkStatus {
        let mut s = self.lock();
        self.poll(&mut s, Instant::now());
        s.status
    }

    fn wait(&self, stream: *mut c_void) -> Result<()> {
        {
            let s = self.lock();
            if s.error.is_some() {
                return Self::outcome(&s);
            }
        }
        let _g = self.end.pool_device().scoped()?;
        cuda::stream_wait_event(stream as cuda::RawStream, &self.end)
            .map_err(|e| e.context(self.description()))
    }

    fn wait_blocking(&self) -> Result<()> {
        if self.captured {
            return Ok(());
        }
        let mut pause = Duration::from_micros(2);
        loop {
            {
                let mut s = self.lock();
                self.poll(&mut s, Instant::now());
                if s.status.is_finished() {
                    return Self::outcome(&s);
                }
                if let Some(f) = self.shared.failure() {
                    let e = Error::new(f.kind, f.message).context(self.description());
                    Self::finish(&mut s, WorkStatus::Error, Some(e.clone()));
                    return Err(e);
                }
            }
            if pause < Duration::from_micros(64) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(pause);
            }
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    fn check_timeout(&self, now: Instant) -> Option<Error> {
        let mut s = self.lock();
        self.poll(&mut s, now);
        let started = s.started?;
        if s.status != WorkStatus::InProgress || now.duration_since(started) <= self.timeout {
            return None;
        }
        // A rank that refused this call never issued it (NCCL cannot be
        // told): name it. The store is asked without the state lock, so a
        // waiter keeps polling meanwhile instead of queueing on the lock and
        // seeing the timeout before the watchdog has recorded it for the comm.
        drop(s);
        let refused = self
            .shared
            .refusals
            .as_ref()
            .and_then(|r| r.by_peers())
            .map(|told| {
                format!("; a peer refused a collective, which this rank then waits for: {told}")
            })
            .unwrap_or_default();
        let mut s = self.lock();
        if s.status != WorkStatus::InProgress {
            return None; // it finished (or failed) while the store was asked
        }
        let err = Error::new(
            ErrorKind::Timeout,
            format!(
                "{} timed out: still running {} ms after it started on the device (timeout {} ms){refused}",
                self.description(),
                now.duration_since(started).as_millis(),
                self.timeout.as_millis()
            ),
        );
        Self::finish(&mut s, WorkStatus::TimedOut, Some(err.clone()));
        Some(err)
    }
}

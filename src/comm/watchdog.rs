//! The comm's watchdog and failure handling: the thread that fails works
//! past their timeout and polls the backend's asynchronous errors, and what
//! a failed operation does to its comm (abort, or abort the process).

use super::Comm;
use crate::error::{Error, ErrorKind, Result};
use crate::util::lock;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const WATCHDOG_PERIOD: Duration = Duration::from_millis(100);

/// The watchdog's clock: a period, cut short once stopped.
#[derive(Default)]
pub(super) struct Ticker {
    stopped: Mutex<bool>,
    changed: Condvar,
}

impl Ticker {
    /// Waits up to `period` (less once stopped); false once stopped.
    pub(super) fn tick(&self, period: Duration) -> bool {
        let stopped = lock(&self.stopped);
        if *stopped {
            return false;
        }
        let (stopped, _) = self
            .changed
            .wait_timeout(stopped, period)
            .unwrap_or_else(|e| e.into_inner());
        !*stopped
    }

    pub(super) fn stop(&self) {
        *lock(&self.stopped) = true;
        self.changed.notify_all();
    }
}

/// What the host executor reaches of its comm while an operation runs.
impl Comm {
    /// Starts the watchdog thread (it holds the comm until stopped).
    pub(super) fn start_watchdog(self: &Arc<Self>) -> Result<()> {
        let comm = self.clone();
        let watchdog = std::thread::Builder::new()
            .name(format!("tc-watchdog-{}", self.name))
            .spawn(move || comm.watchdog_loop())
            .map_err(|e| Error::system("spawning the watchdog thread", e))?;
        lock(&self.threads).push(watchdog);
        Ok(())
    }

    fn watchdog_loop(self: Arc<Self>) {
        loop {
            if !self.ticker.tick(WATCHDOG_PERIOD) {
                return;
            }
            let now = Instant::now();
            let mut expired = None;
            lock(&self.outstanding).retain(|w| {
                if let Some(e) = w.check_timeout(now) {
                    expired.get_or_insert(e);
                }
                !w.status().is_finished()
            });
            // The works still in the flight recorder's ring are on no list
            // (see `CommEvents::issued`).
            for w in self.recorder.works() {
                if !w.known_finished() {
                    if let Some(e) = w.check_timeout(now) {
                        expired.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = expired.or_else(|| self.backend.abilities().async_error()) {
                self.record_failure(e);
            }
        }
    }

    /// Records an operation's failure: the comm is aborted (or, with
    /// abort-on-error, the process), so that no rank waits forever.
    pub(super) fn record_failure(&self, err: Error) {
        lock(&self.first_failure).get_or_insert_with(|| err.clone());
        // Caller errors that every rank detects alike (mismatched sizes or
        // collectives) leave the connections healthy: fail only that call.
        // So does memory a call's counts ask for and this rank lacks: the
        // backend tells the peers, and closes its connections itself where
        // the ranks are left out of step.
        if matches!(
            err.kind,
            ErrorKind::Aborted
                | ErrorKind::InvalidUsage
                | ErrorKind::InvalidArgument
                | ErrorKind::Unsupported
                | ErrorKind::OutOfMemory
        ) {
            return;
        }
        if !self.enter_aborted(&err) {
            return;
        }
        // The recent operations, with the failed one still in progress or
        // timed out, are what a person reading a hang needs next to the
        // error (compare the ranks' sequence numbers).
        let recent = self.recorder.dump(&self.label);
        if self.abort_on_error.load(Ordering::Relaxed) {
            crate::config::log(
                crate::config::Level::Warn,
                &format!(
                    "{}; aborting the process (abort_on_error; TORCHCOMM_ABORT_ON_ERROR=0 to fail calls instead)\n{recent}",
                    err.message
                ),
            );
            self.run_abort_hook(&err);
            std::process::abort();
        }
        crate::log_warn!("comm '{}' aborted: {}\n{recent}", self.name, err.message);
        self.run_abort_hook(&err);
        self.backend.abilities().abort();
        self.abort_windows(&Error::new(
            ErrorKind::Aborted,
            format!("comm '{}' was aborted: {}", self.name, err.message),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::Ticker;
    use crate::backends::{CommEvents, Issue};
    use crate::comm::Op;
    use crate::work::{DoneWork, HostWork, Work, WorkStatus};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// A watched work is on no list while the flight recorder's ring holds
    /// it, and joins the watchdog's list when the ring drops it unfinished:
    /// both must still time out.
    #[test]
    fn works_in_the_recorders_ring_and_dropped_from_it_time_out() {
        let comm = crate::comm::test_support::one_rank_comm("watchdog-ring", None);
        assert!(comm.recorder.holds_works());
        let timeout = Duration::from_millis(100);
        let stuck = |name| {
            let w = Arc::new(HostWork::new(name, "test".into(), timeout));
            w.start();
            w
        };
        let dropped = stuck("barrier");
        let kept = stuck("all_reduce");
        let issue = |w: &Arc<dyn Work>| {
            let seq = comm.recorder.reserve();
            comm.issued(seq, &Op::Barrier, true, Issue::Watched(w), Instant::now());
        };
        issue(&(dropped.clone() as Arc<dyn Work>));
        // Enough finished ones after it to push it out of the ring.
        let done: Arc<dyn Work> = Arc::new(DoneWork(Ok(())));
        for _ in 0..crate::config::config().flight_recorder {
            issue(&done);
        }
        issue(&(kept.clone() as Arc<dyn Work>));
        let deadline = Instant::now() + Duration::from_secs(20);
        while [&dropped, &kept]
            .iter()
            .any(|w| w.status() != WorkStatus::TimedOut)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            dropped.status(),
            WorkStatus::TimedOut,
            "dropped from the ring"
        );
        assert_eq!(kept.status(), WorkStatus::TimedOut, "still in the ring");
        let _ = comm.finalize();
    }

    #[test]
    fn a_stopped_ticker_ends_the_watchdog_loop() {
        let t = Ticker::default();
        assert!(t.tick(Duration::from_millis(1)));
        t.stop();
        assert!(!t.tick(Duration::from_secs(60)), "returns at once, false");
    }
}

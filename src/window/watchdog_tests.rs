//! Window works under the comm's watchdog: a backend call that never ends by
//! itself (as a device-side wait for a signal a dead peer never sends) is
//! timed out by the watchdog, which aborts the comm and so ends the call.
//! The backend here is a test double that blocks until it is closed.

use super::Window;
use crate::backends::WindowBackend;
use crate::comm::{Comm, OpOptions};
use crate::error::{ErrorKind, Result};
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Every traffic call blocks, ignoring its timeout, until `close`.
#[derive(Default)]
struct Stuck {
    closed: Mutex<bool>,
    cv: Condvar,
    closes: AtomicUsize,
}

impl Stuck {
    fn block(&self) -> Result<()> {
        let mut closed = crate::util::lock(&self.closed);
        while !*closed {
            closed = self.cv.wait(closed).unwrap_or_else(|e| e.into_inner());
        }
        Err(crate::error::Error::new(
            ErrorKind::Aborted,
            "the stuck call was ended by close",
        ))
    }
}

impl WindowBackend for Stuck {
    fn register(&self, _: *mut c_void, _: usize, _: Duration) -> Result<()> {
        Ok(())
    }
    fn deregister(&self, _: Duration) -> Result<()> {
        Ok(())
    }
    fn remote_size(&self, _: i32) -> usize {
        1 << 20
    }
    fn put(&self, _: *const c_void, _: usize, _: i32, _: usize, _: Duration) -> Result<()> {
        self.block()
    }
    fn get(&self, _: *mut c_void, _: usize, _: i32, _: usize, _: Duration) -> Result<()> {
        self.block()
    }
    fn signal(&self, _: i32, _: Duration) -> Result<()> {
        self.block()
    }
    fn wait_signal(&self, _: i32, _: Duration) -> Result<()> {
        self.block()
    }
    fn map_remote(&self, _: i32) -> Result<*mut c_void> {
        Ok(std::ptr::null_mut())
    }
    fn close(&self) {
        self.closes.fetch_add(1, Ordering::SeqCst);
        *crate::util::lock(&self.closed) = true;
        self.cv.notify_all();
    }
}

const TIMEOUT: Duration = Duration::from_millis(600);

fn one_rank_comm(name: &str) -> Arc<Comm> {
    crate::comm::test_support::one_rank_comm(name, Some(TIMEOUT))
}

/// Runs `call` on a window over a stuck backend, on a thread of its own (so
/// that a missing watchdog fails the test instead of hanging it), and
/// checks that it fails with the watchdog's timeout naming `op`, within the
/// timeout and the grace (plus slack for a loaded machine), and that the
/// comm is aborted and the backend closed.
fn check_watched(name: &str, op: &str, call: fn(&Window) -> Result<()>) {
    let comm = one_rank_comm(name);
    let stuck = Arc::new(Stuck::default());
    let win = Arc::new(Window::with_backend(&comm, stuck.clone()));
    let mut buf = [0u8; 64];
    win.register(buf.as_mut_ptr() as *mut c_void, buf.len())
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let w = win.clone();
    let start = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(call(&w));
    });
    let limit = TIMEOUT + comm.backend().abilities().watchdog_grace() + Duration::from_secs(20);
    let result = rx
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{op}: still stuck after {limit:?}: not watched"));
    let took = start.elapsed();
    let e = result.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout, "{op}: {e}");
    assert!(e.message.contains(op), "{e}");
    assert!(e.message.contains("timed out after"), "{e}");
    assert!(
        e.message.contains(&format!("window of comm '{name}'")),
        "{e}"
    );
    assert!(
        took >= TIMEOUT,
        "{op}: failed after {took:?}, before its timeout"
    );
    // The watchdog aborts the comm just after it failed the work.
    let deadline = Instant::now() + Duration::from_secs(10);
    while comm.check_active().is_ok() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let aborted = comm.check_active().unwrap_err();
    assert_eq!(aborted.kind, ErrorKind::Aborted, "{aborted}");
    assert!(aborted.message.contains(op), "{aborted}");
    // The abort closed the backend (once), which ended the stuck call.
    while stuck.closes.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(stuck.closes.load(Ordering::SeqCst), 1, "closed once");
    drop(win);
}

fn async_opts() -> OpOptions {
    OpOptions {
        async_op: true,
        ..OpOptions::default()
    }
}

#[test]
fn stuck_async_wait_signal_is_timed_out_by_the_watchdog() {
    check_watched("wd_async_wait", "window_wait_signal", |w| {
        w.wait_signal(0, &async_opts())?.wait_blocking()
    });
}

#[test]
fn stuck_blocking_put_is_timed_out_by_the_watchdog() {
    check_watched("wd_blocking_put", "window_put", |w| {
        let src = [1u8; 8];
        w.put(
            src.as_ptr() as *const c_void,
            8,
            0,
            0,
            &OpOptions::default(),
        )
        .map(drop)
    });
}

#[test]
fn stuck_async_get_is_timed_out_by_the_watchdog() {
    check_watched("wd_async_get", "window_get", |w| {
        // Leaked: the get may outlive this closure's frame.
        let dst: &'static mut [u8] = Box::leak(Box::new([0u8; 8]));
        w.get(dst.as_mut_ptr() as *mut c_void, 8, 0, 0, &async_opts())?
            .wait_blocking()
    });
}

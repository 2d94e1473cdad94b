//! One-sided windows (RMA) over a comm: the checks every backend shares.
//!
//! A [`Window`] holds its comm alive and the backend's [`WindowBackend`].
//! It checks arguments before the backend sees them (ranks in range,
//! offsets and sizes without overflow and within the target's registered
//! buffer, a buffer registered where one is needed, the comm still active)
//! and keeps registration apart from traffic: `register`/`deregister` take
//! the state exclusively, `put`/`signal`/`wait_signal` share it, so a
//! thread waiting for a signal never blocks another thread's puts.
//! Every call completes before it returns (host windows have no stream).

use crate::backends::WindowBackend;
use crate::comm::{Comm, OpOptions};
use crate::error::{Error, Result};
use std::ffi::c_void;
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::Duration;

pub struct Window {
    comm: Arc<Comm>,
    inner: Box<dyn WindowBackend>,
    /// This rank's registered buffer and its size, or None.
    registered: RwLock<Option<(usize, usize)>>,
}

impl Window {
    /// Collective over the comm: every rank creates its window in the same
    /// order.
    pub fn new(comm: &Arc<Comm>) -> Result<Window> {
        comm.check_active()?;
        let inner = comm.backend().new_window(comm.timeout())?;
        Ok(Window { comm: comm.clone(), inner, registered: RwLock::new(None) })
    }

    pub fn comm(&self) -> &Arc<Comm> {
        &self.comm
    }

    fn timeout(&self, opts: &OpOptions) -> Duration {
        opts.timeout.unwrap_or(self.comm.timeout())
    }

    fn check_rank(&self, rank: i32, arg: &str) -> Result<()> {
        if rank < 0 || rank >= self.comm.size() {
            return Err(Error::invalid_argument(format!(
                "argument '{arg}': rank {rank} is outside [0, {})",
                self.comm.size()
            )));
        }
        Ok(())
    }

    /// The state, shared, once a buffer is registered and the comm active.
    fn registered_state(&self, what: &str) -> Result<RwLockReadGuard<'_, Option<(usize, usize)>>> {
        self.comm.check_active()?;
        let state = self.registered.read().unwrap_or_else(|e| e.into_inner());
        if state.is_none() {
            return Err(Error::invalid_usage(format!("{what}: no buffer is registered with this window (tc_window_register)")));
        }
        Ok(state)
    }

    /// Collective: registers `bytes` at `buf` as this rank's window memory.
    pub fn register(&self, buf: *mut c_void, bytes: usize) -> Result<()> {
        self.comm.check_active()?;
        let mut state = self.registered.write().unwrap_or_else(|e| e.into_inner());
        if state.is_some() {
            return Err(Error::invalid_usage("a buffer is already registered with this window: deregister it first"));
        }
        if bytes == 0 {
            return Err(Error::invalid_argument("argument 'bytes': a window buffer needs at least one byte"));
        }
        self.inner.register(buf, bytes, self.comm.timeout())?;
        *state = Some((buf as usize, bytes));
        Ok(())
    }

    /// Collective: after it no put lands in the buffer any more.
    pub fn deregister(&self) -> Result<()> {
        self.comm.check_active()?;
        let mut state = self.registered.write().unwrap_or_else(|e| e.into_inner());
        if state.is_none() {
            return Err(Error::invalid_usage("no buffer is registered with this window"));
        }
        // The registration ends whatever the backend answers: a failed
        // collective leaves the buffer no longer safe to count on.
        *state = None;
        self.inner.deregister(self.comm.timeout())
    }

    pub fn put(&self, src: *const c_void, bytes: usize, dst_rank: i32, dst_offset: usize, opts: &OpOptions) -> Result<()> {
        self.check_rank(dst_rank, "dst_rank")?;
        let _state = self.registered_state("put")?;
        let size = self.inner.remote_size(dst_rank);
        match dst_offset.checked_add(bytes) {
            Some(end) if end <= size => {}
            _ => {
                return Err(Error::invalid_argument(format!(
                    "argument 'dst_offset': {bytes} bytes at offset {dst_offset} do not fit in rank {dst_rank}'s window of {size} bytes"
                )))
            }
        }
        if bytes == 0 {
            return Ok(());
        }
        self.inner.put(src, bytes, dst_rank, dst_offset, self.timeout(opts))
    }

    pub fn signal(&self, peer: i32, opts: &OpOptions) -> Result<()> {
        self.check_rank(peer, "peer")?;
        let _state = self.registered_state("signal")?;
        self.inner.signal(peer, self.timeout(opts))
    }

    pub fn wait_signal(&self, peer: i32, opts: &OpOptions) -> Result<()> {
        self.check_rank(peer, "peer")?;
        let _state = self.registered_state("wait_signal")?;
        self.inner.wait_signal(peer, self.timeout(opts))
    }

    pub fn map_remote(&self, rank: i32) -> Result<*mut c_void> {
        self.check_rank(rank, "rank")?;
        let _state = self.registered_state("map_remote")?;
        self.inner.map_remote(rank)
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        self.inner.close();
    }
}

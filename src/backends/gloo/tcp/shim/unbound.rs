//! Gloo's unbound buffers over caller memory: point-to-point sends and
//! receives, and waits that another thread may abort.

use super::{call, ms, CallError, CallResult, Context, Module, Ubuf, ABORTED, OK};
use std::ffi::{c_char, c_int, c_void};

/// How a wait on an unbound buffer ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// One operation completed, with this peer.
    Done(i32),
    /// `abort_wait_*` ended the wait.
    Aborted,
}

/// An owned Gloo unbound buffer over caller memory (see tc_gloo.h). It
/// borrows its context: drop it before the context.
pub struct UnboundBuffer {
    module: &'static Module,
    ptr: *mut Ubuf,
}

// Gloo's unbound buffers lock internally: a wait on one thread and an abort
// on another is their intended use.
unsafe impl Send for UnboundBuffer {}
unsafe impl Sync for UnboundBuffer {}

impl Drop for UnboundBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr came from ubuf_new and is freed once.
        unsafe { (self.module.ubuf_free)(self.ptr) }
    }
}

/// Milliseconds for a wait; None: no timeout.
fn wait_ms(t: Option<std::time::Duration>) -> i64 {
    t.map_or(0, ms)
}

impl UnboundBuffer {
    /// # Safety
    /// `ptr` must stay valid for `size` bytes until the buffer is dropped
    /// and no transfer into it is pending.
    pub unsafe fn new(
        ctx: &Context,
        ptr: *mut u8,
        size: usize,
    ) -> std::result::Result<UnboundBuffer, CallError> {
        let mut out = std::ptr::null_mut();
        call(|(e, l)| (ctx.module.ubuf_new)(ctx.ptr, ptr as *mut c_void, size, &mut out, e, l))?;
        Ok(UnboundBuffer {
            module: ctx.module,
            ptr: out,
        })
    }

    pub fn send(&self, peer: i32, slot: u64, offset: usize, nbytes: usize) -> CallResult {
        call(|(e, l)| unsafe {
            (self.module.ubuf_send)(self.ptr, peer, slot, offset, nbytes, e, l)
        })
    }

    pub fn recv(&self, peer: i32, slot: u64, offset: usize, nbytes: usize) -> CallResult {
        call(|(e, l)| unsafe {
            (self.module.ubuf_recv)(self.ptr, peer, slot, offset, nbytes, e, l)
        })
    }

    /// From whichever of `srcs` sends first (empty: every other rank).
    pub fn recv_any(&self, srcs: &[i32], slot: u64, offset: usize, nbytes: usize) -> CallResult {
        let p = if srcs.is_empty() {
            std::ptr::null()
        } else {
            srcs.as_ptr()
        };
        call(|(e, l)| unsafe {
            (self.module.ubuf_recv_any)(self.ptr, p, srcs.len(), slot, offset, nbytes, e, l)
        })
    }

    fn wait(
        &self,
        f: unsafe extern "C" fn(*mut Ubuf, i64, *mut c_int, *mut c_char, usize) -> c_int,
        t: Option<std::time::Duration>,
    ) -> std::result::Result<Waited, CallError> {
        let mut peer: c_int = -1;
        let mut aborted = false;
        call(|(e, l)| {
            let rc = unsafe { f(self.ptr, wait_ms(t), &mut peer, e, l) };
            if rc == ABORTED {
                aborted = true;
                return OK;
            }
            rc
        })?;
        Ok(if aborted {
            Waited::Aborted
        } else {
            Waited::Done(peer)
        })
    }

    /// Waits for one send; `None`: no timeout (a Gloo timeout closes the
    /// context's connections).
    pub fn wait_send(
        &self,
        t: Option<std::time::Duration>,
    ) -> std::result::Result<Waited, CallError> {
        self.wait(self.module.ubuf_wait_send, t)
    }

    pub fn wait_recv(
        &self,
        t: Option<std::time::Duration>,
    ) -> std::result::Result<Waited, CallError> {
        self.wait(self.module.ubuf_wait_recv, t)
    }

    pub fn abort_wait_send(&self) {
        unsafe { (self.module.ubuf_abort_wait_send)(self.ptr) }
    }

    pub fn abort_wait_recv(&self) {
        unsafe { (self.module.ubuf_abort_wait_recv)(self.ptr) }
    }
}

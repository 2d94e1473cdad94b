//! Window calls (`tc_window_put`, `_get`, `_signal`, `_wait_signal`)
//! through their comm's operation hooks.
//!
//! A window call is described like an operation: its name ("window_put",
//! ...), the target rank as `peer`, a put's source as its one input and a
//! get's destination as its one output (`count` in bytes, dtype uint8),
//! the offset in the target's window. Its sequence number counts the
//! comm's window calls on their own, from 1: a one-sided call has no
//! counterpart on other ranks, so it must not shift the numbers the
//! collectives share across ranks (nor enter the flight recorder).
//! Pre hooks run on the calling thread once the call passed its checks;
//! post hooks once it ended, on the thread that ran it (the caller's for a
//! blocking call run inline, the window's lane thread otherwise), before
//! its work reports completion; a call refused after its pre hooks (the
//! window freed, the comm aborted) gets its post hooks on the calling
//! thread with that error.

use super::{refuse_inside_hook, run, HookEvent, OpRecord, PostHooks};
use crate::comm::Comm;
use crate::error::{Error, ErrorKind, Result};
use crate::types::DType;
use crate::util::lock;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// One window call as hooks see it.
pub struct WindowCall {
    /// One of the window names of [`crate::op::OP_NAMES`].
    pub name: &'static str,
    /// The target (put, signal), source (get) or signalling (wait) rank.
    pub peer: i32,
    /// Put: the bytes read; get: the bytes written; None for the others.
    pub local: Option<(*mut c_void, usize)>,
    /// Put / get: the byte offset in the peer's window.
    pub offset: usize,
    pub async_op: bool,
}

impl WindowCall {
    /// A put or get of `local` (address, bytes) at `offset` of `peer`'s
    /// window.
    pub fn transfer(
        name: &'static str,
        peer: i32,
        local: (usize, usize),
        offset: usize,
        opts: &crate::comm::OpOptions,
    ) -> WindowCall {
        WindowCall {
            name,
            peer,
            local: Some((local.0 as *mut c_void, local.1)),
            offset,
            async_op: opts.async_op,
        }
    }

    /// A signal to, or a wait for a signal from, `peer`.
    pub fn signal(name: &'static str, peer: i32, opts: &crate::comm::OpOptions) -> WindowCall {
        WindowCall {
            name,
            peer,
            local: None,
            offset: 0,
            async_op: opts.async_op,
        }
    }
}

/// The post hooks a window call owes, taken by whichever of its run or its
/// refusal comes first.
pub type OwedPostHooks = Option<Arc<Mutex<Option<PostHooks>>>>;

/// Runs the post hooks still owed with `result` (no-op once run).
pub fn settle(owed: &OwedPostHooks, result: &Result<()>) {
    if let Some(post) = owed.as_ref().and_then(|o| lock(o).take()) {
        post.run(result, true);
    }
}

/// Carried by a call's task: the post hooks run with its result, or with an
/// `Aborted` error when the task is discarded unrun (the window freed, or
/// the comm aborted, before it ran: refused, or dropped from the queue).
pub struct Settler {
    pub owed: OwedPostHooks,
    pub name: &'static str,
}

impl Drop for Settler {
    fn drop(&mut self) {
        if let Some(post) = self.owed.as_ref().and_then(|o| lock(o).take()) {
            let why = format!(
                "{} did not run: its window was freed or its comm aborted first",
                self.name
            );
            post.run(&Err(Error::new(ErrorKind::Aborted, why)), true);
        }
    }
}

impl Comm {
    /// The pre hooks of `call`, and the post hooks it then owes; None (at
    /// the cost of one relaxed load) when the comm has no hook.
    pub(crate) fn window_hooks(&self, call: WindowCall) -> Result<OwedPostHooks> {
        if !self.hooks().active() {
            return Ok(None);
        }
        let hooks = self.hooks().snapshot();
        if hooks.pre.is_empty() && hooks.post.is_empty() {
            return Ok(None); // only the NaN check, which windows skip
        }
        refuse_inside_hook(call.name)?;
        let record = Arc::new(describe(call, self.hooks().next_window_seq()));
        if !hooks.pre.is_empty() {
            let event = HookEvent {
                record: &record,
                outcome: None,
                completed: false,
            };
            run(&hooks.pre, &event);
        }
        Ok(Some(Arc::new(Mutex::new(Some(PostHooks {
            record,
            hooks,
        })))))
    }
}

impl super::Hooks {
    fn next_window_seq(&self) -> u64 {
        self.window_seq.fetch_add(1, Ordering::Relaxed) + 1
    }
}

fn describe(call: WindowCall, seq: u64) -> OpRecord {
    let buffer = call.local.map(|(ptr, bytes)| super::tc_op_buffer_t {
        ptr,
        count: bytes,
        dtype: DType::U8.to_c(),
        peer: call.peer,
    });
    let is_get = call.name == "window_get";
    let (inputs, outputs) = match buffer {
        Some(b) if is_get => (Vec::new(), vec![b]),
        Some(b) => (vec![b], Vec::new()),
        None => (Vec::new(), Vec::new()),
    };
    OpRecord {
        name: call.name,
        seq,
        dtype: buffer.map(|_| DType::U8),
        root: -1,
        peer: call.peer,
        reduce_op: None,
        async_op: call.async_op,
        inputs,
        outputs,
        tag: 0,
        input_tags: Vec::new(),
        output_tags: Vec::new(),
        window_offset: call.offset,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_puts_gets_and_signals() {
        let call = |name, local| WindowCall {
            name,
            peer: 2,
            local,
            offset: 24,
            async_op: true,
        };
        let put = describe(call("window_put", Some((8 as *mut c_void, 16))), 3);
        assert_eq!(
            (put.seq, put.peer, put.window_offset, put.async_op),
            (3, 2, 24, true)
        );
        assert_eq!(
            (put.inputs.len(), put.outputs.len(), put.inputs[0].count),
            (1, 0, 16)
        );
        assert_eq!(put.dtype, Some(DType::U8));
        let get = describe(call("window_get", Some((8 as *mut c_void, 4))), 4);
        assert_eq!(
            (get.inputs.len(), get.outputs.len(), get.outputs[0].peer),
            (0, 1, 2)
        );
        let signal = describe(call("window_signal", None), 5);
        assert!(signal.inputs.is_empty() && signal.outputs.is_empty() && signal.dtype.is_none());
        for name in [
            "window_put",
            "window_get",
            "window_signal",
            "window_wait_signal",
        ] {
            assert_eq!(super::super::c_op_name(name).to_str().unwrap(), name);
        }
    }
}

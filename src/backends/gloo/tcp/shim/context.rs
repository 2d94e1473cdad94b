//! An owned Gloo context: the full mesh over the store, and the
//! collectives and barrier the backend calls on it.

use super::{call, ms, CallError, CallResult, Ctx, Module, ReduceFn, StoreVtable, Transfer};
use std::ffi::CString;
use std::ffi::{c_char, c_int, c_void, CStr};

/// An owned Gloo context.
pub struct Context {
    pub(super) module: &'static Module,
    pub(super) ptr: *mut Ctx,
}

// The context is used by one thread at a time for operations (the comm's
// progress thread); `close` may come from another thread, which Gloo's
// closeConnections allows.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: ptr came from context_new and is freed once.
        unsafe { (self.module.context_free)(self.ptr) }
    }
}

impl Context {
    /// Connects the full mesh through `store`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        module: &'static Module,
        rank: i32,
        size: i32,
        store: &StoreVtable,
        timeout: std::time::Duration,
        hostname: Option<&str>,
        iface: Option<&str>,
    ) -> std::result::Result<Context, CallError> {
        let host = hostname.map(|h| CString::new(h).unwrap_or_default());
        let ifc = iface.map(|h| CString::new(h).unwrap_or_default());
        let mut ptr = std::ptr::null_mut();
        call(|(e, l)| unsafe {
            (module.context_new)(
                rank,
                size,
                store,
                ms(timeout),
                host.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                ifc.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                &mut ptr,
                e,
                l,
            )
        })?;
        Ok(Context { module, ptr })
    }

    /// This rank's local address of its connection to `peer`.
    pub fn pair_address(&self, peer: i32) -> std::result::Result<String, CallError> {
        let mut out = vec![0 as c_char; 256];
        call(|(e, l)| unsafe {
            (self.module.pair_address)(self.ptr, peer, out.as_mut_ptr(), out.len(), e, l)
        })?;
        Ok(unsafe { CStr::from_ptr(out.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    pub fn close(&self) {
        unsafe { (self.module.context_close)(self.ptr) }
    }

    /// Puts Gloo's network thread of this context under SCHED_BATCH (its
    /// wake-ups then never preempt the thread running on its CPU) or back
    /// under the default policy; nothing with a module that cannot.
    pub fn network_thread_batch(&self, batch: bool) {
        if let Some(f) = self.module.network_thread_batch {
            // SAFETY: a live context; the call never fails.
            unsafe { f(self.ptr, c_int::from(batch)) };
        }
    }

    /// # Safety (for all operations below)
    /// Buffers must be valid for the sizes given for the call's duration.
    pub unsafe fn broadcast(
        &self,
        buf: *mut u8,
        nbytes: usize,
        root: i32,
        tag: u32,
        t: std::time::Duration,
    ) -> CallResult {
        call(|(e, l)| {
            (self.module.broadcast)(self.ptr, buf as *mut c_void, nbytes, root, tag, ms(t), e, l)
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub unsafe fn allreduce(
        &self,
        input: *const u8,
        out: *mut u8,
        count: usize,
        elem: usize,
        f: ReduceFn,
        tag: u32,
        t: std::time::Duration,
    ) -> CallResult {
        call(|(e, l)| {
            (self.module.allreduce)(
                self.ptr,
                input as *const c_void,
                out as *mut c_void,
                count,
                elem,
                f,
                tag,
                ms(t),
                e,
                l,
            )
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &self,
        input: *const u8,
        out: *mut u8,
        count: usize,
        elem: usize,
        root: i32,
        f: ReduceFn,
        tag: u32,
        t: std::time::Duration,
    ) -> CallResult {
        call(|(e, l)| {
            (self.module.reduce)(
                self.ptr,
                input as *const c_void,
                out as *mut c_void,
                count,
                elem,
                root,
                f,
                tag,
                ms(t),
                e,
                l,
            )
        })
    }

    pub unsafe fn allgather(
        &self,
        input: *const u8,
        out: *mut u8,
        nbytes: usize,
        tag: u32,
        t: std::time::Duration,
    ) -> CallResult {
        call(|(e, l)| {
            (self.module.allgather)(
                self.ptr,
                input as *const c_void,
                out as *mut c_void,
                nbytes,
                tag,
                ms(t),
                e,
                l,
            )
        })
    }

    pub unsafe fn allgatherv(
        &self,
        input: *const u8,
        out: *mut u8,
        sizes: &[usize],
        tag: u32,
        t: std::time::Duration,
    ) -> CallResult {
        call(|(e, l)| {
            (self.module.allgatherv)(
                self.ptr,
                input as *const c_void,
                out as *mut c_void,
                sizes.as_ptr(),
                tag,
                ms(t),
                e,
                l,
            )
        })
    }

    pub unsafe fn gather(
        &self,
        input: *const u8,
        out: *mut u8,
        nbytes: usize,
        root: i32,
        tag: u32,
        t: std::time::Duration,
    ) -> CallResult {
        call(|(e, l)| {
            (self.module.gather)(
                self.ptr,
                input as *const c_void,
                out as *mut c_void,
                nbytes,
                root,
                tag,
                ms(t),
                e,
                l,
            )
        })
    }

    pub unsafe fn scatter(
        &self,
        inputs: &[*const u8],
        out: *mut u8,
        nbytes: usize,
        root: i32,
        tag: u32,
        t: std::time::Duration,
    ) -> CallResult {
        let ptrs: Vec<*const c_void> = inputs.iter().map(|p| *p as *const c_void).collect();
        let pp = if ptrs.is_empty() {
            std::ptr::null()
        } else {
            ptrs.as_ptr()
        };
        call(|(e, l)| {
            (self.module.scatter)(
                self.ptr,
                pp,
                out as *mut c_void,
                nbytes,
                root,
                tag,
                ms(t),
                e,
                l,
            )
        })
    }

    pub unsafe fn alltoall(
        &self,
        input: *const u8,
        out: *mut u8,
        nbytes: usize,
        tag: u32,
        t: std::time::Duration,
    ) -> CallResult {
        call(|(e, l)| {
            (self.module.alltoall)(
                self.ptr,
                input as *const c_void,
                out as *mut c_void,
                nbytes,
                tag,
                ms(t),
                e,
                l,
            )
        })
    }

    pub unsafe fn alltoallv(
        &self,
        input: *const u8,
        in_bytes: &[usize],
        out: *mut u8,
        out_bytes: &[usize],
        tag: u32,
        t: std::time::Duration,
    ) -> CallResult {
        call(|(e, l)| {
            (self.module.alltoallv)(
                self.ptr,
                input as *const c_void,
                in_bytes.as_ptr(),
                out as *mut c_void,
                out_bytes.as_ptr(),
                tag,
                ms(t),
                e,
                l,
            )
        })
    }

    pub fn barrier(&self, tag: u32, t: std::time::Duration) -> CallResult {
        call(|(e, l)| unsafe { (self.module.barrier)(self.ptr, tag, ms(t), e, l) })
    }

    pub unsafe fn p2p(&self, ops: &[Transfer], t: std::time::Duration) -> CallResult {
        let mut peer: c_int = -1;
        call(|(e, l)| (self.module.p2p)(self.ptr, ops.as_ptr(), ops.len(), ms(t), &mut peer, e, l))
            .map_err(|mut err| {
                err.peer = (peer >= 0).then_some(peer);
                err
            })
    }
}

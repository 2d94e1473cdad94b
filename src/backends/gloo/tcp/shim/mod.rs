//! Loading `libtorchcomm-gloo.so`, the C++ module that carries the Gloo
//! calls (gloo_shim/tc_gloo.h), and thin safe wrappers around its entry
//! points.
//!
//! The module is looked up, in order: `TORCHCOMM_GLOO_LIBRARY` (a path); the
//! directory of the loaded libtorchcomm (found with dladdr), for an
//! installed library; the directory of the running executable, its parent
//! (Rust tests under target/<profile>/deps) and `../lib` beside it (the
//! installed tc-perf in PREFIX/bin); then the dynamic loader's own search
//! path. It is loaded once per process.

use crate::error::ErrorKind;
use std::ffi::{c_char, c_int, c_void, CStr};

mod context;
mod load;
mod unbound;

pub use context::Context;
pub use load::module;
pub use unbound::{UnboundBuffer, Waited};

pub(crate) const MODULE_NAME: &str = "libtorchcomm-gloo.so";
const ABI_VERSION: c_int = 2;

pub(crate) const OK: c_int = 0;
pub(crate) const ERR_TIMEOUT: c_int = 1;
pub(crate) const ERR_REMOTE: c_int = 2;
pub(crate) const ERR_INVALID: c_int = 3;
#[allow(dead_code)] // returned by the shim; mapped by the catch-all arm
pub(crate) const ERR_INTERNAL: c_int = 4;
pub(crate) const ERR_STORE: c_int = 5;
/// A wait ended by an abort (not an error).
pub(crate) const ABORTED: c_int = 6;

#[repr(C)]
pub struct Ctx {
    _opaque: [u8; 0],
}

#[repr(C)]
pub struct Ubuf {
    _opaque: [u8; 0],
}

pub type SinkFn = unsafe extern "C" fn(sink: *mut c_void, data: *const c_void, len: usize);

#[repr(C)]
pub struct StoreVtable {
    pub user: *mut c_void,
    pub set: unsafe extern "C" fn(
        *mut c_void,
        *const c_char,
        *const c_void,
        usize,
        *mut c_char,
        usize,
    ) -> c_int,
    pub get: unsafe extern "C" fn(
        *mut c_void,
        *const c_char,
        *mut c_void,
        SinkFn,
        *mut c_char,
        usize,
    ) -> c_int,
    pub wait: unsafe extern "C" fn(
        *mut c_void,
        *const *const c_char,
        usize,
        i64,
        *mut c_char,
        usize,
    ) -> c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Transfer {
    pub peer: c_int,
    pub is_send: c_int,
    pub buf: *mut c_void,
    pub nbytes: usize,
    pub slot: u64,
}

pub use crate::kernels::reduce::ReduceFn;

type Err = (*mut c_char, usize);

#[allow(clippy::type_complexity)]
pub struct Module {
    pub path: String,
    abi_version: unsafe extern "C" fn() -> c_int,
    /// GLOO_VERSION of the module's Gloo headers; None for a module built
    /// before it had the call.
    gloo_version: Option<unsafe extern "C" fn() -> c_int>,
    /// Optional too: older modules lack it.
    network_thread_batch: Option<unsafe extern "C" fn(*mut Ctx, c_int) -> c_int>,
    context_new: unsafe extern "C" fn(
        c_int,
        c_int,
        *const StoreVtable,
        i64,
        *const c_char,
        *const c_char,
        *mut *mut Ctx,
        *mut c_char,
        usize,
    ) -> c_int,
    pub context_close: unsafe extern "C" fn(*mut Ctx),
    pub context_free: unsafe extern "C" fn(*mut Ctx),
    pair_address:
        unsafe extern "C" fn(*mut Ctx, c_int, *mut c_char, usize, *mut c_char, usize) -> c_int,
    broadcast: unsafe extern "C" fn(
        *mut Ctx,
        *mut c_void,
        usize,
        c_int,
        u32,
        i64,
        *mut c_char,
        usize,
    ) -> c_int,
    allreduce: unsafe extern "C" fn(
        *mut Ctx,
        *const c_void,
        *mut c_void,
        usize,
        usize,
        ReduceFn,
        u32,
        i64,
        *mut c_char,
        usize,
    ) -> c_int,
    reduce: unsafe extern "C" fn(
        *mut Ctx,
        *const c_void,
        *mut c_void,
        usize,
        usize,
        c_int,
        ReduceFn,
        u32,
        i64,
        *mut c_char,
        usize,
    ) -> c_int,
    allgather: unsafe extern "C" fn(
        *mut Ctx,
        *const c_void,
        *mut c_void,
        usize,
        u32,
        i64,
        *mut c_char,
        usize,
    ) -> c_int,
    allgatherv: unsafe extern "C" fn(
        *mut Ctx,
        *const c_void,
        *mut c_void,
        *const usize,
        u32,
        i64,
        *mut c_char,
        usize,
    ) -> c_int,
    gather: unsafe extern "C" fn(
        *mut Ctx,
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        u32,
        i64,
        *mut c_char,
        usize,
    ) -> c_int,
    scatter: unsafe extern "C" fn(
        *mut Ctx,
        *const *const c_void,
        *mut c_void,
        usize,
        c_int,
        u32,
        i64,
        *mut c_char,
        usize,
    ) -> c_int,
    alltoall: unsafe extern "C" fn(
        *mut Ctx,
        *const c_void,
        *mut c_void,
        usize,
        u32,
        i64,
        *mut c_char,
        usize,
    ) -> c_int,
    alltoallv: unsafe extern "C" fn(
        *mut Ctx,
        *const c_void,
        *const usize,
        *mut c_void,
        *const usize,
        u32,
        i64,
        *mut c_char,
        usize,
    ) -> c_int,
    barrier: unsafe extern "C" fn(*mut Ctx, u32, i64, *mut c_char, usize) -> c_int,
    p2p: unsafe extern "C" fn(
        *mut Ctx,
        *const Transfer,
        usize,
        i64,
        *mut c_int,
        *mut c_char,
        usize,
    ) -> c_int,
    ubuf_new: unsafe extern "C" fn(
        *mut Ctx,
        *mut c_void,
        usize,
        *mut *mut Ubuf,
        *mut c_char,
        usize,
    ) -> c_int,
    ubuf_free: unsafe extern "C" fn(*mut Ubuf),
    ubuf_send:
        unsafe extern "C" fn(*mut Ubuf, c_int, u64, usize, usize, *mut c_char, usize) -> c_int,
    ubuf_recv:
        unsafe extern "C" fn(*mut Ubuf, c_int, u64, usize, usize, *mut c_char, usize) -> c_int,
    ubuf_recv_any: unsafe extern "C" fn(
        *mut Ubuf,
        *const c_int,
        usize,
        u64,
        usize,
        usize,
        *mut c_char,
        usize,
    ) -> c_int,
    ubuf_wait_send: unsafe extern "C" fn(*mut Ubuf, i64, *mut c_int, *mut c_char, usize) -> c_int,
    ubuf_wait_recv: unsafe extern "C" fn(*mut Ubuf, i64, *mut c_int, *mut c_char, usize) -> c_int,
    ubuf_abort_wait_send: unsafe extern "C" fn(*mut Ubuf),
    ubuf_abort_wait_recv: unsafe extern "C" fn(*mut Ubuf),
}

// The module's functions are plain C functions callable from any thread.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

impl Module {
    /// "x.y.z" of the Gloo headers the module was built with.
    pub fn gloo_version(&self) -> Option<String> {
        // SAFETY: resolved from the module, which stays loaded.
        let v = unsafe { (self.gloo_version?)() };
        Some(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
    }
}

/// A failed module call: its code and message.
#[derive(Debug, Clone)]
pub struct CallError {
    pub code: c_int,
    pub message: String,
    /// For p2p: the peer whose transfer failed.
    pub peer: Option<i32>,
}

impl CallError {
    pub fn kind(&self) -> ErrorKind {
        match self.code {
            ERR_TIMEOUT => ErrorKind::Timeout,
            ERR_REMOTE => ErrorKind::Remote,
            ERR_INVALID => ErrorKind::InvalidArgument,
            ERR_STORE => ErrorKind::Remote,
            _ => ErrorKind::Internal,
        }
    }
}

pub type CallResult = std::result::Result<(), CallError>;

const ERRLEN: usize = 1024;

#[inline]
fn call(f: impl FnOnce(Err) -> c_int) -> CallResult {
    let mut buf = vec![0 as c_char; ERRLEN];
    let rc = f((buf.as_mut_ptr(), ERRLEN));
    if rc == OK {
        return Ok(());
    }
    let message = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Err(CallError {
        code: rc,
        message,
        peer: None,
    })
}

/// Milliseconds for a module call's timeout, at least 1.
fn ms(t: std::time::Duration) -> i64 {
    (t.as_millis().min(i64::MAX as u128) as i64).max(1)
}

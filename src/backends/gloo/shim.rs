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

use crate::error::{Error, ErrorKind, Result};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

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

pub use super::reduce::ReduceFn;

type Err = (*mut c_char, usize);

#[allow(clippy::type_complexity)]
pub struct Module {
    pub path: String,
    abi_version: unsafe extern "C" fn() -> c_int,
    /// GLOO_VERSION of the module's Gloo headers; None for a module built
    /// before it had the call.
    gloo_version: Option<unsafe extern "C" fn() -> c_int>,
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

static MODULE: OnceLock<std::result::Result<Module, Error>> = OnceLock::new();

/// The loaded module, or `TC_ERR_UNAVAILABLE` saying what to install.
pub fn module() -> Result<&'static Module> {
    MODULE.get_or_init(load).as_ref().map_err(|e| e.clone())
}

fn dlerror_string() -> String {
    // SAFETY: dlerror returns NULL or a thread-local C string.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown dlopen error".into()
    } else {
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Directory of the object that contains this function (libtorchcomm.so, or
/// the executable when the crate is linked statically).
fn own_object_dir() -> Option<PathBuf> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address.
    let rc = unsafe { libc::dladdr(own_object_dir as *const c_void, &mut info) };
    if rc == 0 || info.dli_fname.is_null() {
        return None;
    }
    let name = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    let path = std::fs::canonicalize(&name).unwrap_or_else(|_| PathBuf::from(name));
    path.parent().map(|p| p.to_path_buf())
}

/// Where the module may lie: beside libtorchcomm.so (or the executable), one
/// level up (Rust tests under target/<profile>/deps), and in `../lib`, where
/// `make install` puts it for the installed binaries in PREFIX/bin.
fn candidates() -> Vec<PathBuf> {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.to_path_buf()));
    let mut out = Vec::new();
    for dir in [own_object_dir(), exe_dir].into_iter().flatten() {
        out.push(dir.join(MODULE_NAME));
        if let Some(parent) = dir.parent() {
            out.push(parent.join(MODULE_NAME));
            out.push(parent.join("lib").join(MODULE_NAME));
        }
    }
    out.dedup();
    out
}

fn load() -> std::result::Result<Module, Error> {
    let explicit = std::env::var_os("TORCHCOMM_GLOO_LIBRARY").filter(|v| !v.is_empty());
    let mut tried = Vec::new();
    let mut handle = std::ptr::null_mut();
    let mut path_used = String::new();
    let looked_in;
    let try_open = |p: &str, tried: &mut Vec<String>| -> *mut c_void {
        let c = match CString::new(p) {
            Ok(c) => c,
            Err(_) => return std::ptr::null_mut(),
        };
        // SAFETY: dlopen with a valid C string.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            tried.push(format!("{p}: {}", dlerror_string()));
        }
        h
    };
    if let Some(p) = explicit {
        let p = p.to_string_lossy().into_owned();
        looked_in = format!("TORCHCOMM_GLOO_LIBRARY={p}");
        handle = try_open(&p, &mut tried);
        path_used = p;
    } else {
        let searched = candidates();
        looked_in = searched
            .iter()
            .map(|c| c.display().to_string())
            .chain(["the loader's path".to_string()])
            .collect::<Vec<_>>()
            .join(", ");
        for c in searched {
            if !c.exists() {
                continue;
            }
            let p = c.to_string_lossy().into_owned();
            handle = try_open(&p, &mut tried);
            if !handle.is_null() {
                path_used = p;
                break;
            }
        }
        if handle.is_null() {
            handle = try_open(MODULE_NAME, &mut tried);
            path_used = MODULE_NAME.into();
        }
    }
    if handle.is_null() {
        return Err(Error::unavailable(format!(
            "the gloo backend needs {MODULE_NAME}, which was not found or did not load \
             (looked in: {looked_in}): {}. It is built beside libtorchcomm.so only when Gloo's \
             headers are present at build time (apt-get install libgloo-dev, then rebuild), \
             `make install` puts it in PREFIX/lib, and TORCHCOMM_GLOO_LIBRARY names it",
            tried.join("; ")
        )));
    }
    macro_rules! sym {
        ($name:literal) => {{
            let c = concat!($name, "\0");
            // SAFETY: handle is a live dlopen handle; the symbol's type is
            // the one declared in tc_gloo.h.
            let p = unsafe { libc::dlsym(handle, c.as_ptr() as *const c_char) };
            if p.is_null() {
                return Err(Error::unavailable(format!(
                    "{path_used} lacks symbol {} (stale build?)",
                    $name
                )));
            }
            // The target type is the field's: the declared C signature.
            #[allow(clippy::missing_transmute_annotations)]
            let f = unsafe { std::mem::transmute::<*mut c_void, _>(p) };
            f
        }};
    }
    let m = Module {
        path: path_used.clone(),
        abi_version: sym!("tc_gloo_abi_version"),
        // SAFETY: as for `sym!`; a missing symbol is None.
        gloo_version: unsafe {
            let p = libc::dlsym(handle, c"tc_gloo_version".as_ptr());
            (!p.is_null())
                .then(|| std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> c_int>(p))
        },
        context_new: sym!("tc_gloo_context_new"),
        context_close: sym!("tc_gloo_context_close"),
        context_free: sym!("tc_gloo_context_free"),
        pair_address: sym!("tc_gloo_pair_address"),
        broadcast: sym!("tc_gloo_broadcast"),
        allreduce: sym!("tc_gloo_allreduce"),
        reduce: sym!("tc_gloo_reduce"),
        allgather: sym!("tc_gloo_allgather"),
        allgatherv: sym!("tc_gloo_allgatherv"),
        gather: sym!("tc_gloo_gather"),
        scatter: sym!("tc_gloo_scatter"),
        alltoall: sym!("tc_gloo_alltoall"),
        alltoallv: sym!("tc_gloo_alltoallv"),
        barrier: sym!("tc_gloo_barrier"),
        p2p: sym!("tc_gloo_p2p"),
        ubuf_new: sym!("tc_gloo_ubuf_new"),
        ubuf_free: sym!("tc_gloo_ubuf_free"),
        ubuf_send: sym!("tc_gloo_ubuf_send"),
        ubuf_recv: sym!("tc_gloo_ubuf_recv"),
        ubuf_recv_any: sym!("tc_gloo_ubuf_recv_any"),
        ubuf_wait_send: sym!("tc_gloo_ubuf_wait_send"),
        ubuf_wait_recv: sym!("tc_gloo_ubuf_wait_recv"),
        ubuf_abort_wait_send: sym!("tc_gloo_ubuf_abort_wait_send"),
        ubuf_abort_wait_recv: sym!("tc_gloo_ubuf_abort_wait_recv"),
    };
    // SAFETY: resolved above.
    let v = unsafe { (m.abi_version)() };
    if v != ABI_VERSION {
        return Err(Error::unavailable(format!(
            "{path_used} has ABI version {v}, this library needs {ABI_VERSION}"
        )));
    }
    Ok(m)
}

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

/// An owned Gloo context.
pub struct Context {
    module: &'static Module,
    ptr: *mut Ctx,
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

fn ms(t: std::time::Duration) -> i64 {
    (t.as_millis().min(i64::MAX as u128) as i64).max(1)
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

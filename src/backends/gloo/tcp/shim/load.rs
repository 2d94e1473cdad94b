//! Finding and loading the module: the places it may lie and the table of
//! its entry points, resolved once per process.

use super::{Module, ABI_VERSION, MODULE_NAME};
use crate::error::{Error, Result};
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

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
    let (handle, path_used) = open_module()?;
    let m = resolve_symbols(handle, &path_used)?;
    // SAFETY: resolved above.
    let v = unsafe { (m.abi_version)() };
    if v != ABI_VERSION {
        return Err(Error::unavailable(format!(
            "{path_used} has ABI version {v}, this library needs {ABI_VERSION}"
        )));
    }
    Ok(m)
}

/// dlopens `p`; on failure records why in `tried` and returns NULL.
fn try_open(p: &str, tried: &mut Vec<String>) -> *mut c_void {
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
}

/// Opens the module named by TORCHCOMM_GLOO_LIBRARY, else the first
/// candidate that loads, else whatever the loader's path finds; returns the
/// handle and the path it was opened by.
fn open_module() -> std::result::Result<(*mut c_void, String), Error> {
    let explicit = std::env::var_os("TORCHCOMM_GLOO_LIBRARY").filter(|v| !v.is_empty());
    let mut tried = Vec::new();
    let mut handle = std::ptr::null_mut();
    let mut path_used = String::new();
    let looked_in;
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
    Ok((handle, path_used))
}

/// The module's entry-point table, resolved from a live dlopen handle.
fn resolve_symbols(handle: *mut c_void, path_used: &str) -> std::result::Result<Module, Error> {
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
    // An entry point older modules lack: None then.
    macro_rules! optional_sym {
        ($name:literal) => {{
            let c = concat!($name, "\0");
            // SAFETY: as for `sym!`.
            let p = unsafe { libc::dlsym(handle, c.as_ptr() as *const c_char) };
            #[allow(clippy::missing_transmute_annotations)]
            (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, _>(p) })
        }};
    }
    let m = Module {
        path: path_used.to_string(),
        abi_version: sym!("tc_gloo_abi_version"),
        gloo_version: optional_sym!("tc_gloo_version"),
        network_thread_batch: optional_sym!("tc_gloo_network_thread_batch"),
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
    Ok(m)
}

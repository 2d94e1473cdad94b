//! What the UCX host transport's tests over TCP loopback share: their
//! ranks' environment, the probe that lets them pass (saying SKIPPED) where
//! UCX is missing, and a comm on a chosen host transport.

#![allow(dead_code)]

use crate::gloo_common::{child_comm_hinted, child_store, rank, size};
use std::sync::Arc;
use std::time::Duration;
use torchcomm::Comm;

/// Every rank's environment: shared memory off, UCX as the host transport,
/// TCP loopback only.
pub const LOOPBACK_ENV: &[(&str, &str)] = &[
    ("TORCHCOMM_GLOO_SHM", "0"),
    ("TORCHCOMM_HOST_TRANSPORT", "ucx"),
    ("UCX_TLS", "tcp,self"),
];

/// True (and says SKIPPED) where libucp.so.0 cannot be loaded.
pub fn ucx_missing() -> bool {
    let name = std::ffi::CString::new("libucp.so.0").unwrap();
    // SAFETY: a valid C string; the handle is kept (loading twice is cheap).
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        println!("SKIPPED: libucp.so.0 is not installed (make deps installs libucx0)");
        return true;
    }
    false
}

/// A gloo comm over this child's store whose host transport is
/// `transport` (the hint wins over the environment), failing calls (not
/// the process) on errors.
pub fn comm_with(name: &str, transport: &str, timeout: Duration) -> Arc<Comm> {
    let hints = vec![("gloo.host_transport".into(), transport.into())];
    child_comm_hinted(child_store(), name, (rank(), size()), timeout, hints).unwrap()
}

//! Helpers of the multi-process tests that drive the C API: a gloo comm of
//! this child's rank through `tc_comm_new`, and the thread's last error.

#![allow(dead_code)]

use crate::gloo_common::{rank, size};
use std::ffi::c_void;
use torchcomm::capi::TC_SUCCESS;
use torchcomm::capi::{tc_comm_destroy, tc_comm_finalize, tc_comm_new, tc_comm_t};
use torchcomm::capi::{tc_comm_options_t, Versioned};
use torchcomm::capi::{tc_device_t, TC_DEVICE_CPU};
use torchcomm::capi::{
    tc_dtype_t, tc_reducer_new, tc_reducer_options_t, tc_reducer_t, tc_result_t,
};
use torchcomm::capi::{tc_store_free, tc_store_tcp_new};

/// A gloo comm named `name` over the parent's store, failing calls (not the
/// process) on errors, with a 60 s timeout.
pub fn new_comm(name: &str) -> *mut tc_comm_t {
    new_comm_with_timeout(name, 60_000)
}

/// [`new_comm`] with a timeout of `timeout_ms`.
pub fn new_comm_with_timeout(name: &str, timeout_ms: i64) -> *mut tc_comm_t {
    let port: u16 = std::env::var("TC_GLOO_PORT").unwrap().parse().unwrap();
    let mut store = std::ptr::null_mut();
    let rc = tc_store_tcp_new(c"127.0.0.1".as_ptr(), port, 0, -1, 30_000, &mut store);
    assert_eq!(rc, TC_SUCCESS);
    let mut opts = tc_comm_options_t::defaults();
    let cname = std::ffi::CString::new(name).unwrap();
    opts.name = cname.as_ptr();
    opts.rank = rank();
    opts.world_size = size();
    opts.abort_on_error = 0;
    opts.timeout_ms = timeout_ms;
    opts.store = store;
    let mut comm = std::ptr::null_mut();
    let cpu = tc_device_t {
        r#type: TC_DEVICE_CPU,
        index: 0,
    };
    let rc = tc_comm_new(c"gloo".as_ptr(), cpu, &opts, &mut comm);
    assert_eq!(rc, TC_SUCCESS, "{}", last_error());
    tc_store_free(store);
    comm
}

pub fn last_error() -> String {
    unsafe { std::ffi::CStr::from_ptr(torchcomm::capi::tc_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// The end of a child's comm: finalize, which must succeed, then destroy.
#[track_caller]
pub fn finalize_and_destroy(comm: *mut tc_comm_t) {
    assert_eq!(tc_comm_finalize(comm), TC_SUCCESS, "{}", last_error());
    tc_comm_destroy(comm);
}

/// `tc_reducer_new` with one gradient per entry of `counts` and `dtypes`,
/// at `grads` (None: in the reducer's buckets, for
/// `gradient_as_bucket_view`): its result and the reducer (null when it
/// failed).
pub fn reducer_new(
    comm: *mut tc_comm_t,
    grads: Option<&[*mut c_void]>,
    counts: &[usize],
    dtypes: &[tc_dtype_t],
    opts: &tc_reducer_options_t,
) -> (tc_result_t, *mut tc_reducer_t) {
    let mut r = std::ptr::null_mut();
    let rc = tc_reducer_new(
        comm,
        grads.map_or(std::ptr::null(), <[_]>::as_ptr),
        counts.as_ptr(),
        dtypes.as_ptr(),
        counts.len(),
        opts,
        &mut r,
    );
    (rc, r)
}

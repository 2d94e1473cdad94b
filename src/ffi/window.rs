//! `tc_window_*`: one-sided (RMA) windows. No backend implements them yet;
//! `tc_window_new` answers `TC_ERR_UNSUPPORTED` (listed in the README).

use crate::error::{tc_result_t, Error};
use crate::ffi::comm::tc_comm_t;
use crate::ffi::{arg_out, arg_ref, boundary, boundary_void, take_handle};

/// A one-sided communication window over a comm.
pub struct tc_window {
    _private: (),
}

pub type tc_window_t = tc_window;

/// Creates a window on `comm`. Not implemented by any backend yet: returns
/// `TC_ERR_UNSUPPORTED` and leaves `*window` untouched.
#[no_mangle]
pub extern "C" fn tc_window_new(comm: *mut tc_comm_t, window: *mut *mut tc_window_t) -> tc_result_t {
    boundary("tc_window_new", || {
        let (comm, _out) = unsafe { (arg_ref(comm, "comm")?, arg_out(window, "window")?) };
        Err(Error::unsupported(format!(
            "windows (RMA) are not implemented for the {} backend yet",
            comm.inner.backend_name()
        )))
    })
}

/// Frees a window. NULL is ignored.
#[no_mangle]
pub extern "C" fn tc_window_free(window: *mut tc_window_t) {
    boundary_void("tc_window_free", || {
        drop(unsafe { take_handle(window) });
        Ok(())
    })
}

//! Routing of the library's log lines.

use crate::config::set_log_callback;
use crate::error::tc_result_t;
use crate::ffi::boundary;
use std::ffi::c_char;
use std::ffi::c_void;

/// Log levels passed to a log callback (and named by `TORCHCOMM_DEBUG`).
pub const TC_LOG_WARN: i32 = 1;
pub const TC_LOG_INFO: i32 = 2;
pub const TC_LOG_TRACE: i32 = 3;

/// A log sink: `level` is `TC_LOG_*`; `message` is valid during the call only.
pub type tc_log_callback_t =
    Option<extern "C" fn(level: i32, message: *const c_char, user_data: *mut c_void)>;

/// Sends the library's log lines (already filtered by `TORCHCOMM_DEBUG`) to
/// `callback` instead of stderr; NULL restores stderr. The callback may be
/// called from any thread, including the library's background threads, and
/// must not call back into libtorchcomm; `message` (the full line, with its
/// host:pid:rank prefix) is valid only during the call. `user_data` is passed
/// through untouched and must stay valid until the callback is replaced.
#[no_mangle]
pub extern "C" fn tc_set_log_callback(
    callback: tc_log_callback_t,
    user_data: *mut c_void,
) -> tc_result_t {
    boundary("tc_set_log_callback", || {
        set_log_callback(callback, user_data);
        Ok(())
    })
}

//! The `extern "C"` layer: one module per C object family, each a thin shell
//! over the safe Rust modules. Every exported function runs its body through
//! [`boundary`], which catches panics, turns errors into result codes and
//! records the thread's last-error detail, and checks its handle arguments
//! with [`handle_ref`] (see [`handle`]).

#![allow(non_camel_case_types)]
// Exported functions take raw pointers by design; each body checks them
// through the helpers below before any dereference.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod coalesced;
pub mod comm;
pub mod comm_names;
pub mod comm_ops;
pub mod comm_settings;
pub mod errors;
pub mod handle;
pub mod hooks;
pub mod local;
pub mod log;
pub mod mem;
pub mod persistent;
pub mod reducer;
pub mod shrink;
pub mod sparse;
pub mod store;
pub mod store_callbacks;
pub mod types;
pub mod window;
pub mod work;

pub use handle::{handle_mut, handle_ref, into_handle, take_handle};

use crate::error::{set_last_error, tc_result_t, Error, ErrorKind, Result, TC_SUCCESS};
use std::panic::{catch_unwind, AssertUnwindSafe};

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic payload".into())
}

/// Runs the body of exported function `func`: a panic becomes `TC_ERR_PANIC`,
/// an error its code; either way the thread's last error names `func`.
pub fn boundary(func: &'static str, body: impl FnOnce() -> Result<()>) -> tc_result_t {
    let err = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return TC_SUCCESS,
        Ok(Err(e)) => e,
        Err(payload) => Error::new(
            ErrorKind::Panic,
            format!("internal panic: {}", panic_message(&*payload)),
        ),
    };
    set_last_error(&format!("{func}: {}", err.message));
    crate::log_info!("{func} failed: {} ({})", err.message, err.code());
    err.code()
}

/// Like [`boundary`] for functions that return nothing (destroy/free):
/// failures are logged as warnings.
pub fn boundary_void(func: &'static str, body: impl FnOnce() -> Result<()>) {
    let rc = boundary(func, body);
    if rc != TC_SUCCESS {
        crate::log_warn!(
            "{}",
            unsafe { std::ffi::CStr::from_ptr(crate::error::last_error_ptr()) }.to_string_lossy()
        );
    }
}

/// Borrows a non-NULL input pointer to a plain C struct (never a handle:
/// handles go through [`handle_ref`], which checks they are live).
///
/// # Safety
/// `p` must be NULL or valid for reads for `'a`.
pub unsafe fn arg_ref<'a, T>(p: *const T, name: &str) -> Result<&'a T> {
    p.as_ref().ok_or_else(|| Error::null_argument(name))
}

/// Borrows a non-NULL output pointer. Callers check every out-pointer before
/// doing any work and write them only on success.
///
/// # Safety
/// `p` must be NULL or valid for writes for `'a`.
pub unsafe fn arg_out<'a, T>(p: *mut T, name: &str) -> Result<&'a mut T> {
    p.as_mut().ok_or_else(|| Error::null_argument(name))
}

/// Borrows `n` elements at `p`; NULL is allowed only when `n == 0`.
///
/// # Safety
/// `p` must be valid for reads of `n` elements for `'a`.
pub unsafe fn arg_slice<'a, T>(p: *const T, n: usize, name: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::null_argument(name));
    }
    Ok(std::slice::from_raw_parts(p, n))
}

/// Copies `bytes` into memory from `malloc`, for the caller to release with
/// `tc_free` (never NULL, even when empty).
pub fn malloc_copy(bytes: &[u8]) -> Result<*mut std::ffi::c_void> {
    let p = unsafe { libc::malloc(bytes.len().max(1)) };
    if p.is_null() {
        return Err(Error::system(
            "allocating memory for the caller",
            std::io::Error::from(std::io::ErrorKind::OutOfMemory),
        ));
    }
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast::<u8>(), bytes.len()) };
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{TC_ERR_NULL_ARGUMENT, TC_ERR_PANIC};

    fn last_error() -> String {
        unsafe { std::ffi::CStr::from_ptr(crate::error::last_error_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn panic_becomes_an_error_code() {
        let rc = boundary("tc_test_panic", || panic!("boom {}", 42));
        assert_eq!(rc, TC_ERR_PANIC);
        assert!(
            last_error().contains("tc_test_panic") && last_error().contains("boom 42"),
            "{}",
            last_error()
        );
    }

    #[test]
    fn null_argument_is_named() {
        let rc = boundary("tc_test_null", || unsafe {
            arg_out::<i32>(std::ptr::null_mut(), "thing").map(|_| ())
        });
        assert_eq!(rc, TC_ERR_NULL_ARGUMENT);
        assert!(last_error().contains("'thing'"), "{}", last_error());
    }
}

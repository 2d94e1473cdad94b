//! Result strings, per-thread error detail and the library version.

use crate::error::{last_error_ptr, tc_result_t, ErrorKind, TC_SUCCESS};
use crate::ffi::{arg_out, boundary};
use std::ffi::{c_char, c_int};

pub const TC_VERSION_MAJOR: i32 = 0;
pub const TC_VERSION_MINOR: i32 = 1;
pub const TC_VERSION_PATCH: i32 = 0;

/// Static English text for a result code; never NULL, never freed. Unknown
/// codes give "unknown result code". Thread-safe.
#[no_mangle]
pub extern "C" fn tc_result_string(result: tc_result_t) -> *const c_char {
    let text: &'static str = if result == TC_SUCCESS {
        "success\0"
    } else {
        ErrorKind::from_code(result).map_or("unknown result code\0", |k| k.describe())
    };
    text.as_ptr() as *const c_char
}

/// Detail of the last call that failed on the calling thread: which argument,
/// peer or OS/CUDA/NCCL error. Empty string if none failed yet. The pointer
/// stays valid until the next failing call on this thread; do not free it.
#[no_mangle]
pub extern "C" fn tc_last_error() -> *const c_char {
    last_error_ptr()
}

/// Writes the library's version (that of the loaded `libtorchcomm.so`, which
/// may differ from the header's `TC_VERSION_*`). All three pointers must be
/// non-NULL; nothing is written on failure. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_get_version(
    major: *mut c_int,
    minor: *mut c_int,
    patch: *mut c_int,
) -> tc_result_t {
    boundary("tc_get_version", || {
        let (major, minor, patch) = unsafe {
            (
                arg_out(major, "major")?,
                arg_out(minor, "minor")?,
                arg_out(patch, "patch")?,
            )
        };
        *major = TC_VERSION_MAJOR;
        *minor = TC_VERSION_MINOR;
        *patch = TC_VERSION_PATCH;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_version_matches_cargo() {
        assert_eq!(
            TC_VERSION_MAJOR.to_string(),
            env!("CARGO_PKG_VERSION_MAJOR")
        );
        assert_eq!(
            TC_VERSION_MINOR.to_string(),
            env!("CARGO_PKG_VERSION_MINOR")
        );
        assert_eq!(
            TC_VERSION_PATCH.to_string(),
            env!("CARGO_PKG_VERSION_PATCH")
        );
    }

    #[test]
    fn every_code_has_distinct_text() {
        let mut seen = std::collections::HashSet::new();
        for k in ErrorKind::ALL {
            let s = unsafe { std::ffi::CStr::from_ptr(tc_result_string(k.code())) };
            assert!(seen.insert(s.to_owned()), "duplicate text for {k:?}");
        }
    }
}

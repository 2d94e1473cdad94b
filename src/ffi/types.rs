//! Queries on value types.

use crate::error::tc_result_t;
use crate::ffi::{arg_out, boundary};
use crate::types::{tc_dtype_t, DType};

/// Writes the size in bytes of one element of `dtype` to `*size`. Returns
/// `TC_ERR_INVALID_ARGUMENT` for an unknown dtype, `TC_ERR_NULL_ARGUMENT` for
/// a NULL `size`; nothing is written on failure. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_dtype_size(dtype: tc_dtype_t, size: *mut usize) -> tc_result_t {
    boundary("tc_dtype_size", || {
        let out = unsafe { arg_out(size, "size")? };
        *out = DType::from_c(dtype, "dtype")?.size();
        Ok(())
    })
}

//! The C API as Rust items: every `extern "C"` function of
//! `include/torchcomm.h` (`tc_*`), its handle and option types and its
//! constants (`TC_*`), flat as in the header, for Rust programs and tests that
//! drive the library the way a C caller does. The functions are the ones the
//! shared library exports (defined in the crate's `ffi` layer); nothing here
//! is Rust-only except [`Versioned`] (`Versioned::defaults()` is what the
//! header's `TC_*_OPTIONS_INIT` gives a C caller) and [`clear_last_error`].

pub use crate::comm::hooks::tc_op_buffer_t;
pub use crate::error::{
    clear_last_error, tc_result_t, TC_ERR_ABORTED, TC_ERR_BUFFER_TOO_SMALL, TC_ERR_CUDA,
    TC_ERR_INTERNAL, TC_ERR_INVALID_ARGUMENT, TC_ERR_INVALID_USAGE, TC_ERR_NCCL, TC_ERR_NOT_FOUND,
    TC_ERR_NULL_ARGUMENT, TC_ERR_OUT_OF_MEMORY, TC_ERR_PANIC, TC_ERR_REMOTE, TC_ERR_SYSTEM,
    TC_ERR_TIMEOUT, TC_ERR_UNAVAILABLE, TC_ERR_UNSUPPORTED, TC_SUCCESS,
};
pub use crate::ffi::coalesced::*;
pub use crate::ffi::comm::*;
pub use crate::ffi::comm_ops::*;
pub use crate::ffi::comm_settings::*;
pub use crate::ffi::errors::*;
pub use crate::ffi::hooks::*;
pub use crate::ffi::local::*;
pub use crate::ffi::log::*;
pub use crate::ffi::mem::*;
pub use crate::ffi::persistent::*;
pub use crate::ffi::reconfigure::*;
pub use crate::ffi::reducer::*;
pub use crate::ffi::shrink::*;
pub use crate::ffi::sparse::*;
pub use crate::ffi::store::*;
pub use crate::ffi::store_callbacks::*;
pub use crate::ffi::types::*;
pub use crate::ffi::window::*;
pub use crate::ffi::work::*;
pub use crate::options::{
    tc_comm_options_t, tc_op_options_t, Versioned, TC_COMM_OPTIONS_MAGIC, TC_COMM_OPTIONS_VERSION,
    TC_OP_OPTIONS_MAGIC, TC_OP_OPTIONS_VERSION, TC_UNSET,
};
pub use crate::reducer::hooks::tc_grad_bucket_t;
pub use crate::types::{
    tc_device_t, tc_dtype_t, tc_hint_t, tc_red_kind_t, tc_reduce_op_t, TC_AVG, TC_BAND,
    TC_BFLOAT16, TC_BOOL, TC_BOR, TC_BXOR, TC_DEVICE_CPU, TC_DEVICE_CUDA, TC_FLOAT16, TC_FLOAT32,
    TC_FLOAT64, TC_FLOAT8_E4M3, TC_FLOAT8_E5M2, TC_INT32, TC_INT64, TC_INT8, TC_MAX, TC_MIN,
    TC_PREMUL_SUM, TC_PRODUCT, TC_SUM, TC_UINT32, TC_UINT64, TC_UINT8,
};

//! Versioned option structs (NCCL's config convention).
//!
//! Each struct starts with `size`, `magic`, `version`; callers fill it with
//! `TC_*_OPTIONS_INIT`. The library copies `min(size, sizeof)` bytes over its
//! own defaults, so fields newer than the caller's struct keep their defaults,
//! and rejects a wrong magic. Fields are only ever appended.

#![allow(non_camel_case_types)]

use crate::error::{Error, Result};
use crate::types::tc_hint_t;
use std::ffi::{c_char, c_void};
use std::mem::size_of;

/// "Not set" value of integer option fields: the library picks the default.
pub const TC_UNSET: i32 = -1;

pub const TC_COMM_OPTIONS_MAGIC: u32 = 0x5443_4F4D;
pub const TC_COMM_OPTIONS_VERSION: u32 = 1;
pub const TC_OP_OPTIONS_MAGIC: u32 = 0x5443_4F50;
pub const TC_OP_OPTIONS_VERSION: u32 = 1;

/// Options of `tc_comm_new` and `tc_comm_split`. Initialize with
/// `TC_COMM_OPTIONS_INIT`, then set the fields you need.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_comm_options_t {
    /// `sizeof(tc_comm_options_t)` as the caller compiled it.
    pub size: usize,
    /// Must be `TC_COMM_OPTIONS_MAGIC`.
    pub magic: u32,
    /// `TC_COMM_OPTIONS_VERSION` as the caller compiled it.
    pub version: u32,
    /// Communicator name, unique among the live comms of this process
    /// (`tc_comm_new` refuses a name in use with `TC_ERR_INVALID_ARGUMENT`;
    /// `tc_comm_destroy` frees it); keys in the store are scoped by it.
    /// NULL: a generated name, the first `comm<N>` not in use. Copied during
    /// the call. `tc_comm_split` takes the name as an argument instead.
    pub name: *const c_char,
    /// Default timeout of every operation, in milliseconds. `TC_UNSET`:
    /// `TORCHCOMM_TIMEOUT_SECONDS`, else 600 s.
    pub timeout_ms: i64,
    /// 1: abort the process on a timeout or remote failure; 0: abort the
    /// communicator and fail later calls. `TC_UNSET`: `TORCHCOMM_ABORT_ON_ERROR`,
    /// else 1.
    pub abort_on_error: i32,
    /// This process's rank. `TC_UNSET`: from the environment.
    pub rank: i32,
    /// Number of ranks. `TC_UNSET`: from the environment.
    pub world_size: i32,
    /// Rendezvous store, borrowed for the call (the comm keeps its own
    /// reference). NULL: bootstrap from `MASTER_ADDR`/`MASTER_PORT`.
    pub store: *mut crate::ffi::store::tc_store_t,
    /// Backend hints, copied during the call; NULL when `num_hints` is 0.
    pub hints: *const tc_hint_t,
    pub num_hints: usize,
}

/// Options of every operation. Initialize with `TC_OP_OPTIONS_INIT`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_op_options_t {
    /// `sizeof(tc_op_options_t)` as the caller compiled it.
    pub size: usize,
    /// Must be `TC_OP_OPTIONS_MAGIC`.
    pub magic: u32,
    /// `TC_OP_OPTIONS_VERSION` as the caller compiled it.
    pub version: u32,
    /// 0: the call returns when the operation is complete (CPU) or enqueued
    /// on `stream` (CUDA). 1: asynchronous; use the work handle.
    pub async_op: i32,
    /// Timeout in milliseconds; 0 or `TC_UNSET`: the comm's timeout.
    pub timeout_ms: i64,
    /// `cudaStream_t`/`CUstream` for CUDA buffers; NULL: the legacy default
    /// stream. Ignored for host buffers.
    pub stream: *mut c_void,
    /// Backend hints, copied during the call; NULL when `num_hints` is 0.
    pub hints: *const tc_hint_t,
    pub num_hints: usize,
}

/// A struct with the size/magic/version header and defaults.
pub trait Versioned: Copy {
    const MAGIC: u32;
    const NAME: &'static str;
    fn defaults() -> Self;
}

impl Versioned for tc_comm_options_t {
    const MAGIC: u32 = TC_COMM_OPTIONS_MAGIC;
    const NAME: &'static str = "tc_comm_options_t";
    fn defaults() -> Self {
        tc_comm_options_t {
            size: size_of::<Self>(),
            magic: TC_COMM_OPTIONS_MAGIC,
            version: TC_COMM_OPTIONS_VERSION,
            name: std::ptr::null(),
            timeout_ms: TC_UNSET as i64,
            abort_on_error: TC_UNSET,
            rank: TC_UNSET,
            world_size: TC_UNSET,
            store: std::ptr::null_mut(),
            hints: std::ptr::null(),
            num_hints: 0,
        }
    }
}

impl Versioned for tc_op_options_t {
    const MAGIC: u32 = TC_OP_OPTIONS_MAGIC;
    const NAME: &'static str = "tc_op_options_t";
    fn defaults() -> Self {
        tc_op_options_t {
            size: size_of::<Self>(),
            magic: TC_OP_OPTIONS_MAGIC,
            version: TC_OP_OPTIONS_VERSION,
            async_op: 0,
            timeout_ms: TC_UNSET as i64,
            stream: std::ptr::null_mut(),
            hints: std::ptr::null(),
            num_hints: 0,
        }
    }
}

/// The header every versioned struct starts with.
#[repr(C)]
struct Header {
    size: usize,
    magic: u32,
    version: u32,
}

/// Reads a versioned struct from C: NULL gives the defaults; otherwise the
/// caller's `min(size, sizeof)` bytes are copied over the defaults.
///
/// # Safety
/// `p` must be NULL or point to at least `p->size` readable bytes.
pub unsafe fn read_versioned<T: Versioned>(p: *const T, arg: &str) -> Result<T> {
    let mut out = T::defaults();
    if p.is_null() {
        return Ok(out);
    }
    let header = std::ptr::read_unaligned(p as *const Header);
    if header.magic != T::MAGIC {
        return Err(Error::invalid_argument(format!(
            "argument '{arg}': bad magic 0x{:08x} (expected 0x{:08x}); initialize {} with its _INIT macro",
            header.magic,
            T::MAGIC,
            T::NAME
        )));
    }
    if header.size < size_of::<Header>() {
        return Err(Error::invalid_argument(format!(
            "argument '{arg}': size {} is smaller than the {}-byte header of {}",
            header.size,
            size_of::<Header>(),
            T::NAME
        )));
    }
    let n = header.size.min(size_of::<T>());
    std::ptr::copy_nonoverlapping(p as *const u8, &mut out as *mut T as *mut u8, n);
    Ok(out)
}

/// Timeout option in ms: `TC_UNSET` (any negative) or 0 means "inherit".
pub fn timeout_from_ms(ms: i64) -> Option<std::time::Duration> {
    (ms > 0).then(|| std::time::Duration::from_millis(ms as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_gives_defaults() {
        let o = unsafe { read_versioned::<tc_op_options_t>(std::ptr::null(), "opts") }.unwrap();
        assert_eq!(o.async_op, 0);
        assert_eq!(o.timeout_ms, TC_UNSET as i64);
    }

    #[test]
    fn short_struct_keeps_defaults_for_newer_fields() {
        // A caller compiled against a version whose struct ended after
        // `timeout_ms`: the bytes beyond its size must be ignored.
        let mut o = tc_comm_options_t::defaults();
        o.timeout_ms = 1234;
        o.rank = 7;
        o.world_size = 9;
        o.size = std::mem::offset_of!(tc_comm_options_t, abort_on_error);
        let read = unsafe { read_versioned(&o, "opts") }.unwrap();
        assert_eq!(read.timeout_ms, 1234);
        assert_eq!(read.rank, TC_UNSET);
        assert_eq!(read.world_size, TC_UNSET);
    }

    #[test]
    fn wrong_magic_and_tiny_size_are_rejected() {
        let mut o = tc_op_options_t::defaults();
        o.magic = 0xdead_beef;
        let e = unsafe { read_versioned(&o, "opts") }.unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::InvalidArgument);
        assert!(
            e.message.contains("opts") && e.message.contains("magic"),
            "{}",
            e.message
        );
        let mut o = tc_op_options_t::defaults();
        o.size = 3;
        assert!(unsafe { read_versioned(&o, "opts") }.is_err());
    }

    #[test]
    fn larger_struct_from_a_newer_caller_is_accepted() {
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Newer {
            base: tc_op_options_t,
            extra: u64,
        }
        let mut n = Newer {
            base: tc_op_options_t::defaults(),
            extra: 99,
        };
        n.base.size = std::mem::size_of::<Newer>();
        n.base.async_op = 1;
        let read = unsafe { read_versioned(&n.base as *const tc_op_options_t, "opts") }.unwrap();
        assert_eq!(read.async_op, 1);
    }
}

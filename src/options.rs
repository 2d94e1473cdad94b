//! Versioned option structs (NCCL's config convention).
//!
//! Each struct starts with `size`, `magic`, `version`; callers fill it with
//! `TC_*_OPTIONS_INIT`. Fields are only ever appended, and a version's struct
//! is a prefix of the next one's. The library rejects a wrong magic and
//! version 0 (no struct ever had it), then copies over its own defaults the
//! caller's bytes up to the smallest of `size`, its own `sizeof` and the end
//! of the last field the caller's `version` has: fields newer than the
//! caller's version or struct keep their defaults. A version newer than the
//! library's is accepted, as NCCL accepts a newer `ncclConfig_t`: only the
//! fields this library knows are read, and later fields (whose defaults
//! must mean "as before") are ignored; callers that need a newer field's
//! behaviour check `tc_get_version`.

#![allow(non_camel_case_types)]

use crate::error::{Error, Result};
use crate::types::tc_hint_t;
use std::ffi::{c_char, c_void};
use std::mem::size_of;

/// "Not set" value of integer option fields: the library picks the default.
pub const TC_UNSET: i32 = -1;

/// The `peer` of a `tc_recv` that takes a message from any other rank
/// (as MPI_ANY_SOURCE; see `tc_recv`).
pub const TC_ANY_SOURCE: i32 = -1;

pub const TC_COMM_OPTIONS_MAGIC: u32 = 0x5443_4F4D;
/// Version 2 added `enable_reconfigure`.
pub const TC_COMM_OPTIONS_VERSION: u32 = 2;
pub const TC_OP_OPTIONS_MAGIC: u32 = 0x5443_4F50;
/// Version 2 added `tag`.
pub const TC_OP_OPTIONS_VERSION: u32 = 2;

/// Options of `tc_comm_new` and `tc_comm_split`. Initialize with
/// `TC_COMM_OPTIONS_INIT`, then set the fields you need.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_comm_options_t {
    /// `sizeof(tc_comm_options_t)` as the caller compiled it.
    pub size: usize,
    /// Must be `TC_COMM_OPTIONS_MAGIC`.
    pub magic: u32,
    /// `TC_COMM_OPTIONS_VERSION` as the caller compiled it. Fields added after
    /// that version keep their defaults; a newer version than the library's
    /// is accepted and its unknown fields ignored; 0 is refused.
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
    pub store: *mut crate::store::tc_store_t,
    /// Backend hints, copied during the call; NULL when `num_hints` is 0.
    pub hints: *const tc_hint_t,
    pub num_hints: usize,
    /// (Version 2.) 1: `tc_comm_new` makes a comm with no members yet, to be
    /// formed by `tc_comm_reconfigure` (torchcomms' `enable_reconfigure`);
    /// `rank` and `world_size` are then not the comm's (see
    /// `tc_comm_reconfigure`). 0, the default and what version-1 callers
    /// get: a comm formed at creation, which cannot be reconfigured.
    /// `tc_comm_split` and `tc_comm_shrink` refuse 1.
    pub enable_reconfigure: i32,
}

/// Options of every operation. Initialize with `TC_OP_OPTIONS_INIT`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_op_options_t {
    /// `sizeof(tc_op_options_t)` as the caller compiled it.
    pub size: usize,
    /// Must be `TC_OP_OPTIONS_MAGIC`.
    pub magic: u32,
    /// `TC_OP_OPTIONS_VERSION` as the caller compiled it. Fields added after
    /// that version keep their defaults; a newer version than the library's
    /// is accepted and its unknown fields ignored; 0 is refused.
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
    /// (Version 2.) Tag of `tc_send`/`tc_recv`: a send matches a receive of
    /// the same (peer, tag). 0, the default and what version-1 callers get,
    /// is the tag of every untagged call. Non-zero on any other call:
    /// `TC_ERR_INVALID_ARGUMENT` (batch entries carry their own, see
    /// `tc_batch_send_tagged`). On `nccl`, non-zero: `TC_ERR_UNSUPPORTED`.
    pub tag: u32,
}

/// A struct with the size/magic/version header and defaults (whose
/// `version` is the library's).
pub trait Versioned: Copy {
    const MAGIC: u32;
    const NAME: &'static str;
    fn defaults() -> Self;
    /// Bytes of the struct as `version` (1 up to the library's) defined it.
    /// Override when a version appends fields: every field of today's
    /// structs dates from version 1.
    fn size_in_version(_version: u32) -> usize {
        size_of::<Self>()
    }
}

impl Versioned for tc_comm_options_t {
    const MAGIC: u32 = TC_COMM_OPTIONS_MAGIC;
    const NAME: &'static str = "tc_comm_options_t";
    fn size_in_version(version: u32) -> usize {
        match version {
            1 => std::mem::offset_of!(tc_comm_options_t, enable_reconfigure),
            _ => size_of::<Self>(),
        }
    }
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
            enable_reconfigure: 0,
        }
    }
}

impl Versioned for tc_op_options_t {
    const MAGIC: u32 = TC_OP_OPTIONS_MAGIC;
    const NAME: &'static str = "tc_op_options_t";
    fn size_in_version(version: u32) -> usize {
        match version {
            1 => std::mem::offset_of!(tc_op_options_t, tag),
            _ => size_of::<Self>(),
        }
    }
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
            tag: 0,
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
/// caller's bytes up to `min(size, sizeof, size in the caller's version)`
/// are copied over the defaults (see the module's documentation).
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
    if header.version == 0 {
        return Err(Error::invalid_argument(format!(
            "argument '{arg}': version 0 is not a version of {}; initialize it with its _INIT macro",
            T::NAME
        )));
    }
    let library_version = std::ptr::read_unaligned(&out as *const T as *const Header).version;
    let known = T::size_in_version(header.version.min(library_version));
    let n = header.size.min(size_of::<T>()).min(known);
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

    /// A struct of two versions: `added` came with version 2.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    struct TwoVersions {
        size: usize,
        magic: u32,
        version: u32,
        first: i32,
        added: i32,
    }

    impl Versioned for TwoVersions {
        const MAGIC: u32 = 0x7e57_0002;
        const NAME: &'static str = "TwoVersions";
        fn defaults() -> Self {
            TwoVersions {
                size: size_of::<Self>(),
                magic: Self::MAGIC,
                version: 2,
                first: -1,
                added: -1,
            }
        }
        fn size_in_version(version: u32) -> usize {
            match version {
                1 => std::mem::offset_of!(TwoVersions, added),
                _ => size_of::<Self>(),
            }
        }
    }

    fn caller(version: u32) -> TwoVersions {
        TwoVersions {
            version,
            first: 5,
            added: 6,
            ..TwoVersions::defaults()
        }
    }

    #[test]
    fn fields_newer_than_the_callers_version_keep_their_defaults() {
        // Full size, but version 1 had no `added`: its bytes are not read.
        let v1 = unsafe { read_versioned(&caller(1), "opts") }.unwrap();
        assert_eq!((v1.first, v1.added), (5, -1));
        let v2 = unsafe { read_versioned(&caller(2), "opts") }.unwrap();
        assert_eq!((v2.first, v2.added), (5, 6));
    }

    #[test]
    fn a_version_newer_than_the_librarys_reads_the_known_fields() {
        let v3 = unsafe { read_versioned(&caller(3), "opts") }.unwrap();
        assert_eq!((v3.first, v3.added), (5, 6));
        let mut o = tc_comm_options_t::defaults();
        o.version = TC_COMM_OPTIONS_VERSION + 1;
        o.rank = 3;
        assert_eq!(unsafe { read_versioned(&o, "opts") }.unwrap().rank, 3);
    }

    #[test]
    fn op_options_tag_is_read_from_version_2_only() {
        let mut o = tc_op_options_t::defaults();
        o.tag = 77;
        assert_eq!(unsafe { read_versioned(&o, "opts") }.unwrap().tag, 77);
        o.version = 1;
        assert_eq!(unsafe { read_versioned(&o, "opts") }.unwrap().tag, 0);
        // A version-1 caller's struct ends before `tag`.
        o.version = 2;
        o.size = std::mem::offset_of!(tc_op_options_t, tag);
        assert_eq!(unsafe { read_versioned(&o, "opts") }.unwrap().tag, 0);
    }

    #[test]
    fn comm_options_enable_reconfigure_is_read_from_version_2_only() {
        let mut o = tc_comm_options_t::defaults();
        o.enable_reconfigure = 1;
        assert_eq!(
            unsafe { read_versioned(&o, "opts") }
                .unwrap()
                .enable_reconfigure,
            1
        );
        o.version = 1;
        assert_eq!(
            unsafe { read_versioned(&o, "opts") }
                .unwrap()
                .enable_reconfigure,
            0
        );
    }

    #[test]
    fn version_zero_is_refused() {
        let e = unsafe { read_versioned(&caller(0), "opts") }.unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::InvalidArgument);
        assert!(e.message.contains("'opts': version 0"), "{}", e.message);
        let mut o = tc_op_options_t::defaults();
        o.version = 0;
        assert!(unsafe { read_versioned(&o, "opts") }.is_err());
    }
}

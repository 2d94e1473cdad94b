//! NCCL loaded at run time through a small table of our own (dlopen/dlsym).
//!
//! Results, data types and reduction ops are plain C ints here: NCCL returns
//! codes newer than any binding (2.30's ncclTimeout = 8) and creates
//! reduction ops numbered past the built-in ones (PreMulSum), so typing them
//! as Rust enums would be undefined behaviour.
//!
//! Search order: a copy already loaded in the process (`libnccl.so.2` or
//! `libnccl.so` with RTLD_NOLOAD, e.g. inside a PyTorch process), the path in
//! `TORCHCOMM_NCCL_LIBRARY` (an explicit path that fails is an error, not a
//! reason to look elsewhere), then `libnccl.so.2` (the only name the pip
//! wheel ships), then `libnccl.so`.
//!
//! The constants are crate-private so that they stay out of the C header;
//! the table mirrors NCCL's whole result/type/op lists for reference.
//!
//! Checked against NCCL's own nccl.h by `abi_matches_the_nccl_header` (run
//! by `make nccl-real-test` with the nvidia-nccl-cu13 wheel's header): type
//! sizes, every ncclConfig_t offset and initializer value, every constant
//! here, and every entry point's Rust type against the header's prototype.
//! Last checked clean against the 2.27.7, 2.28.9, 2.29.7, 2.30.3, 2.31.2 and
//! 2.32.3 headers.

#![allow(dead_code)]
// Stream, event and comm handles are opaque: passed to the driver or NCCL,
// never dereferenced here.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use crate::error::{Error, ErrorKind, Result};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::OnceLock;

pub(crate) type NcclResult = c_int;
pub(crate) type NcclComm = *mut c_void;
pub(crate) type NcclDataType = c_int;
pub(crate) type NcclRedOp = c_int;
pub(crate) type Stream = *mut c_void;
/// ncclWindow_t (NCCL 2.27+): opaque.
pub(crate) type NcclWindow = *mut c_void;

pub(crate) const NCCL_SUCCESS: NcclResult = 0;
pub(crate) const NCCL_UNHANDLED_CUDA_ERROR: NcclResult = 1;
pub(crate) const NCCL_SYSTEM_ERROR: NcclResult = 2;
pub(crate) const NCCL_INTERNAL_ERROR: NcclResult = 3;
pub(crate) const NCCL_INVALID_ARGUMENT: NcclResult = 4;
pub(crate) const NCCL_INVALID_USAGE: NcclResult = 5;
pub(crate) const NCCL_REMOTE_ERROR: NcclResult = 6;
pub(crate) const NCCL_IN_PROGRESS: NcclResult = 7;
pub(crate) const NCCL_TIMEOUT: NcclResult = 8;

pub(crate) const NCCL_INT8: NcclDataType = 0;
pub(crate) const NCCL_UINT8: NcclDataType = 1;
pub(crate) const NCCL_INT32: NcclDataType = 2;
pub(crate) const NCCL_UINT32: NcclDataType = 3;
pub(crate) const NCCL_INT64: NcclDataType = 4;
pub(crate) const NCCL_UINT64: NcclDataType = 5;
pub(crate) const NCCL_FLOAT16: NcclDataType = 6;
pub(crate) const NCCL_FLOAT32: NcclDataType = 7;
pub(crate) const NCCL_FLOAT64: NcclDataType = 8;
pub(crate) const NCCL_BFLOAT16: NcclDataType = 9;
pub(crate) const NCCL_FLOAT8_E4M3: NcclDataType = 10;
pub(crate) const NCCL_FLOAT8_E5M2: NcclDataType = 11;

pub(crate) const NCCL_SUM: NcclRedOp = 0;
pub(crate) const NCCL_PROD: NcclRedOp = 1;
pub(crate) const NCCL_MAX: NcclRedOp = 2;
pub(crate) const NCCL_MIN: NcclRedOp = 3;
pub(crate) const NCCL_AVG: NcclRedOp = 4;

/// ncclScalarResidence_t.
pub(crate) const NCCL_SCALAR_DEVICE: c_int = 0;
pub(crate) const NCCL_SCALAR_HOST_IMMEDIATE: c_int = 1;

pub(crate) const NCCL_SPLIT_NOCOLOR: c_int = -1;
/// ncclCommShrink flags (NCCL 2.27+): shrink a healthy comm, or first end
/// the operations of a failed one.
pub(crate) const NCCL_SHRINK_DEFAULT: c_int = 0;
pub(crate) const NCCL_SHRINK_ABORT: c_int = 1;
/// ncclCommRevoke's only accepted flags value (NCCL 2.28+).
pub(crate) const NCCL_REVOKE_DEFAULT: c_int = 0;
pub(crate) const NCCL_CONFIG_UNDEF_INT: c_int = i32::MIN;
pub(crate) const NCCL_API_MAGIC: u32 = 0xcafe_beef;

/// ncclCommWindowRegister flags (NCCL 2.27+).
pub(crate) const NCCL_WIN_DEFAULT: c_int = 0;
pub(crate) const NCCL_WIN_COLL_SYMMETRIC: c_int = 1;

/// NCCL's version code for x.y.z (2.9 and later: x*10000 + y*100 + z).
pub(crate) const fn version_code(x: i32, y: i32, z: i32) -> i32 {
    if x <= 2 && y <= 8 {
        x * 1000 + y * 100 + z
    } else {
        x * 10000 + y * 100 + z
    }
}

/// "2.28.9" from a version code.
pub fn version_string(code: i32) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

/// ncclUniqueId: 128 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [u8; 128],
}

/// The ncclConfig_t layout of NCCL 2.28 (nccl.h `ncclConfig_v22800`, 80
/// bytes; checked against the 2.28.9 header by `abi_matches_the_nccl_header`).
/// NCCL only ever appends fields (2.27: 72 bytes, 2.29: 88, 2.30: 96, 2.31:
/// 112, 2.32: 120) and copies `min(size, its own sizeof)` bytes of the
/// caller's struct over its NCCL_CONFIG_INITIALIZER, so this prefix is read
/// correctly by older and newer libraries alike: an older one does not read
/// the fields it lacks, a newer one keeps its defaults for the fields it
/// added. `version` says which header the caller was built against; NCCL
/// resets fields newer than that version to their defaults, so it is never
/// claimed newer than this layout (see [`CONFIG_LAYOUT_VERSION`]).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Config {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub blocking: c_int,
    pub cga_cluster_size: c_int,
    pub min_ctas: c_int,
    pub max_ctas: c_int,
    pub net_name: *const c_char,
    pub split_share: c_int,
    pub traffic_class: c_int,
    pub comm_name: *const c_char,
    pub collnet_enable: c_int,
    pub cta_policy: c_int,
    pub shrink_share: c_int,
    pub nvls_ctas: c_int,
    pub n_channels_per_net_peer: c_int,
    pub nvlink_centric_sched: c_int,
}

/// The NCCL version whose ncclConfig_t [`Config`] mirrors (2.28.9, the
/// header it was checked against).
pub(crate) const CONFIG_LAYOUT_VERSION: i32 = version_code(2, 28, 9);

impl Config {
    /// NCCL_CONFIG_INITIALIZER for a library of version `version`, as a
    /// program built against that library's nccl.h (up to 2.28.9) would pass
    /// it: `size` is this struct's size, `version` the library's version but
    /// never newer than the layout ([`CONFIG_LAYOUT_VERSION`]), so the two
    /// describe the same struct; every other field "undefined" so that NCCL
    /// applies its own defaults.
    pub fn new(version: i32) -> Config {
        let u = NCCL_CONFIG_UNDEF_INT;
        Config {
            size: std::mem::size_of::<Config>(),
            magic: NCCL_API_MAGIC,
            version: version.clamp(0, CONFIG_LAYOUT_VERSION) as u32,
            blocking: u,
            cga_cluster_size: u,
            min_ctas: u,
            max_ctas: u,
            net_name: std::ptr::null(),
            split_share: u,
            traffic_class: u,
            comm_name: std::ptr::null(),
            collnet_enable: u,
            cta_policy: u,
            shrink_share: u,
            nvls_ctas: u,
            n_channels_per_net_peer: u,
            nvlink_centric_sched: u,
        }
    }
}

type FnGetVersion = unsafe extern "C" fn(*mut c_int) -> NcclResult;
type FnGetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> NcclResult;
type FnInitRankConfig =
    unsafe extern "C" fn(*mut NcclComm, c_int, UniqueId, c_int, *mut Config) -> NcclResult;
type FnComm = unsafe extern "C" fn(NcclComm) -> NcclResult;
/// ncclCommInitAll: one comm per device of this process.
type FnInitAll = unsafe extern "C" fn(*mut NcclComm, c_int, *const c_int) -> NcclResult;
type FnAsyncError = unsafe extern "C" fn(NcclComm, *mut NcclResult) -> NcclResult;
/// ncclCommCount and ncclCommUserRank.
type FnCommInt = unsafe extern "C" fn(NcclComm, *mut c_int) -> NcclResult;
type FnErrorString = unsafe extern "C" fn(NcclResult) -> *const c_char;
type FnLastError = unsafe extern "C" fn(NcclComm) -> *const c_char;
pub(crate) type FnSplit =
    unsafe extern "C" fn(NcclComm, c_int, c_int, *mut NcclComm, *mut Config) -> NcclResult;
/// ncclCommRevoke(comm, revokeFlags).
pub(crate) type FnRevoke = unsafe extern "C" fn(NcclComm, c_int) -> NcclResult;
/// ncclCommShrink(comm, excludeRanksList, excludeRanksCount, newcomm,
/// config, shrinkFlags).
pub(crate) type FnShrink = unsafe extern "C" fn(
    NcclComm,
    *mut c_int,
    c_int,
    *mut NcclComm,
    *mut Config,
    c_int,
) -> NcclResult;
type FnPreMulSum =
    unsafe extern "C" fn(*mut NcclRedOp, *mut c_void, NcclDataType, c_int, NcclComm) -> NcclResult;
type FnRedOpDestroy = unsafe extern "C" fn(NcclRedOp, NcclComm) -> NcclResult;
type FnReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    NcclDataType,
    NcclRedOp,
    c_int,
    NcclComm,
    Stream,
) -> NcclResult;
type FnBroadcast = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    NcclDataType,
    c_int,
    NcclComm,
    Stream,
) -> NcclResult;
type FnAllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    NcclDataType,
    NcclRedOp,
    NcclComm,
    Stream,
) -> NcclResult;
type FnAllGather = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    NcclDataType,
    NcclComm,
    Stream,
) -> NcclResult;
type FnSendRecv =
    unsafe extern "C" fn(*mut c_void, usize, NcclDataType, c_int, NcclComm, Stream) -> NcclResult;
type FnGroup = unsafe extern "C" fn() -> NcclResult;
type FnRegister =
    unsafe extern "C" fn(NcclComm, *mut c_void, usize, *mut *mut c_void) -> NcclResult;
type FnDeregister = unsafe extern "C" fn(NcclComm, *mut c_void) -> NcclResult;
type FnMemAlloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> NcclResult;
type FnMemFree = unsafe extern "C" fn(*mut c_void) -> NcclResult;
type FnWindowRegister =
    unsafe extern "C" fn(NcclComm, *mut c_void, usize, *mut NcclWindow, c_int) -> NcclResult;
type FnWindowDeregister = unsafe extern "C" fn(NcclComm, NcclWindow) -> NcclResult;
type FnPutSignal = unsafe extern "C" fn(
    *const c_void,
    usize,
    NcclDataType,
    c_int,
    NcclWindow,
    usize,
    c_int,
    c_int,
    c_uint,
    NcclComm,
    Stream,
) -> NcclResult;
type FnSignal = unsafe extern "C" fn(c_int, c_int, c_int, c_uint, NcclComm, Stream) -> NcclResult;
type FnWaitSignal =
    unsafe extern "C" fn(c_int, *mut WaitSignalDesc, NcclComm, Stream) -> NcclResult;

/// ncclWaitSignalDesc_t (NCCL 2.29+): wait for `op_cnt` signals from `peer`
/// on signal index `sig_idx` of context `ctx`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WaitSignalDesc {
    pub op_cnt: c_int,
    pub peer: c_int,
    pub sig_idx: c_int,
    pub ctx: c_int,
}

/// The resolved NCCL entry points. Required ones are plain function
/// pointers; optional ones (absent from older libraries) are `Option`s.
pub struct Nccl {
    /// Where the library came from (path or soname), for messages.
    pub origin: String,
    pub version: i32,
    pub get_unique_id: FnGetUniqueId,
    pub comm_init_rank_config: FnInitRankConfig,
    pub comm_finalize: FnComm,
    pub comm_destroy: FnComm,
    pub comm_abort: FnComm,
    pub comm_get_async_error: FnAsyncError,
    pub comm_count: FnCommInt,
    pub comm_user_rank: FnCommInt,
    pub get_error_string: FnErrorString,
    pub get_last_error: Option<FnLastError>,
    pub comm_split: Option<FnSplit>,
    /// ncclCommShrink (2.27+).
    pub comm_shrink: Option<FnShrink>,
    /// NCCL 2.28+: stops a failed comm's operations but keeps it for a shrink.
    pub comm_revoke: Option<FnRevoke>,
    pub red_op_create_pre_mul_sum: Option<FnPreMulSum>,
    pub red_op_destroy: Option<FnRedOpDestroy>,
    pub reduce: FnReduce,
    pub broadcast: FnBroadcast,
    pub all_reduce: FnAllReduce,
    /// ncclReduceScatter has the all-reduce signature (recvcount).
    pub reduce_scatter: FnAllReduce,
    pub all_gather: FnAllGather,
    pub send: FnSendRecv,
    pub recv: FnSendRecv,
    pub group_start: FnGroup,
    pub group_end: FnGroup,
    pub all_to_all: Option<FnAllGather>,
    pub comm_register: Option<FnRegister>,
    pub comm_deregister: Option<FnDeregister>,
    pub mem_alloc: Option<FnMemAlloc>,
    pub mem_free: Option<FnMemFree>,
    /// ncclGather / ncclScatter (2.28+) have the broadcast signature (count
    /// per rank, root).
    pub gather: Option<FnBroadcast>,
    pub scatter: Option<FnBroadcast>,
    /// Window registration (2.27+).
    pub comm_window_register: Option<FnWindowRegister>,
    pub comm_window_deregister: Option<FnWindowDeregister>,
    /// One-sided put with signal, signal, wait (2.29+).
    pub put_signal: Option<FnPutSignal>,
    pub signal: Option<FnSignal>,
    pub wait_signal: Option<FnWaitSignal>,
    /// One comm per device of this process (tc_local_*).
    pub comm_init_all: Option<FnInitAll>,
}

// SAFETY: function pointers into a library that is never unloaded.
unsafe impl Send for Nccl {}
unsafe impl Sync for Nccl {}

fn dlerror_string() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

fn dlopen(name: &str, flags: c_int) -> std::result::Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|_| format!("{name:?} contains a NUL byte"))?;
    // SAFETY: a valid C string; loading runs the library's constructors.
    let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
    if h.is_null() {
        Err(dlerror_string())
    } else {
        Ok(h)
    }
}

/// The library handle and its origin, following the search order above.
/// `explicit` is the value of `TORCHCOMM_NCCL_LIBRARY`.
pub fn open(explicit: Option<&str>) -> Result<(*mut c_void, String)> {
    for name in ["libnccl.so.2", "libnccl.so"] {
        if let Ok(h) = dlopen(name, libc::RTLD_NOW | libc::RTLD_NOLOAD) {
            return Ok((h, format!("{name} (already loaded)")));
        }
    }
    if let Some(path) = explicit.filter(|p| !p.is_empty()) {
        return dlopen(path, libc::RTLD_NOW | libc::RTLD_LOCAL)
            .map(|h| (h, path.to_string()))
            .map_err(|e| {
                Error::unavailable(format!(
                    "NCCL library TORCHCOMM_NCCL_LIBRARY={path} could not be loaded: {e}"
                ))
            });
    }
    let mut tried = Vec::new();
    for name in ["libnccl.so.2", "libnccl.so"] {
        match dlopen(name, libc::RTLD_NOW | libc::RTLD_LOCAL) {
            Ok(h) => return Ok((h, name.to_string())),
            Err(e) => tried.push(e),
        }
    }
    Err(Error::unavailable(format!(
        "NCCL was not found: looked for an already-loaded libnccl.so.2, TORCHCOMM_NCCL_LIBRARY (unset), libnccl.so.2 and \
         libnccl.so on the loader's path ({}); install it (e.g. pip install nvidia-nccl-cu13) and set \
         TORCHCOMM_NCCL_LIBRARY to .../nvidia/nccl/lib/libnccl.so.2 or add that directory to LD_LIBRARY_PATH",
        tried.join("; ")
    )))
}

unsafe fn sym<T: Copy>(h: *mut c_void, name: &str) -> Option<T> {
    debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    let c = CString::new(name).ok()?;
    let p = libc::dlsym(h, c.as_ptr());
    if p.is_null() {
        None
    } else {
        Some(std::mem::transmute_copy::<*mut c_void, T>(&p))
    }
}

impl Nccl {
    /// Resolves the table from an open handle.
    ///
    /// # Safety
    /// `h` must be a handle of a library exporting NCCL's C API; it is never
    /// closed.
    pub unsafe fn from_handle(h: *mut c_void, origin: String) -> Result<Nccl> {
        let o = origin.clone();
        let missing = move |name: &str| {
            Error::unavailable(format!(
                "{o} is not a usable NCCL: symbol {name} is missing"
            ))
        };
        macro_rules! req {
            ($name:literal) => {
                sym(h, $name).ok_or_else(|| missing($name))?
            };
        }
        let get_version: FnGetVersion = req!("ncclGetVersion");
        let mut version = 0;
        let r = get_version(&mut version);
        if r != NCCL_SUCCESS {
            return Err(Error::unavailable(format!(
                "{origin}: ncclGetVersion failed with NCCL result {r}"
            )));
        }
        if version < version_code(2, 18, 0) {
            return Err(Error::unavailable(format!(
                "{origin} is NCCL {}; libtorchcomm needs NCCL 2.18 or newer",
                version_string(version)
            )));
        }
        Ok(Nccl {
            origin,
            version,
            get_unique_id: req!("ncclGetUniqueId"),
            comm_init_rank_config: req!("ncclCommInitRankConfig"),
            comm_finalize: req!("ncclCommFinalize"),
            comm_destroy: req!("ncclCommDestroy"),
            comm_abort: req!("ncclCommAbort"),
            comm_get_async_error: req!("ncclCommGetAsyncError"),
            comm_count: req!("ncclCommCount"),
            comm_user_rank: req!("ncclCommUserRank"),
            get_error_string: req!("ncclGetErrorString"),
            get_last_error: sym(h, "ncclGetLastError"),
            comm_split: sym(h, "ncclCommSplit"),
            comm_shrink: sym(h, "ncclCommShrink"),
            comm_revoke: sym(h, "ncclCommRevoke"),
            red_op_create_pre_mul_sum: sym(h, "ncclRedOpCreatePreMulSum"),
            red_op_destroy: sym(h, "ncclRedOpDestroy"),
            reduce: req!("ncclReduce"),
            broadcast: req!("ncclBroadcast"),
            all_reduce: req!("ncclAllReduce"),
            reduce_scatter: req!("ncclReduceScatter"),
            all_gather: req!("ncclAllGather"),
            send: req!("ncclSend"),
            recv: req!("ncclRecv"),
            group_start: req!("ncclGroupStart"),
            group_end: req!("ncclGroupEnd"),
            all_to_all: sym(h, "ncclAlltoAll"),
            comm_register: sym(h, "ncclCommRegister"),
            comm_deregister: sym(h, "ncclCommDeregister"),
            mem_alloc: sym(h, "ncclMemAlloc"),
            mem_free: sym(h, "ncclMemFree"),
            gather: sym(h, "ncclGather"),
            scatter: sym(h, "ncclScatter"),
            comm_window_register: sym(h, "ncclCommWindowRegister"),
            comm_window_deregister: sym(h, "ncclCommWindowDeregister"),
            put_signal: sym(h, "ncclPutSignal"),
            signal: sym(h, "ncclSignal"),
            wait_signal: sym(h, "ncclWaitSignal"),
            comm_init_all: sym(h, "ncclCommInitAll"),
        })
    }

    pub fn version_string(&self) -> String {
        version_string(self.version)
    }

    /// fp8 (e4m3, e5m2) data types exist from NCCL 2.24 on.
    pub fn has_fp8(&self) -> bool {
        self.version >= version_code(2, 24, 0)
    }

    /// NCCL's text for a result code.
    pub fn error_string(&self, r: NcclResult) -> String {
        // SAFETY: returns a static string for any code (unknown ones too).
        let p = unsafe { (self.get_error_string)(r) };
        if p.is_null() {
            format!("NCCL result {r}")
        } else {
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    }

    /// The comm's last error detail, when the library provides it.
    pub fn last_error(&self, comm: NcclComm) -> Option<String> {
        let f = self.get_last_error?;
        // SAFETY: `comm` is NULL or a live comm; the string is owned by NCCL.
        let p = unsafe { f(comm) };
        if p.is_null() {
            return None;
        }
        let s = unsafe { CStr::from_ptr(p) }
            .to_string_lossy()
            .trim()
            .to_string();
        (!s.is_empty()).then_some(s)
    }

    /// An error for result `r` of call `what`; the kind follows the code.
    pub fn error(&self, r: NcclResult, what: &str, comm: NcclComm) -> Error {
        let kind = match r {
            NCCL_INVALID_ARGUMENT => ErrorKind::InvalidArgument,
            NCCL_INVALID_USAGE => ErrorKind::InvalidUsage,
            NCCL_REMOTE_ERROR => ErrorKind::Remote,
            NCCL_TIMEOUT => ErrorKind::Timeout,
            _ => ErrorKind::Nccl,
        };
        let detail = self
            .last_error(comm)
            .map(|d| format!(": {d}"))
            .unwrap_or_default();
        Error::new(
            kind,
            format!(
                "{what} failed: {} (NCCL result {r}){detail}",
                self.error_string(r)
            ),
        )
    }

    /// Ok for ncclSuccess, else [`Nccl::error`].
    pub fn check(&self, r: NcclResult, what: &str, comm: NcclComm) -> Result<()> {
        if r == NCCL_SUCCESS {
            Ok(())
        } else {
            Err(self.error(r, what, comm))
        }
    }
}

/// The process's NCCL, loaded on first use (the outcome is kept: changing
/// `TORCHCOMM_NCCL_LIBRARY` later has no effect).
pub fn nccl() -> Result<&'static Nccl> {
    static LIB: OnceLock<Result<Nccl>> = OnceLock::new();
    LIB.get_or_init(|| {
        let explicit = std::env::var("TORCHCOMM_NCCL_LIBRARY").ok();
        let (h, origin) = open(explicit.as_deref())?;
        // SAFETY: a library found under NCCL's names or given as NCCL.
        unsafe { Nccl::from_handle(h, origin) }
    })
    .as_ref()
    .map_err(|e| e.clone())
}

/// The C signature of each entry point of the table, derived from the Rust
/// function types themselves, for the ABI test against nccl.h: a return
/// code and argument codes, `i` int (and NCCL's int-sized enums), `u`
/// unsigned int, `z` size_t, `p` any pointer or handle, `id` ncclUniqueId
/// by value.
#[cfg(test)]
mod abi {
    use super::*;

    pub trait Arg {
        const CODE: &'static str;
    }
    impl Arg for c_int {
        const CODE: &'static str = "i";
    }
    impl Arg for c_uint {
        const CODE: &'static str = "u";
    }
    impl Arg for usize {
        const CODE: &'static str = "z";
    }
    impl<T> Arg for *mut T {
        const CODE: &'static str = "p";
    }
    impl<T> Arg for *const T {
        const CODE: &'static str = "p";
    }
    impl Arg for UniqueId {
        const CODE: &'static str = "id";
    }

    pub trait Signature {
        fn signature() -> String;
    }
    macro_rules! signature {
        ($($a:ident),*) => {
            impl<R: Arg, $($a: Arg),*> Signature for unsafe extern "C" fn($($a),*) -> R {
                fn signature() -> String {
                    let args: &[&str] = &[$($a::CODE),*];
                    format!("{}({})", R::CODE, args.join(","))
                }
            }
        };
    }
    signature!();
    signature!(A);
    signature!(A, B);
    signature!(A, B, C);
    signature!(A, B, C, D);
    signature!(A, B, C, D, E);
    signature!(A, B, C, D, E, F);
    signature!(A, B, C, D, E, F, G);
    signature!(A, B, C, D, E, F, G, H);
    signature!(A, B, C, D, E, F, G, H, I);
    signature!(A, B, C, D, E, F, G, H, I, J);
    signature!(A, B, C, D, E, F, G, H, I, J, K);

    fn sig<T: Signature>() -> String {
        T::signature()
    }

    /// Every symbol [`Nccl::from_handle`] resolves, with the Rust type it is
    /// called through and whether the table requires it.
    pub fn table() -> Vec<(&'static str, String, bool)> {
        vec![
            ("ncclGetVersion", sig::<FnGetVersion>(), true),
            ("ncclGetUniqueId", sig::<FnGetUniqueId>(), true),
            ("ncclCommInitRankConfig", sig::<FnInitRankConfig>(), true),
            ("ncclCommFinalize", sig::<FnComm>(), true),
            ("ncclCommDestroy", sig::<FnComm>(), true),
            ("ncclCommAbort", sig::<FnComm>(), true),
            ("ncclCommGetAsyncError", sig::<FnAsyncError>(), true),
            ("ncclCommCount", sig::<FnCommInt>(), true),
            ("ncclCommUserRank", sig::<FnCommInt>(), true),
            ("ncclGetErrorString", sig::<FnErrorString>(), true),
            ("ncclGetLastError", sig::<FnLastError>(), false),
            ("ncclCommSplit", sig::<FnSplit>(), false),
            ("ncclCommShrink", sig::<FnShrink>(), false),
            ("ncclCommRevoke", sig::<FnRevoke>(), false),
            ("ncclRedOpCreatePreMulSum", sig::<FnPreMulSum>(), false),
            ("ncclRedOpDestroy", sig::<FnRedOpDestroy>(), false),
            ("ncclReduce", sig::<FnReduce>(), true),
            ("ncclBroadcast", sig::<FnBroadcast>(), true),
            ("ncclAllReduce", sig::<FnAllReduce>(), true),
            ("ncclReduceScatter", sig::<FnAllReduce>(), true),
            ("ncclAllGather", sig::<FnAllGather>(), true),
            ("ncclSend", sig::<FnSendRecv>(), true),
            ("ncclRecv", sig::<FnSendRecv>(), true),
            ("ncclGroupStart", sig::<FnGroup>(), true),
            ("ncclGroupEnd", sig::<FnGroup>(), true),
            ("ncclAlltoAll", sig::<FnAllGather>(), false),
            ("ncclCommRegister", sig::<FnRegister>(), false),
            ("ncclCommDeregister", sig::<FnDeregister>(), false),
            ("ncclMemAlloc", sig::<FnMemAlloc>(), false),
            ("ncclMemFree", sig::<FnMemFree>(), false),
            ("ncclGather", sig::<FnBroadcast>(), false),
            ("ncclScatter", sig::<FnBroadcast>(), false),
            ("ncclCommWindowRegister", sig::<FnWindowRegister>(), false),
            (
                "ncclCommWindowDeregister",
                sig::<FnWindowDeregister>(),
                false,
            ),
            ("ncclPutSignal", sig::<FnPutSignal>(), false),
            ("ncclSignal", sig::<FnSignal>(), false),
            ("ncclWaitSignal", sig::<FnWaitSignal>(), false),
            ("ncclCommInitAll", sig::<FnInitAll>(), false),
        ]
    }

    /// The same code for a C type as written in nccl.h (parameter name, if
    /// any, already removed); None for a type this mapping does not know.
    fn c_type_code(ty: &str) -> Option<&'static str> {
        if ty.contains('*') {
            return Some("p");
        }
        let words: Vec<&str> = ty.split_whitespace().filter(|w| *w != "const").collect();
        Some(match words.join(" ").as_str() {
            "int" | "ncclResult_t" | "ncclDataType_t" | "ncclRedOp_t" | "ncclScalarResidence_t" => {
                "i"
            }
            "unsigned int" | "unsigned" => "u",
            "size_t" => "z",
            "ncclComm_t" | "cudaStream_t" | "ncclWindow_t" => "p",
            "ncclUniqueId" => "id",
            _ => return None,
        })
    }

    /// The prototype of `name` in nccl.h's text, as the same codes
    /// ("i(p,z,i)"), or None where the header does not declare it. A
    /// prototype is a line starting with its return type, the name preceded
    /// by blanks or `*` (so `pnccl...` profiling twins and mentions in
    /// comments do not match), and `);` after the arguments.
    pub fn c_signature(header: &str, name: &str) -> Option<std::result::Result<String, String>> {
        let pat = format!("{name}(");
        let mut from = 0;
        while let Some(i) = header[from..].find(&pat).map(|i| i + from) {
            from = i + pat.len();
            let before = header[..i].chars().next_back();
            if !matches!(before, Some(' ') | Some('\t') | Some('*')) {
                continue;
            }
            let line_start = header[..i].rfind('\n').map_or(0, |n| n + 1);
            let ret = header[line_start..i].trim();
            let Some(close) = header[from..].find(')').map(|c| c + from) else {
                continue;
            };
            if !header[close + 1..].trim_start().starts_with(';') {
                continue;
            }
            let ret_code = match ret
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .as_str()
            {
                "ncclResult_t" => "i",
                "const char*" | "const char *" => "p",
                _ => continue,
            };
            let args = header[from..close]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            let mut codes = Vec::new();
            if !(args.is_empty() || args == "void") {
                for a in args.split(',') {
                    let a = a.trim();
                    // Drop the parameter name: the last word, unless the
                    // parameter is a bare type ("void*", "int").
                    let ty = match a.rfind([' ', '*']) {
                        Some(k) if !a[k + 1..].is_empty() && c_type_code(&a[k + 1..]).is_none() => {
                            &a[..=k]
                        }
                        _ => a,
                    };
                    match c_type_code(ty) {
                        Some(c) => codes.push(c),
                        None => {
                            return Some(Err(format!("{name}: unknown C type {ty:?} in ({args})")))
                        }
                    }
                }
            }
            return Some(Ok(format!("{ret_code}({})", codes.join(","))));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_layout_matches_nccl_2_28() {
        // Offsets of ncclConfig_v22800 on LP64.
        assert_eq!(std::mem::offset_of!(Config, magic), 8);
        assert_eq!(std::mem::offset_of!(Config, blocking), 16);
        assert_eq!(std::mem::offset_of!(Config, net_name), 32);
        assert_eq!(std::mem::offset_of!(Config, split_share), 40);
        assert_eq!(std::mem::offset_of!(Config, traffic_class), 44);
        assert_eq!(std::mem::offset_of!(Config, comm_name), 48);
        assert_eq!(std::mem::offset_of!(Config, nvls_ctas), 68);
        assert_eq!(std::mem::size_of::<Config>(), 80);
        let c = Config::new(version_code(2, 28, 9));
        assert_eq!(c.size, 80);
        assert_eq!(c.version, 22809);
        assert_eq!(c.blocking, i32::MIN);
        assert_eq!(std::mem::size_of::<UniqueId>(), 128);
        // `version` names the layout `size` describes: an older library's
        // own version, never one newer than 2.28.9's layout.
        assert_eq!(Config::new(version_code(2, 21, 5)).version, 22105);
        assert_eq!(Config::new(version_code(2, 32, 3)).version, 22809);
        assert_eq!(Config::new(version_code(2, 32, 3)).size, 80);
    }

    /// The ABI test's table names exactly the symbols `from_handle`
    /// resolves (so that no entry point escapes the header comparison).
    #[test]
    fn signature_table_covers_every_resolved_symbol() {
        let src = include_str!("loader.rs");
        let start = src.find("pub unsafe fn from_handle").unwrap();
        let end = start + src[start..].find("pub fn version_string").unwrap();
        let mut resolved: Vec<&str> = src[start..end]
            .split('"')
            .skip(1)
            .step_by(2)
            .filter(|w| w.starts_with("nccl") && w.chars().all(|c| c.is_ascii_alphanumeric()))
            .collect();
        resolved.sort();
        resolved.dedup();
        let mut table: Vec<&str> = abi::table().iter().map(|(n, _, _)| *n).collect();
        table.sort();
        assert_eq!(resolved, table);
        // Required symbols are the ones resolved with req!.
        for (name, _, required) in abi::table() {
            assert_eq!(
                src[start..end].contains(&format!("req!(\"{name}\")")),
                required,
                "{name}"
            );
        }
    }

    #[test]
    fn c_prototypes_are_parsed() {
        let h = "/* a ncclGroupEnd() call */\nncclResult_t  ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,\n    \
                 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);\n\
                 ncclResult_t pncclGroupEnd();\nncclResult_t  ncclGroupEnd();\nconst char*  ncclGetLastError(ncclComm_t comm);\n\
                 ncclResult_t ncclSignal(int peer, unsigned int flags, ncclUniqueId id, ncclComm_t *c);\n";
        let get = |n| abi::c_signature(h, n).map(|r| r.unwrap());
        assert_eq!(get("ncclAllReduce").as_deref(), Some("i(p,p,z,i,i,p,p)"));
        assert_eq!(get("ncclGroupEnd").as_deref(), Some("i()"));
        assert_eq!(get("ncclGetLastError").as_deref(), Some("p(p)"));
        assert_eq!(get("ncclSignal").as_deref(), Some("i(i,u,id,p)"));
        assert_eq!(get("ncclBroadcast"), None);
        assert_eq!(
            abi::table()
                .iter()
                .find(|t| t.0 == "ncclAllReduce")
                .unwrap()
                .1,
            "i(p,p,z,i,i,p,p)"
        );
    }

    /// Compiles tests/nccl_abi/nccl_abi.c against the nccl.h named by
    /// TORCHCOMM_TEST_NCCL_HEADER (CUDA headers stubbed), runs it, and
    /// compares its sizes, offsets, initializer values and constants with
    /// this file's; then compares every entry point's Rust type with the
    /// header's prototype. `make nccl-real-test` sets the variable from the
    /// nvidia-nccl-cu13 wheel.
    #[test]
    fn abi_matches_the_nccl_header() {
        let Some(header) = std::env::var("TORCHCOMM_TEST_NCCL_HEADER")
            .ok()
            .filter(|p| !p.is_empty())
        else {
            println!("SKIPPED abi_matches_the_nccl_header: TORCHCOMM_TEST_NCCL_HEADER is not set (make nccl-wheel fetches nccl.h)");
            return;
        };
        let header = std::path::PathBuf::from(header);
        let text = std::fs::read_to_string(&header)
            .unwrap_or_else(|e| panic!("{}: {e}", header.display()));
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nccl_abi");
        let exe = std::env::temp_dir().join(format!("tc-nccl-abi-{}", std::process::id()));
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = std::process::Command::new(&cc)
            .args(["-std=c11", "-Wall", "-I"])
            .arg(dir.join("cuda_stub"))
            .arg("-I")
            .arg(header.parent().unwrap())
            .arg(dir.join("nccl_abi.c"))
            .arg("-o")
            .arg(&exe)
            .output()
            .unwrap_or_else(|e| panic!("{cc}: {e}"));
        assert!(
            out.status.success(),
            "compiling nccl_abi.c failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let run = std::process::Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_file(&exe);
        assert!(run.status.success());
        let mut c = std::collections::HashMap::new();
        for line in String::from_utf8(run.stdout).unwrap().lines() {
            let (key, value) = line.rsplit_once(' ').unwrap();
            c.insert(key.to_string(), value.parse::<i64>().unwrap());
        }
        let hv = c["header NCCL_VERSION_CODE"] as i32;
        let mut bad = Vec::new();
        let mut checked = 0;
        let mut same = |what: &str, c_value: i64, ours: i64, bad: &mut Vec<String>| {
            checked += 1;
            if c_value != ours {
                bad.push(format!(
                    "{what}: nccl.h has {c_value}, loader.rs has {ours}"
                ));
            }
        };

        same(
            "NCCL_VERSION(2,28,9)",
            c["header NCCL_VERSION(2,28,9)"],
            version_code(2, 28, 9) as i64,
            &mut bad,
        );
        same(
            "NCCL_VERSION(2,8,4)",
            c["header NCCL_VERSION(2,8,4)"],
            version_code(2, 8, 4) as i64,
            &mut bad,
        );
        let sizes: [(&str, usize); 6] = [
            ("ncclUniqueId", std::mem::size_of::<UniqueId>()),
            ("ncclComm_t", std::mem::size_of::<NcclComm>()),
            ("ncclResult_t", std::mem::size_of::<NcclResult>()),
            ("ncclDataType_t", std::mem::size_of::<NcclDataType>()),
            ("ncclRedOp_t", std::mem::size_of::<NcclRedOp>()),
            ("ncclScalarResidence_t", std::mem::size_of::<c_int>()),
        ];
        for (name, ours) in sizes {
            same(
                &format!("sizeof({name})"),
                c[&format!("sizeof {name}")],
                ours as i64,
                &mut bad,
            );
        }
        if let Some(v) = c.get("sizeof ncclWindow_t") {
            same(
                "sizeof(ncclWindow_t)",
                *v,
                std::mem::size_of::<NcclWindow>() as i64,
                &mut bad,
            );
        }
        if let Some(v) = c.get("sizeof ncclWaitSignalDesc_t") {
            same(
                "sizeof(ncclWaitSignalDesc_t)",
                *v,
                std::mem::size_of::<WaitSignalDesc>() as i64,
                &mut bad,
            );
            for (f, ours) in [
                ("opCnt", std::mem::offset_of!(WaitSignalDesc, op_cnt)),
                ("peer", std::mem::offset_of!(WaitSignalDesc, peer)),
                ("sigIdx", std::mem::offset_of!(WaitSignalDesc, sig_idx)),
                ("ctx", std::mem::offset_of!(WaitSignalDesc, ctx)),
            ] {
                same(
                    &format!("offsetof(ncclWaitSignalDesc_t, {f})"),
                    c[&format!("offsetof ncclWaitSignalDesc_t.{f}")],
                    ours as i64,
                    &mut bad,
                );
            }
        }

        // ncclConfig_t: every field of ours at the header's offset, or (an
        // older header) past the end of the header's struct, which that
        // NCCL does not read; our initializer equal to the header's.
        use std::mem::offset_of;
        let init = Config::new(hv);
        let c_size = c["sizeof ncclConfig_t"];
        let ours_size = std::mem::size_of::<Config>() as i64;
        let fields: [(&str, usize, i64); 17] = [
            ("size", offset_of!(Config, size), init.size as i64),
            ("magic", offset_of!(Config, magic), init.magic as i64),
            ("version", offset_of!(Config, version), init.version as i64),
            (
                "blocking",
                offset_of!(Config, blocking),
                init.blocking as i64,
            ),
            (
                "cgaClusterSize",
                offset_of!(Config, cga_cluster_size),
                init.cga_cluster_size as i64,
            ),
            (
                "minCTAs",
                offset_of!(Config, min_ctas),
                init.min_ctas as i64,
            ),
            (
                "maxCTAs",
                offset_of!(Config, max_ctas),
                init.max_ctas as i64,
            ),
            (
                "netName",
                offset_of!(Config, net_name),
                !init.net_name.is_null() as i64,
            ),
            (
                "splitShare",
                offset_of!(Config, split_share),
                init.split_share as i64,
            ),
            (
                "trafficClass",
                offset_of!(Config, traffic_class),
                init.traffic_class as i64,
            ),
            (
                "commName",
                offset_of!(Config, comm_name),
                !init.comm_name.is_null() as i64,
            ),
            (
                "collnetEnable",
                offset_of!(Config, collnet_enable),
                init.collnet_enable as i64,
            ),
            (
                "CTAPolicy",
                offset_of!(Config, cta_policy),
                init.cta_policy as i64,
            ),
            (
                "shrinkShare",
                offset_of!(Config, shrink_share),
                init.shrink_share as i64,
            ),
            (
                "nvlsCTAs",
                offset_of!(Config, nvls_ctas),
                init.nvls_ctas as i64,
            ),
            (
                "nChannelsPerNetPeer",
                offset_of!(Config, n_channels_per_net_peer),
                init.n_channels_per_net_peer as i64,
            ),
            (
                "nvlinkCentricSched",
                offset_of!(Config, nvlink_centric_sched),
                init.nvlink_centric_sched as i64,
            ),
        ];
        let mut beyond = Vec::new();
        for (f, off, value) in fields {
            match c.get(&format!("offsetof ncclConfig_t.{f}")) {
                Some(c_off) => {
                    same(
                        &format!("offsetof(ncclConfig_t, {f})"),
                        *c_off,
                        off as i64,
                        &mut bad,
                    );
                    let c_init = c[&format!("init ncclConfig_t.{f}")];
                    match f {
                        // Ours describes our struct: its size, and the
                        // header's version up to our layout's.
                        "size" => {
                            same("NCCL_CONFIG_INITIALIZER.size", c_init, c_size, &mut bad);
                            same("Config::new().size", value, ours_size, &mut bad);
                        }
                        "version" => same(
                            "NCCL_CONFIG_INITIALIZER.version (ours: up to the layout's)",
                            c_init.min(CONFIG_LAYOUT_VERSION as i64),
                            value,
                            &mut bad,
                        ),
                        _ => same(
                            &format!("NCCL_CONFIG_INITIALIZER.{f}"),
                            c_init,
                            value,
                            &mut bad,
                        ),
                    }
                }
                None if (off as i64) >= c_size => beyond.push(f),
                None => bad.push(format!(
                    "ncclConfig_t.{f}: not in nccl.h, yet inside its {c_size}-byte struct"
                )),
            }
        }
        if hv / 100 == CONFIG_LAYOUT_VERSION / 100 {
            same(
                "sizeof(ncclConfig_t) (the layout's own version)",
                c_size,
                ours_size,
                &mut bad,
            );
        } else if c_size < ours_size && beyond.is_empty() {
            bad.push(format!(
                "sizeof(ncclConfig_t) is {c_size} but no field of ours lies past it"
            ));
        }

        // Constants. Some exist only from some version on.
        let consts: [(&str, i64, i32); 31] = [
            ("NCCL_CONFIG_UNDEF_INT", NCCL_CONFIG_UNDEF_INT as i64, 0),
            ("NCCL_SPLIT_NOCOLOR", NCCL_SPLIT_NOCOLOR as i64, 0),
            (
                "NCCL_SHRINK_DEFAULT",
                NCCL_SHRINK_DEFAULT as i64,
                version_code(2, 27, 0),
            ),
            (
                "NCCL_SHRINK_ABORT",
                NCCL_SHRINK_ABORT as i64,
                version_code(2, 27, 0),
            ),
            (
                "NCCL_API_MAGIC",
                NCCL_API_MAGIC as i64,
                version_code(2, 29, 0),
            ),
            ("ncclSuccess", NCCL_SUCCESS as i64, 0),
            (
                "ncclUnhandledCudaError",
                NCCL_UNHANDLED_CUDA_ERROR as i64,
                0,
            ),
            ("ncclSystemError", NCCL_SYSTEM_ERROR as i64, 0),
            ("ncclInternalError", NCCL_INTERNAL_ERROR as i64, 0),
            ("ncclInvalidArgument", NCCL_INVALID_ARGUMENT as i64, 0),
            ("ncclInvalidUsage", NCCL_INVALID_USAGE as i64, 0),
            ("ncclRemoteError", NCCL_REMOTE_ERROR as i64, 0),
            ("ncclInProgress", NCCL_IN_PROGRESS as i64, 0),
            ("ncclTimeout", NCCL_TIMEOUT as i64, version_code(2, 30, 0)),
            ("ncclInt8", NCCL_INT8 as i64, 0),
            ("ncclUint8", NCCL_UINT8 as i64, 0),
            ("ncclInt32", NCCL_INT32 as i64, 0),
            ("ncclUint32", NCCL_UINT32 as i64, 0),
            ("ncclInt64", NCCL_INT64 as i64, 0),
            ("ncclUint64", NCCL_UINT64 as i64, 0),
            ("ncclFloat16", NCCL_FLOAT16 as i64, 0),
            ("ncclFloat32", NCCL_FLOAT32 as i64, 0),
            ("ncclFloat64", NCCL_FLOAT64 as i64, 0),
            ("ncclBfloat16", NCCL_BFLOAT16 as i64, 0),
            (
                "ncclFloat8e4m3",
                NCCL_FLOAT8_E4M3 as i64,
                version_code(2, 24, 0),
            ),
            (
                "ncclFloat8e5m2",
                NCCL_FLOAT8_E5M2 as i64,
                version_code(2, 24, 0),
            ),
            ("ncclSum", NCCL_SUM as i64, 0),
            ("ncclProd", NCCL_PROD as i64, 0),
            ("ncclMax", NCCL_MAX as i64, 0),
            ("ncclMin", NCCL_MIN as i64, 0),
            ("ncclAvg", NCCL_AVG as i64, 0),
        ];
        for (name, ours, since) in consts {
            match c.get(&format!("const {name}")) {
                Some(v) => same(name, *v, ours, &mut bad),
                None if hv < since => {}
                None => bad.push(format!(
                    "{name}: missing from NCCL {} header",
                    version_string(hv)
                )),
            }
        }
        if !c.contains_key("const NCCL_API_MAGIC") {
            same(
                "NCCL_CONFIG_INITIALIZER.magic",
                c["init ncclConfig_t.magic"],
                NCCL_API_MAGIC as i64,
                &mut bad,
            );
        }
        same(
            "ncclScalarDevice",
            c["const ncclScalarDevice"],
            NCCL_SCALAR_DEVICE as i64,
            &mut bad,
        );
        same(
            "ncclScalarHostImmediate",
            c["const ncclScalarHostImmediate"],
            NCCL_SCALAR_HOST_IMMEDIATE as i64,
            &mut bad,
        );
        // PreMulSum ops are numbered from ncclNumOps: the built-in list is ours.
        same(
            "ncclNumOps",
            c["const ncclNumOps"],
            NCCL_AVG as i64 + 1,
            &mut bad,
        );
        if let Some(v) = c.get("const NCCL_WIN_DEFAULT") {
            same("NCCL_WIN_DEFAULT", *v, NCCL_WIN_DEFAULT as i64, &mut bad);
            same(
                "NCCL_WIN_COLL_SYMMETRIC",
                c["const NCCL_WIN_COLL_SYMMETRIC"],
                NCCL_WIN_COLL_SYMMETRIC as i64,
                &mut bad,
            );
        }
        let constants = checked;

        // Entry points: the Rust type of each against the header's prototype.
        let mut functions = 0;
        let mut absent = Vec::new();
        for (name, ours, required) in abi::table() {
            match abi::c_signature(&text, name) {
                Some(Ok(theirs)) => {
                    functions += 1;
                    if theirs != ours {
                        bad.push(format!(
                            "{name}: nccl.h declares {theirs}, loader.rs calls it as {ours}"
                        ));
                    }
                }
                Some(Err(e)) => bad.push(e),
                None if required => bad.push(format!(
                    "{name}: required by loader.rs, not declared in nccl.h"
                )),
                None => absent.push(name),
            }
        }
        assert!(
            bad.is_empty(),
            "loader.rs differs from NCCL {}'s nccl.h ({}):\n  {}",
            version_string(hv),
            header.display(),
            bad.join("\n  ")
        );
        println!(
            "abi_matches_the_nccl_header: NCCL {} ({}): {constants} sizes/offsets/values and {functions} prototypes match; \
             ncclConfig_t {c_size} bytes there, {ours_size} ours{}{}",
            version_string(hv),
            header.display(),
            if beyond.is_empty() { String::new() } else { format!(" (fields past its end, unread by it: {})", beyond.join(", ")) },
            if absent.is_empty() { String::new() } else { format!("; optional, not in this version: {}", absent.join(", ")) },
        );
    }

    #[test]
    fn version_codes() {
        assert_eq!(version_code(2, 28, 9), 22809);
        assert_eq!(version_code(2, 8, 4), 2804);
        assert_eq!(version_string(22809), "2.28.9");
        assert_eq!(version_string(2804), "2.8.4");
    }

    #[test]
    fn explicit_path_that_fails_names_the_path() {
        // Only meaningful when no NCCL is already loaded in this test process.
        if dlopen("libnccl.so.2", libc::RTLD_NOW | libc::RTLD_NOLOAD).is_ok() {
            return;
        }
        let e = open(Some("/nonexistent/libnccl.so.2")).expect_err("must fail");
        assert_eq!(e.kind, ErrorKind::Unavailable);
        assert!(
            e.message
                .contains("TORCHCOMM_NCCL_LIBRARY=/nonexistent/libnccl.so.2"),
            "{}",
            e.message
        );
    }

    #[test]
    fn a_library_without_nccl_symbols_is_rejected() {
        let (h, origin) = match dlopen("libc.so.6", libc::RTLD_NOW) {
            Ok(h) => (h, "libc.so.6".to_string()),
            Err(_) => return,
        };
        let e = unsafe { Nccl::from_handle(h, origin) }
            .err()
            .expect("libc is not NCCL");
        assert_eq!(e.kind, ErrorKind::Unavailable);
        assert!(e.message.contains("ncclGetVersion"), "{}", e.message);
    }

    #[test]
    fn default_search_either_loads_or_says_what_it_looked_for() {
        match open(None) {
            Ok((h, origin)) => {
                let lib =
                    unsafe { Nccl::from_handle(h, origin) }.expect("a found libnccl must resolve");
                assert!(lib.version >= version_code(2, 18, 0));
            }
            Err(e) => {
                assert_eq!(e.kind, ErrorKind::Unavailable);
                assert!(
                    e.message.contains("libnccl.so.2")
                        && e.message.contains("TORCHCOMM_NCCL_LIBRARY"),
                    "{}",
                    e.message
                );
            }
        }
    }
}

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

#[cfg(test)]
mod abi;
#[cfg(test)]
mod tests;

//! UCX's UCP loaded at run time through a small table of our own
//! (dlopen/dlsym), so that nothing needs UCX to build and a machine without
//! it runs the Gloo path.
//!
//! The types, field masks and constants below are the ones of UCX 1.13's
//! `ucp/api/ucp.h`, `ucp_def.h` and `ucs/type/status.h` (Debian bookworm's
//! libucx0 1.13.1), checked against that header by printing `sizeof`,
//! `offsetof` and the enum values from a C program: the struct prefixes used
//! here are what that header lays out. UCP's parameter structs carry a
//! `field_mask`, and UCP reads only the fields the mask names, so declaring
//! a struct at its full 1.13 size and setting only the masked fields is
//! what a program built against the header does; newer UCX versions keep
//! the ABI of version 1 (they only append fields and mask bits).
//!
//! Search order: the library named by `TORCHCOMM_UCX_LIBRARY` (an explicit
//! name that fails is an error; tests point it at a missing name to hide
//! UCX), then `libucp.so.0`.

use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::OnceLock;

pub(crate) type Status = c_int;
pub(crate) type Context = *mut c_void;
pub(crate) type Worker = *mut c_void;
pub(crate) type Ep = *mut c_void;
pub(crate) type Config = *mut c_void;
pub(crate) type Address = c_void;
pub(crate) type Tag = u64;
/// ucs_status_ptr_t: NULL (done at once), a request, or an error status
/// cast to a pointer (see [`status_of_ptr`]).
pub(crate) type StatusPtr = *mut c_void;

pub(crate) const UCS_OK: Status = 0;
pub(crate) const UCS_INPROGRESS: Status = 1;
pub(crate) const UCS_ERR_CANCELED: Status = -16;
pub(crate) const UCS_ERR_MESSAGE_TRUNCATED: Status = -9;
/// From `ucp_worker_arm`: events are pending, progress before sleeping.
pub(crate) const UCS_ERR_BUSY: Status = -15;
/// Statuses from here down to -1 are errors (UCS_ERR_LAST).
const UCS_ERR_LAST: isize = -100;

/// ucp_params_t field mask bits and features.
pub(crate) const UCP_PARAM_FIELD_FEATURES: u64 = 1;
pub(crate) const UCP_PARAM_FIELD_ESTIMATED_NUM_EPS: u64 = 1 << 6;
pub(crate) const UCP_PARAM_FIELD_NAME: u64 = 1 << 8;
pub(crate) const UCP_FEATURE_TAG: u64 = 1;
/// Remote memory access and 64-bit atomics (the windows, `window.rs`).
pub(crate) const UCP_FEATURE_RMA: u64 = 1 << 1;
pub(crate) const UCP_FEATURE_AMO64: u64 = 1 << 3;
/// The worker's event file descriptor (`ucp_worker_get_efd`, `ucp_worker_arm`).
pub(crate) const UCP_FEATURE_WAKEUP: u64 = 1 << 4;
/// ucp_worker_params_t.
pub(crate) const UCP_WORKER_PARAM_FIELD_THREAD_MODE: u64 = 1;
pub(crate) const UCS_THREAD_MODE_SINGLE: c_int = 0;
/// ucp_ep_params_t.
pub(crate) const UCP_EP_PARAM_FIELD_REMOTE_ADDRESS: u64 = 1;
pub(crate) const UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE: u64 = 1 << 1;
pub(crate) const UCP_EP_PARAM_FIELD_ERR_HANDLER: u64 = 1 << 2;
pub(crate) const UCP_ERR_HANDLING_MODE_PEER: c_int = 1;
/// ucp_request_param_t.
pub(crate) const UCP_OP_ATTR_FIELD_FLAGS: u32 = 1 << 4;
pub(crate) const UCP_OP_ATTR_FIELD_DATATYPE: u32 = 1 << 3;
/// ucp_dt_make_contig(8): one 64-bit element (the atomics' operand).
pub(crate) const UCP_DATATYPE_U64: u64 = 8 << 3;
/// ucp_atomic_op_t.
pub(crate) const UCP_ATOMIC_OP_ADD: c_int = 0;
/// ucp_mem_map_params_t field mask bits and protections.
pub(crate) const UCP_MEM_MAP_PARAM_FIELD_ADDRESS: u64 = 1;
pub(crate) const UCP_MEM_MAP_PARAM_FIELD_LENGTH: u64 = 1 << 1;
pub(crate) const UCP_MEM_MAP_PARAM_FIELD_PROT: u64 = 1 << 3;
pub(crate) const UCP_MEM_MAP_PROT_ALL: c_uint = 1 | 2 | (1 << 8) | (1 << 9);
/// In `op_attr_mask` too: always return a request.
pub(crate) const UCP_OP_ATTR_FLAG_NO_IMM_CMPL: u32 = 1 << 16;
pub(crate) const UCP_EP_CLOSE_FLAG_FORCE: u32 = 1;
/// ucp_worker_attr_t.
pub(crate) const UCP_WORKER_ATTR_FIELD_ADDRESS: u64 = 1 << 1;
/// The API version this table was written against (UCP_API_MAJOR/MINOR).
pub(crate) const API_MAJOR: c_uint = 1;
pub(crate) const API_MINOR: c_uint = 13;

/// ucp_params_t (80 bytes in 1.13).
#[repr(C)]
pub(crate) struct Params {
    pub field_mask: u64,
    pub features: u64,
    pub request_size: usize,
    pub request_init: *mut c_void,
    pub request_cleanup: *mut c_void,
    pub tag_sender_mask: u64,
    pub mt_workers_shared: c_int,
    pub estimated_num_eps: usize,
    pub estimated_num_ppn: usize,
    pub name: *const c_char,
}

/// ucp_worker_params_t (200 bytes in 1.13): the thread mode is the only
/// field set; the rest is padding to the header's size.
#[repr(C)]
pub(crate) struct WorkerParams {
    pub field_mask: u64,
    pub thread_mode: c_int,
    pub rest: [u8; 188],
}

pub(crate) type ErrHandlerCb = unsafe extern "C" fn(arg: *mut c_void, ep: Ep, status: Status);

/// ucp_ep_params_t (104 bytes in 1.13).
#[repr(C)]
pub(crate) struct EpParams {
    pub field_mask: u64,
    pub address: *const Address,
    pub err_mode: c_int,
    pub err_handler_cb: Option<ErrHandlerCb>,
    pub err_handler_arg: *mut c_void,
    pub rest: [u8; 64],
}

/// ucp_request_param_t (72 bytes in 1.13); `cb` is a union of callbacks,
/// `recv_info` a union whose tag form is a `*mut TagRecvInfo`.
#[repr(C)]
pub(crate) struct RequestParam {
    pub op_attr_mask: u32,
    pub flags: u32,
    pub request: *mut c_void,
    pub cb: *mut c_void,
    pub datatype: u64,
    pub user_data: *mut c_void,
    pub reply_buffer: *mut c_void,
    pub memory_type: c_int,
    pub recv_info: *mut TagRecvInfo,
    pub memh: *mut c_void,
}

impl RequestParam {
    /// No callback, contiguous bytes, host memory: completion is polled.
    pub fn new() -> RequestParam {
        // SAFETY: all-zero is a valid value of every field (no mask bits).
        unsafe { std::mem::zeroed() }
    }
}

/// ucp_tag_recv_info_t.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(crate) struct TagRecvInfo {
    pub sender_tag: Tag,
    pub length: usize,
}

/// ucp_worker_attr_t (80 bytes in 1.13).
#[repr(C)]
pub(crate) struct WorkerAttr {
    pub field_mask: u64,
    pub thread_mode: c_int,
    pub address: *mut Address,
    pub address_length: usize,
    pub rest: [u8; 48],
}

/// ucp_mem_map_params_t (40 bytes in 1.13).
#[repr(C)]
pub(crate) struct MemMapParams {
    pub field_mask: u64,
    pub address: *mut c_void,
    pub length: usize,
    pub flags: c_uint,
    pub prot: c_uint,
    pub memory_type: c_int,
}

pub(crate) type MemH = *mut c_void;
pub(crate) type RKey = *mut c_void;

/// The status of a `ucs_status_ptr_t`: [`UCS_OK`] for NULL,
/// [`UCS_INPROGRESS`] for a request, else the error it encodes.
pub(crate) fn status_of_ptr(p: StatusPtr) -> Status {
    if p.is_null() {
        UCS_OK
    } else if (p as usize) >= (UCS_ERR_LAST as usize) {
        p as isize as Status
    } else {
        UCS_INPROGRESS
    }
}

type FnGetVersion = unsafe extern "C" fn(*mut c_uint, *mut c_uint, *mut c_uint);
type FnConfigRead = unsafe extern "C" fn(*const c_char, *const c_char, *mut Config) -> Status;
type FnConfigRelease = unsafe extern "C" fn(Config);
type FnConfigModify = unsafe extern "C" fn(Config, *const c_char, *const c_char) -> Status;
type FnInitVersion =
    unsafe extern "C" fn(c_uint, c_uint, *const Params, Config, *mut Context) -> Status;
type FnCleanup = unsafe extern "C" fn(Context);
type FnWorkerCreate = unsafe extern "C" fn(Context, *const WorkerParams, *mut Worker) -> Status;
type FnWorkerDestroy = unsafe extern "C" fn(Worker);
type FnWorkerQuery = unsafe extern "C" fn(Worker, *mut WorkerAttr) -> Status;
type FnWorkerReleaseAddress = unsafe extern "C" fn(Worker, *mut Address);
type FnWorkerProgress = unsafe extern "C" fn(Worker) -> c_uint;
type FnWorkerGetEfd = unsafe extern "C" fn(Worker, *mut c_int) -> Status;
type FnWorkerArm = unsafe extern "C" fn(Worker) -> Status;
type FnEpCreate = unsafe extern "C" fn(Worker, *const EpParams, *mut Ep) -> Status;
type FnEpCloseNbx = unsafe extern "C" fn(Ep, *const RequestParam) -> StatusPtr;
type FnTagSendNbx =
    unsafe extern "C" fn(Ep, *const c_void, usize, Tag, *const RequestParam) -> StatusPtr;
type FnTagRecvNbx =
    unsafe extern "C" fn(Worker, *mut c_void, usize, Tag, Tag, *const RequestParam) -> StatusPtr;
type FnRequestCheckStatus = unsafe extern "C" fn(*mut c_void) -> Status;
type FnTagRecvRequestTest = unsafe extern "C" fn(*mut c_void, *mut TagRecvInfo) -> Status;
type FnRequestCancel = unsafe extern "C" fn(Worker, *mut c_void);
type FnRequestFree = unsafe extern "C" fn(*mut c_void);
type FnMemMap = unsafe extern "C" fn(Context, *const MemMapParams, *mut MemH) -> Status;
type FnMemUnmap = unsafe extern "C" fn(Context, MemH) -> Status;
type FnRkeyPack = unsafe extern "C" fn(Context, MemH, *mut *mut c_void, *mut usize) -> Status;
type FnRkeyBufferRelease = unsafe extern "C" fn(*mut c_void);
type FnEpRkeyUnpack = unsafe extern "C" fn(Ep, *const c_void, *mut RKey) -> Status;
type FnRkeyDestroy = unsafe extern "C" fn(RKey);
type FnPutNbx =
    unsafe extern "C" fn(Ep, *const c_void, usize, u64, RKey, *const RequestParam) -> StatusPtr;
type FnGetNbx =
    unsafe extern "C" fn(Ep, *mut c_void, usize, u64, RKey, *const RequestParam) -> StatusPtr;
type FnAtomicOpNbx = unsafe extern "C" fn(
    Ep,
    c_int,
    *const c_void,
    usize,
    u64,
    RKey,
    *const RequestParam,
) -> StatusPtr;
type FnEpFlushNbx = unsafe extern "C" fn(Ep, *const RequestParam) -> StatusPtr;
type FnStatusString = unsafe extern "C" fn(Status) -> *const c_char;

/// The resolved UCP entry points (all required).
pub(crate) struct Ucp {
    /// Where the library came from, for messages.
    pub origin: String,
    /// "1.13.1".
    pub version: String,
    pub config_read: FnConfigRead,
    pub config_release: FnConfigRelease,
    pub config_modify: FnConfigModify,
    pub init_version: FnInitVersion,
    pub cleanup: FnCleanup,
    pub worker_create: FnWorkerCreate,
    pub worker_destroy: FnWorkerDestroy,
    pub worker_query: FnWorkerQuery,
    pub worker_release_address: FnWorkerReleaseAddress,
    pub worker_progress: FnWorkerProgress,
    pub worker_get_efd: FnWorkerGetEfd,
    pub worker_arm: FnWorkerArm,
    pub ep_create: FnEpCreate,
    pub ep_close_nbx: FnEpCloseNbx,
    pub tag_send_nbx: FnTagSendNbx,
    pub tag_recv_nbx: FnTagRecvNbx,
    pub request_check_status: FnRequestCheckStatus,
    pub tag_recv_request_test: FnTagRecvRequestTest,
    pub request_cancel: FnRequestCancel,
    pub request_free: FnRequestFree,
    pub mem_map: FnMemMap,
    pub mem_unmap: FnMemUnmap,
    pub rkey_pack: FnRkeyPack,
    pub rkey_buffer_release: FnRkeyBufferRelease,
    pub ep_rkey_unpack: FnEpRkeyUnpack,
    pub rkey_destroy: FnRkeyDestroy,
    pub put_nbx: FnPutNbx,
    pub get_nbx: FnGetNbx,
    pub atomic_op_nbx: FnAtomicOpNbx,
    pub ep_flush_nbx: FnEpFlushNbx,
    status_string: FnStatusString,
}

// SAFETY: function pointers into a library that is never unloaded.
unsafe impl Send for Ucp {}
unsafe impl Sync for Ucp {}

fn dlerror_string() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
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

impl Ucp {
    /// Opens `name` and resolves the table.
    fn load(name: &str) -> Result<Ucp> {
        let c = CString::new(name)
            .map_err(|_| Error::invalid_argument("TORCHCOMM_UCX_LIBRARY contains a NUL byte"))?;
        // SAFETY: a valid C string; loading runs the library's constructors.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(Error::unavailable(format!(
                "UCX ({name}) could not be loaded: {} (install libucx0)",
                dlerror_string()
            )));
        }
        let missing = |s: &str| {
            Error::unavailable(format!("{name} is not a usable UCX: symbol {s} is missing"))
        };
        macro_rules! req {
            ($s:literal) => {
                // SAFETY: the symbol has the type of its 1.13 prototype.
                unsafe { sym(h, $s) }.ok_or_else(|| missing($s))?
            };
        }
        let get_version: FnGetVersion = req!("ucp_get_version");
        let (mut major, mut minor, mut release) = (0, 0, 0);
        // SAFETY: three out-parameters.
        unsafe { get_version(&mut major, &mut minor, &mut release) };
        if major != API_MAJOR || minor < API_MINOR {
            return Err(Error::unavailable(format!(
                "{name} is UCX {major}.{minor}.{release}; libtorchcomm needs UCX 1.13 or a newer 1.x"
            )));
        }
        Ok(Ucp {
            origin: name.to_string(),
            version: format!("{major}.{minor}.{release}"),
            config_read: req!("ucp_config_read"),
            config_release: req!("ucp_config_release"),
            config_modify: req!("ucp_config_modify"),
            init_version: req!("ucp_init_version"),
            cleanup: req!("ucp_cleanup"),
            worker_create: req!("ucp_worker_create"),
            worker_destroy: req!("ucp_worker_destroy"),
            worker_query: req!("ucp_worker_query"),
            worker_release_address: req!("ucp_worker_release_address"),
            worker_progress: req!("ucp_worker_progress"),
            worker_get_efd: req!("ucp_worker_get_efd"),
            worker_arm: req!("ucp_worker_arm"),
            ep_create: req!("ucp_ep_create"),
            ep_close_nbx: req!("ucp_ep_close_nbx"),
            tag_send_nbx: req!("ucp_tag_send_nbx"),
            tag_recv_nbx: req!("ucp_tag_recv_nbx"),
            request_check_status: req!("ucp_request_check_status"),
            tag_recv_request_test: req!("ucp_tag_recv_request_test"),
            request_cancel: req!("ucp_request_cancel"),
            request_free: req!("ucp_request_free"),
            mem_map: req!("ucp_mem_map"),
            mem_unmap: req!("ucp_mem_unmap"),
            rkey_pack: req!("ucp_rkey_pack"),
            rkey_buffer_release: req!("ucp_rkey_buffer_release"),
            ep_rkey_unpack: req!("ucp_ep_rkey_unpack"),
            rkey_destroy: req!("ucp_rkey_destroy"),
            put_nbx: req!("ucp_put_nbx"),
            get_nbx: req!("ucp_get_nbx"),
            atomic_op_nbx: req!("ucp_atomic_op_nbx"),
            ep_flush_nbx: req!("ucp_ep_flush_nbx"),
            // In libucs, a dependency of libucp: dlsym searches it too.
            status_string: req!("ucs_status_string"),
        })
    }

    /// UCX's text for a status.
    pub fn status_string(&self, s: Status) -> String {
        // SAFETY: returns a static string for any status.
        let p = unsafe { (self.status_string)(s) };
        if p.is_null() {
            format!("UCS status {s}")
        } else {
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    }
}

/// The process's UCP, loaded on first use (the outcome is kept).
pub(crate) fn ucp() -> Result<&'static Ucp> {
    static LIB: OnceLock<Result<Ucp>> = OnceLock::new();
    LIB.get_or_init(|| {
        let name = std::env::var("TORCHCOMM_UCX_LIBRARY")
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "libucp.so.0".into());
        Ucp::load(&name)
    })
    .as_ref()
    .map_err(|e| e.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layouts of UCX 1.13's ucp.h (sizeof and offsetof printed by a C
    /// program built against libucx-dev 1.13.1).
    #[test]
    fn layouts_match_ucx_1_13() {
        use std::mem::{offset_of, size_of};
        assert_eq!(size_of::<Params>(), 80);
        assert_eq!(offset_of!(Params, tag_sender_mask), 40);
        assert_eq!(offset_of!(Params, estimated_num_eps), 56);
        assert_eq!(offset_of!(Params, name), 72);
        assert_eq!(size_of::<WorkerParams>(), 200);
        assert_eq!(offset_of!(WorkerParams, thread_mode), 8);
        assert_eq!(size_of::<EpParams>(), 104);
        assert_eq!(offset_of!(EpParams, err_mode), 16);
        assert_eq!(offset_of!(EpParams, err_handler_cb), 24);
        assert_eq!(offset_of!(EpParams, err_handler_arg), 32);
        assert_eq!(size_of::<RequestParam>(), 72);
        assert_eq!(offset_of!(RequestParam, datatype), 24);
        assert_eq!(offset_of!(RequestParam, memory_type), 48);
        assert_eq!(offset_of!(RequestParam, recv_info), 56);
        assert_eq!(size_of::<TagRecvInfo>(), 16);
        assert_eq!(size_of::<WorkerAttr>(), 80);
        assert_eq!(offset_of!(WorkerAttr, address), 16);
        assert_eq!(offset_of!(WorkerAttr, address_length), 24);
        assert_eq!(size_of::<MemMapParams>(), 40);
        assert_eq!(offset_of!(MemMapParams, address), 8);
        assert_eq!(offset_of!(MemMapParams, length), 16);
        assert_eq!(offset_of!(MemMapParams, flags), 24);
        assert_eq!(offset_of!(MemMapParams, prot), 28);
        assert_eq!(offset_of!(MemMapParams, memory_type), 32);
    }

    #[test]
    fn status_pointers_decode() {
        assert_eq!(status_of_ptr(std::ptr::null_mut()), UCS_OK);
        assert_eq!(status_of_ptr(0x1000 as StatusPtr), UCS_INPROGRESS);
        assert_eq!(status_of_ptr(-25isize as StatusPtr), -25);
        assert_eq!(status_of_ptr(-1isize as StatusPtr), -1);
    }

    /// The status values declared here are UCX's (where UCX is installed).
    #[test]
    fn statuses_match_ucx() {
        let Ok(u) = ucp() else { return };
        assert_eq!(u.status_string(UCS_ERR_BUSY), "Device is busy");
        assert_eq!(u.status_string(UCS_ERR_CANCELED), "Request canceled");
        assert_eq!(
            u.status_string(UCS_ERR_MESSAGE_TRUNCATED),
            "Message truncated"
        );
    }
}

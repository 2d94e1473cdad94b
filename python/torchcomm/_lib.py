"""Loading libtorchcomm and declaring its C functions (include/torchcomm.h)."""
from __future__ import annotations

import ctypes as C
import ctypes.util
import functools
import os
from pathlib import Path
from typing import Any, Callable, List, Optional, TypeVar

# Values of include/torchcomm.h (tests/test_constants.py checks each).
TC_SUCCESS = 0
TC_UNSET = -1
TC_ANY_SOURCE = -1
TC_DEVICE_CPU = 0
TC_DEVICE_CUDA = 1
TC_COMM_OPTIONS_MAGIC = 1413697357
TC_COMM_OPTIONS_VERSION = 2
TC_OP_OPTIONS_MAGIC = 1413697360
TC_OP_OPTIONS_VERSION = 2
TC_REDUCER_OPTIONS_MAGIC = 1413698116
TC_REDUCER_OPTIONS_VERSION = 2
TC_POWERSGD_OPTIONS_MAGIC = 1413697619
TC_POWERSGD_OPTIONS_VERSION = 1
TC_HOOK_PRE = 0
TC_HOOK_POST = 1
TC_OP_INFO_VERSION = 2
TC_INIT_HANDLES_LIST = 0
TC_INIT_HANDLES_SET = 1
TC_STORE_CALLBACKS_MAGIC = 1413698371
TC_STORE_CALLBACKS_VERSION = 1
TC_ERR_REMOTE = 1007
TC_ERR_TIMEOUT = 1006

ERROR_NAMES = {
    1001: "TC_ERR_NULL_ARGUMENT",
    1002: "TC_ERR_INVALID_ARGUMENT",
    1003: "TC_ERR_INVALID_USAGE",
    1004: "TC_ERR_UNSUPPORTED",
    1005: "TC_ERR_UNAVAILABLE",
    1006: "TC_ERR_TIMEOUT",
    1007: "TC_ERR_REMOTE",
    1008: "TC_ERR_ABORTED",
    1009: "TC_ERR_CUDA",
    1010: "TC_ERR_NCCL",
    1011: "TC_ERR_SYSTEM",
    1012: "TC_ERR_INTERNAL",
    1013: "TC_ERR_PANIC",
    1014: "TC_ERR_BUFFER_TOO_SMALL",
    1015: "TC_ERR_NOT_FOUND",
    1016: "TC_ERR_OUT_OF_MEMORY",
}


class Device(C.Structure):
    _fields_ = [("type", C.c_int32), ("index", C.c_int32)]


class Hint(C.Structure):
    _fields_ = [("key", C.c_char_p), ("value", C.c_char_p)]


class CommOptions(C.Structure):
    _fields_ = [
        ("size", C.c_size_t),
        ("magic", C.c_uint32),
        ("version", C.c_uint32),
        ("name", C.c_char_p),
        ("timeout_ms", C.c_int64),
        ("abort_on_error", C.c_int32),
        ("rank", C.c_int32),
        ("world_size", C.c_int32),
        ("store", C.c_void_p),
        ("hints", C.POINTER(Hint)),
        ("num_hints", C.c_size_t),
        ("enable_reconfigure", C.c_int32),
    ]


class OpOptions(C.Structure):
    _fields_ = [
        ("size", C.c_size_t),
        ("magic", C.c_uint32),
        ("version", C.c_uint32),
        ("async_op", C.c_int32),
        ("timeout_ms", C.c_int64),
        ("stream", C.c_void_p),
        ("hints", C.POINTER(Hint)),
        ("num_hints", C.c_size_t),
        ("tag", C.c_uint32),  # version 2
    ]


class ReduceOpC(C.Structure):
    _fields_ = [("kind", C.c_int32), ("premul_factor", C.c_double), ("premul_factor_ptr", C.c_void_p)]


class SparseCoo(C.Structure):
    """tc_sparse_coo_t: a COO tensor in torch's layout."""

    _fields_ = [
        ("sparse_dim", C.c_size_t),
        ("dense_dim", C.c_size_t),
        ("shape", C.POINTER(C.c_int64)),
        ("nnz", C.c_size_t),
        ("indices", C.POINTER(C.c_int64)),
        ("values", C.c_void_p),
        ("dtype", C.c_int32),
    ]


class ReducerOptions(C.Structure):
    """tc_reducer_options_t."""

    _fields_ = [
        ("size", C.c_size_t),
        ("magic", C.c_uint32),
        ("version", C.c_uint32),
        ("bucket_cap_bytes", C.c_size_t),
        ("first_bucket_bytes", C.c_size_t),
        ("gradient_as_bucket_view", C.c_int32),
        ("stream", C.c_void_p),  # version 2
    ]


class PowerSGDOptions(C.Structure):
    """tc_powersgd_options_t."""

    _fields_ = [
        ("size", C.c_size_t),
        ("magic", C.c_uint32),
        ("version", C.c_uint32),
        ("matrix_approximation_rank", C.c_size_t),
        ("start_iter", C.c_uint64),
        ("min_compression_rate", C.c_double),
        ("orthogonalization_epsilon", C.c_double),
        ("use_error_feedback", C.c_int32),
        ("warm_start", C.c_int32),
        ("seed", C.c_uint64),
        ("rows", C.POINTER(C.c_size_t)),
        ("num_rows", C.c_size_t),
    ]


class LocalOptions(C.Structure):
    """tc_local_options_t."""

    _fields_ = [
        ("size", C.c_size_t),
        ("magic", C.c_uint32),
        ("version", C.c_uint32),
        ("use_nccl", C.c_int32),
        ("bucket_bytes", C.c_size_t),
    ]


class GradBucketC(C.Structure):
    """tc_grad_bucket_t: the bucket a communication hook exchanges."""

    _fields_ = [
        ("index", C.c_size_t),
        ("num_buckets", C.c_size_t),
        ("is_last", C.c_int),
        ("buffer", C.c_void_p),
        ("count", C.c_size_t),
        ("dtype", C.c_int32),
        ("num_grads", C.c_size_t),
        ("grad_indices", C.POINTER(C.c_size_t)),
        ("offsets", C.POINTER(C.c_size_t)),
        ("lengths", C.POINTER(C.c_size_t)),
    ]


ABORT_HOOK = C.CFUNCTYPE(None, C.c_int32, C.c_char_p, C.c_void_p)


class OpBuffer(C.Structure):
    _fields_ = [("ptr", C.c_void_p), ("count", C.c_size_t), ("dtype", C.c_int32), ("peer", C.c_int32)]


class ReduceOpC(C.Structure):
    _fields_ = [("kind", C.c_int32), ("premul_factor", C.c_double), ("premul_factor_ptr", C.c_void_p)]


class OpInfo(C.Structure):
    """tc_op_info_t: what an operation hook receives (valid during the call)."""

    _fields_ = [
        ("struct_size", C.c_size_t),
        ("version", C.c_uint32),
        ("phase", C.c_int),
        ("op_name", C.c_char_p),
        ("comm_name", C.c_char_p),
        ("seq", C.c_uint64),
        ("rank", C.c_int),
        ("size", C.c_int),
        ("dtype", C.c_int32),
        ("root", C.c_int),
        ("peer", C.c_int),
        ("reduce_op", ReduceOpC),
        ("async_op", C.c_int),
        ("inputs", C.POINTER(OpBuffer)),
        ("num_inputs", C.c_size_t),
        ("outputs", C.POINTER(OpBuffer)),
        ("num_outputs", C.c_size_t),
        ("status", C.c_int32),
        ("message", C.c_char_p),
        ("completed", C.c_int),
        # version 2
        ("tag", C.c_uint32),
        ("input_tags", C.POINTER(C.c_uint32)),
        ("output_tags", C.POINTER(C.c_uint32)),
        ("window_offset", C.c_size_t),
    ]


OP_HOOK = C.CFUNCTYPE(None, C.POINTER(OpInfo), C.c_void_p)
COMM_HOOK = C.CFUNCTYPE(C.c_int32, C.c_void_p, C.c_void_p, C.POINTER(GradBucketC), C.POINTER(C.c_void_p))
LOG_CALLBACK = C.CFUNCTYPE(None, C.c_int32, C.c_char_p, C.c_void_p)

_p, _sz, _i32, _i64 = C.c_void_p, C.c_size_t, C.c_int32, C.c_int64

# tc_store_callbacks_t's functions; the last argument is the tc_store_reply_t.
STORE_SET = C.CFUNCTYPE(C.c_int32, C.c_void_p, C.c_char_p, C.c_void_p, C.c_size_t, C.c_void_p)
STORE_GET = C.CFUNCTYPE(C.c_int32, C.c_void_p, C.c_char_p, C.c_void_p)
STORE_ADD = C.CFUNCTYPE(C.c_int32, C.c_void_p, C.c_char_p, C.c_int64, C.POINTER(C.c_int64), C.c_void_p)
STORE_CHECK = C.CFUNCTYPE(C.c_int32, C.c_void_p, C.POINTER(C.c_char_p), C.c_size_t, C.POINTER(C.c_int), C.c_void_p)
STORE_WAIT = C.CFUNCTYPE(C.c_int32, C.c_void_p, C.POINTER(C.c_char_p), C.c_size_t, C.c_int64, C.c_void_p)
STORE_DELETE = C.CFUNCTYPE(C.c_int32, C.c_void_p, C.c_char_p, C.POINTER(C.c_int), C.c_void_p)
STORE_COMPARE_SET = C.CFUNCTYPE(C.c_int32, C.c_void_p, C.c_char_p, C.c_void_p, C.c_size_t, C.c_void_p, C.c_size_t,
                                C.c_void_p)
STORE_NUM_KEYS = C.CFUNCTYPE(C.c_int32, C.c_void_p, C.POINTER(C.c_int64), C.c_void_p)
STORE_DESTROY = C.CFUNCTYPE(None, C.c_void_p)


class StoreCallbacks(C.Structure):
    """tc_store_callbacks_t."""

    _fields_ = [
        ("size", C.c_size_t),
        ("magic", C.c_uint32),
        ("version", C.c_uint32),
        ("user_data", C.c_void_p),
        ("set", STORE_SET),
        ("get", STORE_GET),
        ("add", STORE_ADD),
        ("check", STORE_CHECK),
        ("wait", STORE_WAIT),
        ("delete_key", STORE_DELETE),
        ("compare_set", STORE_COMPARE_SET),
        ("num_keys", STORE_NUM_KEYS),
        ("destroy", STORE_DESTROY),
        ("timeout_ms", C.c_int64),
    ]

_out = C.POINTER(C.c_void_p)
_int_p = C.POINTER(C.c_int)
_sz_p = C.POINTER(C.c_size_t)
_opts = C.POINTER(OpOptions)

# name: (restype, argtypes); restype None for void functions.
_R = C.c_int32
PROTOTYPES = {
    "tc_comm_new": (_R, [C.c_char_p, Device, C.POINTER(CommOptions), _out]),
    "tc_comm_get_rank": (_R, [_p, _int_p]),
    "tc_comm_get_size": (_R, [_p, _int_p]),
    "tc_comm_get_name": (_R, [_p, C.POINTER(C.c_char_p)]),
    "tc_comm_get_backend": (_R, [_p, C.POINTER(C.c_char_p)]),
    "tc_comm_get_ranks": (_R, [_p, _int_p, _sz_p]),
    "tc_comm_get_backend_version": (_R, [_p, C.POINTER(C.c_char_p)]),
    "tc_comm_set_timeout": (_R, [_p, C.c_int64]),
    "tc_comm_set_hints": (_R, [_p, C.POINTER(Hint), _sz]),
    "tc_comm_get_device": (_R, [_p, C.POINTER(Device)]),
    "tc_comm_get_async_error": (_R, [_p]),
    "tc_comm_dump_flight_recorder": (_R, [_p, _out]),
    "tc_comm_set_abort_hook": (_R, [_p, ABORT_HOOK, _p]),
    "tc_comm_add_pre_hook": (_R, [_p, OP_HOOK, _p, C.POINTER(C.c_uint64)]),
    "tc_comm_add_post_hook": (_R, [_p, OP_HOOK, _p, C.POINTER(C.c_uint64)]),
    "tc_comm_remove_hook": (_R, [_p, C.c_uint64]),
    "tc_comm_split": (_R, [_p, C.POINTER(C.c_int), _sz, C.c_char_p, C.POINTER(CommOptions), _out]),
    "tc_comm_shrink": (_R, [_p, C.POINTER(C.c_int), _sz, C.c_char_p, C.POINTER(CommOptions), _out]),
    "tc_comm_get_init_handle": (_R, [_p, C.POINTER(C.c_char_p)]),
    "tc_comm_refuse": (_R, [_p, C.c_char_p, C.c_char_p]),
    "tc_comm_reconfigure": (_R, [_p, C.c_int64, C.POINTER(C.c_char_p), _sz, C.c_int, _opts, _out]),
    "tc_comm_finalize": (_R, [_p]),
    "tc_comm_abort": (_R, [_p]),
    "tc_comm_destroy": (None, [_p]),
    "tc_comm_register": (_R, [_p, _p, _sz, _out]),
    "tc_comm_deregister": (_R, [_p, _p]),
    "tc_mem_alloc": (_R, [_p, _sz, _out]),
    "tc_mem_free": (_R, [_p, _p]),
    "tc_free": (None, [_p]),
    "tc_broadcast_coalesced": (
        _R,
        [_p, C.POINTER(C.c_void_p), _sz_p, C.POINTER(C.c_int32), _sz, _sz, C.c_int, _opts, _out],
    ),
    "tc_reducer_new": (
        _R,
        [_p, C.POINTER(C.c_void_p), _sz_p, C.POINTER(C.c_int32), _sz, C.POINTER(ReducerOptions), _out],
    ),
    "tc_reducer_free": (None, [_p]),
    "tc_reducer_mark_ready": (_R, [_p, _sz]),
    "tc_reducer_finalize": (_R, [_p]),
    "tc_reducer_finalize_async": (_R, [_p, _out]),
    "tc_reducer_set_hook": (_R, [_p, COMM_HOOK, _p]),
    "tc_reducer_set_builtin_hook": (_R, [_p, _i32]),
    "tc_reducer_get_grad": (_R, [_p, _sz, _out]),
    "tc_reducer_num_buckets": (_R, [_p, _sz_p]),
    "tc_reducer_set_powersgd": (_R, [_p, C.POINTER(PowerSGDOptions)]),
    "tc_local_new": (_R, [C.POINTER(Device), _sz, C.POINTER(LocalOptions), _out]),
    "tc_local_free": (None, [_p]),
    "tc_local_broadcast": (_R, [_p, _p, _sz, _out, _sz, _i32, _out]),
    "tc_local_broadcast_coalesced": (_R, [_p, _out, _sz_p, C.POINTER(C.c_int32), _sz, _sz, _out, _out]),
    "tc_local_scatter": (_R, [_p, _p, Device, _sz, _i32, _sz_p, _out, _out]),
    "tc_local_gather": (_R, [_p, _out, _sz_p, _i32, _p, Device, _p]),
    "tc_local_reduce_add": (_R, [_p, _out, _sz, _i32, _p, _sz, _out]),
    "tc_local_reduce_add_coalesced": (
        _R,
        [_p, _out, _sz_p, C.POINTER(C.c_int32), _sz, _sz, _out, _sz, _out],
    ),
    "tc_sparse_all_reduce": (_R, [_p, C.POINTER(SparseCoo), ReduceOpC, C.POINTER(SparseCoo), _opts, _out]),
    "tc_send": (_R, [_p, _p, _sz, _i32, C.c_int, _opts, _out]),
    "tc_recv": (_R, [_p, _p, _sz, _i32, C.c_int, _opts, _out]),
    "tc_batch_begin": (_R, [_p, _out]),
    "tc_batch_send": (_R, [_p, _p, _sz, _i32, C.c_int]),
    "tc_batch_send_tagged": (_R, [_p, _p, _sz, _i32, C.c_int, C.c_uint32]),
    "tc_batch_recv_tagged": (_R, [_p, _p, _sz, _i32, C.c_int, C.c_uint32]),
    "tc_batch_recv": (_R, [_p, _p, _sz, _i32, C.c_int]),
    "tc_batch_issue": (_R, [_p, _opts, _out]),
    "tc_batch_free": (None, [_p]),
    "tc_broadcast": (_R, [_p, _p, _sz, _i32, C.c_int, _opts, _out]),
    "tc_reduce": (_R, [_p, _p, _sz, _i32, C.c_int, ReduceOpC, _opts, _out]),
    "tc_all_reduce": (_R, [_p, _p, _sz, _i32, ReduceOpC, _opts, _out]),
    "tc_all_gather": (_R, [_p, _out, _p, _sz, _i32, _opts, _out]),
    "tc_all_gather_single": (_R, [_p, _p, _p, _sz, _i32, _opts, _out]),
    "tc_all_gather_v": (_R, [_p, _p, _sz_p, _p, _i32, _opts, _out]),
    "tc_reduce_scatter": (_R, [_p, _p, _out, _sz, _i32, ReduceOpC, _opts, _out]),
    "tc_reduce_scatter_single": (_R, [_p, _p, _p, _sz, _i32, ReduceOpC, _opts, _out]),
    "tc_reduce_scatter_v": (_R, [_p, _p, _p, _sz_p, _i32, ReduceOpC, _opts, _out]),
    "tc_all_to_all": (_R, [_p, _out, _out, _sz, _i32, _opts, _out]),
    "tc_all_to_all_single": (_R, [_p, _p, _p, _sz, _i32, _opts, _out]),
    "tc_all_to_all_v_single": (_R, [_p, _p, _sz_p, _p, _sz_p, _i32, _opts, _out]),
    "tc_barrier": (_R, [_p, _opts, _out]),
    "tc_scatter": (_R, [_p, _p, _out, _sz, _i32, C.c_int, _opts, _out]),
    "tc_gather": (_R, [_p, _out, _p, _sz, _i32, C.c_int, _opts, _out]),
    "tc_gather_single": (_R, [_p, _p, _p, _sz, _i32, C.c_int, _opts, _out]),
    "tc_all_gather_p_init": (_R, [_p, _p, _sz, _i32, _opts, _out]),
    "tc_all_gather_p_exec": (_R, [_p, _p, _opts, _out]),
    "tc_all_gather_p_free": (None, [_p]),
    "tc_result_string": (C.c_char_p, [C.c_int32]),
    "tc_last_error": (C.c_char_p, []),
    "tc_get_version": (_R, [_int_p, _int_p, _int_p]),
    "tc_set_log_callback": (_R, [LOG_CALLBACK, _p]),
    "tc_store_tcp_new": (_R, [C.c_char_p, C.c_uint16, C.c_int, _i32, _i64, _out]),
    "tc_store_tcp_port": (_R, [_p, C.POINTER(C.c_uint16)]),
    "tc_store_file_new": (_R, [C.c_char_p, _i32, _out]),
    "tc_store_prefix_new": (_R, [_p, C.c_char_p, _out]),
    "tc_store_set": (_R, [_p, C.c_char_p, C.c_char_p, _sz]),
    "tc_store_get": (_R, [_p, C.c_char_p, _p, _sz, _sz_p]),
    "tc_store_get_alloc": (_R, [_p, C.c_char_p, _out, _sz_p]),
    "tc_store_add": (_R, [_p, C.c_char_p, _i64, C.POINTER(C.c_int64)]),
    "tc_store_compare_set": (_R, [_p, C.c_char_p, C.c_char_p, _sz, C.c_char_p, _sz, _out, _sz_p]),
    "tc_store_check": (_R, [_p, C.POINTER(C.c_char_p), _sz, _int_p]),
    "tc_store_wait": (_R, [_p, C.POINTER(C.c_char_p), _sz, _i64]),
    "tc_store_delete": (_R, [_p, C.c_char_p, _int_p]),
    "tc_store_num_keys": (_R, [_p, C.POINTER(C.c_int64)]),
    "tc_store_free": (None, [_p]),
    "tc_store_new_callbacks": (_R, [C.POINTER(StoreCallbacks), _out]),
    "tc_store_reply_value": (_R, [_p, C.c_char_p, _sz]),
    "tc_store_reply_error": (_R, [_p, C.c_char_p]),
    "tc_dtype_size": (_R, [_i32, _sz_p]),
    "tc_window_new": (_R, [_p, _out]),
    "tc_window_register": (_R, [_p, _p, _sz]),
    "tc_window_deregister": (_R, [_p]),
    "tc_window_put": (_R, [_p, _p, _sz, _i32, _sz, _opts, _out]),
    "tc_window_get": (_R, [_p, _p, _sz, _i32, _sz, _opts, _out]),
    "tc_window_signal": (_R, [_p, _i32, _opts, _out]),
    "tc_window_wait_signal": (_R, [_p, _i32, _opts, _out]),
    "tc_window_map_remote": (_R, [_p, _i32, _out]),
    "tc_window_free": (None, [_p]),
    "tc_work_is_completed": (_R, [_p, _int_p]),
    "tc_work_status": (_R, [_p, C.POINTER(C.c_int32)]),
    "tc_work_source": (_R, [_p, C.POINTER(C.c_int32)]),
    "tc_work_wait": (_R, [_p, _p]),
    "tc_work_wait_blocking": (_R, [_p]),
    "tc_work_free": (None, [_p]),
}


def _candidates() -> List[str]:
    """Where to look for the library, in order."""
    found = []
    env = os.environ.get("TORCHCOMM_LIBRARY")
    if env:
        return [env]
    # A wheel carries the library (and the gloo module beside it, which the
    # library finds by its own directory) inside the package.
    packaged = Path(__file__).resolve().parent / "libtorchcomm.so"
    if packaged.is_file():
        found.append(str(packaged))
    found.append("libtorchcomm.so.0")  # the installed one, through the loader's path
    name = ctypes.util.find_library("torchcomm")
    if name:
        found.append(name)
    for prefix in ("/usr/local/lib", "/usr/lib"):
        found.append(os.path.join(prefix, "libtorchcomm.so"))
    # A build tree: above this package's source (python/torchcomm) or the cwd.
    for start in (Path(__file__).resolve().parent, Path.cwd()):
        for d in (start, *start.parents):
            lib = d / "target" / "release" / "libtorchcomm.so"
            if lib.is_file():
                found.append(str(lib))
                break
    return found


def load(path: Optional[str] = None) -> Any:
    """Loads the library (first candidate that loads) and declares its functions."""
    tried = []
    for cand in [path] if path else _candidates():
        try:
            lib = C.CDLL(cand)
            break
        except OSError as e:
            tried.append(f"{cand}: {e}")
    else:
        raise OSError(
            "libtorchcomm not found; set TORCHCOMM_LIBRARY to its path. Tried:\n  " + "\n  ".join(tried)
        )
    for fname, (restype, argtypes) in PROTOTYPES.items():
        fn = getattr(lib, fname)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


lib = load()


class TorchCommError(RuntimeError):
    """A failed call: ``code`` (the C result code), ``name`` (``TC_ERR_*``),
    ``detail`` (the thread's ``tc_last_error()`` text) and ``call``."""

    # Whether the library returned it (``check``), rather than the
    # binding's own checks before calling it (see ``refusing``).
    from_library = False

    def __init__(self, code: int, detail: str, call: str = ""):
        self.code = code
        self.name = ERROR_NAMES.get(code, str(code))
        self.detail = detail
        self.call = call
        text = lib.tc_result_string(code).decode()
        # The library's detail usually starts with the call's name already.
        head = "" if not call or detail.startswith(call) else f"{call}: "
        super().__init__(f"{head}{self.name} ({text}): {detail}")


def check(rc: int, call: str) -> None:
    if rc != TC_SUCCESS:
        err = TorchCommError(rc, lib.tc_last_error().decode(errors="replace"), call)
        err.from_library = True
        raise err


F = TypeVar("F", bound=Callable[..., Any])


def refusing(call: str, comm_of: Callable[..., Any] = lambda self, *a, **k: self) -> Callable[[F], F]:
    """Decorates a function that makes collective `call` (its C name) on
    the comm ``comm_of(*args, **kwargs)`` returns: when the binding's own
    checks raise before the library is called (a byte order or dtype the
    library has no code for, a list of the wrong length, ...), the refusal
    of `call` is issued in its place (``tc_comm_refuse``) so that the call
    fails on every rank instead of the peers pairing it with this rank's
    next collective; then the exception is raised as it was. Not for
    point-to-point calls (a refused send fails only its rank)."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def refused_in_place(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                handle = getattr(comm_of(*args, **kwargs), "_h", None)
                if handle and not getattr(e, "from_library", False):
                    lib.tc_comm_refuse(handle, call.encode(), str(e).encode(errors="replace"))
                raise
        return refused_in_place  # type: ignore[return-value]
    return wrap


def invalid(detail: str, call: str = "") -> TorchCommError:
    """An argument error found on the Python side, coded like the library's."""
    return TorchCommError(1002, detail, call)


def take_bytes(ptr: C.c_void_p, n: int) -> bytes:
    """Copies `n` bytes the library allocated, then frees them."""
    try:
        return C.string_at(ptr, n) if n else b""
    finally:
        lib.tc_free(ptr)


def hint_array(hints: Optional[dict]) -> Any:
    """The C array of a dict of hints (keep the result alive for the call)."""
    if not hints:
        return None
    arr = (Hint * len(hints))(*[Hint(str(k).encode(), str(v).encode()) for k, v in hints.items()])
    return arr


def op_options(async_op: bool, timeout: Optional[float], stream: Optional[int], hints: Optional[dict]) -> OpOptions:
    o = OpOptions(C.sizeof(OpOptions), TC_OP_OPTIONS_MAGIC, TC_OP_OPTIONS_VERSION, 1 if async_op else 0, TC_UNSET,
                  stream, None, 0)
    if timeout is not None:
        o.timeout_ms = int(timeout * 1000)
    arr = hint_array(hints)
    if arr is not None:
        o.hints = C.cast(arr, C.POINTER(Hint))
        o.num_hints = len(arr)
        o._keep = arr  # type: ignore[attr-defined]
    return o


Callback = Callable[..., None]

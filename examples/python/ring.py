"""libtorchcomm from Python through ctypes alone (no compiler, no numpy).

Every rank joins a host ("gloo") communicator bootstrapped from its
launcher's environment, all-reduces its rank, all-gathers a block, and
writes its block into the next rank's one-sided window. Each result is
checked; the exit status says whether all were right. Run it under a
launcher:

    tc-run -n 3 -- python3 examples/python/ring.py target/release/libtorchcomm.so

The structures below mirror include/torchcomm.h (versioned option structs:
size, magic, version first; the library reads only what `size` says).
"""
import ctypes as C
import sys

lib = C.CDLL(sys.argv[1] if len(sys.argv) > 1 else "libtorchcomm.so")

# Values of include/torchcomm.h (`make capi-test` checks each against it).
TC_DEVICE_CPU = 0
TC_INT64 = 7
TC_SUM = 0
TC_COMM_OPTIONS_MAGIC = 1413697357
TC_COMM_OPTIONS_VERSION = 2
TC_UNSET = -1


class Device(C.Structure):
    _fields_ = [("type", C.c_int32), ("index", C.c_int32)]


class ReduceOp(C.Structure):
    _fields_ = [("kind", C.c_int32), ("premul_factor", C.c_double), ("premul_factor_ptr", C.c_void_p)]


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
        ("hints", C.c_void_p),
        ("num_hints", C.c_size_t),
        ("enable_reconfigure", C.c_int32),
    ]


handle, out = C.c_void_p, C.POINTER(C.c_void_p)
lib.tc_last_error.restype = C.c_char_p
lib.tc_result_string.restype = C.c_char_p
lib.tc_comm_new.argtypes = [C.c_char_p, Device, C.POINTER(CommOptions), out]
lib.tc_comm_get_rank.argtypes = lib.tc_comm_get_size.argtypes = [handle, C.POINTER(C.c_int)]
lib.tc_all_reduce.argtypes = [handle, C.c_void_p, C.c_size_t, C.c_int32, ReduceOp, C.c_void_p, out]
lib.tc_all_gather_single.argtypes = [handle, C.c_void_p, C.c_void_p, C.c_size_t, C.c_int32, C.c_void_p, out]
lib.tc_window_new.argtypes = [handle, out]
lib.tc_window_register.argtypes = [handle, C.c_void_p, C.c_size_t]
lib.tc_window_put.argtypes = [handle, C.c_void_p, C.c_size_t, C.c_int32, C.c_size_t, C.c_void_p, out]
lib.tc_window_signal.argtypes = lib.tc_window_wait_signal.argtypes = [handle, C.c_int32, C.c_void_p, out]
lib.tc_window_deregister.argtypes = [handle]
lib.tc_window_free.argtypes = [handle]
lib.tc_comm_finalize.argtypes = [handle]
lib.tc_comm_destroy.argtypes = [handle]


def check(rc, what):
    if rc != 0:
        sys.exit(f"{what} failed: {lib.tc_result_string(rc).decode()}: {lib.tc_last_error().decode()}")


opts = CommOptions(C.sizeof(CommOptions), TC_COMM_OPTIONS_MAGIC, TC_COMM_OPTIONS_VERSION, b"python-ring", TC_UNSET, 0,
                   TC_UNSET, TC_UNSET, None, None, 0)
comm = C.c_void_p()
check(lib.tc_comm_new(b"gloo", Device(TC_DEVICE_CPU, 0), C.byref(opts), C.byref(comm)), "tc_comm_new")
rank, size = C.c_int(), C.c_int()
check(lib.tc_comm_get_rank(comm, C.byref(rank)), "tc_comm_get_rank")
check(lib.tc_comm_get_size(comm, C.byref(size)), "tc_comm_get_size")
me, n = rank.value, size.value
wrong = []

total = C.c_int64(me)
check(lib.tc_all_reduce(comm, C.byref(total), 1, TC_INT64, ReduceOp(TC_SUM, 1.0, None), None, None), "tc_all_reduce")
if total.value != n * (n - 1) // 2:
    wrong.append(f"all_reduce gave {total.value}")

block = (C.c_int64 * 4)(*[me * 10 + i for i in range(4)])
gathered = (C.c_int64 * (4 * n))()
check(lib.tc_all_gather_single(comm, gathered, block, 4, TC_INT64, None, None), "tc_all_gather_single")
if list(gathered) != [r * 10 + i for r in range(n) for i in range(4)]:
    wrong.append(f"all_gather_single gave {list(gathered)}")

window = C.c_void_p()
check(lib.tc_window_new(comm, C.byref(window)), "tc_window_new")
landing = (C.c_int64 * 4)()
check(lib.tc_window_register(window, landing, C.sizeof(landing)), "tc_window_register")
nxt, prev = (me + 1) % n, (me + n - 1) % n
check(lib.tc_window_put(window, block, C.sizeof(block), nxt, 0, None, None), "tc_window_put")
check(lib.tc_window_signal(window, nxt, None, None), "tc_window_signal")
check(lib.tc_window_wait_signal(window, prev, None, None), "tc_window_wait_signal")
if list(landing) != [prev * 10 + i for i in range(4)]:
    wrong.append(f"window put from rank {prev} gave {list(landing)}")
check(lib.tc_window_deregister(window), "tc_window_deregister")
lib.tc_window_free(window)

check(lib.tc_comm_finalize(comm), "tc_comm_finalize")
lib.tc_comm_destroy(comm)
if wrong:
    sys.exit(f"rank {me}: " + "; ".join(wrong))
print(f"rank {me}/{n}: all_reduce, all_gather_single and a window put from Python: all results correct")

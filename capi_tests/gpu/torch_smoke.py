"""ctypes smoke test: libtorchcomm's nccl backend on torch tensors.

Passes tensors' data_ptr() and torch's current CUDA stream to tc_all_reduce
and tc_all_gather_single, and compares with torch's own computation. Run
under tc-run (rank/size/store from the environment):
    tc-run -n 1 -- python3 torch_smoke.py path/to/libtorchcomm.so
Prints "N passed, N failed".
"""
import ctypes as C
import sys

import torch

lib = C.CDLL(sys.argv[1])


class Device(C.Structure):
    _fields_ = [("type", C.c_int32), ("index", C.c_int32)]


class ReduceOp(C.Structure):
    _fields_ = [("kind", C.c_int32), ("premul_factor", C.c_double), ("premul_factor_ptr", C.c_void_p)]


class OpOptions(C.Structure):
    _fields_ = [
        ("size", C.c_size_t),
        ("magic", C.c_uint32),
        ("version", C.c_uint32),
        ("async_op", C.c_int32),
        ("timeout_ms", C.c_int64),
        ("stream", C.c_void_p),
        ("hints", C.c_void_p),
        ("num_hints", C.c_size_t),
    ]


TC_OP_OPTIONS_MAGIC, TC_FLOAT32, TC_BFLOAT16, TC_SUM, TC_AVG = 1413697360, 0, 3, 0, 8
lib.tc_last_error.restype = C.c_char_p
lib.tc_comm_new.argtypes = [C.c_char_p, Device, C.c_void_p, C.POINTER(C.c_void_p)]
lib.tc_all_reduce.argtypes = [C.c_void_p, C.c_void_p, C.c_size_t, C.c_int32, ReduceOp, C.POINTER(OpOptions), C.c_void_p]
lib.tc_all_gather_single.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_size_t, C.c_int32, C.POINTER(OpOptions), C.c_void_p]
lib.tc_comm_get_rank.argtypes = [C.c_void_p, C.POINTER(C.c_int)]
lib.tc_comm_get_size.argtypes = [C.c_void_p, C.POINTER(C.c_int)]
lib.tc_comm_finalize.argtypes = [C.c_void_p]
lib.tc_comm_destroy.argtypes = [C.c_void_p]

passed = failed = 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL", what, lib.tc_last_error(), file=sys.stderr)


torch.cuda.init()
torch.zeros(1, device="cuda")  # creates the primary context
comm = C.c_void_p()
rc = lib.tc_comm_new(b"nccl", Device(1, -1), None, C.byref(comm))
if rc != 0:
    print("tc_comm_new failed:", rc, lib.tc_last_error(), file=sys.stderr)
    print("0 passed, 1 failed")
    sys.exit(1)
rank, size = C.c_int(), C.c_int()
lib.tc_comm_get_rank(comm, C.byref(rank))
lib.tc_comm_get_size(comm, C.byref(size))
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):
    opts = OpOptions(C.sizeof(OpOptions), TC_OP_OPTIONS_MAGIC, 1, 0, -1, stream.cuda_stream, None, 0)
    for dtype, tc_dtype in ((torch.float32, TC_FLOAT32), (torch.bfloat16, TC_BFLOAT16)):
        g = torch.Generator(device="cuda").manual_seed(1234)
        inputs = [torch.randint(-8, 8, (1000,), generator=g, device="cuda").to(dtype) for _ in range(size.value)]
        x = inputs[rank.value].clone()
        rc = lib.tc_all_reduce(comm, x.data_ptr(), x.numel(), tc_dtype, ReduceOp(TC_SUM, 1.0, None), C.byref(opts), None)
        stream.synchronize()
        check(rc == 0 and torch.equal(x, torch.stack(inputs).sum(0).to(dtype)), f"all_reduce sum {dtype}")
        y = inputs[rank.value].clone()
        out = torch.empty(size.value * y.numel(), dtype=dtype, device="cuda")
        rc = lib.tc_all_gather_single(comm, out.data_ptr(), y.data_ptr(), y.numel(), tc_dtype, C.byref(opts), None)
        stream.synchronize()
        check(rc == 0 and torch.equal(out, torch.cat(inputs)), f"all_gather_single {dtype}")
check(lib.tc_comm_finalize(comm) == 0, "finalize")
lib.tc_comm_destroy(comm)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

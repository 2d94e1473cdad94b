"""ctypes bindings of libtorchcomm's sparse all-reduce (and what it needs),
shared by the torch parity test and the sparse benchmark. The structures
mirror include/torchcomm.h."""
import ctypes as C

import numpy as np

TC_DEVICE_CPU = 0
TC_SUM, TC_AVG = 0, 8
TC_COMM_OPTIONS_MAGIC, TC_COMM_OPTIONS_VERSION = 1413697357, 1
TC_UNSET = -1
# numpy dtype -> tc_dtype_t (bfloat16 travels as its uint16 bits).
DTYPES = {
    "float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int8": 4, "uint8": 5,
    "int32": 6, "int64": 7, "uint32": 9, "uint64": 10,
}
NUMPY = {0: np.float32, 1: np.float64, 2: np.float16, 3: np.uint16, 4: np.int8, 5: np.uint8,
         6: np.int32, 7: np.int64, 9: np.uint32, 10: np.uint64}


class Device(C.Structure):
    _fields_ = [("type", C.c_int32), ("index", C.c_int32)]


class ReduceOp(C.Structure):
    _fields_ = [("kind", C.c_int32), ("premul_factor", C.c_double), ("premul_factor_ptr", C.c_void_p)]


class CommOptions(C.Structure):
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint32), ("version", C.c_uint32), ("name", C.c_char_p),
                ("timeout_ms", C.c_int64), ("abort_on_error", C.c_int32), ("rank", C.c_int32),
                ("world_size", C.c_int32), ("store", C.c_void_p), ("hints", C.c_void_p), ("num_hints", C.c_size_t)]


class SparseCoo(C.Structure):
    _fields_ = [("sparse_dim", C.c_size_t), ("dense_dim", C.c_size_t), ("shape", C.POINTER(C.c_int64)),
                ("nnz", C.c_size_t), ("indices", C.POINTER(C.c_int64)), ("values", C.c_void_p),
                ("dtype", C.c_int32)]


class Lib:
    def __init__(self, path):
        lib = self.lib = C.CDLL(path)
        out = C.POINTER(C.c_void_p)
        lib.tc_last_error.restype = C.c_char_p
        lib.tc_store_file_new.argtypes = [C.c_char_p, C.c_int32, out]
        lib.tc_comm_new.argtypes = [C.c_char_p, Device, C.POINTER(CommOptions), out]
        lib.tc_sparse_all_reduce.argtypes = [C.c_void_p, C.POINTER(SparseCoo), ReduceOp, C.POINTER(SparseCoo),
                                             C.c_void_p, out]
        lib.tc_all_reduce.argtypes = [C.c_void_p, C.c_void_p, C.c_size_t, C.c_int32, ReduceOp, C.c_void_p, out]
        lib.tc_free.argtypes = [C.c_void_p]
        lib.tc_comm_finalize.argtypes = [C.c_void_p]
        lib.tc_comm_destroy.argtypes = [C.c_void_p]
        lib.tc_store_free.argtypes = [C.c_void_p]

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: rc {rc}: {self.lib.tc_last_error().decode()}")

    def comm(self, store_path, rank, world, name=b"sparse"):
        store, comm = C.c_void_p(), C.c_void_p()
        self.check(self.lib.tc_store_file_new(store_path.encode(), world, C.byref(store)), "tc_store_file_new")
        o = CommOptions(C.sizeof(CommOptions), TC_COMM_OPTIONS_MAGIC, TC_COMM_OPTIONS_VERSION, name, 120000, 0,
                        rank, world, store, None, 0)
        self.check(self.lib.tc_comm_new(b"gloo", Device(TC_DEVICE_CPU, 0), C.byref(o), C.byref(comm)), "tc_comm_new")
        return comm, store

    def close(self, comm, store):
        self.check(self.lib.tc_comm_finalize(comm), "tc_comm_finalize")
        self.lib.tc_comm_destroy(comm)
        self.lib.tc_store_free(store)

    def sparse_all_reduce(self, comm, shape, sparse_dim, indices, values, tc_dtype, kind=TC_SUM, fetch=True):
        """indices: int64 array (sparse_dim, nnz); values: array (nnz, *dense).
        Returns (indices (sparse_dim, nnz), values (nnz, *dense)) as numpy
        copies; with fetch=False only frees the result (and returns nnz)."""
        shape_a = np.ascontiguousarray(shape, dtype=np.int64)
        idx = np.ascontiguousarray(indices, dtype=np.int64)
        vals = np.ascontiguousarray(values)
        nnz = idx.shape[1] if idx.ndim == 2 else 0
        coo = SparseCoo(sparse_dim, len(shape) - sparse_dim, shape_a.ctypes.data_as(C.POINTER(C.c_int64)), nnz,
                        idx.ctypes.data_as(C.POINTER(C.c_int64)), vals.ctypes.data, tc_dtype)
        out = SparseCoo()
        self.check(self.lib.tc_sparse_all_reduce(comm, C.byref(coo), ReduceOp(kind, 1.0, None), C.byref(out),
                                                 None, None), "tc_sparse_all_reduce")
        try:
            if not fetch:
                return out.nnz
            n, dense = out.nnz, list(shape[sparse_dim:])
            row = int(np.prod(dense)) if dense else 1
            np_t = NUMPY[out.dtype]
            got_idx = np.ctypeslib.as_array(out.indices, shape=(max(sparse_dim * n, 1),))[:sparse_dim * n]
            got_idx = got_idx.copy().reshape(sparse_dim, n)
            raw = C.cast(out.values, C.POINTER(C.c_uint8))
            nbytes = n * row * np.dtype(np_t).itemsize
            got_val = np.frombuffer(C.string_at(raw, nbytes), dtype=np_t).reshape([n] + dense)
            return got_idx, got_val
        finally:
            self.lib.tc_free(C.cast(out.shape, C.c_void_p))
            self.lib.tc_free(C.cast(out.indices, C.c_void_p))
            self.lib.tc_free(out.values)

    def dense_all_reduce(self, comm, array, tc_dtype):
        self.check(self.lib.tc_all_reduce(comm, array.ctypes.data, array.size, tc_dtype, ReduceOp(TC_SUM, 1.0, None),
                                          None, None), "tc_all_reduce")

"""tc_local_scatter's split with chunk_counts NULL against torch.chunk itself.

A group of CPU members needs no GPU: every member gets its chunk by a host
copy, so which outputs were written, and with how many elements, shows the
split. For every count in 0..40 and every member count 1..8 the element
counts must equal len(torch.arange(count).chunk(n)[i]), missing chunks
counting as 0 (those outputs must stay untouched).

Usage: python local_chunk_parity.py path/to/libtorchcomm.so
"""
import ctypes
import sys

import torch

TC_DEVICE_CPU, TC_INT32 = 0, 6
FILL = -7


class Device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int32), ("index", ctypes.c_int32)]


def main(lib_path):
    lib = ctypes.CDLL(lib_path)
    lib.tc_last_error.restype = ctypes.c_char_p
    checked = 0
    for n in range(1, 9):
        devices = (Device * n)(*[Device(TC_DEVICE_CPU, 0)] * n)
        group = ctypes.c_void_p()
        assert lib.tc_local_new(devices, ctypes.c_size_t(n), None, ctypes.byref(group)) == 0, lib.tc_last_error()
        for count in range(0, 41):
            src = (ctypes.c_int32 * max(count, 1))(*range(count))
            outs = [(ctypes.c_int32 * (count + 1))(*([FILL] * (count + 1))) for _ in range(n)]
            dsts = (ctypes.c_void_p * n)(*[ctypes.cast(o, ctypes.c_void_p) for o in outs])
            rc = lib.tc_local_scatter(group, src, Device(TC_DEVICE_CPU, 0), ctypes.c_size_t(count), TC_INT32, None, dsts, None)
            assert rc == 0, lib.tc_last_error()
            want = [len(c) for c in torch.arange(count).chunk(n)] if count else [0] * n
            want += [0] * (n - len(want))
            start = 0
            for i, o in enumerate(outs):
                got = next((k for k, v in enumerate(o) if v == FILL), count + 1)
                assert got == want[i], f"count {count} over {n}: output {i} holds {got} elements, torch.chunk gives {want[i]}"
                assert list(o[:got]) == list(range(start, start + got)), f"count {count} over {n}: output {i} has the wrong elements"
                start += got
            checked += 1
        lib.tc_local_free(group)
    print(f"local_chunk_parity: {checked} (count, n) cases match torch.chunk {torch.__version__}")


if __name__ == "__main__":
    main(sys.argv[1])

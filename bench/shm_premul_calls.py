#!/usr/bin/env python3
"""CALLS float32 PREMUL_SUM (factor 0.5) all_reduces of 2 MiB on 2 ranks of
the gloo shared-memory path, rank 0 under callgrind writing CGDIR/cg.0.premul (tc-perf
has no PREMUL_SUM; the reducer's default hook uses it). Needs numpy.

    python shm_premul_calls.py LIBTORCHCOMM.so CALLS CGDIR
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "torch_parity"))
TC_FLOAT32, TC_PREMUL_SUM = 0, 7


def rank_main(lib_path, rank, tmp, calls):
    import numpy as np
    from tc_sparse import Lib, ReduceOp

    lib = Lib(lib_path)
    comm, store = lib.comm(f"{tmp}/tc-store", rank, 2, name=b"premul")
    a = np.ones(1 << 19, np.float32)
    for _ in range(calls):
        rc = lib.lib.tc_all_reduce(comm, a.ctypes.data, a.size, TC_FLOAT32, ReduceOp(TC_PREMUL_SUM, 0.5, None),
                                   None, None)
        if rc != 0:
            sys.exit(f"tc_all_reduce failed: {rc}")
    lib.close(comm, store)


def main():
    if len(sys.argv) == 5:
        return rank_main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    lib, calls, cgdir = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as tmp:
        cmds = [[sys.executable, __file__, lib, str(r), tmp, calls] for r in range(2)]
        cmds[0] = ["valgrind", "-q", "--tool=callgrind", f"--callgrind-out-file={cgdir}/cg.0.premul"] + cmds[0]
        procs = [subprocess.Popen(c) for c in cmds]
        return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())

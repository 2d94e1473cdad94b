#!/usr/bin/env python3
"""One large tc_all_reduce against the same bytes as consecutive blocking
all-reduces of PIECE MiB (float32 sum, gloo, one host: the shared-memory
path), interleaved per round (order alternating), on WORLD ranks; prints
rank 0's median [min, max] per variant. Needs numpy (no torch).

    python shm_pieces.py LIBTORCHCOMM.so WORLD MIB PIECE_MIB ROUNDS
"""
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "torch_parity"))


def rank_main(lib_path, world, mib, piece_mib, rounds, rank, tmp):
    import numpy as np
    from tc_sparse import Lib

    lib = Lib(lib_path)
    comm, store = lib.comm(f"{tmp}/tc-store", rank, world, name=b"pieces")
    a = np.ones(mib * 262144, np.float32)
    k = int(piece_mib * 262144)
    res = {"whole": [], "pieces": []}
    for i in range(rounds + 1):
        for name in (("whole", "pieces") if i % 2 else ("pieces", "whole")):
            lib.dense_all_reduce(comm, a[:1], 0)  # start together
            t0 = time.perf_counter()
            if name == "whole":
                lib.dense_all_reduce(comm, a, 0)
            else:
                for s in range(0, a.size, k):
                    lib.dense_all_reduce(comm, a[s:s + k], 0)
            if i > 0:  # the first round warms up
                res[name].append(time.perf_counter() - t0)
    lib.close(comm, store)
    if rank == 0:
        for n, v in res.items():
            v = sorted(v)
            print(f"{world} ranks, {mib} MiB, {n:6s} ({piece_mib} MiB pieces): median {v[len(v) // 2] * 1e3:.1f} ms "
                  f"[{v[0] * 1e3:.1f}, {v[-1] * 1e3:.1f}]")


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    lib, world, mib, piece, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    if len(sys.argv) > 6:
        return rank_main(lib, world, mib, piece, rounds, int(sys.argv[6]), sys.argv[7])
    with tempfile.TemporaryDirectory() as tmp:
        procs = [subprocess.Popen([sys.executable, __file__] + sys.argv[1:6] + [str(r), tmp]) for r in range(world)]
        return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())

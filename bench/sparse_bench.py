#!/usr/bin/env python3
"""Sparse all-reduce benchmark: an embedding-gradient workload.

A ROWS x DIM float32 table; each rank's gradient touches DENSITY of its rows
(distinct rows in random order, drawn with a Zipf skew of exponent ZIPF, so
hot rows are touched by every rank), as nn.Embedding(sparse=True) produces
after a coalesce. Per world size and density, interleaved rounds of
  ours   tc_sparse_all_reduce (ctypes, libtorchcomm, gloo),
  torch  torch.distributed.all_reduce of the sparse tensor on a gloo group,
  dense  tc_all_reduce (SUM) of the whole table through our API (the
         densified gradient; the scatter into the table is not timed),
each timed on every rank from a barrier to its return; the table shows the
median over rounds of the slowest rank, and the ratios. With --before
OTHER.so (another build's library, with its libtorchcomm-gloo.so beside it)
that build's tc_sparse_all_reduce runs too, in the same rounds, and a second
table compares the two (median, min, max).

    python sparse_bench.py LIBTORCHCOMM.so [--worlds 2,4] [--densities 0.01,0.1,0.5]
                           [--rows 1000000] [--dim 64] [--rounds 5] [--before OTHER.so]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "torch_parity"))


def gradient(np, rank, rows, dim, density, zipf):
    """Distinct Zipf-skewed rows (unsorted) and their random gradients."""
    rng = np.random.default_rng(1234 + rank)
    want = max(1, int(rows * density))
    weights = 1.0 / np.arange(1, rows + 1) ** zipf
    # Efraimidis-Spirakis: the `want` largest u^(1/w) are a weighted sample
    # without replacement (fast for a million rows).
    keys = np.log(rng.random(rows)) / weights
    picked = np.argpartition(-keys, want - 1)[:want]
    picked = rng.permutation(picked).astype(np.int64)
    values = rng.standard_normal((want, dim), dtype=np.float32)
    return picked, values


def child(a, rank, world, tmp):
    import numpy as np
    import torch
    import torch.distributed as dist
    from tc_sparse import Lib

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/torch-store", rank=rank, world_size=world)
    lib = Lib(a.lib)
    comm, store = lib.comm(f"{tmp}/tc-store", rank, world, name=b"sparse-bench")
    if a.before:
        lib_b = Lib(a.before)
        comm_b, store_b = lib_b.comm(f"{tmp}/tc-store-before", rank, world, name=b"sparse-bench-before")
    table = np.zeros((a.rows, a.dim), dtype=np.float32)
    results = []
    for density in [float(d) for d in a.densities.split(",")]:
        idx, vals = gradient(np, rank, a.rows, a.dim, density, a.zipf)
        shape = [a.rows, a.dim]
        tidx, tvals = torch.from_numpy(idx).reshape(1, -1), torch.from_numpy(vals)

        def ours():
            lib.sparse_all_reduce(comm, shape, 1, idx.reshape(1, -1), vals, 0, fetch=False)

        def theirs():
            # As DDP hands torch a gradient: an uncoalesced COO tensor.
            t = torch.sparse_coo_tensor(tidx, tvals, shape)
            dist.all_reduce(t)

        table[:] = 0
        table[idx] = vals  # the same gradient, densified (not timed)

        def dense():
            lib.dense_all_reduce(comm, table, 0)

        def before():
            lib_b.sparse_all_reduce(comm_b, shape, 1, idx.reshape(1, -1), vals, 0, fetch=False)

        runs = [("ours", ours), ("torch", theirs), ("dense", dense)] + ([("before", before)] if a.before else [])
        times = {name: [] for name, _ in runs}
        for r in range(a.rounds + 1):
            # Alternate which build goes first, so neither always follows torch.
            for name, f in (runs if r % 2 else runs[::-1]):
                dist.barrier()
                t0 = time.perf_counter()
                f()
                dt = torch.tensor([time.perf_counter() - t0])
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                if r > 0:  # the first round warms up
                    times[name].append(float(dt[0]))
        nnz_total = torch.tensor([len(idx)])
        dist.all_reduce(nnz_total)
        results.append((density, int(nnz_total[0]), {k: sorted(v)[len(v) // 2] for k, v in times.items()}, times))
    lib.close(comm, store)
    if a.before:
        lib_b.close(comm_b, store_b)
    dist.destroy_process_group()
    if rank == 0:
        for density, nnz, med, _ in results:
            print(f"{world:5d}  {density * 100:6.1f}%  {nnz:10d}  {med['ours'] * 1e3:9.1f}  {med['torch'] * 1e3:9.1f}  "
                  f"{med['dense'] * 1e3:9.1f}  {med['torch'] / med['ours']:11.2f}x  {med['dense'] / med['ours']:11.2f}x",
                  flush=True)
        if a.before:
            print_before_after(world, results)


def print_before_after(world, results):
    ms = lambda v: f"{sorted(v)[len(v) // 2] * 1e3:.1f} [{min(v) * 1e3:.1f}, {max(v) * 1e3:.1f}]"
    print(f"before/after, {world} ranks: tc_sparse_all_reduce, median [min, max] ms over the same rounds")
    print("ranks  touched        before ms                 after ms        before/after")
    for density, _, med, times in results:
        print(f"{world:5d}  {density * 100:6.1f}%  {ms(times['before']):>24}  {ms(times['ours']):>24}  "
              f"{med['before'] / med['ours']:10.2f}x", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--densities", default="0.01,0.1,0.5")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--zipf", type=float, default=1.05)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--before", default="", help="another build's libtorchcomm.so, timed alongside")
    ap.add_argument("--rank", type=int, default=-1)
    ap.add_argument("--size", type=int, default=0)
    ap.add_argument("--tmp", default="")
    a = ap.parse_args()
    if a.rank >= 0:
        return child(a, a.rank, a.size, a.tmp)
    print(f"sparse all-reduce, embedding gradient: {a.rows} x {a.dim} float32 table, rows touched per rank at a "
          f"Zipf({a.zipf}) skew; median of {a.rounds} interleaved rounds, slowest rank, ms")
    print("ranks  touched  total nnz     ours ms   torch ms   dense ms  torch/ours  dense/ours", flush=True)
    ok = True
    for world in [int(w) for w in a.worlds.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            args = [sys.executable, __file__, a.lib, "--rank", "0", "--size", str(world), "--tmp", tmp,
                    "--densities", a.densities, "--rows", str(a.rows), "--dim", str(a.dim), "--zipf", str(a.zipf),
                    "--rounds", str(a.rounds), "--before", a.before]
            procs = []
            for r in range(world):
                args[4] = str(r)
                procs.append(subprocess.Popen(list(args)))
            codes = [p.wait() for p in procs]
            ok = ok and not any(codes)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Parity of tc_sparse_all_reduce with torch.distributed.all_reduce of sparse
COO tensors on a torch gloo process group: the same inputs on 2 and 3 ranks,
every case compared entry by entry (indices identical; integer values bit
for bit; float values within rounding, and the share that is bit-identical
printed).

    python sparse_parity.py LIBTORCHCOMM.so [--world 2,3]

Exit 0 when every case on every world size agrees."""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


# (name, dtype, shape, sparse_dim, nnz per rank (callable), index range)
def cases(world):
    return [
        ("float32 embedding rows", "float32", [1000, 16], 1, lambda r: 300, 1000),
        ("float32 same indices", "float32", [50, 4], 1, lambda r: 40, 50),
        ("float64 two sparse dims", "float64", [30, 40, 3], 2, lambda r: 200, 40),
        ("int64 duplicates 2-D dense", "int64", [20, 2, 3], 1, lambda r: 60, 20),
        ("int32 wrapping", "int32", [10, 5], 1, lambda r: 30, 10),
        ("uint8", "uint8", [10, 5], 1, lambda r: 30, 10),
        ("int8", "int8", [10, 5], 1, lambda r: 30, 10),
        ("float16", "float16", [200, 8], 1, lambda r: 100, 200),
        ("bfloat16", "bfloat16", [200, 8], 1, lambda r: 100, 200),
        ("nnz 0 on rank 1", "float32", [100, 4], 1, lambda r: 0 if r == 1 else 50, 100),
        ("nnz 0 everywhere", "float32", [100, 4], 1, lambda r: 0, 100),
        ("uneven 1000x", "float32", [100000, 4], 1, lambda r: 10000 if r == 0 else 10, 100000),
        ("sparse only", "float32", [64, 64], 2, lambda r: 500, 64),
    ]


def make_input(torch, seed, dtype, shape, sparse_dim, nnz, rng_range):
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randint(0, min(rng_range, shape[d]), (nnz,), generator=g) for d in range(sparse_dim)]) \
        if sparse_dim else torch.zeros((0, nnz), dtype=torch.int64)
    dense = shape[sparse_dim:]
    td = getattr(torch, dtype)
    if td.is_floating_point:
        mag = torch.tensor([1e-3, 1.0, 1e3, 1e6])[torch.randint(0, 4, (nnz, *dense), generator=g)]
        if dtype in ("float16", "bfloat16"):
            mag = torch.tensor([0.01, 1.0, 100.0])[torch.randint(0, 3, (nnz, *dense), generator=g)]
        vals = ((torch.rand((nnz, *dense), generator=g, dtype=torch.float64) - 0.5) * mag).to(td)
    else:
        info = torch.iinfo(td)
        vals = torch.randint(info.min, info.max, (nnz, *dense), generator=g, dtype=torch.int64).to(td)
    return idx, vals


def bits_of(torch, t):
    """The raw bits of `t`, as integers of its width."""
    width = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(width)


def child(lib_path, rank, world, tmp):
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.path.insert(0, HERE)
    from tc_sparse import DTYPES, Lib

    dist.init_process_group("gloo", init_method=f"file://{tmp}/torch-store", rank=rank, world_size=world)
    lib = Lib(lib_path)
    comm, store = lib.comm(f"{tmp}/tc-store", rank, world)
    failures, lines = 0, []
    for k, (name, dtype, shape, sparse_dim, nnz_of, rng_range) in enumerate(cases(world)):
        idx, vals = make_input(torch, 1000 * k + rank, dtype, shape, sparse_dim, nnz_of(rank), rng_range)
        # The largest contribution on any rank: a sum of values of mixed
        # sign and magnitude is exact only to that scale.
        scale = torch.tensor([float(vals.double().abs().max()) if vals.numel() else 0.0])
        dist.all_reduce(scale, op=dist.ReduceOp.MAX)
        scale = float(scale[0])
        t = torch.sparse_coo_tensor(idx, vals, shape)
        note = ""
        try:
            dist.all_reduce(t)
        except (NotImplementedError, RuntimeError) as e:
            # torch's gloo refuses some dtypes (float16: no sparse add): its
            # algorithm done by hand, summing in float32 (our accumulation).
            note = f" (torch refuses: {str(e).splitlines()[0][:40]}; float32 reference)"
            every = [None] * world
            dist.all_gather_object(every, (idx, vals.float()))
            t = torch.sparse_coo_tensor(torch.cat([i for i, _ in every], 1), torch.cat([v for _, v in every]), shape)
            t = torch.sparse_coo_tensor(t.coalesce().indices(), t.coalesce().values().to(vals.dtype), shape)
        t = t.coalesce()
        want_idx, want_val = t.indices().numpy(), t.values()
        as_np = vals.view(torch.uint16) if dtype == "bfloat16" else vals
        got_idx, got_val = lib.sparse_all_reduce(comm, shape, sparse_dim, idx.numpy(), as_np.numpy(), DTYPES[dtype])
        if dtype == "bfloat16":
            got_val = torch.from_numpy(got_val.copy()).view(torch.bfloat16)
        else:
            got_val = torch.from_numpy(got_val.copy())
        problem = None
        if got_idx.shape != want_idx.shape or not np.array_equal(got_idx, want_idx):
            problem = f"indices differ: {got_idx.shape} vs {want_idx.shape}"
        elif got_val.shape != want_val.shape:
            problem = f"values shape {tuple(got_val.shape)} vs {tuple(want_val.shape)}"
        else:
            identical = int((bits_of(torch, got_val) == bits_of(torch, want_val)).sum())
            if not want_val.dtype.is_floating_point:
                if identical != want_val.numel():
                    problem = "integer values not bit-identical"
            else:
                tol = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
                err = float((got_val.double() - want_val.double()).abs().max()) if got_val.numel() else 0.0
                if err > tol * max(scale, 1.0) * world:
                    problem = f"values differ by {err:g} (scale {scale:g})"
            lines.append(f"  {name:28s} nnz {got_idx.shape[1]:6d}  bit-identical {identical}/{got_val.numel()}{note}")
        if problem:
            failures += 1
            lines.append(f"  {name:28s} FAILED: {problem}")
    lib.close(comm, store)
    dist.destroy_process_group()
    if rank == 0 or failures:
        print(f"world {world} (rank {rank}):\n" + "\n".join(lines))
    sys.exit(1 if failures else 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("--world", default="2,3")
    ap.add_argument("--rank", type=int, default=-1)
    ap.add_argument("--size", type=int, default=0)
    ap.add_argument("--tmp", default="")
    a = ap.parse_args()
    if a.rank >= 0:
        return child(a.lib, a.rank, a.size, a.tmp)
    ok = True
    for world in [int(w) for w in a.world.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            procs = [subprocess.Popen([sys.executable, __file__, a.lib, "--rank", str(r), "--size", str(world),
                                       "--tmp", tmp]) for r in range(world)]
            try:
                codes = [p.wait(timeout=600) for p in procs]
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                codes = [1]
            if any(codes):
                ok = False
                print(f"sparse parity: world {world}: FAILED (exit codes {codes})")
    print("sparse parity: " + ("torch and libtorchcomm agree on every case" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Per-call cost of torch.distributed's "torchcomm" backend, its C++ and its
Python implementation side by side, in one job: every rank has the default
group (gloo), two new_groups of the same ranks on "torchcomm" (one made with
TORCHCOMM_TORCH_BACKEND=python, one with =cpp) and a torchcomm Comm of its
own (the same all_reduce through the C ABI with ctypes, no torch in between).
Blocking dist.all_reduce of SIZE bytes of float32 per call; the sides
interleaved round by round (--rounds rounds of --iters calls each, a barrier
before each); the median round's time per call, and the fastest round.

Usage: torch_backend_call.py WORLD [--bytes 4] [--rounds 9] [--iters 5000]
Needs the C++ extension built (scripts/build-torch-ext.sh).
"""
import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def per_call(fn, iters):
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) / iters


def group(impl, world):
    os.environ["TORCHCOMM_TORCH_BACKEND"] = impl
    g = dist.new_group(list(range(world)), backend="torchcomm")
    kind = type(g._get_backend(torch.device("cpu"))).__name__
    want = "CppBackend" if impl == "cpp" else "TorchCommBackend"
    assert kind == want, f"{impl}: the group's backend is {kind}, not {want}"
    return g


def rank_main(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torchcomm
    import torchcomm.distributed  # noqa: F401

    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    py, cpp = group("python", args.world), group("cpp", args.world)
    comm = torchcomm.Comm("gloo", rank=rank, world_size=args.world,
                          store=torchcomm.TCPStore("127.0.0.1", port, timeout=60))
    x = torch.ones(max(1, args.bytes // 4))
    sides = {
        "gloo": lambda: dist.all_reduce(x),
        "torchcomm, Python": lambda: dist.all_reduce(x, group=py),
        "torchcomm, C++": lambda: dist.all_reduce(x, group=cpp),
        "C call (ctypes)": lambda: comm.all_reduce(x),
    }
    times = {k: [] for k in sides}
    for fn in sides.values():  # warm-up
        per_call(fn, 200)
    for _ in range(args.rounds):
        for k, fn in sides.items():
            dist.barrier(group=cpp)
            times[k].append(per_call(fn, args.iters))
    if rank == 0:
        print(f"\n### dist.all_reduce of {args.bytes} B float32, {args.world} rank(s): time per call "
              f"({args.rounds} interleaved rounds of {args.iters} calls; load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)\n")
        print("| side | median round | fastest round |")
        print("|---|---|---|")
        for k, v in times.items():
            print(f"| {k} | {statistics.median(v) * 1e6:.1f} us | {min(v) * 1e6:.1f} us |")
    comm.finalize()
    comm.destroy()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("world", type=int)
    p.add_argument("--bytes", type=int, default=4)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--iters", type=int, default=5000)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args, port), nprocs=args.world)


if __name__ == "__main__":
    sys.exit(main())

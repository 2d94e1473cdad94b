#!/usr/bin/env python3
"""torch.distributed on the "torchcomm" backend against torch's gloo, in one
job: every rank has the default group (gloo) and a new_group of the same ranks
on "torchcomm", plus a torchcomm Comm of its own (the same all_reduce through
our C ABI with ctypes, no torch in between). Tables in markdown on rank 0.

  all_reduce: float32 in place, blocking dist.all_reduce per call; the three
    sides interleaved round by round (--rounds rounds of --iters calls each);
    the median round's time per call.
  ddp: one step's gradient exchange of ResNet-50 / BERT-base gradient shapes
    (tests/data) through DistributedDataParallel on each group, default and
    gradient_as_bucket_view: the time of forward+backward with DDP minus the
    same without it (a model whose forward is sum(p) over the shapes).

Usage: torch_backend_bench.py WORLD [--sizes 4,64,...] [--only all_reduce|ddp] [--rounds N] [--iters N]
                               [--steps N] [--models resnet50,bert_base]
Run by scripts/bench-torch.sh (make bench-torch).
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data")


def fmt_us(s):
    us = s * 1e6
    return f"{us:.1f}" if us < 1000 else f"{us / 1000:.2f} ms"


def size_name(n):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n // k} {unit}"
    return f"{n} B"


def per_call(fn, iters):
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) / iters


def bench_all_reduce(args, rank, gloo, ours, comm):
    rows = []
    for nbytes in args.sizes:
        x = torch.ones(max(1, nbytes // 4))
        iters = max(3, min(args.iters, (64 << 20) // max(nbytes, 1) * 4))
        sides = {
            "gloo": lambda: dist.all_reduce(x, group=gloo),
            "ours": lambda: dist.all_reduce(x, group=ours),
            "C": lambda: comm.all_reduce(x),
        }
        times = {k: [] for k in sides}
        for fn in sides.values():  # warm-up
            per_call(fn, min(iters, 10))
        for _ in range(args.rounds):
            for k, fn in sides.items():
                dist.barrier(group=ours)
                times[k].append(per_call(fn, iters))
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append((nbytes, med))
    if rank == 0:
        print(f"\n### dist.all_reduce, float32, {dist.get_world_size()} ranks (time per call, median of "
              f"{args.rounds} interleaved rounds)\n")
        print("| size | torch gloo | torch \"torchcomm\" | our C call (ctypes) | gloo / ours | ours - C |")
        print("|---|---|---|---|---|---|")
        for nbytes, m in rows:
            print(f"| {size_name(nbytes)} | {fmt_us(m['gloo'])} | {fmt_us(m['ours'])} | {fmt_us(m['C'])} | "
                  f"{m['gloo'] / m['ours']:.1f}x | {(m['ours'] - m['C']) * 1e6:+.1f} us |")


class Grads(torch.nn.Module):
    def __init__(self, shapes):
        super().__init__()
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in shapes])

    def forward(self):
        return sum(p.sum() for p in self.ps)


def shapes(model):
    out = []
    with open(os.path.join(DATA, f"{model}_param_shapes.txt")) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if line:
                out.append(tuple(int(v) for v in line.split("\t")[1].split(",")))
    return out


def bench_ddp(args, rank, gloo, ours):
    from torch.nn.parallel import DistributedDataParallel as DDP

    rows = []
    for model in args.models.split(","):
        sh = shapes(model)
        base = Grads(sh)
        def step(m):
            m.zero_grad(set_to_none=False)
            m().backward()
        bare = statistics.median(per_call(lambda: step(base), 1) for _ in range(args.steps))
        res = {}
        for name, group in (("gloo", gloo), ("ours", ours)):
            for view in (False, True):
                m = DDP(Grads(sh), process_group=group, gradient_as_bucket_view=view)
                step(m)
                t = statistics.median(per_call(lambda: step(m), 1) for _ in range(args.steps))
                res[(name, view)] = t - bare
                del m
        rows.append((model, res))
    if rank == 0:
        print(f"\n### DDP gradient exchange per step, {dist.get_world_size()} ranks (ms, median of {args.steps} "
              "steps; step with DDP minus the same backward without)\n")
        print("| model | gloo | ours | gloo / ours | gloo, bucket view | ours, bucket view | gloo / ours (view) |")
        print("|---|---|---|---|---|---|---|")
        for model, r in rows:
            g, o, gv, ov = r[("gloo", False)], r[("ours", False)], r[("gloo", True)], r[("ours", True)]
            print(f"| {model} | {g * 1e3:.1f} | {o * 1e3:.1f} | {g / o:.1f}x | {gv * 1e3:.1f} | {ov * 1e3:.1f} | "
                  f"{gv / ov:.1f}x |")


def rank_main(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torchcomm
    import torchcomm.distributed  # noqa: F401

    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    ours = dist.new_group(list(range(args.world)), backend="torchcomm")
    gloo = dist.group.WORLD
    comm = torchcomm.Comm("gloo", rank=rank, world_size=args.world,
                          store=torchcomm.TCPStore("127.0.0.1", port, timeout=60))
    if args.only in (None, "all_reduce"):
        bench_all_reduce(args, rank, gloo, ours, comm)
    if args.only in (None, "ddp"):
        bench_ddp(args, rank, gloo, ours)
    comm.finalize()
    comm.destroy()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("world", type=int)
    p.add_argument("--sizes", default="4,64,1024,4096,65536,1048576,67108864")
    p.add_argument("--only", choices=["all_reduce", "ddp"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--models", default="resnet50,bert_base")
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args, port), nprocs=args.world)


if __name__ == "__main__":
    sys.exit(main())

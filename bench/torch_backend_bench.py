#!/usr/bin/env python3
"""torch.distributed on the "torchcomm" backend against torch's gloo, in one
job: every rank has the default group (gloo) and a new_group of the same ranks
on "torchcomm", plus a torchcomm Comm of its own (the same all_reduce through
our C ABI with ctypes, no torch in between). Tables in markdown on rank 0.

  all_reduce: float32 in place, blocking dist.all_reduce per call; the three
    sides interleaved round by round (--rounds rounds of --iters calls each);
    the median round's time per call.
  ddp: one step with gradient exchange of ResNet-50 / BERT-base gradient
    shapes (tests/data) through DistributedDataParallel on each group, default
    and gradient_as_bucket_view: forward+backward of a model whose forward is
    sum(p) over the shapes, with DDP on each group, without DDP (bare), and
    with DDP whose comm hook exchanges nothing (DDP's own work: its bucket
    copies and hook calls), the four interleaved step by step; the step's
    time, and the exchange: that minus the no-exchange DDP step's.
  fsdp: one FSDP2 (fully_shard) training step of a small transformer on
    each group, the groups' steps alternating.

Usage: torch_backend_bench.py WORLD [--sizes 4,64,...] [--only all_reduce|ddp|fsdp] [--rounds N] [--iters N]
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


def no_exchange_hook(_state, bucket):
    """A DDP comm hook that exchanges nothing: the bucket as it is."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def bench_ddp(args, rank, gloo, ours):
    from torch.nn.parallel import DistributedDataParallel as DDP

    def step(m):
        m.zero_grad(set_to_none=False)
        m().backward()

    rows = []
    for model in args.models.split(","):
        sh = shapes(model)
        res = {}
        for view in (False, True):
            # The bare model, one DDP model per group and one that exchanges
            # nothing, their steps interleaved, so that the machine's drift
            # hits all four alike.
            sides = {"bare": Grads(sh)}
            for name, group in (("gloo", gloo), ("ours", ours), ("none", ours)):
                sides[name] = DDP(Grads(sh), process_group=group, gradient_as_bucket_view=view)
            sides["none"].register_comm_hook(None, no_exchange_hook)
            times = {k: [] for k in sides}
            for m in sides.values():
                step(m)
            for _ in range(args.steps):
                for k, m in sides.items():
                    dist.barrier(group=ours)
                    times[k].append(per_call(lambda: step(m), 1))
            med = {k: statistics.median(v) for k, v in times.items()}
            for k in ("gloo", "ours"):
                res[(k, view)] = (med[k], med[k] - med["none"])
            res[("none", view)] = (med["none"], med["none"] - med["bare"])
            del sides
        rows.append((model, res))
    if rank == 0:
        print(f"\n### DDP step with gradient exchange, {dist.get_world_size()} ranks (ms, median of {args.steps} "
              "interleaved steps: the step's time, and in brackets the exchange: that minus the step of DDP "
              "with a comm hook that exchanges nothing; for that one, in brackets, its step minus the step "
              "without DDP)\n")
        print("| model | mode | DDP, no exchange | gloo | ours | gloo / ours, step | gloo / ours, exchange |")
        print("|---|---|---|---|---|---|---|")

        def cell(t):
            return f"{t[0] * 1e3:.1f} ({t[1] * 1e3:.1f})"

        for model, r in rows:
            for view, mode in ((False, "default"), (True, "bucket view")):
                g, o, n = r[("gloo", view)], r[("ours", view)], r[("none", view)]
                exchange = f"{g[1] / o[1]:.1f}x" if o[1] > 0 else "-"
                print(f"| {model} | {mode} | {cell(n)} | {cell(g)} | {cell(o)} | {g[0] / o[0]:.2f}x | {exchange} |")

class SmallTransformer(torch.nn.Module):
    """A small language-model-shaped transformer (4 layers, width 256)."""

    def __init__(self, vocab=1000, width=256, layers=4):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True)
            for _ in range(layers))
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h).flatten(0, 1)


def bench_fsdp(args, rank, gloo, ours):
    """One FSDP2 training step (forward, backward, SGD step) of the same
    model fully sharded over each group; the groups' steps alternate."""
    import warnings

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    # FSDP2 warns that the model returns a view; nothing here changes it.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")

    models = {}
    for name, group in (("gloo", gloo), ("ours", ours)):
        torch.manual_seed(0)
        m = SmallTransformer()
        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in m.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
        models[name] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, 1000, (8, 64), generator=g)
    y = torch.randint(0, 1000, (8 * 64,), generator=g)

    def step(name):
        m, opt = models[name]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()

    times = {k: [] for k in models}
    for k in models:  # warm-up
        step(k)
    for _ in range(args.steps * 2):
        for k in models:
            dist.barrier(group=ours)
            times[k].append(per_call(lambda: step(k), 1))
    med = {k: statistics.median(v) for k, v in times.items()}
    if rank == 0:
        params = sum(p.numel() for p in SmallTransformer().parameters())
        print(f"\n### FSDP2 training step, {dist.get_world_size()} ranks (ms, median of {args.steps * 2} "
              f"alternating steps; transformer of {params / 1e6:.1f} M parameters, 4 layers, width 256, "
              "batch 8 x 64 tokens)\n")
        print("| model | gloo | ours | gloo / ours |")
        print("|---|---|---|---|")
        print(f"| small transformer | {med['gloo'] * 1e3:.1f} | {med['ours'] * 1e3:.1f} | "
              f"{med['gloo'] / med['ours']:.2f}x |")


def spawn_ranks(rank_main, args, world):
    """Runs rank_main(rank, args, port) in `world` processes, `port` a free
    port on 127.0.0.1 for their rendezvous."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args, port), nprocs=world)


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
    if args.only in (None, "fsdp"):
        bench_fsdp(args, rank, gloo, ours)
    comm.finalize()
    comm.destroy()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("world", type=int)
    p.add_argument("--sizes", default="4,64,1024,4096,65536,1048576,67108864")
    p.add_argument("--only", choices=["all_reduce", "ddp", "fsdp"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--models", default="resnet50,bert_base")
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    spawn_ranks(rank_main, args, args.world)


if __name__ == "__main__":
    sys.exit(main())

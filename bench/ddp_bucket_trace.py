#!/usr/bin/env python3
"""Where DDP's gradient exchange spends its time: per bucket, when DDP
launched its all_reduce and when the result came back, relative to the
step's start, on torch's gloo and on the "torchcomm" backend (2 ranks
by default), beside the same all_reduces with the step's backward not
running (the bytes of every bucket, all launched at once).

A comm hook launches each bucket's all_reduce exactly as DDP's default
hook does (`dist.all_reduce(bucket.buffer(), async_op=True)`) and notes
the time of launch and of completion (a `then` callback on its future).
Printed by rank 0: one line per step and backend.

Usage: ddp_bucket_trace.py [--world 2] [--model resnet50|bert_base] [--view] [--steps 3]
Needs torch and the torchcomm package (PYTHONPATH=python, TORCHCOMM_LIBRARY).
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_backend_bench import Grads, shapes, spawn_ranks  # noqa: E402


def traced_ddp(model, group, view, log):
    from torch.nn.parallel import DistributedDataParallel as DDP

    m = DDP(Grads(shapes(model)), process_group=group, gradient_as_bucket_view=view)

    def hook(_, bucket):
        buf = bucket.buffer()
        launched = time.perf_counter()

        def done(fut):
            log.append((buf.numel() * buf.element_size(), launched, time.perf_counter()))
            return fut.value()[0]

        return dist.all_reduce(buf, group=group, async_op=True).get_future().then(done)

    m.register_comm_hook(None, hook)
    return m


def rank_main(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torchcomm.distributed  # noqa: F401

    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    groups = {"gloo": dist.group.WORLD, "torchcomm": dist.new_group(list(range(args.world)), backend="torchcomm")}
    sync = groups["torchcomm"]
    logs = {k: [] for k in groups}
    models = {k: traced_ddp(args.model, g, args.view, logs[k]) for k, g in groups.items()}

    def step(m):
        m.zero_grad(set_to_none=False)
        m().backward()

    for m in models.values():  # warm-up: DDP rebuilds its buckets after the first step
        step(m)
        step(m)
    for _ in range(args.steps):
        for name, m in models.items():
            logs[name].clear()
            dist.barrier(group=sync)
            start = time.perf_counter()
            step(m)
            took = time.perf_counter() - start
            buckets = sorted(logs[name], key=lambda b: b[1])
            # The same bytes with no backward running: every bucket at once.
            bufs = [torch.ones(b[0] // 4) for b in buckets]
            dist.barrier(group=sync)
            t = time.perf_counter()
            for w in [dist.all_reduce(b, group=groups[name], async_op=True) for b in bufs]:
                w.wait()
            alone = time.perf_counter() - t
            if rank == 0:
                spans = " ".join(f"{b[0] / 2**20:.0f}MiB:+{(b[1] - start) * 1e3:.0f}..+{(b[2] - start) * 1e3:.0f}"
                                 for b in buckets)
                print(f"{name:9s} step {took * 1e3:6.1f} ms | buckets (launch..done, ms) {spans} | "
                      f"same all_reduces alone {alone * 1e3:.1f} ms", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--view", action="store_true", help="gradient_as_bucket_view")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    spawn_ranks(rank_main, args, args.world)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""torch.distributed baseline for tc-perf -B nccl: ProcessGroupNCCL at world
size 1 (FileStore in a temporary directory), all_reduce in place on a CUDA
tensor, issued from a non-blocking side stream of the benchmark's own (as
tc-perf and nccl_raw do). Per size: host time spent issuing the timed loop
per call, and device time per call from CUDA events recorded on that stream
around the loop (the stream waits for each collective, as torch does with
async_op=False). Same flags, columns and CSV as tc-perf (out-of-place is N/A:
all_reduce is in place).

Usage: torch_dist.py [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]
                     [-c 0|1] [-d DTYPE] [-r sum|prod|min|max|avg] [-a 0|1]
                     [-z 0|1] [-C 0|1] [-D DEVICE] [--csv FILE] [--label NAME]
"""
import argparse
import os
import sys
import tempfile
import time


def parse_size(s):
    s = s.strip()
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1].lower(), 1)
    return int(s[:-1] if mult > 1 else s) * mult


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-b", default="32M")
    p.add_argument("-e", default="32M")
    p.add_argument("-f", type=int, default=2)
    p.add_argument("-n", type=int, default=20)
    p.add_argument("-w", type=int, default=5)
    p.add_argument("-c", type=int, default=1)
    p.add_argument("-o", default="all_reduce")
    p.add_argument("-d", default="float32")
    p.add_argument("-r", default="sum")
    p.add_argument("-a", type=int, default=0)
    p.add_argument("-z", type=int, default=0)
    p.add_argument("-C", type=int, default=0)
    p.add_argument("-D", type=int, default=0)
    p.add_argument("--csv")
    p.add_argument("--label", default="torch-dist")
    a = p.parse_args()
    if a.o not in ("all_reduce", "allreduce"):
        sys.exit("torch_dist: only all_reduce")

    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        sys.exit(f"torch_dist: torch is not importable: {e}")
    if not torch.cuda.is_available():
        sys.exit("torch_dist: no usable CUDA device (TC_ERR_UNAVAILABLE)")
    dtypes = {
        "float32": torch.float32, "float": torch.float32, "float64": torch.float64, "double": torch.float64,
        "float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
        "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int": torch.int32, "int64": torch.int64,
    }
    ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
           "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}
    if a.d not in dtypes or a.r not in ops:
        sys.exit(f"torch_dist: unsupported dtype {a.d!r} or reduce op {a.r!r}")
    dt, op = dtypes[a.d], ops[a.r]
    dt_name = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
               torch.bfloat16: "bfloat16", torch.int8: "int8", torch.uint8: "uint8", torch.int32: "int32",
               torch.int64: "int64"}[dt]
    es = torch.empty(0, dtype=dt).element_size()

    device = torch.device("cuda", a.D)
    torch.cuda.set_device(device)
    tmp = tempfile.mkdtemp(prefix="torch_dist-")
    store = dist.FileStore(os.path.join(tmp, "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=device)
    stream = torch.cuda.Stream(device=device)  # non-blocking, priority 0
    ev0 = torch.cuda.Event(enable_timing=True)
    ev1 = torch.cuda.Event(enable_timing=True)

    csv = None
    if a.csv:
        fresh = not os.path.exists(a.csv) or os.path.getsize(a.csv) == 0
        csv = open(a.csv, "a")
        if fresh:
            csv.write("system,op,nranks,size,count,type,redop,root,placement,time_us,algbw_gbs,busbw_gbs,wrong,host_us,device_us\n")

    try:
        v = torch.cuda.nccl.version()
        nccl_v = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:  # only for the banner
        nccl_v = "?"
    print(f"# torch_dist: all_reduce, torch {torch.__version__} ProcessGroupNCCL (NCCL {nccl_v}) ({a.label}), 1 rank, "
          f"CUDA device {a.D}, iters {a.n}, warm-up {a.w}, check {a.c}, async_op={a.a}"
          f"{', stream synchronized after each call' if a.z else ''}, time = "
          f"{'host time issuing per call (-C)' if a.C else 'device time per call (CUDA events)'}")
    print("#")
    hdr = "# {:>10} {:>12} {:>9} {:>6} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}"
    print(hdr.format("", "", "", "", "", "out-of-place", "", "", "", "in-place", "", "", ""))
    print(hdr.format("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
                     "busbw", "#wrong"))
    print(hdr.format("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""))
    sys.stdout.flush()

    minb, maxb = parse_size(a.b), parse_size(a.e)
    sizes, s = [], minb
    while True:
        sizes.append(s)
        if s >= maxb:
            break
        s = min(s * a.f, maxb)
    buf = torch.empty(max(maxb // es, 1), dtype=dt, device=device)
    seed = 0
    wrong_total = 0
    last = None

    def fill(t, seed):
        # Small non-zero values (1..5), a different pattern for every seed.
        i = torch.arange(t.numel(), device=device, dtype=torch.int64)
        t.copy_(((i * 2654435761 + seed * 40503) % 5 + 1).to(dt))

    with torch.cuda.stream(stream):
        for size in sizes:
            count = size // es
            if count == 0 or count * es == last:
                continue
            nbytes = count * es
            last = nbytes
            t = buf[:count]
            seed += 1
            fill(t, seed)
            for _ in range(a.w):
                w = dist.all_reduce(t, op=op, async_op=bool(a.a))
                if a.a:
                    w.wait()
            stream.synchronize()
            works = []
            ev0.record(stream)
            t0 = time.perf_counter()
            for _ in range(a.n):
                w = dist.all_reduce(t, op=op, async_op=bool(a.a))
                if a.z:
                    if a.a:
                        w.wait()
                    stream.synchronize()
                elif a.a:
                    works.append(w)
            issued = time.perf_counter() - t0
            for w in works:
                w.wait()  # the current stream waits for the collective
            ev1.record(stream)
            ev1.synchronize()
            host_us = issued * 1e6 / a.n
            dev_us = ev0.elapsed_time(ev1) * 1e3 / a.n
            wrong = -1
            if a.c:
                seed += 1
                fill(t, seed)
                want = t.clone()  # one rank: every reduction returns its input
                dist.all_reduce(t, op=op)
                stream.synchronize()
                wrong = int((t != want).sum().item())
                wrong_total += wrong
            tm = host_us if a.C else dev_us
            algbw = nbytes / (tm * 1e-6) / 1e9
            busbw = 0.0  # one rank: 2(n-1)/n = 0
            print(f"  {nbytes:>10} {count:>12} {dt_name:>9} {a.r:>6} {'-1':>5}   {'N/A':>9} {'N/A':>7} {'N/A':>7} "
                  f"{'N/A':>6}   {tm:>9.2f} {algbw:>7.3f} {busbw:>7.3f} {wrong if wrong >= 0 else 'N/A':>6}")
            sys.stdout.flush()
            if csv:
                csv.write(f"{a.label},all_reduce,1,{nbytes},{count},{dt_name},{a.r},-1,in-place,{tm:.3f},{algbw:.6f},"
                          f"{busbw:.6f},{wrong},{host_us:.3f},{dev_us:.3f}\n")
    print(f"# Out of bounds values : {wrong_total} {'OK' if wrong_total == 0 else 'FAILED'}")
    print("# Avg bus bandwidth    : 0.000000 \n#")
    if csv:
        csv.close()
    dist.destroy_process_group()
    sys.exit(1 if wrong_total else 0)


if __name__ == "__main__":
    main()

"""torch.distributed (gloo, CPU tensors) all_reduce float32 SUM, in place,
the same size sweep and CSV as tc-perf and bench/mpi_allreduce.c. Launched by
tc-run, which hosts the store at MASTER_ADDR:MASTER_PORT; torch's own TCPStore
client joins it (our server speaks torch's wire protocol).

  tc-run -n 2 -- python bench/torch_host.py -b 4 -e 64M -f 2 -n 20 -w 5 [--csv F] [--label L]
"""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist


def size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", type=size, default=4)
    ap.add_argument("-e", type=size, default=1 << 20)
    ap.add_argument("-f", type=int, default=2)
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("-w", type=int, default=5)
    ap.add_argument("--csv")
    ap.add_argument("--label", default="torch-gloo")
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # tc-run (and torchrun) host the store; a plain launcher leaves it to rank 0.
    host_store = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=host_store,
                          timeout=datetime.timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    rows, s, last = [], a.b, 0
    while True:
        count = s // 4
        if count > 0 and count * 4 != last:
            last = count * 4
            t = torch.full((count,), float(rank + 1))
            dist.all_reduce(t)
            wrong = int((t != world * (world + 1) / 2).sum())
            for _ in range(a.w):
                dist.all_reduce(t)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(a.n):
                dist.all_reduce(t)
            us = (time.perf_counter() - t0) / a.n * 1e6
            rows.append((count * 4, count, us, wrong))
            if rank == 0:
                print(f"{count * 4:>12} {count:>12} float32 sum {us:>12.1f} us  wrong {wrong}", flush=True)
        if s >= a.e:
            break
        s = min(s * a.f, a.e)
    if rank == 0 and a.csv:
        fresh = not os.path.exists(a.csv) or os.path.getsize(a.csv) == 0
        with open(a.csv, "a") as f:
            if fresh:
                f.write("system,op,nranks,size,count,type,redop,root,placement,time_us,algbw_gbs,busbw_gbs,wrong\n")
            for b, c, us, wrong in rows:
                alg = b / us / 1e3
                f.write(f"{a.label},all_reduce,{world},{b},{c},float32,sum,-1,in-place,{us:.3f},{alg:.4f},"
                        f"{alg * 2 * (world - 1) / world:.4f},{wrong}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""torch.distributed (gloo, CPU tensors) point-to-point between ranks 0 and 1,
OSU-style, the same method as tc-osu: latency = half a ping-pong round trip
(dist.send/dist.recv), bandwidth = a window of dist.isend/dist.irecv of one
buffer closed by a 4-byte reply (MB/s = 10^6 bytes/s); median of the rounds.
Launched by tc-run (torch's TCPStore client joins tc-run's store). Rank 0
writes `size value` lines to LAT and BW (tc-osu --extra reads them).

  tc-run -n 2 -- python bench/torch_p2p.py -b 1 -e 16M -r 3 LAT BW
"""
import argparse
import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist


def size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def latency(buf, n, rank):
    warm = max(n // 10, 2)
    for i in range(warm + n):
        if i == warm:
            t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
    return (time.perf_counter() - t0) * 1e6 / (2 * n)


def bandwidth(buf, length, rank):
    window = min(max((64 << 20) // length, 2), 64)
    windows = 2
    ack = torch.zeros(4, dtype=torch.uint8)
    for w in range(windows + 1):
        if w == 1:
            t0 = time.perf_counter()
        op = dist.isend if rank == 0 else dist.irecv
        for work in [op(buf, 1 - rank) for _ in range(window)]:
            work.wait()
        if rank == 0:
            dist.recv(ack, 1)
        else:
            dist.send(ack, 0)
    return window * windows * length / (time.perf_counter() - t0) / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", type=size, default=1)
    ap.add_argument("-e", type=size, default=16 << 20)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("lat")
    ap.add_argument("bw")
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # tc-run (and torchrun) host the store; a plain launcher leaves it to rank 0.
    host_store = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=host_store,
                          timeout=datetime.timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    lat_rows, bw_rows, s = [], [], max(a.b, 1)
    while s <= a.e:
        buf = torch.full((s,), 7, dtype=torch.uint8)
        n = max((min(max((32 << 20) // max(s, 4096), 20), 2000)) // 50, 10)
        lats = [latency(buf, n, rank) for _ in range(a.r)]
        bws = [bandwidth(buf, s, rank) for _ in range(a.r)]
        lat_rows.append((s, statistics.median(lats)))
        bw_rows.append((s, statistics.median(bws)))
        s *= 2
    dist.barrier()
    if rank == 0:
        for path, rows in ((a.lat, lat_rows), (a.bw, bw_rows)):
            with open(path, "w") as f:
                f.writelines(f"{s} {v}\n" for s, v in rows)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

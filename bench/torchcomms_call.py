"""Time per call of a 4-byte all_reduce through torchcomm.torchcomms (one
float32, SUM, synchronous), as tc-perf times the same call from Rust:
warm-up, then ITERS calls, rank 0 prints microseconds per call.

    tc-run -n 2 -- python bench/torchcomms_call.py [ITERS]
"""
import sys
import time

import torch

import torchcomm.torchcomms as torchcomms

iters = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="call-cost")
t = torch.ones(1)
op = torchcomms.ReduceOp.SUM
for _ in range(1000):
    comm.all_reduce(t, op, False)
comm.barrier(False)
start = time.perf_counter()
for _ in range(iters):
    comm.all_reduce(t, op, False)
us = (time.perf_counter() - start) / iters * 1e6
if comm.get_rank() == 0:
    print(f"torchcomms all_reduce 4 B: {us:.2f} us per call ({iters} calls)")
comm.finalize()

"""One training step's gradient exchange with PowerSGD: our reducer's
TC_HOOK_POWERSGD against its plain all-reduce hook and against torch DDP
with powerSGD_hook / its default all-reduce, on the same float32 gradient
list (a model's parameter shapes from tests/data/), side by side,
interleaved per step, rank 0's median ms.

  ours plain      reducer with gradient_as_bucket_view, TC_HOOK_ALLREDUCE
  ours powersgd   the same with tc_reducer_set_powersgd (rank R, from the
                  first iteration: start_iter 0, error feedback, warm start)
  torch plain     DDP step (loss = sum of the parameters) minus the same
                  backward without DDP
  torch powersgd  the same with powerSGD_hook (rank R, start_powerSGD_iter 2:
                  the two warm-up steps are plain, the measured ones compress)

    python powersgd_bench.py LIBTORCHCOMM.so WORLD [--model bert_base]
        [--rank 4] [--steps 5] [--warmup 2]
"""
import argparse
import ctypes as C
import os
import socket
import statistics
import subprocess
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reducer_bench as rb  # noqa: E402


class PowerSGDOptions(C.Structure):
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint32), ("version", C.c_uint32),
                ("matrix_approximation_rank", C.c_size_t), ("start_iter", C.c_uint64),
                ("min_compression_rate", C.c_double), ("orthogonalization_epsilon", C.c_double),
                ("use_error_feedback", C.c_int32), ("warm_start", C.c_int32), ("seed", C.c_uint64),
                ("rows", C.POINTER(C.c_size_t)), ("num_rows", C.c_size_t)]


def shapes(model):
    with open(os.path.join(rb.DATA, rb.MODELS[model])) as f:
        rows = [l.split("\t")[1] for l in f if l.strip() and not l.startswith("#")]
    return [tuple(int(d) for d in r.split(",")) for r in rows]


class Params(torch.nn.Module):
    def __init__(self, shape_list):
        super().__init__()
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in shape_list])

    def forward(self):
        return sum(p.sum() for p in self.ps)


def bench(lib, args):
    shape_list = shapes(args.model)
    sizes = [int(torch.tensor(s).prod()) for s in shape_list]
    n = len(sizes)
    counts = (C.c_size_t * n)(*sizes)
    dtypes = (C.c_int32 * n)(*([0] * n))
    lib.lib.tc_reducer_set_builtin_hook.argtypes = [C.c_void_p, C.c_int32]
    lib.lib.tc_reducer_set_powersgd.argtypes = [C.c_void_p, C.POINTER(PowerSGDOptions)]
    lib.lib.tc_reducer_get_grad.argtypes = [C.c_void_p, C.c_size_t, C.POINTER(C.c_void_p)]
    reducers = []
    for _ in range(2):
        opts = rb.ReducerOptions(C.sizeof(rb.ReducerOptions), 0x5443_5244, 1, 25 << 20, 0, 1)
        r = C.c_void_p()
        lib.ok(lib.lib.tc_reducer_new(lib.comm, None, counts, dtypes, n, C.byref(opts), C.byref(r)))
        for i in range(n):  # random gradients (a sum of ones would be rank 1)
            p = C.c_void_p()
            lib.ok(lib.lib.tc_reducer_get_grad(r, i, C.byref(p)))
            if p.value:
                view = (C.c_float * sizes[i]).from_address(p.value)
                torch.frombuffer(view, dtype=torch.float32).copy_(torch.randn(sizes[i]) * 1e-3)
        reducers.append(r)
    rows = (C.c_size_t * n)(*[s[0] for s in shape_list])
    o = PowerSGDOptions(C.sizeof(PowerSGDOptions), 0x5443_5053, 1, args.rank, 0, 2.0, 0.0, 1, 1, 0,
                        rows, n)
    lib.ok(lib.lib.tc_reducer_set_powersgd(reducers[1], C.byref(o)))

    def ours(r):
        for i in reversed(range(n)):
            lib.ok(lib.lib.tc_reducer_mark_ready(r, i))
        lib.ok(lib.lib.tc_reducer_finalize(r))

    local = Params(shape_list)
    ddp_plain = torch.nn.parallel.DistributedDataParallel(Params(shape_list), gradient_as_bucket_view=True)
    # One bucket: with several, powerSGD_hook issues its second and third
    # all-reduces from gloo callback threads, racing the next bucket's first
    # one, and the ranks' collectives mismatched (seen on 2 ranks here).
    ddp_psgd = torch.nn.parallel.DistributedDataParallel(Params(shape_list), bucket_cap_mb=4096)
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=args.rank,
                               start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)
    ddp_psgd.register_comm_hook(state, psgd.powerSGD_hook)

    def backward(module):
        module.zero_grad(set_to_none=True)
        loss = module()
        return lambda: loss.backward()

    res = {k: [] for k in ["ours plain", "ours powersgd", "ddp plain", "ddp powersgd", "local"]}
    for step in range(args.warmup + args.steps):
        t = [rb.timed(lambda: ours(reducers[0])), rb.timed(lambda: ours(reducers[1])),
             rb.timed(backward(ddp_plain)), rb.timed(backward(ddp_psgd)), rb.timed(backward(local))]
        if step >= args.warmup:
            for k, v in zip(res, t):
                res[k].append(v)
    for r in reducers:
        lib.lib.tc_reducer_free(r)
    return {k: statistics.median(v) for k, v in res.items()}


def rank_main(args, rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.world)
    torch.set_num_threads(1)
    lib = rb.Lib(args.lib, rank, args.world, port)
    m = bench(lib, args)
    if rank == 0:
        tp, tq = m["ddp plain"] - m["local"], m["ddp powersgd"] - m["local"]
        print(f"| {args.model} | {args.world} | {args.rank} | {m['ours plain']:.1f} | {m['ours powersgd']:.1f} "
              f"| {tp:.1f} | {tq:.1f} | {m['ours plain'] / m['ours powersgd']:.2f}x "
              f"| {tq / m['ours powersgd']:.2f}x |", flush=True)
    lib.ok(lib.lib.tc_comm_finalize(lib.comm))
    lib.lib.tc_comm_destroy(lib.comm)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("world", type=int)
    ap.add_argument("--model", default="bert_base")
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rank-of-process", type=int, default=None)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    if args.rank_of_process is not None:
        rank_main(args, args.rank_of_process, args.port)
        return
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    print("| model | ranks | r | ours plain | ours powersgd | torch plain | torch powersgd "
          "| ours plain / powersgd | torch / ours powersgd |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    procs = [subprocess.Popen([sys.executable, __file__] + sys.argv[1:]
                              + ["--rank-of-process", str(r), "--port", str(port)])
             for r in range(args.world)]
    codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit(f"powersgd bench failed: exit codes {codes}")


if __name__ == "__main__":
    main()

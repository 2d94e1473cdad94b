"""One training step's gradient exchange: libtorchcomm's reducer against
per-tensor all-reduce through libtorchcomm and against torch DDP's gloo
reducer, on the same gradient list (float32, the parameter shapes of
ResNet-50 or BERT-base), side by side, interleaved, in one run.

Per step and variant (all ranks start together after a barrier; rank 0's
time is reported, median over the measured steps). Each of ours is measured
as torch's is: a backward that writes every gradient (fill_, in reverse
order) with the exchange, minus the same backward without it (measured
alternately), so both libraries copy gradients that a backward has just
written (--cold: no writes and no subtraction, the exchange of gradients
written long before, the method of the earlier tables in
docs/performance.md):
  ours        write and mark every gradient in reverse order, then finalize
              (bucketed: 25 MiB buckets, 1 MiB first bucket; all-reduce hook;
              gradients copied into the buckets and back)
  ours view   the same with gradient_as_bucket_view (no copies; the writes
              go to the bucket views) and --bucket-cap-mb (default 25)
              buckets
  per-tensor  write each gradient, then one blocking tc_all_reduce of it,
              reverse order
  torch DDP   backward of loss = sum(p.sum()) (the cheapest backward: every
              gradient is ones) under DDP (gloo, 25 MiB buckets) minus the
              same backward without DDP (measured alternately): the exchange
              DDP adds; "copy" with DDP's default (gradients copied into the
              buckets and back, as "ours"), "view" with
              gradient_as_bucket_view (as "ours view")
  overlap     ours view again (no writes), each gradient marked after a
              simulated backward slice (sleep, so the CPU stays free as under
              a GPU backward; the whole backward takes --backward-ms, default
              the measured "ours view" time): exposed = step - backward,
              hidden = 1 - exposed / ours view

    python reducer_bench.py LIBTORCHCOMM.so WORLD [--models resnet50,bert_base]
        [--steps 7] [--warmup 2] [--backward-ms MS] [--bucket-cap-mb MB] [--cold]
"""
import argparse
import ctypes as C
import os
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data")
MODELS = {"resnet50": "resnet50_param_shapes.txt", "bert_base": "bert_base_param_shapes.txt"}


class CommOptions(C.Structure):
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint32), ("version", C.c_uint32),
                ("name", C.c_char_p), ("timeout_ms", C.c_int64), ("abort_on_error", C.c_int32),
                ("rank", C.c_int32), ("world_size", C.c_int32), ("store", C.c_void_p),
                ("hints", C.c_void_p), ("num_hints", C.c_size_t)]


class Device(C.Structure):
    _fields_ = [("type", C.c_int32), ("index", C.c_int32)]


class ReducerOptions(C.Structure):
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint32), ("version", C.c_uint32),
                ("bucket_cap_bytes", C.c_size_t), ("first_bucket_bytes", C.c_size_t),
                ("gradient_as_bucket_view", C.c_int32)]


class ReduceOp(C.Structure):
    _fields_ = [("kind", C.c_int32), ("premul_factor", C.c_double), ("premul_factor_ptr", C.c_void_p)]


def shapes(model):
    with open(os.path.join(DATA, MODELS[model])) as f:
        rows = [l.split("\t")[1] for l in f if l.strip() and not l.startswith("#")]
    out = []
    for r in rows:
        n = 1
        for d in r.split(","):
            n *= int(d)
        out.append(n)
    return out


class Params(torch.nn.Module):
    """Parameters of the given sizes; the output is the sum of them all."""

    def __init__(self, sizes):
        super().__init__()
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in sizes])

    def forward(self):
        return sum(p.sum() for p in self.ps)


class Lib:
    def __init__(self, path, rank, world, port):
        lib = C.CDLL(path)
        lib.tc_last_error.restype = C.c_char_p
        lib.tc_store_tcp_new.argtypes = [C.c_char_p, C.c_uint16, C.c_int, C.c_int32, C.c_int64,
                                         C.POINTER(C.c_void_p)]
        lib.tc_comm_new.argtypes = [C.c_char_p, Device, C.POINTER(CommOptions), C.POINTER(C.c_void_p)]
        lib.tc_reducer_new.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p, C.c_size_t,
                                       C.c_void_p, C.POINTER(C.c_void_p)]
        lib.tc_reducer_mark_ready.argtypes = [C.c_void_p, C.c_size_t]
        lib.tc_reducer_finalize.argtypes = [C.c_void_p]
        lib.tc_reducer_free.argtypes = [C.c_void_p]
        lib.tc_reducer_get_grad.argtypes = [C.c_void_p, C.c_size_t, C.POINTER(C.c_void_p)]
        lib.tc_all_reduce.argtypes = [C.c_void_p, C.c_void_p, C.c_size_t, C.c_int32, ReduceOp,
                                      C.c_void_p, C.c_void_p]
        lib.tc_comm_finalize.argtypes = [C.c_void_p]
        lib.tc_comm_destroy.argtypes = [C.c_void_p]
        self.lib = lib
        store = C.c_void_p()
        self.ok(lib.tc_store_tcp_new(b"127.0.0.1", port, 0, -1, 60000, C.byref(store)))
        opts = CommOptions(C.sizeof(CommOptions), 0x5443_4F4D, 1, b"bench", 600000, 0, rank, world,
                           store, None, 0)
        self.comm = C.c_void_p()
        self.ok(lib.tc_comm_new(b"gloo", Device(0, 0), C.byref(opts), C.byref(self.comm)))

    def ok(self, rc):
        if rc != 0:
            raise RuntimeError(f"libtorchcomm error {rc}: {self.lib.tc_last_error().decode()}")


def view_tensor(lib, red, i, count):
    """Gradient i of a gradient_as_bucket_view reducer, as a float32 tensor
    over the reducer's bucket."""
    if count == 0:
        return torch.empty(0)
    ptr = C.c_void_p()
    lib.ok(lib.lib.tc_reducer_get_grad(red, i, C.byref(ptr)))
    return torch.frombuffer((C.c_float * count).from_address(ptr.value), dtype=torch.float32)


def timed(fn):
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def bench_model(lib, model, args, rank, world):
    sizes = shapes(model)
    grads = [torch.randn(n) * 1e-3 for n in sizes]
    n = len(grads)
    ptrs = (C.c_void_p * n)(*[g.data_ptr() for g in grads])
    counts = (C.c_size_t * n)(*sizes)
    dtypes = (C.c_int32 * n)(*([0] * n))
    red = C.c_void_p()
    lib.ok(lib.lib.tc_reducer_new(lib.comm, ptrs, counts, dtypes, n, None, C.byref(red)))
    # gradient_as_bucket_view: the gradients live in the buckets (no copies).
    view_opts = ReducerOptions(C.sizeof(ReducerOptions), 0x5443_5244, 1,
                               int(args.bucket_cap_mb * (1 << 20)), 0, 1)
    red_view = C.c_void_p()
    lib.ok(lib.lib.tc_reducer_new(lib.comm, None, counts, dtypes, n, C.byref(view_opts),
                                  C.byref(red_view)))
    views = [view_tensor(lib, red_view, i, sizes[i]) for i in range(n)]
    local = Params(sizes)
    ddp = torch.nn.parallel.DistributedDataParallel(Params(sizes), gradient_as_bucket_view=True)
    ddp_copy = torch.nn.parallel.DistributedDataParallel(Params(sizes))
    sum_op = ReduceOp(0, 1.0, None)
    total = sum(sizes)
    order = list(reversed(range(n)))
    write = not args.cold

    def ours(backward_ms=0.0, red=red, written=grads):
        t0 = time.perf_counter()
        done = 0
        for i in order:
            if backward_ms:
                done += sizes[i]
                wake = t0 + backward_ms * 1e-3 * done / total
                pause = wake - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
            elif write:
                written[i].fill_(1e-3)
            lib.ok(lib.lib.tc_reducer_mark_ready(red, i))
        lib.ok(lib.lib.tc_reducer_finalize(red))

    def per_tensor():
        for i in order:
            if write:
                grads[i].fill_(1e-3)
            lib.ok(lib.lib.tc_all_reduce(lib.comm, ptrs[i], sizes[i], 0, sum_op, None, None))

    def writes_only(tensors):
        # The backward of "ours" without the exchange: what is subtracted.
        if write:
            for i in order:
                tensors[i].fill_(1e-3)

    def backward(module):
        # The cheapest backward: every gradient is ones, so the step is
        # autograd's bookkeeping, the gradient copies and the exchange.
        module.zero_grad(set_to_none=True)
        loss = module()
        return lambda: loss.backward()

    results = {k: [] for k in ["ours", "view", "per-tensor", "ddp", "local", "overlap", "ddp copy",
                                "local 2"]}
    for step in range(args.warmup + args.steps):
        t_ours = timed(ours) - timed(lambda: writes_only(grads))
        t_view = timed(lambda: ours(red=red_view, written=views)) - timed(lambda: writes_only(views))
        t_pt = timed(per_tensor) - timed(lambda: writes_only(grads))
        run_ddp, run_local = backward(ddp), backward(local)
        t_ddp = timed(run_ddp)
        t_local = timed(run_local)
        run_ddp_copy, run_local = backward(ddp_copy), backward(local)
        t_ddp_copy = timed(run_ddp_copy)
        t_local_2 = timed(run_local)
        bw = args.backward_ms if args.backward_ms is not None else t_view
        t_overlap = timed(lambda: ours(bw, red_view))
        if step >= args.warmup:
            for k, v in zip(results, [t_ours, t_view, t_pt, t_ddp, t_local, t_overlap - bw,
                                      t_ddp_copy, t_local_2]):
                results[k].append(v)
            results.setdefault("backward", []).append(bw)
    lib.lib.tc_reducer_free(red)
    lib.lib.tc_reducer_free(red_view)
    return {k: statistics.median(v) for k, v in results.items()}


def rank_main(args, rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.world)
    torch.set_num_threads(1)
    lib = Lib(args.lib, rank, args.world, port)
    for model in args.models.split(","):
        m = bench_model(lib, model, args, rank, args.world)
        if rank == 0:
            ddp = m["ddp"] - m["local"]
            ddp_copy = m["ddp copy"] - m["local 2"]
            hidden = 1.0 - max(m["overlap"], 0.0) / m["view"]
            print(f"| {model} | {args.world} | {m['ours']:.1f} | {m['view']:.1f} "
                  f"| {m['per-tensor']:.1f} | {ddp_copy:.1f} | {ddp:.1f} "
                  f"| {ddp_copy / m['ours']:.2f}x | {ddp / m['view']:.2f}x "
                  f"| {m['per-tensor'] / m['view']:.2f}x "
                  f"| {m['backward']:.1f} | {max(m['overlap'], 0.0):.1f} | {100 * hidden:.0f}% |",
                  flush=True)
    lib.ok(lib.lib.tc_comm_finalize(lib.comm))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("lib")
    p.add_argument("world", type=int)
    p.add_argument("--models", default="resnet50,bert_base")
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--backward-ms", type=float, default=None)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0,
                   help="bucket_cap_bytes of the 'ours view' reducer (MiB)")
    p.add_argument("--cold", action="store_true",
                   help="exchange gradients written long before (no writes, nothing subtracted)")
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--port", type=int, default=None)
    args = p.parse_args()
    if args.rank is not None:
        rank_main(args, args.rank, args.port)
        return
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    rest = [a for a in sys.argv[1:]]
    procs = [subprocess.Popen([sys.executable, __file__] + rest + ["--rank", str(r), "--port", str(port)])
             for r in range(args.world)]
    codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit(f"reducer bench on {args.world} ranks failed: exit codes {codes}")


if __name__ == "__main__":
    main()

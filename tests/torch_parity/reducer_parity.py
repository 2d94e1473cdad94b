"""Parity of the gradient reducer and tc_broadcast_coalesced with PyTorch.

Each rank builds the same gradients (ResNet-50's parameter shapes scaled
down, mixed float32/float16/bfloat16, random values) and runs them
  - through torch DDP with a communication hook (allreduce_hook,
    fp16_compress_hook, bf16_compress_hook) on a torch gloo process group:
    a module whose loss makes each parameter's gradient exactly the chosen
    values, so DDP's own reducer and hooks produce the result;
  - through libtorchcomm's reducer (ctypes) with the matching built-in hook;
and compares them bit for bit (2 ranks), or within the rounding a different
summation order allows (more ranks: see TOLERANCE). It also checks tc_broadcast_coalesced
against torch.distributed._broadcast_coalesced.

    python reducer_parity.py LIBTORCHCOMM.so WORLD   # launches WORLD ranks
"""
import ctypes as C
import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = os.path.join(HERE, "..", "data", "resnet50_param_shapes.txt")
SCALE = 64
DTYPES = {torch.float32: 0, torch.float16: 2, torch.bfloat16: 3}
HOOKS = [
    ("allreduce", default_hooks.allreduce_hook, 0, None),
    ("fp16_compress", default_hooks.fp16_compress_hook, 1, torch.float16),
    ("bf16_compress", default_hooks.bf16_compress_hook, 2, torch.bfloat16),
]


class ReducerOptions(C.Structure):
    _fields_ = [
        ("size", C.c_size_t),
        ("magic", C.c_uint32),
        ("version", C.c_uint32),
        ("bucket_cap_bytes", C.c_size_t),
        ("first_bucket_bytes", C.c_size_t),
        ("gradient_as_bucket_view", C.c_int32),
    ]


class CommOptions(C.Structure):
    _fields_ = [
        ("size", C.c_size_t),
        ("magic", C.c_uint32),
        ("version", C.c_uint32),
        ("name", C.c_char_p),
        ("timeout_ms", C.c_int64),
        ("abort_on_error", C.c_int32),
        ("rank", C.c_int32),
        ("world_size", C.c_int32),
        ("store", C.c_void_p),
        ("hints", C.c_void_p),
        ("num_hints", C.c_size_t),
    ]


class Device(C.Structure):
    _fields_ = [("type", C.c_int32), ("index", C.c_int32)]


def param_list():
    """(numel, dtype) per parameter; every 13th is empty."""
    out = []
    with open(SHAPES) as f:
        rows = [l.split("\t")[1] for l in f if l.strip() and not l.startswith("#")]
    for i, shape in enumerate(rows):
        n = 1
        for d in shape.split(","):
            n *= int(d)
        dtype = [torch.float16, torch.bfloat16, torch.float32, torch.float32][i % 4]
        out.append((0 if i % 13 == 7 else -(-n // SCALE), dtype))
    return out


def gradients(rank, iteration):
    g = torch.Generator().manual_seed(1000 * iteration + rank)
    return [(torch.randn(n, generator=g) * 3).to(dt) for n, dt in param_list()]


class Model(torch.nn.Module):
    """Parameters with the list's shapes; loss = sum(p * g) makes p.grad == g."""

    def __init__(self):
        super().__init__()
        self.ps = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.zeros(n, dtype=dt)) for n, dt in param_list()]
        )

    def forward(self, grads):
        return sum((p * g).sum().float() for p, g in zip(self.ps, grads))


# Unit roundoff of the dtype the sums are rounded in. On more than 2 ranks
# each of the world - 1 additions may round differently (torch's gloo rounds
# every partial sum, we round once), so an element may differ by up to
# world units of it relative to the sum of the magnitudes added.
UNIT = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def check(name, ours, theirs, world, wire=None, magnitudes=None):
    """Bitwise on 2 ranks; else within world * UNIT of the dtype on the wire
    (`wire`, or each gradient's own dtype) times `magnitudes[i]` (the sum over
    ranks of |gradient| / world, elementwise), plus one unit in the last
    place of the gradient's dtype for the cast back."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a.numel() == 0:
            continue
        if world == 2:
            ia = a.view(torch.int16 if a.element_size() == 2 else torch.int32)
            ib = b.view(torch.int16 if b.element_size() == 2 else torch.int32)
            if not torch.equal(ia, ib):
                k = int((ia != ib).nonzero()[0])
                raise AssertionError(f"{name}: gradient {i} element {k}: {a[k]} != {b[k]}")
        else:
            # ... plus one unit in the last place of the final cast back.
            bound = (world * UNIT[wire or a.dtype] * magnitudes[i]
                     + 2 * UNIT[a.dtype] * b.double().abs() + 1e-30)
            err = (a.double() - b.double()).abs()
            if bool((err > bound).any()):
                k = int((err > bound).nonzero()[0])
                raise AssertionError(f"{name}: gradient {i} element {k}: {a[k]} vs {b[k]}")


class Ours:
    def __init__(self, lib_path, rank, world, port):
        lib = C.CDLL(lib_path)
        lib.tc_last_error.restype = C.c_char_p
        lib.tc_store_tcp_new.argtypes = [C.c_char_p, C.c_uint16, C.c_int, C.c_int32, C.c_int64,
                                         C.POINTER(C.c_void_p)]
        lib.tc_comm_new.argtypes = [C.c_char_p, Device, C.POINTER(CommOptions), C.POINTER(C.c_void_p)]
        lib.tc_reducer_new.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p, C.c_size_t,
                                       C.POINTER(ReducerOptions), C.POINTER(C.c_void_p)]
        lib.tc_reducer_mark_ready.argtypes = [C.c_void_p, C.c_size_t]
        lib.tc_reducer_finalize.argtypes = [C.c_void_p]
        lib.tc_reducer_set_builtin_hook.argtypes = [C.c_void_p, C.c_int32]
        lib.tc_reducer_free.argtypes = [C.c_void_p]
        lib.tc_broadcast_coalesced.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p,
                                               C.c_size_t, C.c_size_t, C.c_int, C.c_void_p, C.c_void_p]
        lib.tc_comm_finalize.argtypes = [C.c_void_p]
        lib.tc_comm_destroy.argtypes = [C.c_void_p]
        self.lib = lib
        store = C.c_void_p()
        # torch's own TCPStore (rank 0 hosts it): the wire protocol is shared.
        self.ok(lib.tc_store_tcp_new(b"127.0.0.1", port, 0, -1, 60000, C.byref(store)))
        opts = CommOptions(C.sizeof(CommOptions), 0x5443_4F4D, 1, b"parity", 120000, 0, rank, world,
                           store, None, 0)
        self.comm = C.c_void_p()
        self.ok(lib.tc_comm_new(b"gloo", Device(0, 0), C.byref(opts), C.byref(self.comm)))

    def ok(self, rc):
        if rc != 0:
            raise RuntimeError(f"libtorchcomm error {rc}: {self.lib.tc_last_error().decode()}")

    def lists(self, tensors):
        n = len(tensors)
        ptrs = (C.c_void_p * n)(*[t.data_ptr() for t in tensors])
        counts = (C.c_size_t * n)(*[t.numel() for t in tensors])
        dtypes = (C.c_int32 * n)(*[DTYPES[t.dtype] for t in tensors])
        return ptrs, counts, dtypes, n

    def reduce(self, grads, hook):
        ptrs, counts, dtypes, n = self.lists(grads)
        opts = ReducerOptions(C.sizeof(ReducerOptions), 0x5443_5244, 1, 256 << 10, 16 << 10, 0)
        r = C.c_void_p()
        self.ok(self.lib.tc_reducer_new(self.comm, ptrs, counts, dtypes, n, C.byref(opts),
                                        C.byref(r)))
        self.ok(self.lib.tc_reducer_set_builtin_hook(r, hook))
        for i in reversed(range(n)):
            self.ok(self.lib.tc_reducer_mark_ready(r, i))
        self.ok(self.lib.tc_reducer_finalize(r))
        self.lib.tc_reducer_free(r)

    def broadcast_coalesced(self, tensors, buffer_bytes, root):
        ptrs, counts, dtypes, n = self.lists(tensors)
        self.ok(self.lib.tc_broadcast_coalesced(self.comm, ptrs, counts, dtypes, n, buffer_bytes,
                                                root, None, None))

    def close(self):
        self.ok(self.lib.tc_comm_finalize(self.comm))
        self.lib.tc_comm_destroy(self.comm)


def rank_main(lib_path, rank, world, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    ours = Ours(lib_path, rank, world, port)
    for it, (name, hook, ours_hook, wire) in enumerate(HOOKS):
        grads = gradients(rank, it)
        model = Model()
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
        ddp.register_comm_hook(dist.group.WORLD, hook)
        ddp(grads).backward()
        theirs = [p.grad for p in model.ps]
        mine = [g.clone() for g in grads]
        ours.reduce(mine, ours_hook)
        everyone = [gradients(r, it) for r in range(world)]
        magnitudes = [sum(g[i].double().abs() for g in everyone) / world
                      for i in range(len(grads))]
        check(name, mine, theirs, world, wire, magnitudes)
        print(f"rank {rank}: {name}: {len(mine)} gradients match torch DDP's hook", flush=True)
    for root in range(world):
        src = gradients(root, 99)
        theirs = [t.clone() if rank == root else torch.zeros_like(t) for t in src]
        mine = [t.clone() if rank == root else torch.full_like(t, 7) for t in src]
        dist._broadcast_coalesced(dist.group.WORLD, theirs, 1 << 16, root)
        ours.broadcast_coalesced(mine, 1 << 16, root)
        check("broadcast_coalesced", mine, theirs, 2)
    print(f"rank {rank}: tc_broadcast_coalesced matches torch's _broadcast_coalesced", flush=True)
    ours.close()
    dist.destroy_process_group()


def run_ranks(script, rank_main, what):
    """As a rank (argv: lib rank world port), runs rank_main; else launches
    `script` once per rank (argv: lib world) and fails unless every rank
    exits 0 within 10 minutes."""
    if len(sys.argv) == 5:
        rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return
    lib_path, world = sys.argv[1], int(sys.argv[2])
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    procs = [subprocess.Popen([sys.executable, script, lib_path, str(r), str(world), str(port)])
             for r in range(world)]
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=600))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("timeout")
    if any(c != 0 for c in codes):
        sys.exit(f"{what} on {world} ranks failed: exit codes {codes}")
    print(f"{what} on {world} ranks: ok")


if __name__ == "__main__":
    run_ranks(__file__, rank_main, "reducer parity")

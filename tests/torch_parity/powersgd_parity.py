"""The reducer's PowerSGD hook next to PyTorch's powerSGD_hook.

Each rank builds the same float32 gradients (matrices = a rank-2 signal
shared by the ranks, scaled per rank, plus per-rank noise; vectors; a 5x5
matrix below the compression rate) for 4 iterations and runs them through
  - torch DDP with powerSGD_hook (rank 2, start_powerSGD_iter 2, error
    feedback, warm start) on a torch gloo process group, and
  - libtorchcomm's reducer with tc_reducer_set_powersgd, same parameters.
What is compared, honestly:
  - iterations 0 and 1 (before start_powerSGD_iter, the plain all-reduce):
    every gradient, bit for bit on 2 ranks, within summation-order rounding
    on more (as reducer_parity.py);
  - iterations 2 and 3, gradients not worth compressing (sum, then divide,
    with error feedback): the same comparison;
  - iterations 2 and 3, compressed gradients: not value by value, since
    torch's starting Q comes from its own generator. Per gradient, the
    relative error ||result - mean of the inputs|| / ||mean|| of ours and
    of torch's. One power step from a random start has a heavy tail (a
    start nearly orthogonal to the signal gives a large error), so the
    statistic is the median over the 24 compressed gradients: ours and
    torch's must be within a factor RATIO of each other and both below
    MAX_ERROR (no communication would give about 1, a rank-1 result about
    0.3: the signal's second singular value is a third of the first).
    Everything is seeded, so a run's figures are reproducible.

    python powersgd_parity.py LIBTORCHCOMM.so WORLD   # launches WORLD ranks
"""
import ctypes as C
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reducer_parity as rp  # noqa: E402

# Many compressed matrices, so that the mean error over them is a stable
# statistic of the random start.
SHAPES = [(48,), (64, 8, 3, 3), (10,), (5, 5)] + [(32 + 4 * k, 96 - 4 * k) for k in range(24)] + [(7,)]
ITERATIONS, START, RANK = 4, 2, 2
RATIO = 1.5
MAX_ERROR = 0.10


class PowerSGDOptions(C.Structure):
    _fields_ = [
        ("size", C.c_size_t),
        ("magic", C.c_uint32),
        ("version", C.c_uint32),
        ("matrix_approximation_rank", C.c_size_t),
        ("start_iter", C.c_uint64),
        ("min_compression_rate", C.c_double),
        ("orthogonalization_epsilon", C.c_double),
        ("use_error_feedback", C.c_int32),
        ("warm_start", C.c_int32),
        ("seed", C.c_uint64),
        ("rows", C.POINTER(C.c_size_t)),
        ("num_rows", C.c_size_t),
    ]


def compressed(shape):
    if len(shape) < 2:
        return False
    n = shape[0]
    m = 1
    for d in shape[1:]:
        m *= d
    r = min(n, m, RANK)
    return (n + m) * r * 2 < n * m


def gradients(rank, iteration):
    # The signal stays from iteration to iteration (as gradients do in
    # training, which warm start relies on); the noise does not.
    shared = torch.Generator().manual_seed(77)
    own = torch.Generator().manual_seed(1000 * iteration + rank)
    out = []
    for shape in SHAPES:
        if compressed(shape):
            n = shape[0]
            m = int(torch.tensor(shape[1:]).prod())
            a = torch.randn(n, 2, generator=shared) * torch.tensor([3.0, 1.0])
            b = torch.randn(m, 2, generator=shared)
            g = (rank + 1 + 0.1 * iteration) * (a @ b.T) + 0.05 * torch.randn(n, m, generator=own)
            out.append(g.reshape(shape).contiguous())
        else:
            out.append(torch.randn(shape, generator=own))
    return out


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES])

    def forward(self, grads):
        return sum((p * g).sum() for p, g in zip(self.ps, grads))


class OursPowerSGD(rp.Ours):
    def start(self, bufs):
        ptrs, counts, dtypes, n = self.lists(bufs)
        self.lib.tc_reducer_set_powersgd.argtypes = [C.c_void_p, C.POINTER(PowerSGDOptions)]
        opts = rp.ReducerOptions(C.sizeof(rp.ReducerOptions), 0x5443_5244, 1, 64 << 10, 16 << 10, 0)
        self.r = C.c_void_p()
        self.ok(self.lib.tc_reducer_new(self.comm, ptrs, counts, dtypes, n, C.byref(opts),
                                        C.byref(self.r)))
        rows = (C.c_size_t * n)(*[s[0] for s in SHAPES])
        o = PowerSGDOptions(C.sizeof(PowerSGDOptions), 0x5443_5053, 1, RANK, START, 2.0, 0.0, 1, 1,
                            0, rows, n)
        self.ok(self.lib.tc_reducer_set_powersgd(self.r, C.byref(o)))
        self.n = n

    def step(self):
        for i in reversed(range(self.n)):
            self.ok(self.lib.tc_reducer_mark_ready(self.r, i))
        self.ok(self.lib.tc_reducer_finalize(self.r))


def median(xs):
    return sorted(xs)[len(xs) // 2]


def rel_error(result, target):
    return float((result.double() - target.double()).norm() / target.double().norm())


def rank_main(lib_path, rank, world, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    ours = OursPowerSGD(lib_path, rank, world, port)
    bufs = [torch.zeros(s) for s in SHAPES]
    ours.start(bufs)
    model = Model()
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=RANK,
                               start_powerSGD_iter=START, min_compression_rate=2,
                               use_error_feedback=True, warm_start=True)
    ddp.register_comm_hook(state, psgd.powerSGD_hook)
    for it in range(ITERATIONS):
        grads = gradients(rank, it)
        for p in model.ps:
            p.grad = None
        ddp(grads).backward()
        theirs = [p.grad.clone() for p in model.ps]
        for b, g in zip(bufs, grads):
            b.copy_(g)
        ours.step()
        everyone = [gradients(r, it) for r in range(world)]
        mean = [sum(g[i] for g in everyone) / world for i in range(len(SHAPES))]
        magnitudes = [sum(g[i].abs() for g in everyone).double() / world for i in range(len(SHAPES))]
        exact = [i for i, s in enumerate(SHAPES) if it < START or not compressed(s)]
        # On more than 2 ranks, from the second compressed iteration on, the
        # sums also add each rank's error feedback (its own gradient minus
        # the mean, which cancels in the sum but not in its rounding) and
        # carry the previous iteration's rounding difference: the bound is
        # then four times the tensor's largest magnitude, not elementwise.
        def bound(i):
            m = magnitudes[i].view(-1)
            return m if it <= START else 4 * m.max().expand_as(m)

        rp.check(f"iteration {it}", [bufs[i].view(-1) for i in exact], [theirs[i].view(-1) for i in exact],
                 world, None, [bound(i) for i in exact])
        if it < START:
            print(f"rank {rank}: iteration {it}: all {len(exact)} gradients match torch bit for bit"
                  if world == 2 else f"rank {rank}: iteration {it}: all match within rounding",
                  flush=True)
            continue
        lossy = [i for i in range(len(SHAPES)) if i not in exact]
        e_ours = median([rel_error(bufs[i], mean[i]) for i in lossy])
        e_torch = median([rel_error(theirs[i], mean[i]) for i in lossy])
        print(f"rank {rank}: iteration {it}: {len(exact)} uncompressed gradients match torch; "
              f"median relative error of the {len(lossy)} compressed: ours {e_ours:.4f}, "
              f"torch {e_torch:.4f}", flush=True)
        if os.environ.get("POWERSGD_PARITY_VERBOSE"):
            print([round(rel_error(bufs[i], mean[i]), 4) for i in lossy], flush=True)
            print([round(rel_error(theirs[i], mean[i]), 4) for i in lossy], flush=True)
        if not (e_ours < MAX_ERROR and e_torch < MAX_ERROR):
            raise AssertionError(f"iteration {it}: approximation errors {e_ours}, {e_torch}")
        if max(e_ours, e_torch) > RATIO * min(e_ours, e_torch):
            raise AssertionError(f"iteration {it}: ours {e_ours} vs torch {e_torch}")
    ours.lib.tc_reducer_free(ours.r)
    ours.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    rp.run_ranks(__file__, rank_main, "powersgd parity")

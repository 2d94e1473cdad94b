"""torch.distributed's "torchcomm" backend against torch's gloo, under torchrun
(scripts/test-torch-backend.sh; one job per world size so torch is imported
once per rank).

    train.py parity   the default group on "torchcomm", a gloo group of the same
                      ranks; the same models from the same seeds on the same
                      data, 20 steps each way:
                        DDP on a small CNN and a small transformer: default,
                        gradient_as_bucket_view, the fp16-compress hook, the
                        PowerSGD hook;
                        FSDP2 (fully_shard) on the same two models;
                      then every collective torch.distributed offers, checked
                      against gloo's answer on the same data.
                      Parameters: bit-identical where both sides add in the
                      same order (2 ranks: a + b either way), close otherwise.
    train.py killed   the last rank leaves (os._exit) in the middle of a DDP
                      step; the others must get an error, well before the
                      group's 20 s timeout, never hang.
    train.py late     monitored_barrier (2 s) with the last rank 8 s late:
                      rank 0's error names it, every rank fails in time.
Each runs on the implementation torchcomm.distributed picks (C++ when its
extension loads; TORCHCOMM_TORCH_BACKEND=python|cpp forces one, and parity
checks that the group got it). parity also checks that works complete by
themselves: is_completed() polled without wait() turns True once the
operation is done (async all_reduce, isend/irecv), and stays True after
wait(); the Python implementation's works cannot (torch's holder of Python
works routes only wait() and get_future(); docs/status.md), so there the
check prints a "gap" line instead.
Exit status 0 only when every check held; each check prints one line.
"""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

import torchcomm.distributed  # registers "torchcomm"

STEPS = 20
failures = []


def check(cond, what):
    if not cond or dist.get_rank() == 0:
        print(("ok   " if cond else "FAIL ") + f"[{dist.get_world_size()} ranks] {what}", flush=True)
    if not cond:
        failures.append(what)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1),
                                  nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(256, 10))

    def forward(self, x):
        return self.body(x)

    @staticmethod
    def data(step, rank):
        g = torch.Generator().manual_seed(1000 * step + rank)
        return torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 32)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True) for _ in range(2))
        self.head = nn.Linear(32, 50)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h).flatten(0, 1)

    @staticmethod
    def data(step, rank):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randint(0, 50, (4, 12), generator=g)
        return x, torch.roll(x, 1, 1).flatten()


def model_of(cls):
    torch.manual_seed(0)
    return cls()


def train(model, cls, rank):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        x, y = cls.data(step, rank)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def full_params(model):
    out = []
    for p in model.parameters():
        p = p.full_tensor() if hasattr(p, "full_tensor") else p
        out.append(p.detach().clone())
    return out


def compare(a, b, what, exact, tol=1e-4):
    diff = max((x - y).abs().max().item() for x, y in zip(a, b))
    same = all(torch.equal(x, y) for x, y in zip(a, b))
    if exact:
        check(same, f"{what}: parameters bit-identical to gloo's (max diff {diff:.3g})")
    else:
        check(diff < tol, f"{what}: parameters within {tol:g} of gloo's (max diff {diff:.3g})")


def ddp_parity(ours, gloo, rank, world):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    exact = world == 2
    for cls in (CNN, Transformer):
        for mode in ("default", "bucket_view", "fp16_compress", "powersgd"):
            result = []
            for group in (ours, gloo):
                # Small buckets: several per step. PowerSGD keeps the default
                # (one bucket): its callbacks issue collectives from the
                # thread that completes futures, racing the next bucket's
                # all_reduce on the autograd thread (on gloo as well).
                m = DDP(model_of(cls), process_group=group, gradient_as_bucket_view=mode == "bucket_view",
                        bucket_cap_mb=25 if mode == "powersgd" else 0.05)
                if mode == "fp16_compress":
                    m.register_comm_hook(group, default_hooks.fp16_compress_hook)
                elif mode == "powersgd":
                    state = powerSGD_hook.PowerSGDState(process_group=group, matrix_approximation_rank=2,
                                                        start_powerSGD_iter=2, random_seed=7)
                    m.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
                result.append(full_params(train(m, cls, rank).module))
            # fp16 sums in another order round differently (half's epsilon is 1e-3)
            compare(*result, f"DDP {cls.__name__} {mode}", exact and mode != "powersgd",
                    2e-3 if mode == "fp16_compress" else 1e-4)


def fsdp_parity(ours, gloo, rank, world):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    for cls in (CNN, Transformer):
        result = []
        for group in (ours, gloo):
            mesh = DeviceMesh.from_group(group, "cpu")
            m = model_of(cls)
            children = m.layers if cls is Transformer else [m.body[0], m.body[2]]
            for child in children:
                fully_shard(child, mesh=mesh)
            fully_shard(m, mesh=mesh)
            result.append(full_params(train(m, cls, rank)))
        compare(*result, f"FSDP2 {cls.__name__}", world == 2)


def collectives(ours, gloo, rank, world):
    """Each operation on both groups with the same inputs; ours must give
    gloo's answer (exactly: small integers in float)."""
    def both(name, fn):
        got = [fn(g) for g in (ours, gloo)]
        same = all(torch.equal(a, b) for a, b in zip(got[0], got[1]))
        check(same, f"{name}: same result as gloo")

    def base(n=6):
        return torch.arange(n, dtype=torch.float32) + 10 * rank

    def all_reduce(g, op=dist.ReduceOp.SUM, async_op=False):
        t = base()
        w = dist.all_reduce(t, op=op, group=g, async_op=async_op)
        if async_op:
            return [w.get_future().wait()[0]]
        return [t]

    both("all_reduce sum", all_reduce)
    both("all_reduce max", lambda g: all_reduce(g, dist.ReduceOp.MAX))
    both("all_reduce product", lambda g: all_reduce(g, dist.ReduceOp.PRODUCT))
    both("all_reduce async + get_future", lambda g: all_reduce(g, async_op=True))
    t = base()
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=ours)
    check(torch.equal(t, torch.arange(6.0) + 10 * (world - 1) / 2), "all_reduce AVG (gloo has none)")
    t = base()
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5), group=ours)
    check(torch.equal(t, (torch.arange(6.0) * world + 10 * sum(range(world))) * 0.5), "all_reduce PREMUL_SUM")

    def sparse_all_reduce(g):
        t = torch.sparse_coo_tensor([[rank, world]], [1.0, 2.0 + rank], (world + 1,), check_invariants=True)
        dist.all_reduce(t, group=g)
        return [t.to_dense()]
    both("all_reduce of a sparse tensor", sparse_all_reduce)

    def all_reduce_coalesced(g):
        ts = [base(3), base(5) * 2]
        dist.all_reduce_coalesced(ts, group=g)
        return ts
    both("all_reduce_coalesced", all_reduce_coalesced)

    def broadcast(g):
        t = base()
        dist.broadcast(t, src=world - 1, group=g)
        return [t]
    both("broadcast", broadcast)

    def reduce(g):
        t = base()
        dist.reduce(t, dst=1, group=g)
        return [t] if rank == 1 else []
    both("reduce", reduce)

    def all_gather(g):
        out = [torch.empty(6) for _ in range(world)]
        dist.all_gather(out, base(), group=g)
        return out
    both("all_gather", all_gather)

    def all_gather_coalesced(g):
        outs = [[torch.empty(3), torch.empty(2)] for _ in range(world)]
        dist.all_gather_coalesced(outs, [base(3), torch.arange(2.0) * rank], group=g)
        return [t for per_rank in outs for t in per_rank]
    both("all_gather_coalesced", all_gather_coalesced)

    def all_gather_into_tensor(g):
        out = torch.empty(6 * world)
        dist.all_gather_into_tensor(out, base(), group=g)
        return [out]
    both("all_gather_into_tensor", all_gather_into_tensor)

    def reduce_scatter_tensor(g):
        out = torch.empty(3)
        dist.reduce_scatter_tensor(out, base(3 * world), group=g)
        return [out]
    both("reduce_scatter_tensor", reduce_scatter_tensor)

    def reduce_scatter(g):
        out = torch.empty(3)
        dist.reduce_scatter(out, [base(3) + i for i in range(world)], group=g)
        return [out]
    # gloo has no list reduce_scatter: checked against the sum made by hand.
    out = reduce_scatter(ours)[0]
    want = sum(torch.arange(3.0) + 10 * r + rank for r in range(world))
    check(torch.equal(out, want), "reduce_scatter (list form)")

    def gather(g):
        out = [torch.empty(6) for _ in range(world)] if rank == 0 else None
        dist.gather(base(), out, dst=0, group=g)
        return out or []
    both("gather", gather)

    def scatter(g):
        out = torch.empty(6)
        dist.scatter(out, [base() + i for i in range(world)] if rank == 0 else None, src=0, group=g)
        return [out]
    both("scatter", scatter)

    def all_to_all_single(g):
        out = torch.empty(2 * world)
        dist.all_to_all_single(out, base(2 * world), group=g)
        return [out]
    both("all_to_all_single", all_to_all_single)

    def all_to_all_splits(g):
        # rank r sends r + 1 rows of 2 to every peer; receives p + 1 from peer p
        ins = torch.arange((rank + 1) * world * 2, dtype=torch.float32).reshape(-1, 2) + 100 * rank
        out = torch.empty(sum(p + 1 for p in range(world)), 2)
        dist.all_to_all_single(out, ins, [p + 1 for p in range(world)], [rank + 1] * world, group=g)
        return [out]
    both("all_to_all_single with splits", all_to_all_splits)

    def all_to_all(g):
        out = [torch.empty(p + 2) for p in range(world)]
        dist.all_to_all(out, [torch.full((rank + 2,), float(rank * 10 + p)) for p in range(world)], group=g)
        return out
    # gloo's all_to_all wants one size: checked against the blocks made by hand.
    got = all_to_all(ours)
    check(all(torch.equal(got[p], torch.full((p + 2,), float(p * 10 + rank))) for p in range(world)),
          "all_to_all, a size per peer")

    def p2p(g):
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        got = torch.empty(6)
        ops = [dist.P2POp(dist.isend, base(), nxt, g), dist.P2POp(dist.irecv, got, prv, g)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        pair = torch.zeros(2)
        if rank == 0:
            dist.send(torch.tensor([1.0, 2.0]), 1, group=g, tag=3)
        elif rank == 1:
            dist.recv(pair, 0, group=g, tag=3)
        return [got, pair]
    both("batch_isend_irecv ring, send/recv with a tag", p2p)

    obj = [None]
    dist.broadcast_object_list(obj if rank else [{"a": 1}], src=0, group=ours)
    check((obj[0] if rank else {"a": 1}) == {"a": 1}, "broadcast_object_list")
    objs = [None] * world
    dist.all_gather_object(objs, ("r", rank), group=ours)
    check(objs == [("r", r) for r in range(world)], "all_gather_object")
    dist.barrier(group=ours)
    dist.monitored_barrier(group=ours, timeout=timedelta(seconds=20))
    check(True, "barrier, monitored_barrier")
    # recv without src: from any source, returning the sender (every rank
    # sends its rank to rank 0, which takes them in whatever order they come).
    # The Python implementation cannot tell the sender (torch's holder of
    # Python works does not route sourceRank()): there the payloads say it.
    if rank == 0:
        python = torchcomm.distributed.implementation() == "python"
        senders, payloads_ok = [], True
        for k in range(world - 1):
            t = torch.full((3,), -1.0)
            if python:
                dist.irecv(t, group=ours).wait()
                src = int(t[0].item())
            elif k % 2:
                w = dist.irecv(t, group=ours)
                w.wait()
                src = w._source_rank()
            else:
                src = dist.recv(t, group=ours)
            payloads_ok &= bool((t == src).all())
            senders.append(src)
        check(payloads_ok and sorted(senders) == list(range(1, world)),
              f"recv/irecv without src (any source): each sender once, with its payload ({senders})")
    else:
        dist.send(torch.full((3,), float(rank)), 0, group=ours)
    sub = dist.new_group([0, 1], backend="torchcomm")
    if rank < 2:
        t = torch.ones(1) * (rank + 1)
        dist.all_reduce(t, group=sub)
        check(t.item() == 3, "new_group([0, 1], backend='torchcomm') all_reduce")
    split = dist.split_group(ours, [[r for r in range(world) if r % 2 == 0], [r for r in range(world) if r % 2]])
    t = torch.ones(1)
    dist.all_reduce(t, group=split)
    check(t.item() == (world + 1 - rank % 2) // 2, "split_group (even and odd ranks) all_reduce")


def implementation(ours):
    """Which implementation the group got ("cpp" or "python"); checks it is
    the one TORCHCOMM_TORCH_BACKEND asks for, if it asks."""
    kind = type(ours._get_backend(torch.device("cpu"))).__name__
    impl = {"CppBackend": "cpp", "TorchCommBackend": "python"}.get(kind, kind)
    want = os.environ.get("TORCHCOMM_TORCH_BACKEND")
    check(impl == torchcomm.distributed.implementation() and (not want or impl == want),
          f"the group's backend is the {impl} implementation ({kind}; TORCHCOMM_TORCH_BACKEND={want})")
    return impl


def sequence_number(ours, impl):
    """The group's sequence number (gloo's `getSequenceNumberForGroup`; torch
    asks for it, e.g. in object collectives on subgroups): every operation
    counts one. The Python implementation cannot answer (torch does not
    route it): there it must raise torch's own error."""
    try:
        s0 = ours._get_sequence_number_for_group()
    except RuntimeError as e:
        check(impl == "python" and "sequence numbers" in str(e),
              f"the group's sequence number on the {impl} implementation ({str(e)[:60]})")
        return
    dist.all_reduce(torch.ones(1), group=ours)
    dist.barrier(group=ours)
    s1 = ours._get_sequence_number_for_group()
    check(impl == "cpp" and s1 == s0 + 2, f"the group's sequence number counts operations ({s0} -> {s1})")


def completion(ours, impl, rank, world):
    """Works complete by themselves: polling is_completed(), never calling
    wait(), ends (within 20 s, TRAIN_COMPLETION_WAIT) with the operation's
    result in place; after wait(), is_completed(), is_success() and no
    exception()."""
    def polled(works, what):
        deadline = time.monotonic() + float(os.environ.get("TRAIN_COMPLETION_WAIT", "20"))
        while not all(w.is_completed() for w in works) and time.monotonic() < deadline:
            time.sleep(0.001)
        return all(w.is_completed() for w in works)

    if impl == "python" and not os.environ.get("TRAIN_CHECK_PYTHON_COMPLETION"):
        if rank == 0:
            print(f"gap  [{world} ranks] is_completed() without wait(): not on the Python implementation "
                  "(docs/status.md; TRAIN_CHECK_PYTHON_COMPLETION=1 checks it anyway)", flush=True)
        return
    t = torch.full((4,), float(rank))
    w = dist.all_reduce(t, group=ours, async_op=True)
    done = polled([w], "all_reduce")
    check(done and torch.equal(t, torch.full((4,), float(sum(range(world))))),
          f"async all_reduce: is_completed() turns True without wait(), result in place (completed: {done})")
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    got = torch.zeros(3)
    ws = [dist.isend(torch.full((3,), float(rank)), nxt, group=ours), dist.irecv(got, prv, group=ours)]
    done = polled(ws, "isend/irecv")
    check(done and torch.equal(got, torch.full((3,), float(prv))),
          f"isend/irecv ring: is_completed() turns True without wait(), data received (completed: {done})")
    w = dist.all_reduce(torch.ones(1), group=ours, async_op=True)
    w.wait()
    check(w.is_completed() and w.is_success() and w.exception() is None,
          "after wait(): is_completed(), is_success(), no exception")
    # An operation the C++ side hands to the Python one (all_to_all with a
    # size per peer): its work answers is_completed() too.
    outs = [torch.zeros(p + 1) for p in range(world)]
    w = dist.all_to_all(outs, [torch.full((rank + 1,), float(rank)) for _ in range(world)], group=ours,
                        async_op=True)
    done = polled([w], "all_to_all")
    check(done and all(torch.equal(o, torch.full((p + 1,), float(p))) for p, o in enumerate(outs)),
          f"all_to_all, a size per peer (run by the Python side): is_completed() turns True (completed: {done})")
    # Works dropped unwaited: their operations still run to the end on
    # tensors kept alive until then; the next result is right.
    for _ in range(20):
        dist.all_reduce(torch.ones(1000), group=ours, async_op=True)
    t = torch.ones(1)
    dist.all_reduce(t, group=ours)
    check(t.item() == world, "20 async all_reduces dropped unwaited, then a blocking one: right result")


def parity():
    dist.init_process_group("torchcomm", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    ours = dist.group.WORLD
    impl = implementation(ours)
    gloo = dist.new_group(list(range(world)), backend="gloo")
    completion(ours, impl, rank, world)
    sequence_number(ours, impl)
    collectives(ours, gloo, rank, world)
    ddp_parity(ours, gloo, rank, world)
    fsdp_parity(ours, gloo, rank, world)
    dist.destroy_process_group()


def killed():
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("torchcomm", timeout=timedelta(seconds=20))
    rank, world = dist.get_rank(), dist.get_world_size()
    m = DDP(model_of(CNN), bucket_cap_mb=0.01)
    x, y = CNN.data(0, rank)
    nn.functional.cross_entropy(m(x), y).backward()
    if rank == world - 1:
        # Leaves in the middle of the next backward, with some buckets'
        # all_reduce issued (exit 0: torchrun lets the others finish).
        m.module.body[0].weight.register_hook(lambda g: os._exit(0))
    t0 = time.monotonic()
    try:
        for _ in range(3):
            nn.functional.cross_entropy(m(x), y).backward()
        error = None
    except Exception as e:
        error = e
    took = time.monotonic() - t0
    ok = error is not None and took < 15
    print(("ok   " if ok else "FAIL ") + f"[rank {rank}] a peer gone mid-step: "
          f"{type(error).__name__ if error else 'no error'} after {took:.1f} s: {str(error)[:120]}", flush=True)
    if not ok:
        failures.append("killed")
    os._exit(0 if ok else 1)  # the group cannot be finalized without the peer


def late():
    """monitored_barrier with a 2 s timeout while the last rank is 8 s late:
    rank 0 names that rank in its error, well before the late rank comes."""
    dist.init_process_group("torchcomm", timeout=timedelta(seconds=20))
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    if rank == world - 1:
        time.sleep(8)
        os._exit(0)
    t0 = time.monotonic()
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=2))
        error = None
    except Exception as e:
        error = e
    took = time.monotonic() - t0
    named = error is not None and f"Rank {world - 1} failed to pass monitoredBarrier" in str(error)
    ok = error is not None and took < 7 and (rank != 0 or named)
    print(("ok   " if ok else "FAIL ") + f"[rank {rank}] monitored_barrier, rank {world - 1} late: "
          f"{type(error).__name__ if error else 'no error'} after {took:.1f} s: {str(error)[:120]}", flush=True)
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    {"parity": parity, "killed": killed, "late": late}[sys.argv[1]]()
    if failures:
        print(f"FAILED: {failures}", flush=True)
    sys.exit(1 if failures else 0)

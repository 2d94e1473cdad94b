"""torchcomm.torchcomms (torchcomms' API) on every rank of a job started by
tc-run or torchrun (2, 3 or 4 ranks), backend "gloo" with CPU tensors:
every operation at 0, 4, 1024 and 1M elements, float, int, int8, double,
half and bfloat16, SUM, MAX, AVG and PREMUL_SUM, synchronous, asynchronous
and with the work dropped before completion; split, windows, object
collectives, torch stores as store=, bad arguments. Every rank runs every
test in the same order.

    tc-run -n 3 -- python -m pytest -q python/tests/test_torchcomms.py
"""
import os
import re
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import torchcomm.torchcomms as torchcomms
from torchcomm.torchcomms import ReduceOp, RedOpType

RANK = int(os.environ["RANK"])
SIZE = int(os.environ["WORLD_SIZE"])
DTYPES = [torch.float32, torch.int32, torch.int8, torch.float64, torch.float16, torch.bfloat16]
SMALL = [0, 4, 1024]
BIG = 1 << 20
MODES = ["sync", "async", "dropped"]


def cases(mode="sync"):
    """(count, dtype) pairs: synchronously every dtype at the small counts and
    1M floats; asynchronously and dropped, float and bfloat16 (keeps the run short)."""
    for dt in DTYPES if mode == "sync" else (torch.float32, torch.bfloat16):
        for n in SMALL:
            yield n, dt
    yield BIG, torch.float32


@pytest.fixture(scope="module")
def comm():
    c = torchcomms.new_comm("gloo", torch.device("cpu"), name="torchcomms-tests", timeout=timedelta(seconds=120),
                            abort_process_on_timeout_or_error=False)
    yield c
    c.finalize()


def run(comm, mode, issue):
    """Issues `issue(async_op)` as `mode`; a dropped work is collected at once
    and completion comes from a later blocking barrier (operations of a comm
    complete in order)."""
    if mode == "sync":
        w = issue(False)
        assert w.is_completed()
        return
    w = issue(True)
    if mode == "async":
        w.wait()
        assert w.is_completed()
    else:
        del w  # reference counting drops it here
        comm.barrier(False)


def data(n, dt, rank, salt=0):
    """Small integers, exact in every dtype (int8 sums stay below 127)."""
    return ((torch.arange(n) + salt) % 5 + rank + 1).to(dt)


def expect(values, op, dt):
    """The reduction of `values` (one tensor per rank) as the library does it."""
    acc = torch.stack([v.to(torch.float64) for v in values])
    if op is RedOpType.SUM:
        r = acc.sum(0)
    elif op is RedOpType.MAX:
        r = acc.max(0).values
    elif op is RedOpType.AVG:
        s = acc.sum(0)
        r = torch.div(s, len(values), rounding_mode="trunc") if not dt.is_floating_point else s / len(values)
    else:  # PREMUL_SUM by 2
        r = acc.sum(0) * 2
    return r.to(dt)


def close(got, want):
    torch.testing.assert_close(got, want, rtol=1e-2 if got.element_size() == 2 else 1e-5, atol=1e-2)


OPS = [("SUM", lambda: ReduceOp.SUM), ("MAX", lambda: ReduceOp.MAX), ("AVG", lambda: ReduceOp.AVG),
       ("PREMUL_SUM", lambda: ReduceOp.PREMUL_SUM(2.0)), ("PREMUL_SUM_TENSOR",
                                                          lambda: ReduceOp.PREMUL_SUM(torch.tensor([2.0])))]


def op_applies(name, dt):
    return not (name.startswith("PREMUL") and not dt.is_floating_point)


# -- module level

def test_module_names_and_reduce_ops():
    assert ReduceOp.SUM.type is RedOpType.SUM and ReduceOp.AVG.type is RedOpType.AVG
    assert ReduceOp.PREMUL_SUM(0.5).type is RedOpType.PREMUL_SUM
    assert ReduceOp.PREMUL_SUM(torch.tensor([0.5])).type is RedOpType.PREMUL_SUM
    for n in ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG"):
        assert getattr(ReduceOp, n).type is RedOpType[n]
    assert issubclass(torchcomms.TorchCommError, RuntimeError)


def test_every_name_of_the_torchcomms_stub_exists():
    text = Path(__file__).with_name("torchcomms_03_names.txt").read_text()
    stub = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(stub) > 100
    missing = [n for n in stub if not hasattr(torchcomms, n.split(".")[0]) or
               ("." in n and not hasattr(getattr(torchcomms, n.split(".")[0]), n.split(".")[1]))]
    assert not missing


def test_premul_sum_on_integers_is_refused_by_name(comm):
    with pytest.raises(RuntimeError, match="premul_sum is defined on floating dtypes only"):
        comm.all_reduce(torch.ones(4, dtype=torch.int32), ReduceOp.PREMUL_SUM(2.0), async_op=False)


# -- reductions

@pytest.mark.parametrize("mode", MODES)
def test_all_reduce(comm, mode):
    for n, dt in cases(mode):
        for name, make in OPS:
            if not op_applies(name, dt):
                continue
            op = make()
            t = data(n, dt, RANK)
            run(comm, mode, lambda a: comm.all_reduce(t, op, async_op=a))
            close(t, expect([data(n, dt, r) for r in range(SIZE)], op.type, dt))


@pytest.mark.parametrize("mode", MODES)
def test_reduce(comm, mode):
    for n, dt in cases(mode):
        for name, make in OPS[:3]:
            op = make()
            root = n % SIZE
            t = data(n, dt, RANK)
            run(comm, mode, lambda a: comm.reduce(t, root, op, async_op=a))
            if RANK == root:
                close(t, expect([data(n, dt, r) for r in range(SIZE)], op.type, dt))


@pytest.mark.parametrize("mode", MODES)
def test_reduce_scatter_forms(comm, mode):
    for n, dt in cases(mode):
        for name, make in OPS:
            if not op_applies(name, dt) or (n == BIG and name != "SUM"):
                continue
            op = make()
            want = expect([data(n, dt, r, salt=RANK) for r in range(SIZE)], op.type, dt)
            out = torch.zeros(n, dtype=dt)
            ins = [data(n, dt, RANK, salt=dst) for dst in range(SIZE)]
            run(comm, mode, lambda a: comm.reduce_scatter(out, ins, op, async_op=a))
            close(out, want)
            out = torch.zeros(n, dtype=dt)
            flat = torch.cat(ins)
            run(comm, mode, lambda a: comm.reduce_scatter_single(out, flat, op, async_op=a))
            close(out, want)
            # reduce_scatter_v: rank r's share has n + r elements
            ins_v = [data(n + dst, dt, RANK, salt=dst) for dst in range(SIZE)]
            out = torch.zeros(n + RANK, dtype=dt)
            run(comm, mode, lambda a: comm.reduce_scatter_v(out, ins_v, op, async_op=a))
            close(out, expect([data(n + RANK, dt, r, salt=RANK) for r in range(SIZE)], op.type, dt))


# -- data movement

@pytest.mark.parametrize("mode", MODES)
def test_broadcast_and_point_to_point(comm, mode):
    for n, dt in cases(mode):
        root = (n + 1) % SIZE
        t = data(n, dt, RANK) if RANK == root else torch.zeros(n, dtype=dt)
        run(comm, mode, lambda a: comm.broadcast(t, root, async_op=a))
        close(t, data(n, dt, root))
        # a ring: send to the next rank, receive from the previous one
        nxt, prev = (RANK + 1) % SIZE, (RANK - 1) % SIZE
        got = torch.zeros(n, dtype=dt)
        if mode == "dropped":
            # the sent tensor is a temporary: only the dropped work keeps it alive
            comm.send(data(n, dt, RANK), nxt, async_op=True)
        else:
            sw = comm.send(data(n, dt, RANK), nxt, async_op=mode == "async")
        rw = comm.recv(got, prev, async_op=mode != "sync")
        if mode != "sync":
            rw.wait()
        if mode == "async":
            sw.wait()
        close(got, data(n, dt, prev))
    comm.barrier(False)


@pytest.mark.parametrize("mode", MODES)
def test_gathers(comm, mode):
    for n, dt in cases(mode):
        mine = data(n, dt, RANK)
        outs = [torch.zeros(n, dtype=dt) for _ in range(SIZE)]
        run(comm, mode, lambda a: comm.all_gather(outs, mine, async_op=a))
        for r in range(SIZE):
            close(outs[r], data(n, dt, r))
        flat = torch.zeros(n * SIZE, dtype=dt)
        run(comm, mode, lambda a: comm.all_gather_single(flat, mine, async_op=a))
        close(flat, torch.cat([data(n, dt, r) for r in range(SIZE)]))
        mine_v = data(n + RANK, dt, RANK)
        outs_v = [torch.zeros(n + r, dtype=dt) for r in range(SIZE)]
        run(comm, mode, lambda a: comm.all_gather_v(outs_v, mine_v, async_op=a))
        for r in range(SIZE):
            close(outs_v[r], data(n + r, dt, r))
        root = n % SIZE
        outs = [torch.zeros(n, dtype=dt) for _ in range(SIZE)] if RANK == root else []
        run(comm, mode, lambda a: comm.gather(outs, mine, root, async_op=a))
        if RANK == root:
            for r in range(SIZE):
                close(outs[r], data(n, dt, r))
        flat = torch.zeros(n * SIZE, dtype=dt) if RANK == root else None
        run(comm, mode, lambda a: comm.gather_single(flat, mine, root, async_op=a))
        if RANK == root:
            close(flat, torch.cat([data(n, dt, r) for r in range(SIZE)]))


@pytest.mark.parametrize("mode", MODES)
def test_scatter_and_all_to_all(comm, mode):
    for n, dt in cases(mode):
        root = (n + 2) % SIZE
        out = torch.zeros(n, dtype=dt)
        ins = [data(n, dt, root, salt=dst) for dst in range(SIZE)] if RANK == root else []
        run(comm, mode, lambda a: comm.scatter(out, ins, root, async_op=a))
        close(out, data(n, dt, root, salt=RANK))
        # all_to_all: block for dst = data(n, rank, salt=dst)
        ins = [data(n, dt, RANK, salt=dst) for dst in range(SIZE)]
        outs = [torch.zeros(n, dtype=dt) for _ in range(SIZE)]
        run(comm, mode, lambda a: comm.all_to_all(outs, ins, async_op=a))
        for src in range(SIZE):
            close(outs[src], data(n, dt, src, salt=RANK))
        flat_out = torch.zeros(n * SIZE, dtype=dt)
        flat_in = torch.cat(ins)
        run(comm, mode, lambda a: comm.all_to_all_single(flat_out, flat_in, async_op=a))
        close(flat_out, torch.cat([data(n, dt, src, salt=RANK) for src in range(SIZE)]))
        # all_to_all_v_single, 2-D: rank s sends (s + d) % 3 rows of 2 to rank d
        rows = lambda s, d: (s + d) % 3  # noqa: E731
        send_rows = [rows(RANK, d) for d in range(SIZE)]
        recv_rows = [rows(s, RANK) for s in range(SIZE)]
        inp = torch.cat([data(2 * rows(RANK, d), dt, RANK, salt=d) for d in range(SIZE)]).view(-1, 2)
        out = torch.zeros(sum(recv_rows), 2, dtype=dt)
        run(comm, mode, lambda a: comm.all_to_all_v_single(out, inp, recv_rows, send_rows, async_op=a))
        close(out.view(-1), torch.cat([data(2 * rows(s, RANK), dt, s, salt=RANK) for s in range(SIZE)]))


@pytest.mark.parametrize("mode", MODES)
def test_barrier_and_batch(comm, mode):
    run(comm, mode, lambda a: comm.barrier(a))
    got = torch.zeros(8)
    b = comm.batch_op_create()
    b.send(torch.full((8,), float(RANK)), (RANK + 1) % SIZE)
    b.recv(got, (RANK - 1) % SIZE)
    run(comm, mode, lambda a: b.issue(a))
    assert torch.equal(got, torch.full((8,), float((RANK - 1) % SIZE)))


def test_hints_and_timeouts_are_accepted(comm):
    t = torch.ones(4)
    comm.all_reduce(t, ReduceOp.SUM, False, hints={"some.hint": "1"}, timeout=timedelta(seconds=30))
    assert torch.equal(t, torch.full((4,), float(SIZE)))
    comm.set_timeout(timedelta(seconds=90))
    assert comm.get_options().timeout == timedelta(seconds=120)


# -- comm management

def test_queries(comm):
    assert comm.get_rank() == RANK and comm.get_size() == SIZE
    assert comm.get_name() == "torchcomms-tests" and comm.get_backend() == "gloo"
    assert comm.get_device() == torch.device("cpu")
    opts = comm.get_options()
    assert opts.abort_process_on_timeout_or_error is False and opts.timeout == timedelta(seconds=120)
    assert not comm.is_aborted()


def test_split(comm):
    evens = [r for r in range(SIZE) if r % 2 == 0]
    odds = [r for r in range(SIZE) if r % 2 == 1]
    mine = evens if RANK % 2 == 0 else odds
    sub = comm.split(mine, f"split-{RANK % 2}", timeout=timedelta(seconds=60))
    assert sub.get_size() == len(mine) and sub.get_rank() == mine.index(RANK)
    t = torch.tensor([float(RANK)])
    sub.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert t.item() == sum(mine)
    sub.finalize()
    # An empty list opts out: None; a list without the caller is an error.
    assert comm.split([], "nobody") is None
    others = [r for r in range(SIZE) if r != RANK]
    with pytest.raises(RuntimeError):
        comm.split(others[:1], "not-me")
    comm.barrier(False)


def test_reconfigure(comm):
    """torchcomms 0.3's fault tolerance: a comm made with enable_reconfigure
    has no members until reconfigure; re-formed from the handles in reverse
    list order, then shrunk from a set (ranked in the handles' byte order)
    without the last rank, which finalizes instead; collectives work after each."""
    rc = torchcomms.new_comm("gloo", "cpu", name="reconf", enable_reconfigure=True,
                             timeout=timedelta(seconds=60), abort_process_on_timeout_or_error=False)
    with pytest.raises(RuntimeError):
        rc.get_rank()
    mine = rc.get_init_handle()
    assert isinstance(mine, str) and mine and rc.get_init_handle() == mine
    handles = [None] * SIZE
    torchcomms.objcol.all_gather_object(comm, handles, mine)
    assert len(set(handles)) == SIZE
    order = list(reversed(handles))
    assert rc.reconfigure(1, order, timeout=timedelta(seconds=60)).is_completed()
    assert (rc.get_size(), rc.get_rank()) == (SIZE, SIZE - 1 - RANK)
    t = torch.tensor([float(RANK + 1)])
    rc.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert t.item() == SIZE * (SIZE + 1) / 2
    keep = handles[:-1]
    if RANK == SIZE - 1:
        rc.finalize()
    else:
        rc.reconfigure(2, set(keep), timeout=timedelta(seconds=60))
        assert (rc.get_size(), rc.get_rank()) == (SIZE - 1, sorted(keep).index(mine))
        t = torch.tensor([2.0])
        rc.all_reduce(t, ReduceOp.SUM, async_op=False)
        assert t.item() == 2.0 * (SIZE - 1)
        with pytest.raises(RuntimeError, match="init_handles"):
            rc.reconfigure(3, "not a list")
        rc.finalize()
    comm.barrier(False)

def test_windows(comm):
    win = comm.new_window()
    buf = torch.zeros(SIZE * 4, dtype=torch.float32)
    win.tensor_register(buf)
    assert win.get_tensor() is buf and win.dtype == torch.float32 and win.shape == [SIZE * 4]
    nxt, prev = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    w = win.put(torch.full((4,), float(RANK + 1)), nxt, RANK * 4, async_op=True)
    w.wait()
    win.signal(nxt, False)
    win.wait_signal(prev, False)
    assert torch.equal(buf[prev * 4:(prev + 1) * 4], torch.full((4,), float(prev + 1)))
    comm.barrier(False)
    got = torch.zeros(4)
    win.get(got, nxt, RANK * 4, False)  # what this rank put there
    assert torch.equal(got, torch.full((4,), float(RANK + 1)))
    # A plain tensor's memory cannot be mapped by a peer (only memory from
    # the library's allocator can): refused, pointing to put.
    with pytest.raises(torchcomms.TorchCommError, match="use put") as e:
        win.map_remote_tensor(nxt)
    assert e.value.code == 1004
    comm.barrier(False)
    win.tensor_deregister()


def test_object_collectives(comm):
    objcol = torchcomms.objcol
    mine = {"rank": RANK, "text": "x" * RANK}
    out = [None] * SIZE
    objcol.all_gather_object(comm, out, mine)
    assert out == [{"rank": r, "text": "x" * r} for r in range(SIZE)]
    gathered = [None] * SIZE if RANK == 0 else None
    objcol.gather_object(comm, mine, 0, gathered)
    if RANK == 0:
        assert gathered == out
    lst = [1, "two", {"three": 3}] if RANK == 1 % SIZE else [None, None, None]
    objcol.broadcast_object_list(comm, lst, 1 % SIZE)
    assert lst == [1, "two", {"three": 3}]
    got = [None]
    objcol.scatter_object_list(comm, 0, got, [f"for {r}" for r in range(SIZE)] if RANK == 0 else None)
    assert got == [f"for {RANK}"]
    if RANK == 0:
        objcol.send_object_list(comm, ["a", 2], 1, timeout=timedelta(seconds=30))
    elif RANK == 1:
        recv = [None, None]
        objcol.recv_object_list(comm, recv, 0)
        assert recv == ["a", 2]
    comm.barrier(False)


# -- stores

def test_torch_stores_as_store(tmp_path_factory):
    job = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), SIZE, False,
                        timedelta(seconds=60), wait_for_workers=False)
    if RANK == 0:
        job.set("tc-fs-path", str(tmp_path_factory.mktemp("fs") / "store"))
    stores = {
        "tcp": job,
        "prefix": dist.PrefixStore("pfx", job),
        "file": dist.FileStore(job.get("tc-fs-path").decode(), SIZE),
    }
    for kind, store in stores.items():
        c = torchcomms.new_comm("gloo", "cpu", name=f"store-{kind}", store=store,
                                abort_process_on_timeout_or_error=False)
        t = torch.tensor([1.0])
        c.all_reduce(t, ReduceOp.SUM, False)
        assert t.item() == SIZE, kind
        c.finalize()
    # A HashStore lives in one process: a one-rank comm (rank and size from
    # TORCHCOMM_RANK/TORCHCOMM_SIZE, which come before the launcher's).
    saved = {k: os.environ.get(k) for k in ("TORCHCOMM_RANK", "TORCHCOMM_SIZE")}
    os.environ.update(TORCHCOMM_RANK="0", TORCHCOMM_SIZE="1")
    try:
        solo = torchcomms.new_comm("gloo", "cpu", name="store-hash", store=dist.HashStore())
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    t = torch.tensor([3.0])
    solo.all_reduce(t, ReduceOp.SUM, False)
    assert solo.get_size() == 1 and t.item() == 3.0
    solo.finalize()


# -- bad arguments

def test_bad_arguments_name_the_argument(comm):
    t = torch.ones(4)
    cases = [
        (lambda: torchcomms.new_comm("ncclx", "cpu"), "argument 'backend'.*'gloo', 'nccl'"),
        (lambda: torchcomms.new_comm("gloo", "tpu"), "argument 'device'"),
        (lambda: torchcomms.new_comm("gloo", "cpu", timeout=5j), "argument 'timeout'"),
        (lambda: comm.all_reduce([1, 2], ReduceOp.SUM, False), "argument 'tensor'"),
        (lambda: comm.all_reduce(t, "sum", False), "argument 'op'"),
        (lambda: comm.all_reduce(torch.ones(4, 2).t(), ReduceOp.SUM, False), "argument 'tensor'.*contiguous"),
        (lambda: comm.all_reduce(torch.ones(2, dtype=torch.complex64), ReduceOp.SUM, False), "argument 'tensor'"),
        (lambda: comm.all_gather([t], t, False), "argument 'tensor_list'"),
        (lambda: comm.all_gather_single(torch.ones(3), t, False), "argument 'output'"),
        (lambda: comm.broadcast(t, SIZE + 3, False), "root"),
        (lambda: comm.send(t, -1, False), "dst|peer"),
        (lambda: comm.all_to_all_v_single(t, t, [1], [1], False), "argument 'output_split_sizes'"),
        (lambda: comm.all_reduce(t, ReduceOp.SUM, False, timeout=timedelta(seconds=-1)), "argument 'timeout'"),
        (lambda: ReduceOp.PREMUL_SUM(torch.ones(2)), "argument 'factor'"),
        (lambda: ReduceOp.PREMUL_SUM("x"), "argument 'factor'"),
        (lambda: comm.split([0], 7), "argument 'name'"),
    ]
    for call, pattern in cases:
        with pytest.raises(torchcomms.TorchCommError) as e:
            call()
        assert re.search(pattern, str(e.value)), (pattern, str(e.value))
        assert e.value.code in (1001, 1002, 1003), str(e.value)
    with pytest.raises(torchcomms.TorchCommError) as e:
        comm.get_init_handle()
    assert e.value.code == 1003 and "enable_reconfigure" in str(e.value)
    comm.barrier(False)

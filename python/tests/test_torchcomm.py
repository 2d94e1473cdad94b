"""The torchcomm package on every rank of a job started by tc-run (2 or 3
ranks): each operation with numpy arrays, torch tensors and plain buffers,
results checked; stores; windows; errors. Every rank runs every test in the
same order (collectives must match), so no test may skip on some ranks only.

    tc-run -n 3 -- python -m pytest -q python/tests
"""
import array
import ctypes
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import torchcomm as tc

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def comm():
    c = tc.Comm("gloo", name="pytest", timeout=300, abort_on_error=False)
    yield c
    c.finalize()
    c.destroy()


@pytest.fixture(scope="session")
def job_store():
    s = tc.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout=120)
    yield s
    s.close()


def test_constants_match_the_header():
    header = (ROOT / "include" / "torchcomm.h").read_text()
    defines = dict(re.findall(r"^#define (TC_\w+) (-?\d+)$", header, re.M))
    for dt in tc.DType:
        assert defines[f"TC_{dt.name}"] == str(int(dt))
    for op in tc.RedOp:
        assert defines[f"TC_{op.name}"] == str(int(op))
    for code, name in tc.ERROR_NAMES.items():
        assert defines[name] == str(code)
    codes = {n for n in defines if n.startswith("TC_ERR_")}
    assert codes == set(tc.ERROR_NAMES.values()), codes ^ set(tc.ERROR_NAMES.values())
    for st in tc.WorkStatus:
        assert defines[f"TC_WORK_{st.name}"] == str(int(st))
    from torchcomm import _lib

    for name in ("TC_COMM_OPTIONS_MAGIC", "TC_OP_OPTIONS_MAGIC", "TC_STORE_CALLBACKS_MAGIC", "TC_UNSET", "TC_ANY_SOURCE",
                 "TC_DEVICE_CUDA"):
        assert defines[name] == str(getattr(_lib, name))
    exported = set(re.findall(r"^(?:tc_result_t|void|const char) \*?(tc_\w+)\(", header, re.M))
    assert exported == set(_lib.PROTOTYPES), exported ^ set(_lib.PROTOTYPES)


def test_dtypes_map_both_ways():
    for dt in tc.DType:
        t = tc.to_torch_dtype(dt)
        assert tc.dtype_of(t) == dt
        assert tc.dtype_of(torch.empty(1, dtype=t)) == dt
        if dt not in (tc.DType.BFLOAT16, tc.DType.FLOAT8_E4M3, tc.DType.FLOAT8_E5M2):
            assert tc.dtype_of(tc.to_numpy_dtype(dt)) == dt
            assert tc.to_numpy_dtype(dt).itemsize == dt.itemsize
    assert tc.as_buffer(array.array("d", [1.0]), True, "x").dtype == tc.DType.FLOAT64
    assert tc.as_buffer(bytearray(3), True, "x").dtype == tc.DType.UINT8
    with pytest.raises(tc.TorchCommError) as e:
        tc.to_numpy_dtype(tc.DType.BFLOAT16)
    assert e.value.code == 1002


def test_version_and_errors_carry_code_and_detail(tmp_path):
    assert tc.version()[:2] == (0, 1)
    s = tc.FileStore(str(tmp_path / "s"))
    with pytest.raises(tc.TorchCommError) as e:
        s.wait(["missing"], timeout=0.05)
    assert e.value.code == 1006 and e.value.name == "TC_ERR_TIMEOUT" and "missing" in e.value.detail
    with pytest.raises(tc.TorchCommError) as e:
        tc.Comm("nosuch", rank=0, world_size=1, store=s)
    assert e.value.code == 1002 and "nosuch" in str(e.value)
    with pytest.raises(tc.TorchCommError, match="is neither"):
        tc.Comm("gloo", device="tpu", rank=0, world_size=1, store=s)


def test_store_commands(job_store, comm):
    s = tc.PrefixStore("pytest", job_store)
    r, n = comm.rank, comm.size
    s.set(f"k{r}", b"v\0" + bytes([r]))
    s.wait([f"k{i}" for i in range(n)], timeout=60)
    assert s.check([f"k{i}" for i in range(n)]) and not s.check(["never"])
    assert s.get("k0") == b"v\0\0"
    small = bytearray(1)
    with pytest.raises(tc.TorchCommError) as e:
        s.get_into("k0", small)
    assert e.value.code == 1014
    big = bytearray(8)
    assert s.get_into("k0", big) == 3
    assert s.add("counter", 5) >= 5
    mine = f"cas{r}"
    assert s.compare_set(mine, "", "a") == b"a"
    assert s.compare_set(mine, "a", "b") == b"b"
    assert s.compare_set(mine, "x", "c") == b"b"
    assert s.delete_key(mine) and not s.delete_key(mine)
    assert s.num_keys() >= n
    assert job_store.port == int(os.environ["MASTER_PORT"])
    comm.barrier()


def test_all_reduce_each_buffer_kind(comm):
    r, n = comm.rank, comm.size
    a = np.full(5, r + 1, dtype=np.float32)
    comm.all_reduce(a, tc.ReduceOp.SUM)
    assert (a == n * (n + 1) / 2).all()
    t = torch.full((2, 3), r, dtype=torch.int64)
    comm.all_reduce(t, "max")
    assert (t == n - 1).all()
    b = array.array("i", [r] * 3)
    comm.all_reduce(b, tc.RedOp.MIN)
    assert list(b) == [0, 0, 0]
    h = torch.full((4,), float(r + 1), dtype=torch.bfloat16)
    comm.all_reduce(h, tc.ReduceOp.premul_sum(2.0))
    assert (h.float() == n * (n + 1)).all()
    f = np.array([r + 1.0])
    comm.all_reduce(f, tc.ReduceOp.AVG)
    assert f[0] == pytest.approx((n + 1) / 2)
    raw = np.full(2, 1, dtype=np.uint64)
    comm.all_reduce(tc.raw(raw.ctypes.data, 2, "uint64"), tc.ReduceOp.PRODUCT)
    assert (raw == 1).all()


def test_rooted_and_gather_family(comm):
    r, n = comm.rank, comm.size
    b = torch.full((3,), 7 if r == n - 1 else 0, dtype=torch.int32)
    comm.broadcast(b, n - 1)
    assert (b == 7).all()
    x = np.full(2, r + 1, dtype=np.int64)
    comm.reduce(x, 0, tc.ReduceOp.SUM)
    if r == 0:
        assert (x == n * (n + 1) // 2).all()
    inp = np.full(2, r, dtype=np.float64)
    out = np.empty(2 * n)
    comm.all_gather_single(out, inp)
    assert (out == np.repeat(np.arange(n), 2)).all()
    outs = [torch.empty(2, dtype=torch.float64) for _ in range(n)]
    comm.all_gather(outs, inp)
    assert all((o == i).all() for i, o in enumerate(outs))
    counts = [i + 1 for i in range(n)]
    vout = np.empty(sum(counts), dtype=np.int32)
    comm.all_gather_v(vout, counts, np.full(r + 1, r, dtype=np.int32))
    assert (vout == np.repeat(np.arange(n), counts)).all()
    g = [np.empty(2) for _ in range(n)] if r == 0 else None
    comm.gather(g, inp, 0)
    if r == 0:
        assert all((o == i).all() for i, o in enumerate(g))
    sc = np.empty(2)
    comm.scatter(sc, [np.full(2, float(i)) for i in range(n)] if r == 1 else None, 1)
    assert (sc == r).all()


def test_reduce_scatter_and_all_to_all(comm):
    r, n = comm.rank, comm.size
    out = np.empty(3, dtype=np.float32)
    comm.reduce_scatter_single(out, np.ones(3 * n, dtype=np.float32))
    assert (out == n).all()
    comm.reduce_scatter(out, [np.full(3, r, dtype=np.float32) for _ in range(n)], "max")
    assert (out == n - 1).all()
    counts = [i + 1 for i in range(n)]
    vout = np.empty(r + 1, dtype=np.int64)
    comm.reduce_scatter_v(vout, np.ones(sum(counts), dtype=np.int64), counts)
    assert (vout == n).all()
    a_in = torch.tensor([10 * r + j for j in range(n)], dtype=torch.int32)
    a_out = torch.empty(n, dtype=torch.int32)
    comm.all_to_all_single(a_out, a_in)
    assert a_out.tolist() == [10 * i + r for i in range(n)]
    l_out = [np.empty(1, dtype=np.int32) for _ in range(n)]
    comm.all_to_all(l_out, [np.array([10 * r + j], dtype=np.int32) for j in range(n)])
    assert [int(o[0]) for o in l_out] == [10 * i + r for i in range(n)]
    in_counts, out_counts = counts, [r + 1] * n
    v_out = np.empty(n * (r + 1), dtype=np.int32)
    comm.all_to_all_v_single(v_out, out_counts, np.full(sum(in_counts), r, dtype=np.int32), in_counts)
    assert (v_out == np.repeat(np.arange(n), r + 1)).all()


def test_p2p_batch_and_async_work(comm):
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    got = np.empty(4, dtype=np.int64)
    # Operations of a comm run in issue order: even ranks send first.
    if r % 2 == 0:
        comm.send(np.full(4, r, dtype=np.int64), nxt)
        comm.recv(got, prv)
    else:
        comm.recv(got, prv)
        comm.send(np.full(4, r, dtype=np.int64), nxt)
    assert (got == prv).all()
    got2 = torch.empty(4, dtype=torch.int64)
    w = comm.batch().send(torch.full((4,), r), nxt).recv(got2, prv).issue(async_op=True, hints={"k": "v"})
    w.wait()
    assert (got2 == prv).all() and w.is_completed() and w.status() == tc.WorkStatus.COMPLETED
    x = np.ones(1000, dtype=np.float32)
    w = comm.all_reduce(x, async_op=True, timeout=120)
    del x  # the work keeps the buffer alive
    w.wait()
    comm.barrier()


def test_recv_from_any_source(comm):
    r, n = comm.rank, comm.size
    if r == 0:
        senders = []
        for _ in range(n - 1):
            got = np.full(3, -1, dtype=np.int32)
            w = comm.recv(got, tc.ANY_SOURCE, tag=5, async_op=True)
            w.wait()
            senders.append(w.source())
            assert (got == senders[-1]).all()
        assert sorted(senders) == list(range(1, n))
    else:
        w = comm.send(np.full(3, r, dtype=np.int32), 0, tag=5, async_op=True)
        w.wait()
        with pytest.raises(tc.TorchCommError, match="not a receive"):
            w.source()
    comm.barrier()


def test_argument_errors_lose_nothing(comm):
    n = comm.size
    with pytest.raises(tc.TorchCommError) as e:
        comm.all_gather_single(np.empty(2 * n + 1), np.empty(2))
    assert e.value.code == 1002 and "'output' has" in str(e.value)
    with pytest.raises(tc.TorchCommError) as e:
        comm.broadcast(np.empty(2), n)
    assert e.value.code == 1002 and "root" in e.value.detail
    with pytest.raises(tc.TorchCommError) as e:
        comm.all_reduce(np.empty(2, dtype=np.float32), tc.ReduceOp.BAND)
    assert e.value.code == 1004 and "float32" in e.value.detail
    with pytest.raises(tc.TorchCommError, match="not C-contiguous"):
        comm.all_reduce(np.empty((4, 4))[:, 0])
    with pytest.raises(tc.TorchCommError, match="read-only"):
        comm.all_reduce(b"1234")
    with pytest.raises(TypeError, match="unknown option"):
        comm.barrier(asyncop=True)
    assert comm.async_error() is None
    x = np.ones(2)
    comm.all_reduce(x)
    assert (x == n).all()


def test_non_native_byte_order_is_refused(comm):
    # The library reads elements in this machine's byte order: a '>f4'
    # [1, 2, 3] was all-reduced as garbage. Every entry point that takes an
    # array refuses it, naming the argument; each rank refuses before any
    # communication, so the comm stays in step.
    r, n = comm.rank, comm.size
    swapped = np.dtype(np.float32).newbyteorder("S")  # '>f4' here
    x = np.array([1, 2, 3], dtype=swapped)
    native = np.zeros(3 * n, np.float32)

    def refused(what, fn, *args):
        with pytest.raises(tc.TorchCommError) as e:
            fn(*args)
        assert e.value.code == 1002 and f"'{what}' has non-native byte order" in e.value.detail, e.value

    refused("buf", comm.all_reduce, x)
    refused("buf", comm.all_reduce, memoryview(x))
    refused("buf", comm.broadcast, x, 0)
    refused("input", comm.all_gather_single, native, x)
    refused("output", comm.all_gather_single, native.astype(swapped), np.zeros(3, np.float32))
    refused("bufs[1]", comm.broadcast_coalesced, [np.zeros(2), x], 0)
    refused("buf", comm.batch().send, x, (r + 1) % n)
    refused("buf", comm.register, x)
    refused("factor", tc.ReduceOp.premul_sum, np.ones(1, swapped))
    refused("dtype", tc.raw, native.ctypes.data, 3, swapped)
    mem = comm.mem_alloc(16)
    refused("dtype", mem.numpy, swapped)
    mem.free()
    refused("output", comm.all_gather_p, native.astype(swapped))
    with comm.all_gather_p(native) as ag:
        refused("input", ag.exec, x)
    with tc.Window(comm) as win:
        refused("buf", win.register, x)
        win.register(native)
        refused("src", win.put, x, (r + 1) % n)
        refused("dst", win.get, x, (r + 1) % n)
        comm.barrier()
        win.deregister()
    y = x.astype(x.dtype.newbyteorder("="))  # converted, as the error says
    comm.all_reduce(y)
    assert y.tolist() == [n, 2 * n, 3 * n]


def test_shrink_excluding_the_last_rank(comm):
    r, n = comm.rank, comm.size
    if r == n - 1:
        return  # excluded: takes no part
    small = comm.shrink([n - 1], "pytest-shrunk")
    assert small.size == n - 1 and small.rank == r and small.name == "pytest-shrunk"
    v = np.array([r + 1])
    small.all_reduce(v)
    assert v[0] == (n - 1) * n // 2
    small.finalize()
    small.destroy()
    with pytest.raises(tc.TorchCommError) as e:
        comm.shrink([r], "pytest-self")
    assert "excluded" in str(e.value)


def test_split_window_memory_flight_recorder(comm):
    r, n = comm.rank, comm.size
    pair = comm.split([0, 1] if r < 2 else [], "pytest-pair")
    assert (pair is None) == (r >= 2)
    if pair is not None:
        assert pair.size == 2 and pair.rank == r and pair.name == "pytest-pair"
        v = np.array([r + 1])
        pair.all_reduce(v)
        assert v[0] == 3
        pair.finalize()
        pair.destroy()
    nxt, prv = (r + 1) % n, (r - 1) % n
    mem = comm.mem_alloc(64)
    view = mem.numpy("int64")
    with tc.Window(comm) as win:
        win.register(mem)
        assert win.map_remote(r) == mem.ptr
        win.put(np.array([r, 100 * r], dtype=np.int64), nxt, 16).wait()
        win.signal(nxt)
        win.wait_signal(prv, timeout=120)
        assert view[2] == prv and view[3] == 100 * prv
        with pytest.raises(tc.TorchCommError) as e:
            win.put(np.zeros(2, dtype=np.int64), nxt, 60)
        assert e.value.code == 1002
        win.deregister()
    mem.free()
    assert "all_reduce" in comm.dump_flight_recorder()
    lines: list = []
    tc.set_log_callback(lambda level, line: lines.append(line))
    tc.set_log_callback(None)
    buf = np.zeros(8, dtype=np.uint8)
    with pytest.raises(tc.TorchCommError) as e:
        comm.register(buf)
    assert e.value.code == 1004
    hook_calls = []
    comm.set_abort_hook(lambda code, msg: hook_calls.append(code))
    comm.set_abort_hook(None)
    assert ctypes.sizeof(tc.library.tc_comm_new.argtypes[2]._type_) > 0


class DLPackOnly:
    """Exports a tensor through DLPack alone (no buffer protocol, not a
    numpy array or tensor itself)."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, **kwargs):
        return self.t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def test_dlpack_exporter_is_written_in_place(comm):
    t = torch.full((3,), comm.rank + 1.0, dtype=torch.float64)
    b = tc.as_buffer(DLPackOnly(t), True, "buf")
    assert b.ptr == t.data_ptr() and b.count == 3 and b.dtype == tc.DType.FLOAT64
    comm.all_reduce(DLPackOnly(t))
    assert (t == comm.size * (comm.size + 1) / 2).all()

"""Coalesced broadcast, the gradient reducer (built-in and Python hooks) and
sparse all-reduce through the torchcomm package, on every rank of a job
started by tc-run (2 or 3 ranks), each result compared with a numpy or
torch reference computed from every rank's inputs. Every rank runs every
test in the same order.

    tc-run -n 3 -- python -m pytest -q python/tests/test_grad_families.py
"""
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import torchcomm as tc


@pytest.fixture(scope="module")
def comm():
    c = tc.Comm("gloo", name="pytest-grad", timeout=300, abort_on_error=False)
    yield c
    c.finalize()
    c.destroy()


def test_broadcast_coalesced(comm):
    root = comm.size - 1
    rng = np.random.default_rng(comm.rank)  # different data on every rank
    bufs = [rng.standard_normal(7).astype(np.float32), rng.integers(0, 99, 5),
            torch.from_numpy(rng.standard_normal(3)), np.empty(0, np.float32), bytearray(rng.bytes(9))]
    rroot = np.random.default_rng(root)
    expected = [rroot.standard_normal(7).astype(np.float32), rroot.integers(0, 99, 5),
                rroot.standard_normal(3), np.empty(0, np.float32), np.frombuffer(rroot.bytes(9), np.uint8)]
    comm.broadcast_coalesced(bufs, root, buffer_bytes=16)
    for got, want in zip(bufs, expected):
        got = got.numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
        np.testing.assert_array_equal(got, want)
    x = torch.full((4,), float(comm.rank))
    comm.broadcast_coalesced([x], 0, async_op=True).wait()
    assert torch.equal(x, torch.zeros(4))
    with pytest.raises(tc.TorchCommError) as e:
        comm.broadcast_coalesced([x], 0, buffer_bytes=0)
    assert e.value.code == 1002 and "buffer_bytes" in str(e.value)


def rank_grads(rank, shapes, dtype=np.float32):
    """Gradient i of `rank`: reproducible random values."""
    rng = np.random.default_rng(100 + rank)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


SHAPES = [(3, 4), (5,), (2, 2), (7,)]


def test_reducer_averages_like_numpy(comm):
    grads = rank_grads(comm.rank, SHAPES)
    every = [rank_grads(r, SHAPES) for r in range(comm.size)]
    with tc.Reducer(comm, grads, bucket_cap_bytes=32, first_bucket_bytes=16) as red:
        assert red.num_buckets >= 3
        for _ in range(2):  # the reducer serves iteration after iteration
            for g, mine in zip(grads, rank_grads(comm.rank, SHAPES)):
                g[...] = mine
            for i in reversed(range(len(grads))):
                red.mark_ready(i)
            red.finalize()
            for i, g in enumerate(grads):
                want = sum(e[i].astype(np.float64) for e in every) / comm.size
                np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-6)
                assert red.grad(i) is g


def fp16_reference(every, i, size):
    """fp16_compress_hook in numpy float16: cast, divide by the world size
    in float16, sum (in float32, rounded once), cast back."""
    parts = [(e[i].astype(np.float16) / np.float16(size)).astype(np.float32) for e in every]
    return sum(parts).astype(np.float16).astype(np.float32)


def test_reducer_fp16_compress_and_bucket_views(comm):
    every = [rank_grads(r, SHAPES) for r in range(comm.size)]
    layout = [torch.empty(s) for s in SHAPES]
    with tc.Reducer(comm, layout, gradient_as_bucket_view=True, bucket_cap_bytes=48) as red:
        red.set_builtin_hook("fp16_compress")
        views = [red.grad(i) for i in range(len(SHAPES))]
        for v, s, mine in zip(views, SHAPES, every[comm.rank]):
            assert isinstance(v, torch.Tensor) and tuple(v.shape) == s
            v.copy_(torch.from_numpy(mine))
        for i in range(len(SHAPES)):
            red.mark_ready(i)
        red.finalize()
        for i, v in enumerate(views):
            np.testing.assert_array_equal(v.numpy(), fp16_reference(every, i, comm.size))
    with tc.Reducer(comm, [((2, 3), np.float64)], gradient_as_bucket_view=True) as red:
        g = red.grad(0)
        assert isinstance(g, np.ndarray) and g.shape == (2, 3) and g.dtype == np.float64
        g[...] = comm.rank + 1
        red.mark_ready(0)
        work = red.finalize_async()
        work.wait()
        np.testing.assert_allclose(g, (comm.size + 1) / 2)


def test_reducer_powersgd_rank_one_is_exact(comm):
    # Rank k's matrix is (k + 1) u v^T: the average has rank 1, so rank-1
    # PowerSGD reproduces it up to rounding; the vector goes uncompressed.
    u = np.linspace(1.0, 2.0, 12, dtype=np.float32)
    v = np.linspace(-1.0, 1.0, 20, dtype=np.float32)
    grads = [np.outer(u, v) * (comm.rank + 1), np.full(5, comm.rank + 1.0, np.float32)]
    mean = sum(range(1, comm.size + 1)) / comm.size
    with tc.Reducer(comm, grads) as red:
        red.set_powersgd(matrix_approximation_rank=1, start_powerSGD_iter=0)
        for i in range(len(grads)):
            red.mark_ready(i)
        red.finalize()
    np.testing.assert_allclose(grads[0], np.outer(u, v) * mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads[1], np.full(5, mean, np.float32), rtol=1e-6)


def test_reducer_python_hook(comm):
    grads = [np.full(4, comm.rank + 1.0, np.float32), np.full(3, -comm.rank - 1.0, np.float32)]
    seen = []

    def max_hook(bucket):
        seen.append((bucket.index, bucket.num_buckets, bucket.is_last, bucket.grad_indices, bucket.lengths))
        assert bucket.buffer.dtype == np.float32 and bucket.buffer.size == bucket.count == sum(bucket.lengths)
        return bucket.comm.all_reduce(bucket.buffer, tc.ReduceOp.MAX, async_op=True)

    with tc.Reducer(comm, grads, first_bucket_bytes=16, bucket_cap_bytes=16) as red:
        red.set_hook(max_hook)
        red.mark_ready(1)
        red.mark_ready(0)
        red.finalize()
        assert sorted(i for s in seen for i in s[3]) == [0, 1]
        assert [s[2] for s in seen] == [s[0] == s[1] - 1 for s in seen]
        np.testing.assert_array_equal(grads[0], np.full(4, comm.size, np.float32))
        np.testing.assert_array_equal(grads[1], np.full(3, -1.0, np.float32))

        # A raising hook: an error result, the exception chained; nothing
        # written back, and the reducer serves the next iteration.
        def broken(bucket):
            raise ValueError("hook says no")

        red.set_hook(broken)
        grads[0][:] = 5.0
        with pytest.raises(tc.TorchCommError) as e:
            red.mark_ready(0)
            red.mark_ready(1)
        assert e.value.code == 1003 and "hook says no" in str(e.value)
        assert isinstance(e.value.__cause__, ValueError)
        with pytest.raises(tc.TorchCommError):
            red.finalize()
        assert (grads[0] == 5.0).all()

        red.set_hook(lambda bucket: None)  # not a Work: refused, no crash
        with pytest.raises(tc.TorchCommError) as e:
            red.mark_ready(0)
            red.mark_ready(1)
        assert "not a live torchcomm.Work" in str(e.value)
        with pytest.raises(tc.TorchCommError):
            red.finalize()

        red.set_builtin_hook(tc.Hook.NOOP)
        grads[0][:], grads[1][:] = comm.rank, comm.rank
        red.mark_ready(0)
        red.mark_ready(1)
        red.finalize()
        assert (grads[0] == comm.rank).all() and (grads[1] == comm.rank).all()


def rank_sparse(rank, size):
    """Rank r's uncoalesced COO input: 2 sparse dims, 1 dense, duplicates."""
    g = torch.Generator().manual_seed(7 + rank)
    nnz = 3 + rank
    idx = torch.stack([torch.randint(0, 4, (nnz,), generator=g), torch.randint(0, size + 1, (nnz,), generator=g)])
    vals = torch.randn(nnz, 2, generator=g, dtype=torch.float64)
    return torch.sparse_coo_tensor(idx, vals, (4, size + 1, 2), check_invariants=True)


def test_sparse_all_reduce_torch(comm):
    mine = rank_sparse(comm.rank, comm.size)
    everyone = [rank_sparse(r, comm.size) for r in range(comm.size)]
    cat = torch.sparse_coo_tensor(torch.cat([t._indices() for t in everyone], 1),
                                  torch.cat([t._values() for t in everyone]), mine.shape,
                                  check_invariants=True).coalesce()
    got = comm.sparse_all_reduce(mine)
    assert got.is_sparse and got.is_coalesced() and got.shape == mine.shape
    assert torch.equal(got.indices(), cat.indices())
    torch.testing.assert_close(got.values(), cat.values(), rtol=1e-12, atol=1e-12)
    avg = comm.sparse_all_reduce(mine, op=tc.ReduceOp.AVG)
    torch.testing.assert_close(avg.values(), cat.values() / comm.size, rtol=1e-12, atol=1e-12)
    with pytest.raises(tc.TorchCommError) as e:
        comm.sparse_all_reduce(mine, op="max")
    assert e.value.code == 1004


def test_sparse_all_reduce_numpy(comm):
    # Rank r: entries at rows r and r + 1 of a (size + 1) x 3 int32 matrix.
    idx = np.array([[comm.rank, comm.rank + 1], [0, 2]])
    vals = np.array([1, 10 * (comm.rank + 1)], dtype=np.int32)
    shape = (comm.size + 1, 3)
    i, v, s = comm.sparse_all_reduce(idx, vals, shape)
    dense = np.zeros(shape, np.int32)
    for r in range(comm.size):
        dense[r, 0] += 1
        dense[r + 1, 2] += 10 * (r + 1)
    ref = torch.from_numpy(dense).to_sparse()
    assert s == shape and v.dtype == np.int32
    np.testing.assert_array_equal(i, ref.indices().numpy())
    np.testing.assert_array_equal(v, ref.values().numpy())
    with pytest.raises(tc.TorchCommError) as e:
        comm.sparse_all_reduce(idx, vals[:1], shape)
    assert e.value.code == 1002 and "'values'" in str(e.value)


def test_hook_and_reducer_constants_match_the_header():
    import re
    from pathlib import Path

    from torchcomm import _lib

    header = (Path(__file__).resolve().parents[2] / "include" / "torchcomm.h").read_text()
    defines = dict(re.findall(r"^#define (TC_\w+) (-?\d+)$", header, re.M))
    for h in tc.Hook:
        assert defines[f"TC_HOOK_{h.name}"] == str(int(h))
    for name in ("TC_REDUCER_OPTIONS_MAGIC", "TC_REDUCER_OPTIONS_VERSION", "TC_POWERSGD_OPTIONS_MAGIC",
                 "TC_POWERSGD_OPTIONS_VERSION"):
        assert defines[name] == str(getattr(_lib, name))


def test_sparse_all_reduce_refuses_async(comm):
    mine = rank_sparse(comm.rank, comm.size)
    with pytest.raises(tc.TorchCommError) as e:
        comm.sparse_all_reduce(mine, async_op=True)
    assert e.value.code == 1002 and "async_op" in str(e.value)


def other_order(dtype):
    """`dtype` in the byte order that is not this machine's ('>f4' here)."""
    return np.dtype(dtype).newbyteorder("S")


def test_reducer_and_sparse_refuse_non_native_byte_order(comm):
    # Read in this machine's order, a '>f4' gradient was averaged as
    # garbage; every rank refuses locally, naming the argument.
    swapped = other_order(np.float32)
    cases = [([np.zeros(4, np.float32), np.zeros(3, swapped)], False, "grads[1]"),
             ([np.zeros(3, swapped)], True, "grads[0]"),
             ([((2, 3), swapped)], True, "grads[0]")]
    for grads, as_view, what in cases:
        with pytest.raises(tc.TorchCommError) as e:
            tc.Reducer(comm, grads, gradient_as_bucket_view=as_view)
        assert e.value.code == 1002 and f"'{what}' has non-native byte order" in e.value.detail, e.value

    grads = [np.full(4, comm.rank + 1.0, np.float32)]
    with tc.Reducer(comm, grads) as red:
        red.set_hook(lambda bucket: bucket.set_buffer(np.zeros(bucket.count, swapped)))
        with pytest.raises(tc.TorchCommError) as e:
            red.mark_ready(0)
        assert "'buf' has non-native byte order" in str(e.value.__cause__)
        with pytest.raises(tc.TorchCommError):
            red.finalize()
        red.set_builtin_hook("allreduce")  # the reducer serves the next iteration
        red.mark_ready(0)
        red.finalize()
    np.testing.assert_allclose(grads[0], (comm.size + 1) / 2)

    with pytest.raises(tc.TorchCommError) as e:
        comm.sparse_all_reduce(np.array([[0, 1]]), np.ones(2, swapped), (3,))
    assert e.value.code == 1002 and "'values' has non-native byte order" in e.value.detail


def test_sparse_all_reduce_refuses_non_integer_indices(comm):
    vals = np.ones(2, np.float32)
    for idx in ([[0.7, 2.9]], np.array([[0.0, 2.0]]), np.array([[True, False]])):
        with pytest.raises(tc.TorchCommError) as e:  # [[0.7, 2.9]] was summed as [[0, 2]]
            comm.sparse_all_reduce(idx, vals, (4,))
        assert e.value.code == 1002 and "'indices' must be integers" in e.value.detail, e.value
    with pytest.raises(tc.TorchCommError, match="'indices' holds 9223372036854775809, beyond int64"):
        comm.sparse_all_reduce(np.array([[2**63 + 1, 0]], np.uint64), vals, (4,))
    # Integers of any width and byte order keep their values.
    idx = np.array([[comm.rank, 3]], dtype=other_order(np.int32))
    i, v, s = comm.sparse_all_reduce(idx, vals, (4,))
    assert s == (4,) and i.tolist() == [list(range(comm.size)) + [3]]
    assert v.tolist() == [1.0] * comm.size + [float(comm.size)]


def test_reducer_views_keep_its_memory_alive(tmp_path):
    # Writing through grad(i) (or a hook's bucket.buffer) after free() or
    # the with block was a SIGSEGV; the views now keep the memory, and only
    # the memory, until the last of them goes. A child process of its own,
    # so that a crash fails this test only.
    child = Path(__file__).with_name("reducer_view_lifetime.py")
    scenarios = ["numpy_free", "torch_with", "from_numpy", "hook_buffer", "released"]
    r = subprocess.run([sys.executable, str(child), str(tmp_path), *scenarios], capture_output=True, text=True,
                       timeout=240)
    assert r.returncode != -signal.SIGSEGV, f"SIGSEGV after: {r.stdout!r}"
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:-1] == [f"{s}: held" for s in scenarios]

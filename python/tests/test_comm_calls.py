"""Comm queries and settings, gather_single, tags, window get, the
persistent all-gather and operation hooks, on every rank of a job started
by tc-run (2 or 3 ranks; every rank runs every test in the same order)."""
import threading

import numpy as np
import pytest
import torch

import torchcomm as tc


@pytest.fixture(scope="module")
def comm():
    c = tc.Comm("gloo", name="pytest-calls", timeout=300, abort_on_error=False)
    yield c
    c.finalize()
    c.destroy()


def test_ranks_version_timeout_hints(comm):
    r, n = comm.rank, comm.size
    assert comm.ranks() == list(range(n))
    if r > 0:  # rank 0 left out: the others keep their root-comm ranks
        rest = comm.shrink([0], "pytest-rest")
        assert rest.ranks() == list(range(1, n))
        rest.finalize()
        rest.destroy()
    assert comm.backend_version.startswith("gloo ")
    with pytest.raises(tc.TorchCommError) as e:
        comm.set_timeout(0)
    assert e.value.code == 1002 and "timeout" in e.value.detail
    comm.set_timeout(300)
    comm.set_hints({"timeout_ms": "300000", "abort_on_error": "0"})
    with pytest.raises(tc.TorchCommError) as e:
        comm.set_hints({"gloo.iface": "lo"})
    assert e.value.code == 1004 and "gloo.iface" in e.value.detail
    with pytest.raises(tc.TorchCommError) as e:
        comm.set_hints({"no.such.hint": "1"})
    assert e.value.code == 1002 and "no.such.hint" in e.value.detail


def test_gather_single(comm):
    r, n = comm.rank, comm.size
    root = n - 1
    out = torch.full((2 * n,), -1, dtype=torch.int32) if r == root else None
    comm.gather_single(out, torch.tensor([10 * r, 10 * r + 1], dtype=torch.int32), root)
    if r == root:
        assert out.tolist() == [v for k in range(n) for v in (10 * k, 10 * k + 1)]
    # The binding refuses root's bad output in the call's place: every
    # rank's call fails, the others' naming the root and the reason. (Its
    # own comm: a peer's finalize reports the refused call as failed.)
    refusing = tc.Comm("gloo", name="pytest-calls-refusal", timeout=120, abort_on_error=False)
    small = np.empty(2 * n - 1 if r == root else 0, dtype=np.int32)
    with pytest.raises(tc.TorchCommError, match="'output' has"):
        refusing.gather_single(small, np.empty(2, dtype=np.int32), root)
    with pytest.raises(tc.TorchCommError, match="needed on the root"):
        refusing.gather_single(None, np.empty(2, dtype=np.int32), root)
    refusing.destroy()


def test_tags_select_the_matching_transfer(comm):
    r = comm.rank
    with pytest.raises(tc.TorchCommError, match="'tag'"):
        comm.barrier(tag=-1)
    with pytest.raises(tc.TorchCommError) as e:  # the library: tags are for send/recv only
        comm.barrier(tag=5)
    assert e.value.code == 1002 and "tag" in e.value.detail
    if r > 1:
        return  # ranks 0 and 1 only; p2p involves no other rank
    peer = 1 - r
    a, b = np.full(3, 7, dtype=np.int64), np.full(5, 3, dtype=np.int64)
    got_a, got_b = np.zeros(3, dtype=np.int64), np.zeros(5, dtype=np.int64)
    seen = []
    hook_id = comm.add_pre_hook(seen.append)
    batch = comm.batch()
    if r == 0:  # tag 7 sent first, received second
        batch.send(a, peer, tag=7).send(b, peer, tag=3)
    else:
        batch.recv(got_b, peer, tag=3).recv(got_a, peer, tag=7)
    batch.issue().wait()
    batch.free()
    if r == 1:
        assert (got_a == 7).all() and (got_b == 3).all()
    v = np.array([40 + r])
    if r == 0:
        comm.send(v, peer, tag=9)
    else:
        comm.recv(v, peer, tag=9, async_op=True).wait()
    assert v[0] == 40
    comm.remove_hook(hook_id)  # the hooks saw each entry's tag
    assert [(i.op_name, i.tag) for i in seen] == [("batch_p2p", 0), ("send" if r == 0 else "recv", 9)]
    assert (seen[0].input_tags, seen[0].output_tags) == (([7, 3], []) if r == 0 else ([], [3, 7]))
    assert (seen[1].input_tags, seen[1].output_tags) == (([9], []) if r == 0 else ([], [9]))


def test_window_get(comm):
    r, n = comm.rank, comm.size
    nxt = (r + 1) % n
    mine = np.array([r, 100 * r, 1000 * r], dtype=np.int64)
    with tc.Window(comm) as win:
        win.register(mine)
        comm.barrier()
        got = np.full(2, -1, dtype=np.int64)
        win.get(got, nxt, 8).wait()
        assert got.tolist() == [100 * nxt, 1000 * nxt]
        one = torch.zeros(1, dtype=torch.int64)
        win.get(one, nxt, 0, async_op=True).wait()
        assert one.item() == nxt
        with pytest.raises(tc.TorchCommError) as e:
            win.get(got, nxt, 16)
        assert e.value.code == 1002 and "src_offset" in e.value.detail
        comm.barrier()
        win.deregister()


def test_persistent_all_gather(comm):
    r, n = comm.rank, comm.size
    out = np.full(2 * n, -1.0, dtype=np.float32)
    with comm.all_gather_p(out) as ag:
        assert ag.count == 2
        for rnd in range(2):
            ag.exec(np.array([r + rnd, -r], dtype=np.float32), async_op=True).wait()
            assert out.tolist() == [v for k in range(n) for v in (k + rnd, -k)]
        with pytest.raises(tc.TorchCommError, match="'input' has 3"):
            ag.exec(np.zeros(3, dtype=np.float32))
    with pytest.raises(ValueError, match="closed"):
        ag.exec(np.zeros(2, dtype=np.float32))
    with pytest.raises(tc.TorchCommError, match="not a multiple"):
        comm.all_gather_p(np.zeros(2 * n + 1, dtype=np.float32))


def test_operation_hooks(comm, capfd):
    seen, threads = [], []
    pre = comm.add_pre_hook(lambda info: seen.append(info))
    post = comm.add_post_hook(lambda info: (seen.append(info), threads.append(threading.get_ident())))
    x = np.ones(4, dtype=np.float32)
    comm.all_reduce(x)
    comm.barrier(async_op=True).wait()  # post hooks ran before completion
    assert [(i.phase, i.op_name) for i in seen] == [
        ("pre", "all_reduce"), ("post", "all_reduce"), ("pre", "barrier"), ("post", "barrier")]
    first = seen[0]
    assert first.rank == comm.rank and first.size == comm.size and first.dtype == tc.DType.FLOAT32
    assert first.inputs[0][:3] == (x.ctypes.data, 4, tc.DType.FLOAT32)
    assert seen[1].status == 0 and seen[1].completed and seen[3].async_op
    assert len(threads) == 2  # whichever thread ran them (ctypes took the GIL there)

    def bad(info):
        raise RuntimeError("hook failure")

    bad_id = comm.add_pre_hook(bad)
    comm.barrier()  # the exception is printed, not raised
    assert "hook failure" in capfd.readouterr().err
    assert len(seen) == 6
    for hook_id in (pre, post, bad_id):
        comm.remove_hook(hook_id)
    with pytest.raises(tc.TorchCommError) as e:
        comm.remove_hook(pre)
    assert e.value.code == 1015
    with pytest.raises(tc.TorchCommError, match="not callable"):
        comm.add_pre_hook(None)
    comm.all_reduce(x)
    assert len(seen) == 6  # removed: not called again

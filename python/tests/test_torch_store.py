"""torch.distributed stores as libtorchcomm stores (torchcomm.torch_store),
on every rank of a job started by tc-run or torchrun (2, 3 or 4 ranks):
torch's TCPStore (hosted by torch on rank 0) and PrefixStore over it reached
natively, FileStore, HashStore and a Python Store subclass through the
callback store; each bootstraps a comm that all-reduces. Every rank runs
every test in the same order.

    tc-run -n 3 -- python -m pytest -q python/tests/test_torch_store.py
"""
import os
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import torchcomm as tc
from torchcomm.store import CallbackStore
from torchcomm.torch_store import from_torch

RANK = int(os.environ["RANK"])
SIZE = int(os.environ["WORLD_SIZE"])


@pytest.fixture(scope="module")
def job_store():
    # The launcher's store (tc-run's server or torchrun's agent store).
    s = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), SIZE, False,
                      timedelta(seconds=60), wait_for_workers=False)
    yield s


def shared(job_store, key, make):
    """`make()` on rank 0, its (str) result published to the others."""
    if RANK == 0:
        job_store.set(key, make())
    return job_store.get(key).decode()


def comm_sum(store, name):
    """A comm over `store` all-reduces a rank-dependent tensor."""
    c = tc.Comm("gloo", name=name, store=store, rank=RANK, world_size=SIZE, timeout=60, abort_on_error=False)
    try:
        x = torch.full((5,), float(RANK + 1))
        c.all_reduce(x, tc.ReduceOp.SUM)
        assert torch.equal(x, torch.full((5,), SIZE * (SIZE + 1) / 2))
    finally:
        c.finalize()
        c.destroy()


@pytest.fixture(scope="module")
def torch_tcp(job_store):
    """torch's own TCPStore server on rank 0, torch clients on the others."""
    server = dist.TCPStore("127.0.0.1", 0, SIZE, True, timedelta(seconds=60), wait_for_workers=False) \
        if RANK == 0 else None
    port = int(shared(job_store, "tcpstore-port", lambda: str(server.port)))
    s = server or dist.TCPStore("127.0.0.1", port, SIZE, False, timedelta(seconds=60), wait_for_workers=False)
    yield s
    # The server (rank 0) stays up until every rank is done with it.
    s.add("tcp-done", 1)
    while RANK == 0 and s.add("tcp-done", 0) < SIZE:
        time.sleep(0.01)


def test_tcpstore_is_reached_natively(torch_tcp):
    ours = from_torch(torch_tcp)
    assert type(ours) is tc.TCPStore and ours.port == torch_tcp.port
    ours.set(f"ours-{RANK}", b"x")
    torch_tcp.wait([f"ours-{r}" for r in range(SIZE)])
    assert torch_tcp.get(f"ours-{RANK}") == b"x"
    torch_tcp.set(f"theirs-{RANK}", "y")
    assert ours.get(f"theirs-{RANK}") == b"y"
    comm_sum(ours, "torch-tcp")


def test_prefixstore_over_tcpstore_is_native_with_the_same_prefix(torch_tcp):
    p = dist.PrefixStore("outer", dist.PrefixStore("inner", torch_tcp))
    ours = from_torch(p)
    assert isinstance(ours, tc.PrefixStore)
    ours.set(f"k{RANK}", b"v")
    assert torch_tcp.get(f"inner/outer/k{RANK}") == b"v"
    assert p.get(f"k{RANK}") == b"v"
    assert not torch_tcp.check([f"torchcomm-probe"])  # the probe key is gone
    comm_sum(ours, "torch-prefix")


def test_filestore_through_callbacks(job_store, tmp_path_factory):
    path = shared(job_store, "filestore-path", lambda: str(tmp_path_factory.mktemp("fs") / "store"))
    fs = dist.FileStore(path, SIZE)
    ours = from_torch(fs)
    assert isinstance(ours, CallbackStore)
    ours.set(f"f{RANK}", b"hello")
    assert fs.get(f"f{RANK}") == b"hello"
    assert ours.add("counter", 2) >= 2
    comm_sum(ours, "torch-file")
    pre = from_torch(dist.PrefixStore("pre", fs))
    pre.set("k", b"v")
    assert fs.get("pre/k") == b"v"
    comm_sum(pre, "torch-file-prefix")


def test_hashstore_and_errors_through_callbacks():
    hs = dist.HashStore()
    hs.set_timeout(timedelta(seconds=2))
    ours = from_torch(hs)
    ours.set("a", b"1")
    assert hs.get("a") == b"1" and ours.get("a") == b"1"
    assert ours.add("n", 5) == 5 and hs.add("n", 1) == 6
    assert ours.check(["a", "n"]) and not ours.check(["a", "missing"])
    assert ours.compare_set("a", b"1", b"2") == b"2"
    assert ours.delete_key("a") and not ours.check(["a"])
    assert ours.num_keys() == hs.num_keys()
    with pytest.raises(tc.TorchCommError) as e:
        ours.wait(["missing"], timeout=0.2)
    assert e.value.name == "TC_ERR_TIMEOUT" and "store callback wait" in str(e.value)
    # A one-rank comm bootstraps over a HashStore (it lives in one process).
    c = tc.Comm("gloo", name="torch-hash", store=ours, rank=0, world_size=1, abort_on_error=False)
    x = torch.ones(3)
    c.all_reduce(x, tc.ReduceOp.SUM)
    assert torch.equal(x, torch.ones(3))
    c.finalize()
    c.destroy()


class Flaky(dist.Store):
    """A user store: forwards to a torch store, fails one get on demand."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.fail = False
        self.threads = set()

    def set(self, key, value):
        self.threads.add(threading.get_ident())
        self.inner.set(key, value)

    def get(self, key):
        self.threads.add(threading.get_ident())
        if self.fail:
            self.fail = False
            raise ValueError(f"no luck with {key}")
        return self.inner.get(key)

    def add(self, key, delta):
        return self.inner.add(key, delta)

    def check(self, keys):
        return self.inner.check(keys)

    def wait(self, keys, timeout=None):
        self.inner.wait(keys, timeout) if timeout is not None else self.inner.wait(keys)


def test_python_store_subclass_and_its_exceptions(job_store):
    user = Flaky(dist.PrefixStore("user", job_store))
    ours = from_torch(user)
    assert isinstance(ours, CallbackStore)
    user.fail = True
    with pytest.raises(tc.TorchCommError) as e:
        ours.get("anything")
    assert e.value.name == "TC_ERR_REMOTE"
    assert 'store callback get (key "anything") failed: ValueError: no luck with anything' in str(e.value)
    with pytest.raises(tc.TorchCommError) as e:
        ours.delete_key("k")  # Flaky has no delete_key
    assert e.value.name == "TC_ERR_UNSUPPORTED"
    comm_sum(ours, "torch-user")
    # Calls from several threads at once (each takes the GIL in the callback).
    errors = []

    def adder():
        try:
            for _ in range(50):
                ours.add(f"threads{RANK}", 1)
        except Exception as ex:  # pragma: no cover - reported below
            errors.append(ex)

    ts = [threading.Thread(target=adder) for _ in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errors and ours.add(f"threads{RANK}", 0) == 200


def test_not_a_store_is_refused():
    with pytest.raises(TypeError, match="argument 'store'"):
        from_torch(object())

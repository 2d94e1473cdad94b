"""Limits of the reducer's Python hooks (issue 25): a hook that points a
bucket at a buffer the reducer cannot cast back is refused at
``set_buffer``, and the failed iteration writes nothing back. Every rank
runs every test in the same order.

    tc-run -n 2 -- python -m pytest -q python/tests/test_limits.py
"""
import numpy as np
import pytest

import torchcomm as tc


@pytest.fixture(scope="module")
def comm():
    c = tc.Comm("gloo", name="pytest-limits", timeout=300, abort_on_error=False)
    yield c
    c.finalize()
    c.destroy()


def test_set_buffer_refuses_integer_dtypes(comm):
    own = [np.full(4, comm.rank + 1.0, np.float32), np.full(3, comm.rank + 2.0, np.float32)]
    grads = [g.copy() for g in own]
    refusals = []

    def int32_hook(bucket):
        with pytest.raises(tc.TorchCommError) as e:
            bucket.set_buffer(np.zeros(bucket.count, np.int32))
        refusals.append(e.value)
        raise e.value

    with tc.Reducer(comm, grads, first_bucket_bytes=16, bucket_cap_bytes=16) as red:
        red.set_hook(int32_hook)
        with pytest.raises(tc.TorchCommError):
            red.mark_ready(1)
            red.mark_ready(0)
        with pytest.raises(tc.TorchCommError):
            red.finalize()
        assert refusals and all(e.code == 1002 and "int32" in str(e) for e in refusals), refusals
        for g, o in zip(grads, own):
            np.testing.assert_array_equal(g, o)


def test_binding_refusal_fails_every_rank_in_step():
    """The last rank all-reduces a big-endian ('>f4') array, which the
    binding refuses before calling the library: every other rank's
    all_reduce fails at once naming that rank and the argument (not at its
    timeout, not pairing with that rank's next call), and the next
    all_reduce gives every rank the right sum. (Its own comm: a peer's
    finalize reports the refused call as an operation that failed.)"""
    import time
    comm = tc.Comm("gloo", name="pytest-binding-refusal", timeout=120, abort_on_error=False)
    odd = comm.size - 1
    x = np.full(4, comm.rank + 1.0, np.dtype(">f4") if comm.rank == odd else np.float32)
    t0 = time.monotonic()
    with pytest.raises(tc.TorchCommError) as e:
        comm.all_reduce(x)
    took = time.monotonic() - t0
    if comm.rank == odd:
        assert e.value.code == 1002 and "'buf'" in str(e.value), e.value
    else:
        assert f"rank {odd} refused this call (tc_all_reduce)" in str(e.value), e.value
        assert "'buf'" in str(e.value) and took < 60, (took, e.value)
    y = np.full(4, comm.rank + 1.0, np.float32)
    comm.all_reduce(y)
    n = comm.size
    assert (y == n * (n + 1) / 2).all(), y
    comm.destroy()

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

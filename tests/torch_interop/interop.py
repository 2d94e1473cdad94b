"""libtorchcomm against the real PyTorch (scripts/test-torch-interop.sh).

    interop.py stores    one process: torch's TCPStore client against our
                         store server, our client against torch's server;
                         every command both implement, PrefixStore, several
                         clients at once; values cross-checked both ways
    interop.py gloo-pg   under a launcher: torch's gloo process group
                         bootstrapped from the environment, all_reduce checked
    interop.py mixed     under a launcher: torch.distributed and torchcomm in
                         the same processes over one store (torch's keys under
                         "torch/", ours under "torchcomm/"), the same
                         collectives on the same data, results compared
Exit status 0 only when every check held; each check prints one line.
"""
import os
import sys
import threading
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

import torchcomm as tc

T = timedelta(seconds=60)
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def raises(fn, what, *excs):
    try:
        fn()
    except excs or (Exception,) as e:
        check(True, f"{what} ({type(e).__name__})")
        return e
    check(False, f"{what}: nothing raised")
    return None


def torch_client_commands(ts, ours, tag):
    """`ts`: torch client, `ours`: our client on the same server."""
    ts.set("t/a", b"x\0y")
    check(ts.get("t/a") == b"x\0y" and ours.get("t/a") == b"x\0y", f"{tag}: set/get, binary value")
    ours.set("t/b", "from-ours")
    check(ts.get("t/b") == b"from-ours", f"{tag}: torch reads our set")
    check(ts.add("t/n", 5) == 5 and ours.add("t/n", 2) == 7 and ts.add("t/n", -1) == 6, f"{tag}: add both ways")
    check(ts.get("t/n") == b"6" and ours.get("t/n") == b"6", f"{tag}: add stores decimal text")
    check(ts.compare_set("t/c", "", "one") == b"one", f"{tag}: compare_set on a missing key, empty expected")
    check(ts.compare_set("t/c", "one", "two") == b"two", f"{tag}: compare_set swaps")
    check(ts.compare_set("t/c", "nope", "three") == b"two", f"{tag}: compare_set mismatch keeps the value")
    check(ours.compare_set("t/c", "two", "four") == b"four" and ts.get("t/c") == b"four",
          f"{tag}: our compare_set seen by torch")
    check(ts.compare_set("t/missing", "x", "y") == b"x" and not ts.check(["t/missing"]),
          f"{tag}: compare_set on a missing key with expected stores nothing")
    check(ts.check(["t/a", "t/b"]) and not ts.check(["t/a", "t/none"]), f"{tag}: check")
    check(ours.check(["t/a", "t/b"]) and not ours.check(["t/none"]), f"{tag}: our check")
    ts.wait(["t/a", "t/b"], T)
    ours.wait(["t/a", "t/b"], timeout=60)
    raises(lambda: ts.wait(["t/never"], timedelta(milliseconds=100)), f"{tag}: torch wait times out")
    e = raises(lambda: ours.wait(["t/never"], timeout=0.1), f"{tag}: our wait times out", tc.TorchCommError)
    check(e is not None and e.code == 1006, f"{tag}: our wait timeout is TC_ERR_TIMEOUT")
    waiter_saw = []
    th = threading.Thread(target=lambda: (ours.wait(["t/late"], timeout=60), waiter_saw.append(ours.get("t/late"))))
    th.start()
    ts.set("t/late", b"now")
    th.join(120)
    check(waiter_saw == [b"now"], f"{tag}: our wait woken by torch's set")
    ts.append("t/log", b"ab")
    ts.append("t/log", b"cd")
    check(ts.get("t/log") == b"abcd" and ours.get("t/log") == b"abcd", f"{tag}: append")
    ts.multi_set(["t/m1", "t/m2"], [b"1", b"2"])
    check(ts.multi_get(["t/m1", "t/m2"]) == [b"1", b"2"] and ours.get("t/m2") == b"2", f"{tag}: multi_set/multi_get")
    n = ts.num_keys()
    check(n == ours.num_keys() and n >= 8, f"{tag}: num_keys agrees ({n})")
    check(ts.delete_key("t/m1") and not ts.delete_key("t/m1"), f"{tag}: delete_key")
    check(ours.delete_key("t/m2") and not ts.check(["t/m2"]) and ts.num_keys() == n - 2,
          f"{tag}: our delete seen by torch")
    tp = dist.PrefixStore("scope", ts)
    op = tc.PrefixStore("scope", ours)
    tp.set("k", b"v")
    check(op.get("k") == b"v" and ours.get("scope/k") == b"v", f"{tag}: torch PrefixStore = our PrefixStore")
    op.set("k2", b"w")
    check(tp.get("k2") == b"w" and tp.add("cnt", 3) == 3 and op.add("cnt", 1) == 4, f"{tag}: prefixes both ways")


def many_clients(make_client, ours, tag, clients=4, rounds=50):
    def work(i):
        c = make_client()
        for _ in range(rounds):
            c.add("many/counter", 1)
        c.set(f"many/done{i}", str(i))
    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    ours.wait([f"many/done{i}" for i in range(clients)], timeout=120)
    for t in threads:
        t.join(120)
    check(ours.get("many/counter") == str(clients * rounds).encode(),
          f"{tag}: {clients} clients at once, {clients * rounds} adds counted")


def stores():
    # torch's client against our server.
    server = tc.TCPStore("127.0.0.1", 0, is_server=True, timeout=60)
    port = server.port
    ts = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=T)
    torch_client_commands(ts, server, "torch client -> our server")
    many_clients(lambda: dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=T),
                 server, "torch clients -> our server")
    # our client against torch's server (both of its implementations).
    for libuv in (True, False):
        tserver = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=T, use_libuv=libuv)
        ours = tc.TCPStore("127.0.0.1", tserver.port, timeout=60)
        tag = f"our client -> torch server (libuv={libuv})"
        torch_client_commands(tserver, ours, tag)
        many_clients(lambda: tc.TCPStore("127.0.0.1", tserver.port, timeout=60), ours, tag)
        check(tserver.get("many/counter") == b"200", f"{tag}: torch reads our clients' adds")
        ours.close()
    # wait-for-workers: torch's master waits for our client to join.
    tserver = dist.TCPStore("127.0.0.1", 0, world_size=2, is_master=True, wait_for_workers=False, timeout=T)
    joined = tc.TCPStore("127.0.0.1", tserver.port, world_size=2, timeout=60)
    check(tserver.check(["init/"]) or tserver.num_keys() >= 1, "our client joins torch's world_size count")
    joined.close()


def env_rank():
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def gloo_pg():
    rank, size = env_rank()
    dist.init_process_group("gloo", timeout=T)
    x = torch.full((4,), float(rank + 1))
    dist.all_reduce(x)
    check(bool((x == size * (size + 1) / 2).all()), f"rank {rank}: torch gloo all_reduce under this launcher")
    dist.barrier()
    dist.destroy_process_group()


def mixed():
    rank, size = env_rank()
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    base = dist.TCPStore(addr, port, world_size=size, is_master=False, wait_for_workers=False, timeout=T)
    dist.init_process_group("gloo", store=dist.PrefixStore("torch", base), rank=rank, world_size=size, timeout=T)
    ours_base = tc.TCPStore(addr, port, timeout=60)
    comm = tc.Comm("gloo", name="mixed", rank=rank, world_size=size, store=tc.PrefixStore("torchcomm", ours_base),
                   timeout=120)
    g = torch.Generator().manual_seed(rank)
    data = torch.randn(1000, generator=g, dtype=torch.float64)
    a, b = data.clone(), data.clone()
    dist.all_reduce(a)
    comm.all_reduce(b)
    check(torch.allclose(a, b, rtol=0, atol=1e-12), f"rank {rank}: all_reduce: torch.distributed == torchcomm")
    ints = torch.arange(6, dtype=torch.int64) * (rank + 1)
    ta, tb = [torch.empty_like(ints) for _ in range(size)], torch.empty(6 * size, dtype=torch.int64)
    dist.all_gather(ta, ints)
    comm.all_gather_single(tb, ints)
    check(torch.equal(torch.cat(ta), tb), f"rank {rank}: all_gather: torch.distributed == torchcomm")
    m1, m2 = torch.full((3,), float(rank)), torch.full((3,), float(rank))
    dist.all_reduce(m1, op=dist.ReduceOp.MAX)
    comm.all_reduce(m2, tc.ReduceOp.MAX)
    check(torch.equal(m1, m2), f"rank {rank}: max: torch.distributed == torchcomm")
    bt = torch.full((5,), float(rank))
    bo = bt.clone()
    dist.broadcast(bt, size - 1)
    comm.broadcast(bo, size - 1)
    check(torch.equal(bt, bo), f"rank {rank}: broadcast: torch.distributed == torchcomm")
    dist.barrier()
    comm.barrier()
    comm.finalize()
    comm.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    {"stores": stores, "gloo-pg": gloo_pg, "mixed": mixed}[sys.argv[1]]()
    if failures:
        print(f"interop {sys.argv[1]}: {len(failures)} check(s) failed", flush=True)
        sys.exit(1)
    print(f"interop {sys.argv[1]}: all checks passed", flush=True)

"""Data-parallel training of a tiny torch model, torchcomm doing the gradient
exchange: every rank trains on its own shard of a regression problem and a
torchcomm Reducer averages the gradients as DDP does (each gradient marked
ready by a hook as backward produces it, buckets exchanged while backward
goes on, finalize before the optimizer step). At the end each rank
checks that its weights equal the other ranks' and those of the same model
trained in one process on the whole data set.

    pip install ./python          # or PYTHONPATH=python
    tc-run -n 2 -- python examples/python/train.py
    torchrun --nproc-per-node 2 examples/python/train.py
"""
import sys

import torch

import torchcomm as tc


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def data(n: int = 64):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1 * torch.randn(n, 1, generator=g)
    return x, y


def train(model, x, y, steps, reducer=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad(set_to_none=False)  # the reducer holds the gradient buffers
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # marks each gradient ready (see attach_reducer)
        if reducer:
            reducer.finalize()  # every gradient now holds the average
        opt.step()
    return loss.item()


def attach_reducer(comm: tc.Comm, model: torch.nn.Module) -> tc.Reducer:
    params = list(model.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)  # backward accumulates into these in place
    reducer = tc.Reducer(comm, [p.grad for p in params])

    def ready(i, p):
        def hook(_param):
            if p.grad.data_ptr() != reducer.grad(i).data_ptr():
                raise RuntimeError(f"parameter {i}'s gradient was reallocated")
            reducer.mark_ready(i)
        return hook

    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(ready(i, p))
    return reducer


def main() -> int:
    comm = tc.Comm("gloo", name="train")
    rank, size = comm.rank, comm.size
    x, y = data()
    shard = slice(rank * len(x) // size, (rank + 1) * len(x) // size)
    model = make_model()
    with attach_reducer(comm, model) as reducer:
        loss = train(model, x[shard], y[shard], 50, reducer)

    # Equal shards: the mean of shard gradients is the full-batch gradient.
    reference = make_model()
    train(reference, x, y, 50)
    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
    everyone = torch.empty(size * mine.numel())
    comm.all_gather_single(everyone, mine)
    same_everywhere = all(torch.equal(everyone.view(size, -1)[r], mine) for r in range(size))
    matches = torch.allclose(mine, ref, atol=1e-5)
    print(f"rank {rank}/{size}: loss {loss:.4f}, weights equal on every rank: {same_everywhere}, "
          f"match one-process training: {matches}")
    comm.finalize()
    comm.destroy()
    return 0 if same_everywhere and matches else 1


if __name__ == "__main__":
    sys.exit(main())

"""Data-parallel training of a tiny torch model, torchcomm doing the gradient
exchange: every rank trains on its own shard of a regression problem and
averages gradients with one all_reduce per step. At the end each rank
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


def train(model, x, y, steps, exchange=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if exchange:
            exchange(model)
        opt.step()
    return loss.item()


def average_gradients(comm: tc.Comm):
    def exchange(model):
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])  # one message per step
        comm.all_reduce(flat, tc.ReduceOp.AVG)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    return exchange


def main() -> int:
    comm = tc.Comm("gloo", name="train")
    rank, size = comm.rank, comm.size
    x, y = data()
    shard = slice(rank * len(x) // size, (rank + 1) * len(x) // size)
    model = make_model()
    loss = train(model, x[shard], y[shard], 50, average_gradients(comm))

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

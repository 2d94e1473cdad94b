# Seed 004's "Basic Usage" example. Changed: the import line; device cpu and
# backend "gloo"; the FileStore's path and size (the seed hard-codes
# "/tmp/torchcomm_test" and 2 ranks: a file left by an earlier run or shared
# with another job breaks the rendezvous, so the launcher passes a fresh path
# and the job's size).
import os
import torch
import torchcomm.torchcomms as torchcomms

# Create a store for rendezvous
store = torch.distributed.FileStore(os.environ["TC_EXAMPLE_FILESTORE"], int(os.environ["WORLD_SIZE"]))

# Create a communicator
device = torch.device("cpu")
comm = torchcomms.new_comm("gloo", device, store=store)

# Get rank and world size
rank = comm.get_rank()
world_size = comm.get_size()

# Create a tensor
tensor = torch.ones(10, device=device) * rank

# Perform an all-reduce operation
comm.all_reduce(tensor, torchcomms.ReduceOp.SUM, async_op=False)

# Tensor now contains the sum of all ranks
print(f"Rank {rank}: {tensor}")

# Finalize the communicator
comm.finalize()
assert torch.equal(tensor, torch.full((10,), float(world_size * (world_size - 1) // 2)))  # added check

# Seed 004's "Asynchronous Operations" example. Changed: the import line;
# device cpu and backend "gloo"; the FileStore's path and size (as in
# basic_usage.py). It is written for 2 ranks (every rank but 0 receives from
# 0, which sends once), so the launcher runs it on 2.
import os
import torch
import torchcomm.torchcomms as torchcomms

# Create a communicator
store = torch.distributed.FileStore(os.environ["TC_EXAMPLE_FILESTORE"], int(os.environ["WORLD_SIZE"]))
device = torch.device("cpu")
comm = torchcomms.new_comm("gloo", device, store=store)

rank = comm.get_rank()
world_size = comm.get_size()

# Create tensors
send_tensor = torch.ones(10, device=device) * rank
recv_tensor = torch.zeros(10, device=device)

# Perform asynchronous send and receive
if rank == 0:
    work = comm.send(send_tensor, dst=1, async_op=True)
else:
    work = comm.recv(recv_tensor, src=0, async_op=True)

# Do other work while communication is in progress
# ...

# Wait for the operation to complete
work.wait()

# Finalize the communicator
comm.finalize()
assert rank == 0 or torch.equal(recv_tensor, torch.zeros(10))  # added check: rank 0 sent zeros

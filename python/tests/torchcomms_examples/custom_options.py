# Seed 004's "Custom Options" example. Changed: the import line; backend
# "gloo" (the seed's "ncclx" is Meta's NCCL fork) and device cpu; the seed's
# `torch.timedelta`, which does not exist, is datetime's timedelta. No store:
# the comm bootstraps from the launcher's environment.
from datetime import timedelta

import torch
import torchcomm.torchcomms as torchcomms

# Create a communicator with custom options
device = torch.device("cpu")
comm = torchcomms.new_comm(
    "gloo",
    device,
    timeout=timedelta(seconds=60),
    abort_process_on_timeout_or_error=False,
    hints={
        "torchcomm::ncclx::high_priority_stream": "true",
        "backend_option": "value"
    },
)

# ...
comm.finalize()

"""Put on PYTHONPATH by conftest.py, so every process the tests start reads it at start-up.

DeepSpeed on a CPU JIT-builds a C++ shared-memory all-reduce (`deepspeed_shm_comm`) the first time a process calls
`deepspeed.initialize`: on a fresh machine ~50 s of compiling on 2 cores of a slow CPU, ~150 s on one. The trainer
does not depend on it: without it DeepSpeed reduces through torch.distributed (gloo on CPU), its path wherever the
kernel cannot be built. So in the processes that `accelerate launch --use_deepspeed` starts, the tests take that
path."""
import os
import sys

if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
    import deepspeed.comm.torch  # noqa: F401  (deepspeed.comm.torch, the attribute, is the torch package)

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None

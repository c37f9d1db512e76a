"""The last step of setup/oat_venv.sh: load every part of Oat's stack the way a run loads it, and
build what DeepSpeed compiles on first use, so that the first training run (or test) does not.

    .venv-oat/bin/python setup/oat_stack_check.py

Prints one line of versions; exits non-zero, with the error, if any part does not load.
- vLLM's compiled extension (vllm/_C.abi3.so; needs setup/elf_weak_version.py on Debian 12),
- launchpad (its courier RPC loads TensorFlow's runtime) and pyarrow's plasma store (Oat's IPC),
- Oat's program, actor and learner modules,
- DeepSpeed's CPU ops, JIT-compiled with g++ into VENV/torch_extensions (1-3 minutes once, then loaded
  in seconds; oat_dppo/patches.py says why there): the shared-memory collectives of its CPU
  accelerator and the CPU FusedAdam that Oat's optimizer is.
"""

import os

os.environ.setdefault("USE_TF", "0")  # as oat_dppo does (oat_dppo/__init__.py): transformers must not load TensorFlow
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

from oat_dppo import patches  # noqa: E402

patches.apply()  # what every node process does first: here, TORCH_EXTENSIONS_DIR

import launchpad  # noqa: E402,F401
import oat.algorithms.ppo  # noqa: E402,F401
import oat.interface  # noqa: E402,F401
import transformers  # noqa: E402
import vllm  # noqa: E402
from deepspeed.ops.op_builder.cpu import FusedAdamBuilder, ShareMemCommBuilder  # noqa: E402
from pyarrow import plasma  # noqa: E402,F401
from vllm import _custom_ops  # noqa: E402,F401  (loads vllm/_C.abi3.so)

import deepspeed  # noqa: E402

for builder in (ShareMemCommBuilder(), FusedAdamBuilder()):
    builder.load(verbose=False)
print(f"Oat stack: torch {torch.__version__}, transformers {transformers.__version__}, vllm {vllm.__version__}, "
      f"deepspeed {deepspeed.__version__}, launchpad + plasma, DeepSpeed CPU ops built")

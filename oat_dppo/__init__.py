"""oat_dppo: LLM agent RL with a pluggable trust region (DPPO and its baselines).

The trust region (`oat_dppo.trust_region`) is pure torch and the public contract; everything else
(environments, agent loop, local and Oat backends) calls it.
"""

import logging
import os

# A torch project: transformers must never import TensorFlow. Oat's launchpad brings TensorFlow into the
# Oat environment (its courier RPC links libtensorflow_framework; .venv-oat installs tensorflow-cpu
# without the Keras/opt_einsum stack it does not use), and transformers 4.51 imports any TensorFlow it
# finds, which then fails on the missing pieces. Set before anything imports transformers; launchpad's
# node processes inherit it. A user's explicit USE_TF wins.
os.environ.setdefault("USE_TF", "0")

__version__ = "0.2.0"


def _quiet_deepspeed_accelerator_detection(record: logging.LogRecord) -> bool:
    """DeepSpeed, where it is installed (the Oat profile, the test environment), logs which accelerator
    it detected whenever transformers, accelerate or peft import it: two lines on every command,
    DeepSpeed used or not. Only those two are dropped; every other DeepSpeed message passes."""
    return not record.pathname.replace("\\", "/").endswith("accelerator/real_accelerator.py")


logging.getLogger("DeepSpeed").addFilter(_quiet_deepspeed_accelerator_detection)

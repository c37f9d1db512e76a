"""The local backend: everything in one process (CPU, or one GPU with a colocated vLLM)."""

import logging

from oat_dppo.backends.local.trainer import LocalTrainer, build_engine, resolve_engine

# DeepSpeed, where it is installed beside the project (the Oat profile, the test environment), logs
# its accelerator choice whenever transformers or accelerate import it, which they do on the local
# path too. The local backend never uses DeepSpeed: keep its errors, drop the chatter.
logging.getLogger("DeepSpeed").addFilter(lambda record: record.levelno >= logging.ERROR)

__all__ = ["LocalTrainer", "build_engine", "resolve_engine"]

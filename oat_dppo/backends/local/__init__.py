"""The local backend: everything in one process (CPU, or one GPU with a colocated vLLM)."""

import logging

# DeepSpeed, where it is installed beside the project (the Oat profile, the test environment), logs
# its accelerator choice whenever transformers, accelerate or peft import it, which they do on the
# local path too. The local backend never uses DeepSpeed: keep its errors, drop the chatter. (Before
# the imports below: they are what imports it.)
logging.getLogger("DeepSpeed").addFilter(lambda record: record.levelno >= logging.ERROR)

from oat_dppo.backends.local.trainer import LocalTrainer, build_engine, resolve_engine  # noqa: E402

__all__ = ["LocalTrainer", "build_engine", "resolve_engine"]

"""The local backend: everything in one process (CPU, or one GPU with a colocated vLLM)."""

from oat_dppo.backends.local.trainer import LocalTrainer, build_engine, resolve_engine, resolve_engine_dtype

__all__ = ["LocalTrainer", "build_engine", "resolve_engine", "resolve_engine_dtype"]

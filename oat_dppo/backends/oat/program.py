"""Build Oat's launchpad program with the DPPO learner and actor, and launch it.

The node classes live in importable modules (`learner.py`, `actor.py`), never `__main__`: launchpad
pickles node constructors by reference, so every node imports the same installed code. Without CUDA,
`--gpus N` counts process slots that Oat splits as it splits GPUs (N/2 vLLM actors, N/2 DeepSpeed
learners), `cpu.py` stands in for Oat's CUDA-only lines, and the nodes share the cores (`cpu_environment`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from oat_dppo import patches
from oat_dppo.backends.oat.args import finalize, from_train_config, learners_per_group, oat_validate
from oat_dppo.backends.oat.supervise import Stopped, Supervisor
from oat_dppo.config import ConfigError, TrainConfig
from oat_dppo.stopping import say, stop_status

# vLLM-CPU reserves this many GiB of KV cache per actor unless told otherwise (its own default is 4).
CPU_KV_CACHE_GIB = 1


def resolve_model(args) -> None:
    """`--model smollm2` / `gemma3-270m` / `tiny-*` (this project's names) -> a directory Oat's learner and vLLM
    load (a tiny model saved under the run's save path, with its seed's weights). Hub ids and paths stay."""
    from oat_dppo.models import TINY_MODELS, engine_model_source, load_policy
    from oat_dppo.model_names import GEMMA3, SMOLLM2

    name = args.pretrain.strip().lower()
    if name in (SMOLLM2, GEMMA3):
        args.pretrain = engine_model_source(args.pretrain, None, None, args.save_path)
    elif name in TINY_MODELS:
        out = Path(args.save_path) / "initial_model"
        model, tok = load_policy(name, seed=args.seed)
        args.pretrain = engine_model_source(name, model, tok, out)


def node_threads(nodes: int) -> int:
    """torch threads per node process when `nodes` compute processes share this machine's cores."""
    return max(1, (os.cpu_count() or 1) // max(1, nodes))


def cpu_environment(args) -> dict[str, str]:
    """What every node process inherits without CUDA: its torch threads (--threads, else an even share of the
    cores between actors and learners), vLLM-CPU's KV-cache size, DeepSpeed's CPU accelerator."""
    if patches.cuda_present():
        return {}
    nodes = 2 * learners_per_group(args)  # this launcher's; Oat pairs one actor with each learner
    threads = str(args.threads or node_threads(nodes))
    return {
        "OMP_NUM_THREADS": threads,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_CACHE_GIB)),
        "DS_ACCELERATOR": "cpu",
    }


def build_program(args):
    """(launchpad program, local resources) from Oat's `get_program`."""
    # Oat's program and our actor import vLLM and launchpad: only when a program is built
    from oat.interface import get_program

    from oat_dppo.backends.oat.actor import DPPOActor
    from oat_dppo.backends.oat.learner import DPPOLearner

    with patches.gpu_slots(args.gpus):
        try:
            return get_program(args, DPPOLearner, DPPOActor)
        except AssertionError as e:  # Oat's topology checks (GPUs per actor, actors per learner)
            raise ConfigError(f"Oat rejects the topology (--gpus {args.gpus}, --num-gpus-per-actor "
                              f"{args.num_gpus_per_actor}): {e}") from None


def launch(cfg, *, finalized: bool = False) -> int:
    """Run `cfg` (a `DPPOArgs`, or a `TrainConfig` from `oat_dppo.main.run`) on Oat: this launcher's node
    group, until its last node ended. Returns the exit status (`supervise`)."""
    args = from_train_config(cfg) if isinstance(cfg, TrainConfig) else cfg
    hint = "a learner also fails when another node group of the run ended" if args.num_groups > 1 else ""
    with Supervisor(failure_hint=hint) as supervisor:
        try:
            if not finalized:
                for note in finalize(args):
                    print(f"note: {note}", file=sys.stderr)
            patches.apply()
            with patches.gpu_slots(args.gpus):
                oat_validate(args)  # Oat's own checks (GPU count, ...), as its entry points run them
            build_program(args)  # Oat's topology checks, before anything is written (built again below)
            resolve_model(args)
            os.environ.update(cpu_environment(args))
            n, where = learners_per_group(args), "GPUs" if patches.cuda_present() else f"processes on {os.cpu_count()} cores"
            group = f"; node group {args.group_rank} of {args.num_groups}" if args.num_groups > 1 else ""
            print(f"oat_dppo: Oat program with {n} vLLM actor(s) and {n} DeepSpeed learner(s) ({where}{group}); "
                  f"logs under {args.save_path}", file=sys.stderr, flush=True)
            program, resources = build_program(args)
            return supervisor.run(program, resources)
        except Stopped as stop:  # before any node process started
            say(f"oat_dppo: stopped by {stop.signal.name} before any node started")
            return stop_status(stop.signal)

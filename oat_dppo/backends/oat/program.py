"""Build Oat's launchpad program with the DPPO learner and actor, and launch it.

The classes are imported from their own modules (`oat_dppo.backends.oat.learner/actor`), never
defined in `__main__`: launchpad pickles node constructors, and classes from an importable package are
pickled by reference, so every node process imports the same code (`oat_dppo` must be installed in
the node's environment, which `pip install -e .` does).
"""

from __future__ import annotations

import sys

from oat_dppo.backends.oat.args import DPPOArgs, finalize, from_train_config, oat_validate
from oat_dppo.config import TrainConfig


def build_program(args):
    """(launchpad program, local resources) from Oat's `get_program`."""
    # Oat's program and our actor import vLLM and launchpad: only when a program is built
    from oat.interface import get_program

    from oat_dppo.backends.oat.actor import DPPOActor
    from oat_dppo.backends.oat.learner import DPPOLearner

    return get_program(args, DPPOLearner, DPPOActor)


def launch(cfg, *, finalized: bool = False) -> int:
    """Run `cfg` (a `DPPOArgs`, or a `TrainConfig` from `oat_dppo.main.run`) on Oat. Blocks as Oat's own
    entry points do (`lp.launch(..., terminal="current_terminal")`)."""
    args = from_train_config(cfg) if isinstance(cfg, TrainConfig) else cfg
    if not isinstance(args, DPPOArgs):
        raise TypeError(f"launch() takes a DPPOArgs or a TrainConfig, got {type(cfg).__name__}")
    if not finalized:
        for note in finalize(args):
            print(f"note: {note}", file=sys.stderr)
    oat_validate(args)  # Oat's own checks (GPU count, ...), as its entry points run them
    program, resources = build_program(args)
    import launchpad as lp  # only on the GPU stack (the tests fake it)

    lp.launch(program, launch_type=args.launch_type, local_resources=resources, terminal="current_terminal")
    return 0

"""The Oat backend: DPPO as a learner inside Oat's distributed actor/learner program.

    args.py          DPPOArgs (Oat's PPOArgs + the local backend's options), the one mapping, finalize
    availability.py  is the Oat stack (oat-llm, vLLM, launchpad, CUDA) installed here?
    data.py          DPPOTransitionData / DPPOTransitionDataset; Oat batch -> TokenBatch
    actor.py         DPPOActor(PPOActor): GEM episodes through the shared agent loop
    learner.py       DPPOLearner(PPOLearner): the shared trust-region learning step
    program.py       Oat's launchpad program (get_program) and launch
    cli.py           the `--backend oat` command line

Importing this package is cheap (no Oat, no vLLM); `launch` imports them.
"""

from __future__ import annotations


def launch(cfg) -> int:
    from oat_dppo.backends.oat.program import launch as _launch

    return _launch(cfg)


def main(argv: list[str]) -> int:
    from oat_dppo.backends.oat.cli import main as _main

    return _main(argv)


__all__ = ["launch", "main"]

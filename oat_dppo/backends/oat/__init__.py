"""The Oat backend: DPPO as a learner inside Oat's distributed actor/learner program.

    args.py          DPPOArgs (Oat's PPOArgs + the local backend's options), the one mapping, finalize
    availability.py  is the Oat stack (oat-llm, vLLM, launchpad, CUDA) installed here?
    cpu.py           Oat's CUDA-only lines, replaced on a machine without CUDA (no-op with CUDA)
    data.py          DPPOEpisodeData / DPPOTransitionData; the buffer's turns -> TokenBatch
    actor.py         DPPOActor(PPOActor): GEM episodes through the shared agent loop
    learner.py       DPPOLearner(PPOLearner): the shared trust-region learning step
    program.py       Oat's launchpad program (get_program) and its launch
    supervise.py     the launcher's watch over its nodes: how a run ends, and its exit status

Importing this package is cheap (no Oat, no vLLM); `main` and `program.launch` import them.
"""

from __future__ import annotations

import sys

from oat_dppo.backends.oat.availability import require  # cheap: package metadata only


def main(argv: list[str]) -> int:
    """`python -m oat_dppo.main --backend oat ...`: Oat's options (not `TrainConfig` fields, so main
    hands the command line over before its own parsing) with the local ones: parse, check, launch.
    Raises `ConfigError` for bad input (the caller prints it, exit status 2)."""
    if not any(a in ("-h", "--help") for a in argv):  # --help lists the options even where the stack is missing
        require()
    # Oat: torch, deepspeed (and vLLM where present), once the stack is known to be there
    from oat_dppo.backends.oat.args import describe, finalize, parse
    from oat_dppo.backends.oat.program import launch

    args = parse(argv)
    notes = finalize(args)
    if args.print_config:
        print(describe(args, notes))
        return 0
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return launch(args, finalized=True)


__all__ = ["main"]

"""`python -m oat_dppo.main --backend oat ...`: parse Oat's arguments (with the local ones), check, launch.

Called by `oat_dppo.main.main` before its own parsing when the command line selects the Oat backend,
because Oat's options (--gpus, --collocate, --vllm-gpu-ratio, ...) are not `TrainConfig` fields.
"""

from __future__ import annotations

import sys

from oat_dppo.backends.oat.availability import GPU_GUIDE, missing
from oat_dppo.config import ConfigError


def main(argv: list[str]) -> int:
    """Raises `ConfigError` for bad input (the caller prints it and exits with status 2)."""
    wants_help = any(a in ("-h", "--help") for a in argv)
    if not wants_help:  # --help lists every option even where the stack is missing
        lacking = missing()
        if lacking:
            raise ConfigError(
                f"--backend oat needs {', '.join(lacking)}, which this machine lacks. "
                f"The GPU install guide is {GPU_GUIDE}; --backend local runs here."
            )
    from oat_dppo.backends.oat.args import finalize, parse
    from oat_dppo.backends.oat.program import launch

    args = parse(argv)
    for note in finalize(args):
        print(f"note: {note}", file=sys.stderr)
    return launch(args, finalized=True)

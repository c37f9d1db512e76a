"""Reading a run's logged episodes (RUN_DIR/episodes.jsonl, `--log-episodes`) for the tools that grade them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from oat_dppo.cli import fail


def logged_episodes(name: str, doc: str, what: str, argv: list[str]) -> tuple[Path, list[dict]] | int:
    """`python -m benchmarks NAME RUN_DIR`: (the run directory, its logged episodes), or the exit status 2 after
    a one-line error where the run logged none. `what`: the run it expects, for the help text."""
    p = argparse.ArgumentParser(prog=f"python -m benchmarks {name}", description=doc.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, help=f"a run directory with episodes.jsonl ({what})")
    run_dir = p.parse_args(argv).run_dir
    log = run_dir / "episodes.jsonl"
    if not log.is_file():
        return fail(f"{run_dir}: needs episodes.jsonl (a run with --log-episodes > 0)")
    return run_dir, [json.loads(line) for line in log.read_text().splitlines() if line.strip()]

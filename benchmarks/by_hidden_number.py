"""GuessTheNumber: a run's logged episodes split by the hidden number each was played against.

    python -m benchmarks by-hidden-number RUN_DIR [--top 3]

Reads RUN_DIR/episodes.jsonl (`--log-episodes`; log every episode of an iteration to cover every number), finds
each episode's hidden number by resetting the run's env with the episode's seed, and prints per number: episodes,
success rate and the most played guess sequences. A held-out rate that disagrees with the rollouts' can come from
one number the policy fails and the rollouts rarely drew (docs/warm_start.md measures such a case).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

from oat_dppo.agent.metrics import SUCCESS_RETURN
from oat_dppo.cli import fail, stdout_may_close

BOXED = re.compile(r"\\boxed\{([^}]*)\}?")


def hidden_number(env, seed: int) -> int:
    """The number GEM's GuessTheNumber hides for this seed (its own reset draws it)."""
    env.reset(seed=seed)
    return int(env.unwrapped.game_number)


def guesses(episode: dict) -> str:
    """An episode's guesses as '5 8 10' (a response without a boxed guess shows as '?')."""
    return " ".join((m.group(1) if (m := BOXED.search(t["response"])) else "?") for t in episode["turns"])


def by_number(episodes: list[dict], number_of) -> dict[int, tuple[int, float, list[tuple[str, int]]]]:
    """number -> (episodes, success rate, guess sequences by count); `number_of(seed)` gives the hidden number."""
    wins: dict[int, list[bool]] = defaultdict(list)
    paths: dict[int, Counter] = defaultdict(Counter)
    for e in episodes:
        n = number_of(e["seed"])
        wins[n].append(e["return"] >= SUCCESS_RETURN)
        paths[n][guesses(e)] += 1
    return {n: (len(w), sum(w) / len(w), paths[n].most_common()) for n, w in sorted(wins.items())}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks by-hidden-number", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, help="a run directory with episodes.jsonl (GuessTheNumber)")
    p.add_argument("--top", type=int, default=3, help="guess sequences shown per number")
    a = p.parse_args(argv)
    log, config = a.run_dir / "episodes.jsonl", a.run_dir / "config.json"
    if not log.is_file() or not config.is_file():
        return fail(f"{a.run_dir}: needs episodes.jsonl and config.json (a run with --log-episodes > 0)")
    env_id = json.loads(config.read_text())["env"]
    if "GuessTheNumber" not in env_id:
        return fail(f"{a.run_dir} ran {env_id}: this table is for game:GuessTheNumber-*")
    import gem  # noqa: PLC0415 (the run's own env, only here)

    env = gem.make(env_id)
    episodes = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    table = by_number([e for e in episodes if not e.get("error")], lambda seed: hidden_number(env, seed))
    with stdout_may_close():
        print(f"{len(episodes)} episodes of {a.run_dir} ({env_id})\n")
        print("| hidden number | episodes | success | most played guesses |\n|---|---|---|---|")
        for n, (count, rate, paths) in table.items():
            shown = ", ".join(f"`{s}` x{k}" for s, k in paths[: a.top])
            print(f"| {n} | {count} | {rate:.2f} | {shown} |")
    return 0

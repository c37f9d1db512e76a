"""What scripted policies score on GEM's reasoning-gym Arc1D and ACRE: the bounds a trained policy is
read against, measured before any training (as `sudoku_bounds` does for Sudoku).

    python -m benchmarks.reasoning_bounds --env rg:acre --episodes 400
    python -m benchmarks.reasoning_bounds --env rg:arc_1d --episodes 400

Both are single-turn: one question, one `\\boxed{...}` answer, scored by reasoning-gym: on ACRE 1 for
the label exactly, len(label) / len(answer) for a longer answer that contains it, else 0; on Arc1D its
own partial score. Each policy answers through the project's `make_env` (the same
adapter, held-out seeds and scorer as a run's evaluation) and sees the question text only, except
`oracle`, which reads the question's stored answer (the ceiling, and a check of the scorer).

ACRE (blicket detector: "on", "off" or "undetermined" for a new set of objects):

* `always_on`, `always_off`, `always_undetermined`: one label whatever the question (blind).
* `random_label`: one of the three at random (blind).
* `hedge_on_off`: "onoff", which contains the two commonest labels and earns 2/5 or 3/5 of a right
  answer (blind; the partial credit at its most useful).
* `blicket_reader`: reads the listed experiments: an object seen in an "off" trial is not a blicket; an
  "on" trial with a single object not ruled out makes that object a blicket; then "on" if the new set
  holds a blicket, "off" if every object in it is ruled out, else "undetermined".

Arc1D (a row of digits; three input/output examples, then a test input):

* `zeros`: the test input's length of zeros (blind to the examples and the input's digits).
* `copy_input`: the test input unchanged (reads the input, not the rule).
* `last_example_output`: the last example's output (reads the examples, ignores the test input).

A policy that beats every blind row must read the question; one that beats the reading rows must find
the rule.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from typing import Callable

import numpy as np

from oat_dppo.envs.registry import make_env
from oat_dppo_envs.reasoning_gym import ACRE_LABELS, acre_evidence, acre_trials, arc_rows  # noqa: F401 (tests)

ENVS = ("rg:acre", "rg:arc_1d")

Policy = Callable[[str, random.Random, object], str]  # (question, rng, env) -> the answer inside \boxed{}


def blicket_reader(question: str, rng: random.Random, env) -> str:
    return acre_evidence(question)[1]


def _last_example_output(question: str, rng: random.Random, env) -> str:
    examples, _ = arc_rows(question)
    return " ".join(examples[-1][1]) if examples else "0"


def _oracle(question: str, rng: random.Random, env) -> str:
    return str(env.unwrapped.data["answer"])


POLICIES: dict[str, dict[str, Policy]] = {
    "rg:acre": {
        "always_on": lambda q, rng, env: "on",
        "always_off": lambda q, rng, env: "off",
        "always_undetermined": lambda q, rng, env: "undetermined",
        "random_label": lambda q, rng, env: rng.choice(ACRE_LABELS),
        "hedge_on_off": lambda q, rng, env: "onoff",
        "blicket_reader": blicket_reader,
        "oracle": _oracle,
    },
    "rg:arc_1d": {
        "zeros": lambda q, rng, env: " ".join("0" for _ in arc_rows(q)[1]),
        "copy_input": lambda q, rng, env: " ".join(arc_rows(q)[1]),
        "last_example_output": _last_example_output,
        "oracle": _oracle,
    },
}


def play(env_id: str, policy: Policy, episodes: int, seed: int = 0, split: str = "validation") -> dict[str, float]:
    """Mean reward and the share of full-score answers of `policy` over `episodes` questions of the split
    (`oat_dppo.envs.splits`), an instance of a run with this seed."""
    env = make_env(env_id, seed=seed, split=split)
    rng = random.Random(seed)
    rewards = []
    try:
        for _ in range(episodes):
            question, _ = env.reset()
            _, reward, *_ = env.step(f"\\boxed{{{policy(question, rng, env)}}}")
            rewards.append(float(reward))
    finally:
        env.close()
    return {"reward": float(np.mean(rewards)), "solved": float(np.mean([r >= 1 - 1e-6 for r in rewards]))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reasoning_bounds", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="rg:acre", choices=ENVS, help="the reasoning-gym env")
    parser.add_argument("--episodes", type=int, default=400, help="held-out questions per policy (seed 0)")
    parser.add_argument("--policies", default=None,
                        help="comma-separated; default all of the env's: "
                             + "; ".join(f"{e}: {', '.join(p)}" for e, p in POLICIES.items()))
    args = parser.parse_args(argv)
    known = POLICIES[args.env]
    names = [p.strip() for p in (args.policies or ",".join(known)).split(",") if p.strip()]
    unknown = [p for p in names if p not in known]
    if unknown or args.episodes < 1:
        parser.error(f"unknown policy {unknown} for {args.env} (known: {', '.join(known)})" if unknown
                     else "--episodes must be >= 1")
    print(f"{args.env}, {args.episodes} held-out questions each\n")
    print("| policy | reward | full score |")
    print("|---|---|---|")
    for name in names:
        m = play(args.env, known[name], args.episodes)
        print(f"| {name} | {m['reward']:.3f} | {m['solved']:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

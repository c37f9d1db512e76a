"""`python -m benchmarks <benchmark> [options]`: measured ratios, printed as Markdown tables.

`python -m benchmarks <benchmark> --help` lists that benchmark's options; docs/benchmarks*.md
hold the numbers measured so far, each with the command that produced it.
"""

from __future__ import annotations

import importlib
import sys

from oat_dppo.cli import fail, stdout_may_close

# name -> (module, what it measures)
BENCHMARKS = {
    "trust-region": ("benchmarks.trust_region", "every strategy's forward + backward and memory vs pg_is"),
    "engine": ("benchmarks.engine", "rollout throughput (new tokens/s) of the HF engine and vLLM, and vLLM's sync time"),
    "local": ("benchmarks.local", "the local backend end to end: where an iteration's time goes, learner vs "
                                      "a bare loop"),
    "oat": ("benchmarks.oat", "Oat's program on a CPU: generation, learning, sync and launchpad/IPC per iteration, "
                                  "beside the local backend on the same job"),
    "oat-learner": ("benchmarks.oat_learner", "the Oat learner step vs stock Oat PPO, on CPU"),
    "packing": ("benchmarks.packing", "one learner row per chat episode vs one per turn: tokens computed and "
                                          "learner time"),
    "mini-batch-unit": ("benchmarks.mini_batch_unit", "the learner's update in steps of shuffled turns vs whole groups "
                                                      "(a group's prompt once): decoder tokens and time"),
    "layouts": ("benchmarks.layouts", "the learner's decoder layouts (padded grid, a forward per row, one packed "
                                      "sequence) on real turns: padded share and time"),
    "head": ("benchmarks.head", "the LM head in checkpointed blocks: peak memory and time"),
    "mismatch": ("benchmarks.mismatch", "|pi - mu| on the same tokens: engine and learner dtypes (HF copies on any "
                                            "machine, vLLM on a GPU)"),
    "peers": ("benchmarks.peers", "one matched single-turn job beside TRL's GRPOTrainer and Oat's own PPO: "
                                      "generation, learning, tokens/s and peak memory as ratios to TRL's"),
    "credit-signal": ("benchmarks.credit_signal", "GuessTheNumber: how strongly each --advantage mode credits reading "
                                                  "the hints (policy-gradient signal to noise per rollout batch)"),
    "gradient-noise": ("benchmarks.gradient_noise", "a run's loss on its own rollouts: the turns a step needs before "
                                                    "signal outweighs noise (gradient noise scale), and a no-credit "
                                                    "control"),
    "by-hidden-number": ("benchmarks.by_hidden_number", "GuessTheNumber: a run's logged episodes by hidden number "
                                                        "(success, the guesses played)"),
    "sudoku-work": ("benchmarks.sudoku_work", "Sudoku: which step of a worked move (the cell's line, the digits it "
                                              "lacks, the move) a run's logged episodes get wrong"),
    "acre-work": ("benchmarks.acre_work", "ACRE: which step of a worked answer (each object's evidence, the label) a "
                                          "run's logged episodes get wrong"),
    "sums-work": ("benchmarks.sums_work", "sums in columns: which step of a worked addition (the column's digits, "
                                          "the carry, the sum, the result so far) a run's logged episodes get wrong"),
    "gpu": ("benchmarks.gpu", "one GPU: vLLM rollout, weight sync, learner, and the mismatch table"),
}
USAGE = "usage: python -m benchmarks {" + ",".join(BENCHMARKS) + "} [--help | options]"
DESCRIPTION = "Run one of oat_dppo's benchmarks and print what it measures as Markdown tables."
FOOTER = ("`python -m benchmarks BENCHMARK --help` lists a benchmark's options; docs/benchmarks*.md hold "
          "the numbers measured so far, each with the command that produced it.")


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        with stdout_may_close():
            print(USAGE + "\n\n" + DESCRIPTION + "\n\nbenchmarks:")
            for name, (_, what) in BENCHMARKS.items():
                print(f"  {name:<14}{what}")
            print("\n" + FOOTER)
        return 0 if argv else 2
    if argv[0] not in BENCHMARKS:
        print(USAGE, file=sys.stderr)
        return fail(f"unknown benchmark {argv[0]!r}; choose one of {', '.join(BENCHMARKS)}")
    return importlib.import_module(BENCHMARKS[argv[0]][0]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

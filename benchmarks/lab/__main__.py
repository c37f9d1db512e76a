"""`python -m benchmarks.lab FIGURE [--seeds N] [--iterations N] [--out DIR] [--quick]`: the trust-region lab."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, Optional

import tyro

from oat_dppo.cli import fail, opt, parse
from oat_dppo.config import parse_param_value
from benchmarks.lab.experiments import CONTROLS, EXPERIMENTS, FIGURES, PEER_EXPERIMENTS
from benchmarks.lab.plots import plot_experiment
from benchmarks.lab.runner import run_experiment, summarize

QUICK = dict(vocab=256, n_problems=4, seq_len=4, prompts_per_batch=2, group_size=4, iterations=4)


FigureName = Literal[(*EXPERIMENTS, "all")]  # type: ignore[valid-type]  (built from the registry)


@dataclass
class LabArgs:
    """The trust-region lab: train a tiny autoregressive policy with each trust region under a simulated
    training-inference mismatch and reproduce the DPPO paper's figures 3-6 (docs/lab.md)."""

    figure: tyro.conf.Positional[FigureName] = field(metadata={"help": (
        "which experiment: fig3 (trust-region necessity), fig4 (anchor mu vs recompute), fig5 (minimal "
        "negative-sample mask), fig6 (relaxing the clip for low-probability tokens), the controls fig3_lowlr (fig3 "
        "at lr 1e-3) and fig3_bigmismatch (fig3 with a 4-bit engine at lr 3e-3), or all of them")})
    seeds: Optional[int] = opt(None, "seeds per strategy (seeds 0..N-1; each seed draws its own initial policy, "
                                     "hidden answers, sampling and mismatch noise; default 3, --quick 1)")
    iterations: Optional[int] = opt(None, "rollout batches per run (default: the experiment's, 100)")
    out: str = opt("lab_out", "folder for per-run JSONL (runs/, also a cache: an identical run is not recomputed), "
                              "per-figure CSV, summary JSON and the PNGs")
    plot_dir: Optional[str] = opt(None, "where the PNGs go (default: --out)")
    workers: int = opt(1, "parallel worker processes (each uses 1 torch thread)")
    quick: bool = opt(False, "a seconds-long smoke run: vocabulary 256, 4 prompts of 4 tokens, 4 iterations, 1 seed "
                             "unless --seeds is given (for tests, not for conclusions)")
    set: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = opt(
        (), "override a SimConfig field for every experiment, e.g. --set lr=3e-3 --set mantissa_bits=6 (fields: see "
            "benchmarks/lab/config.py)")


def main(argv: list[str] | None = None) -> int:
    args = parse(LabArgs, argv, prog="python -m benchmarks.lab", description=" ".join(LabArgs.__doc__.split()))
    seeds = args.seeds if args.seeds is not None else (1 if args.quick else 3)
    overrides = {}
    for item in args.set:
        k, sep, v = item.partition("=")
        if not sep:
            return fail(f"--set {item!r}: expected FIELD=VALUE, e.g. --set lr=3e-3")
        overrides[k] = parse_param_value(v)
    if args.quick:
        overrides = {**QUICK, **overrides}
    if args.iterations is not None:
        overrides["iterations"] = args.iterations
    keys = list(FIGURES) + list(CONTROLS) + list(PEER_EXPERIMENTS) if args.figure == "all" else [args.figure]
    out = Path(args.out)
    plot_dir = Path(args.plot_dir) if args.plot_dir else out
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    t_all = time.perf_counter()
    for key in keys:
        exp = EXPERIMENTS[key]
        cfg = exp.config.replace(**overrides)
        t0 = time.perf_counter()
        results = run_experiment(exp, cfg, seeds, out, workers=args.workers)
        png = plot_experiment(exp, results, plot_dir / f"{key}.png")
        summary[key] = {"wall_s": time.perf_counter() - t0, "seeds": seeds, "config": cfg.to_dict(), "final": summarize(results)}
        print(f"[{key}] wrote {png} and {out / (key + '.csv')}")
        for label, s in summary[key]["final"].items():
            print(f"    {label:24s} final reward {s['final_reward']:.3f} (worst seed {s['final_reward_min_seed']:.3f}, "
                  f"peak {s['peak_reward']:.3f})  mismatch {s['final_mismatch']:.2e}  entropy {s['final_entropy']:.2f}")
    with open(out / "summary.json", "w") as f:
        json.dump(summary, f, indent=1, default=float)
    print(f"done in {time.perf_counter() - t_all:.1f}s; summary in {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

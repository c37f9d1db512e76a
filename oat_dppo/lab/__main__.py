"""python -m oat_dppo.lab {fig3,fig4,fig5,fig6,fig3_lowlr,fig3_bigmismatch,all} [--seeds N] [--iterations N] [--out DIR] [--quick]"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from oat_dppo.lab.experiments import CONTROLS, EXPERIMENTS, FIGURES
from oat_dppo.lab.plots import plot_experiment
from oat_dppo.lab.runner import run_experiment, summarize

QUICK = dict(vocab=256, n_problems=4, seq_len=4, prompts_per_batch=2, group_size=4, iterations=4)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m oat_dppo.lab",
        description="The trust-region lab: train a tiny autoregressive policy with each trust region under a "
        "simulated training-inference mismatch and reproduce the DPPO paper's figures 3-6 (docs/lab.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "figure",
        choices=[*EXPERIMENTS, "all"],
        help="which experiment: fig3 (trust-region necessity), fig4 (anchor mu vs recompute), fig5 (minimal "
        "negative-sample mask), fig6 (relaxing the clip for low-probability tokens), the controls fig3_lowlr (fig3 "
        "at lr 1e-3) and fig3_bigmismatch (fig3 with a 4-bit engine at lr 3e-3), or all of them",
    )
    p.add_argument("--seeds", type=int, default=3, help="seeds per strategy (seeds 0..N-1; each seed draws its own "
                   "initial policy, hidden answers, sampling and mismatch noise)")
    p.add_argument("--iterations", type=int, default=None, help="rollout batches per run (default: the experiment's, 100)")
    p.add_argument("--out", type=Path, default=Path("lab_out"), help="folder for per-run JSONL (runs/, also a cache: "
                   "an identical run is not recomputed), per-figure CSV, summary JSON and the PNGs")
    p.add_argument("--plot-dir", type=Path, default=None, help="where the PNGs go (default: --out)")
    p.add_argument("--workers", type=int, default=1, help="parallel worker processes (each uses 1 torch thread)")
    p.add_argument("--quick", action="store_true", help="a seconds-long smoke run: vocabulary 256, 4 prompts of 4 "
                   "tokens, 4 iterations, 1 seed unless --seeds is given explicitly (for tests, not for conclusions)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a SimConfig field for every experiment, e.g. --set lr=3e-3 --set mantissa_bits=6 "
                   "(fields: see oat_dppo/lab/config.py)")
    return p


def _parse_value(v: str):
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(v.lower(), v)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    seeds_given = argv is not None and "--seeds" in argv or argv is None and "--seeds" in sys.argv
    seeds = args.seeds if (seeds_given or not args.quick) else 1
    overrides = {}
    for item in args.set:
        k, _, v = item.partition("=")
        overrides[k] = _parse_value(v)
    if args.quick:
        overrides = {**QUICK, **overrides}
    if args.iterations is not None:
        overrides["iterations"] = args.iterations
    keys = list(FIGURES) + list(CONTROLS) if args.figure == "all" else [args.figure]
    plot_dir = args.plot_dir or args.out
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {}
    t_all = time.perf_counter()
    for key in keys:
        exp = EXPERIMENTS[key]
        cfg = exp.config.replace(**overrides)
        t0 = time.perf_counter()
        results = run_experiment(exp, cfg, seeds, args.out, workers=args.workers)
        png = plot_experiment(exp, results, plot_dir / f"{key}.png")
        summary[key] = {"wall_s": time.perf_counter() - t0, "seeds": seeds, "config": cfg.to_dict(), "final": summarize(results)}
        print(f"[{key}] wrote {png} and {args.out / (key + '.csv')}")
        for label, s in summary[key]["final"].items():
            print(f"    {label:24s} final reward {s['final_reward']:.3f} (worst seed {s['final_reward_min_seed']:.3f}, "
                  f"peak {s['peak_reward']:.3f})  mismatch {s['final_mismatch']:.2e}  entropy {s['final_entropy']:.2f}")
    with open(args.out / "summary.json", "w") as f:
        json.dump(summary, f, indent=1, default=float)
    print(f"done in {time.perf_counter() - t_all:.1f}s; summary in {args.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A study's tables: the Markdown of summary.md and the text of summary.csv and runs.csv, from its
groups of run results (`oat_dppo.study.run_results`).

`runs.csv` has one row per run (`RUN_CSV_COLUMNS`): besides the numbers of a `RunResult` (final, best,
reach, ... eval: `oat_dppo.study.run_results`), its lowest R, the iterations
collapsed to the environment's format-failure floor, the entropy's minimum and its mean over the
final window, the largest pi/mu trained on, the mean of train/mismatch_mean (|pi - mu| before
the update's first optimizer step: the mismatch alone, where train/prob_diff_mean also holds the
policy's drift over the update's later steps), the success rate over the first and the final window,
the lowest well-formed rate after the first window (a dip of the format short of the floor),
the iterations whose rollout rewards had no spread (rollout/reward_std 0: every episode earned the
same, normalised advantages are 0 and nothing moves the policy: the absorbing floor), and what
the run says at the end: its most common response and the reward that saying it in every turn earns
in the run's environment (`constant_policy`).

`summary.md` also says how many runs settled on one answer (their most common final response holds
`SETTLED_SHARE` of the final turns) and how their final reward compares with what that answer earns
(`settled_runs`: the gap's mean, spread and range, and Pearson's r).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from oat_dppo.study import significance
from oat_dppo.study.constant_policy import EPISODES
from oat_dppo.study.draws import draws_markdown
from oat_dppo.study.run_results import Group, Stat, num
from oat_dppo.study.spec import RunSpec, Study, format_value

SIGNIFICANCE_METRICS = {"final": "final reward", "lowest": "lowest reward", "collapsed": "iterations at the floor",
                        "well_formed_min": "lowest well-formed rate (after the first window)"}


def cell(g: Group, metric: str) -> str:
    """`mean ± std` over the seeds (just the mean for one seed); reach adds `(k/n)` when not every
    seed reached the threshold."""
    s = g.stat(metric)
    if s.n == 0:
        return "-"
    text = num(s.mean, metric) if s.n == 1 else f"{num(s.mean, metric)} ± {num(s.std, metric)}"
    if metric == "reach" and s.n < len(g.results):
        text += f" ({s.n}/{len(g.results)})"
    return text


def _iters(g: Group) -> str:
    ns = [r.iterations for r in g.results]
    if not ns:
        return "-"
    return str(ns[0]) if min(ns) == max(ns) else f"{min(ns)}-{max(ns)}"


def _seeds(g: Group) -> str:
    k, n = len(g.results), len(g.runs)
    return str(k) if k == n else f"{k}/{n}"


def markdown_table(groups: Sequence[Group], threshold: float | None) -> str:
    extra_keys = list(groups[0].extra) if groups else []
    has_eval = any(g.stat("eval").n for g in groups)
    cols = ["family", "model", "env", "trust region", *extra_keys, "seeds", "iterations", "final reward", "best reward"]
    metrics = ["final", "best"]
    if threshold is not None:
        cols.append(f"iters to ≥ {format_value(threshold)}")
        metrics.append("reach")
    cols += ["AUC", "kept frac", "\\|π − μ\\|"]
    metrics += ["auc", "kept", "mismatch"]
    if has_eval:
        cols.append("eval reward")
        metrics.append("eval")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for g in groups:
        row = [g.family, f"`{g.model}`", f"`{g.env}`", g.trust_region, *g.extra.values(), _seeds(g), _iters(g)]
        row += [cell(g, m) for m in metrics]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def per_seed(g: Group, metric: str, digits: int = 2) -> str:
    """A metric's value for each seed of a row, in seed order ("1.00, 0.93, -"): for a minimum, whose
    mean over seeds hides the one run that dipped."""
    if not g.results:
        return "-"
    values = [getattr(r, metric) for r in sorted(g.results, key=lambda r: r.run.seed)]
    return ", ".join(f"{v:.{digits}f}" if math.isfinite(v) else "-" for v in values)


def stability_table(groups: Sequence[Group]) -> str:
    """Per row, what collapse and the mismatch look like over its seeds: the final reward beside what
    saying the final answer in every turn earns (a policy settled on one answer earns about that),
    the lowest reward, how many runs (and iterations) sat at the format-failure floor, each seed's
    lowest share of well-formed turns once the format was learned (a dip short of the floor), the
    kept fraction, the engine's mismatch alone beside the drift over an update (mismatch + drift), the
    entropy left at the end, the largest pi/mu any seed trained on, and how often a turn repeats the
    response before it at the end (`set_final_responses`)."""
    extra_keys = list(groups[0].extra) if groups else []
    cols = ["model", "env", "trust region", *extra_keys, "seeds", "final reward",
            "saying its final answer every turn earns", "lowest reward", "runs at the floor",
            "iterations at the floor", "lowest well-formed rate (after the first window), per seed", "kept frac",
            "mismatch \\|π − μ\\| (before the update)", "drift \\|π − μ\\| (over the update)", "entropy (final)",
            "largest π/μ (any seed)", "repeated responses (final)", "iterations with no reward spread"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for g in groups:
        at_floor = sum(r.collapsed > 0 for r in g.results)
        largest = max((r.ratio_max for r in g.results if math.isfinite(r.ratio_max)), default=math.nan)
        row = [f"`{g.model}`", f"`{g.env}`", g.trust_region, *g.extra.values(), _seeds(g), cell(g, "final"),
               cell(g, "final_response_reward"), cell(g, "lowest"),
               f"{at_floor}/{len(g.results)}" if g.results else "-", cell(g, "collapsed"),
               per_seed(g, "well_formed_min"), cell(g, "kept"), cell(g, "engine_mismatch"), cell(g, "mismatch"),
               cell(g, "entropy_final"), num(largest, "ratio_max"), cell(g, "repeat_rate"), cell(g, "zero_spread")]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


# A run "settled" on one answer when its most common response is at least this share of its final turns.
SETTLED_SHARE = 0.95


@dataclass
class Settled:
    """The runs that settled on one answer, and how their final reward compares with what saying that
    answer in every turn earns: gap = final - final_response_reward per run; r = Pearson's
    correlation of the two over the runs (NaN under 3 runs or with no spread)."""
    share: float  # the least share of the final turns that counts as settled
    runs: int
    gap: Stat
    gap_min: float
    gap_max: float
    r: float


def settled_runs(groups: Sequence[Group], share: float = SETTLED_SHARE) -> Settled | None:
    """`Settled` over the runs whose final response holds `share` of their final turns and has a
    finite worth; None when there are none."""
    pairs = [(r.final, r.final_response_reward) for g in groups for r in g.results
             if r.final_response_share >= share and math.isfinite(r.final_response_reward) and math.isfinite(r.final)]
    if not pairs:
        return None
    final, worth = np.array(pairs).T  # [runs] each
    gap = final - worth
    spread = len(pairs) >= 3 and np.std(final) > 0 and np.std(worth) > 0
    r = float(np.corrcoef(final, worth)[0, 1]) if spread else math.nan
    return Settled(share, len(pairs), Stat.of(gap), float(gap.min()), float(gap.max()), r)


def settled_text(settled: Settled | None) -> str:
    if settled is None:
        return ""
    g = settled.gap
    text = (f"Settled on one answer (the most common response is at least {settled.share:.0%} of a run's final turns): "
            f"{settled.runs} run{'s' * (settled.runs != 1)}. Final reward minus what saying that response every turn earns: "
            f"{g.mean:+.3f} ± {g.std:.3f} ({settled.gap_min:+.3f} to {settled.gap_max:+.3f})")
    if math.isfinite(settled.r):
        text += f"; Pearson r of the two over the runs: {settled.r:.2f}"
    return text + ".\n"


CSV_METRICS = {
    "final": "final_reward",
    "best": "best_reward",
    "reach": "iters_to_threshold",
    "auc": "auc",
    "kept": "kept_frac",
    "mismatch": "prob_diff",
    "eval": "eval_reward",
}


def csv_number(v: float) -> str:
    """A CSV cell: the number's repr, empty where it is not finite."""
    return repr(float(v)) if math.isfinite(v) else ""


def csv_text(groups: Sequence[Group], study_name: str, threshold: float | None) -> str:
    extra_keys = list(groups[0].extra) if groups else []
    header = ["study", "family", "model", "env", "trust_region", *extra_keys, "runs", "seeds_with_metrics", "seeds",
              "iterations_min", "iterations_max", "threshold"]
    for name in CSV_METRICS.values():
        header += [f"{name}_mean", f"{name}_std"]
    header.append("reached")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)

    for g in groups:
        ns = [r.iterations for r in g.results]
        row = [study_name, g.family, g.model, g.env, g.trust_region, *g.extra.values(), len(g.runs), len(g.results),
               " ".join(str(r.run.seed) for r in g.results), min(ns, default=""), max(ns, default=""),
               "" if threshold is None else repr(threshold)]
        for metric in CSV_METRICS:
            s = g.stat(metric)
            row += [csv_number(s.mean), csv_number(s.std)]
        row.append(g.stat("reach").n if threshold is not None else "")
        w.writerow(row)
    return buf.getvalue()


RUN_CSV_COLUMNS = ("name", "model", "env", "engine", "trust_region", "seed", "iterations", "final_reward",
                   "min_reward", "collapsed_iterations", "kept_frac_mean", "prob_diff_mean", "entropy_min",
                   "eval_reward", "mismatch_mean", "entropy_final", "ratio_max", "machine", "final_response",
                   "final_response_share", "repeat_rate_final", "final_response_reward", "success_first",
                   "success_final", "well_formed_min", "blind_success", "hint_direction_agreement_final",
                   "zero_spread_iterations", "eval_reply_effect", "eval_correct_per_episode")


def runs_csv_text(groups: Sequence[Group]) -> str:
    """One row per run with metrics: `RUN_CSV_COLUMNS`, then the other options the grid varies."""
    extra_keys = [k for k in (groups[0].extra if groups else {}) if k not in RUN_CSV_COLUMNS]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*RUN_CSV_COLUMNS, *extra_keys])

    for g in groups:
        for res in g.results:
            cfg = res.run.config
            n = csv_number
            w.writerow([res.run.name, cfg.model, cfg.env, cfg.engine, cfg.trust_region, cfg.seed, res.iterations,
                        n(res.final), n(res.lowest), res.collapsed, n(res.kept), n(res.mismatch), n(res.entropy_min),
                        n(res.eval), n(res.engine_mismatch), n(res.entropy_final), n(res.ratio_max), res.machine,
                        res.final_response, n(res.final_response_share), n(res.repeat_rate),
                        n(res.final_response_reward), n(res.success_first), n(res.success_final),
                        n(res.well_formed_min), n(res.blind_success), n(res.follows_final), n(res.zero_spread),
                        n(res.reply_effect), n(res.eval_correct),
                        *[g.extra[k] for k in extra_keys]])
    return buf.getvalue()


def shown_response(text: str) -> str:
    """A response as one line of text: every character that does not print (newlines and tabs as `\\n`
    `\\t`, a random model's NUL or bell byte as `\\x00` `\\x07`) as its Python escape, so a report stays
    plain text."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def responses_table(groups: Sequence[Group]) -> str:
    """Per run that logged sample episodes: its most common response at the end (`shown_response`,
    cut to 40 characters, in a code span), that response's share of the turns, the repeat
    rate, the reward for saying that response in every turn beside the run's final reward, the
    success rate over the first and the final window beside the most a feedback-blind policy reaches,
    and the share of follow-up turns that moved the way the env's reply said (final window; agreement
    with the hint's direction: a reader scores about 1.0, but so does a blind ascending sweep)."""
    extra_keys = list(groups[0].extra) if groups else []
    lines = ["| trust region | " + " | ".join([*extra_keys, "seed"]) + " | most common response | share | repeats | "
             "saying it every turn earns | final reward | success, first → final | feedback-blind bound | "
             "agrees with the hint's direction (final) |",
             "|" + "---|" * (len(extra_keys) + 10)]
    for g in groups:
        for r in g.results:
            if not r.final_response and not math.isfinite(r.final_response_share):
                continue
            text = shown_response(r.final_response)
            text = (text[:40] + "…" if len(text) > 40 else text).replace("`", "'").replace("|", "\\|")
            lines.append(f"| {g.trust_region} | " + " | ".join([*g.extra.values(), str(r.run.seed)]) +
                         f" | `{text}` | {r.final_response_share:.2f} | {num(r.repeat_rate, 'final')} | "
                         f"{num(r.final_response_reward, 'final')} | {num(r.final, 'final')} | "
                         f"{num(r.success_first, 'final')} → {num(r.success_final, 'final')} | "
                         f"{num(r.blind_success, 'final')} | {num(r.follows_final, 'final')} |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def markdown(study: Study, groups: Sequence[Group], runs: Sequence[RunSpec], figures: Sequence[Path]) -> str:
    with_metrics = sum(len(g.results) for g in groups)
    missing = [r.name for g in groups for r in g.runs if r.name not in {x.run.name for x in g.results}]
    thr = study.threshold
    lines = [
        f"# Study `{study.name}`",
        "",
        f"{len(runs)} runs from `{study.path}` in `{study.out}`; {with_metrics} have metrics.",
        "",
        "Reward is `rollout/reward_mean` (mean episode reward of an iteration's rollouts). Each cell is the mean "
        "± std (population, ddof 0) over the seeds of the row; `seeds` counts the runs with metrics "
        "(k/n: k of the n runs).",
        "",
        f"- **final reward**: mean over a run's last {study.final_window} iterations; **best reward**: its highest "
        "iteration",
    ]
    if thr is not None:
        lines.append(f"- **iters to ≥ {format_value(thr)}**: the first iteration (0-based, as logged) whose reward "
                     "is ≥ the threshold, over the seeds that reached it ((k/n) when only k did; - when none did)")
    lines += [
        "- **AUC**: area under the reward curve, as the mean reward over all iterations",
        "- **kept frac**: mean `train/kept_frac` (tokens the trust region kept); **|π − μ|**: mean "
        "`train/prob_diff_mean` (the training-inference mismatch plus the policy's drift over an update's steps; "
        "`runs.csv`'s `mismatch_mean` has the mismatch alone)",
        "- **eval reward** (when runs evaluated): the last `eval/reward_mean`",
        "",
        markdown_table(groups, thr),
        "Stability: the **final reward** beside what **saying its final answer every turn earns** (the run's "
        "most common final response played in every turn of its environment, below: a policy settled on one "
        "answer earns about that); the **lowest reward** of a run (mean ± std over seeds); the **runs** and the "
        "**iterations** (per run) whose mean reward sits at the environment's format-failure floor with most "
        "turns malformed (collapse; a batch of well-formed wrong answers earning the same is not one); "
        f"each seed's **lowest well-formed rate** (`rollout/well_formed_rate`) after the first "
        f"{study.final_window} iterations: a dip of the format short of the floor, once the policy has learned "
        "it; the **kept** fraction; the engine's **mismatch** alone (mean `train/mismatch_mean`: |π − μ| before "
        "an update's first optimizer step) beside the **drift** over the update (mean `train/prob_diff_mean`: "
        "the mismatch plus how far π moves over the update's steps); the "
        f"**entropy** over a run's last {study.final_window} iterations (near 0: the policy turned "
        "deterministic); the **largest π/μ** of any token trained on (masked or clipped ones included); the "
        "share of an episode's turns whose response **repeats** the turn before's word for word, in the sample "
        f"episodes logged over the last {study.final_window} iterations; the **iterations with no reward spread** "
        "(per run, where `rollout/reward_std` was logged): every episode earned the same reward, so normalised "
        "advantages are 0 and nothing moves the policy (the absorbing floor, at any reward).",
        "",
        stability_table(groups),
    ]
    said = responses_table(groups)
    if said:
        lines += [f"What each run says at the end (the sample episodes of its last {study.final_window} "
                  "iterations: `episodes.jsonl`, or `responses.jsonl` in a committed copy): its most common "
                  "response, that response's share of the turns, and the share of turns that repeat the turn "
                  "before; what saying that response in every turn earns in the run's environment (mean episode "
                  f"reward over the env's episodes from seeds 0-{EPISODES - 1}, `oat_dppo.study.constant_policy`: "
                  "a final reward near it is a policy that settled on one answer, not one that learned the "
                  "game), beside the run's final reward; the success rate over its first and last "
                  f"{study.final_window} iterations.", "", said, settled_text(settled_runs(groups))]
    comps = significance.comparisons(groups, SIGNIFICANCE_METRICS)
    if comps:
        lines += [
            "Rows of one model and env that differ in the trust region alone, or in the other varied options "
            "alone: the difference of their means and its two-sided p-value over the seeds (exact permutation "
            "test, `oat_dppo.study.significance`; one p per comparison, no correction for how many there are).",
            "",
            significance.markdown_table(comps),
        ]
    machines: dict[str, int] = {}
    for res in (r for g in groups for r in g.results):
        machines[res.machine] = machines.get(res.machine, 0) + 1
    if machines:
        lines += ["Machines (each run's `_machine` in config.json; a vLLM engine's bf16 mismatch depends on the "
                  "machine's kernels): " + "; ".join(f"{label}: {n} run{'s' * (n != 1)}"
                                                       for label, n in machines.items()), ""]
    lines += draws_markdown(study, runs)
    unfinished = [r for g in groups for r in g.results if not r.finished]
    if unfinished:
        lines += [f"Unfinished ({len(unfinished)}; in the table with the iterations they have, left out of "
                  "the tests): " + ", ".join(f"`{r.run.name}` ({r.iterations}/{r.run.config.iterations})"
                                             for r in unfinished), ""]
    if missing:
        lines += [f"No metrics yet ({len(missing)}): " + ", ".join(f"`{m}`" for m in missing), ""]
    if figures:
        lines += ["Figures (one panel per env and model, one line per trust region, band: ± std over seeds):", ""]
        lines += [f"![{p.stem}]({p.name})" for p in figures]
        lines.append("")
    return "\n".join(lines)


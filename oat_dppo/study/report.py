"""A study's report: per-run numbers, seed-aggregated table (Markdown + CSV), paper-style figures.

Per run (from its metrics.jsonl, read with `oat_dppo.plot.read_metrics`), R = rollout/reward_mean:

    final      mean of R over the last `[study] final_window` logged iterations (default 3)
    best       max of R
    reach      the first iteration with R >= threshold (None when never)
    auc        mean of R over all logged iterations (area under the curve / iterations)
    kept       mean of train/kept_frac over iterations
    mismatch   mean of train/prob_diff_mean (|pi - mu| over the update: mismatch + drift) over iterations
    eval       the last logged eval/reward_mean (NaN when the run never evaluated)

`runs.csv` has one row per run (`RUN_CSV_COLUMNS`): besides these, its lowest R, the iterations
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

Runs are grouped by model family, model, env, trust region and any other option the grid varies;
the seeds of a group give mean and population std (ddof 0, as the figures' bands).
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from oat_dppo.config import to_dict
from oat_dppo.envs import get_preset
from oat_dppo.plot.data import IGNORED_CONFIG_KEYS, MetricTable, Run, Series, load_run
from oat_dppo.provenance import machine_label
from oat_dppo.study import significance
from oat_dppo.study.constant_policy import EPISODES, constant_response_reward, feedback_blind_success
from oat_dppo.study.committed import episodes_file, metrics_dir, read_episodes
from oat_dppo.study.spec import NAME_KEYS, RunSpec, Study, format_value, load_study

REWARD = "rollout/reward_mean"
KEPT = "train/kept_frac"
MISMATCH = "train/prob_diff_mean"  # |pi - mu| over the update: the mismatch plus the policy's drift
EVAL = "eval/reward_mean"
ENTROPY = "train/entropy"
PRE_UPDATE_MISMATCH = "train/mismatch_mean"
RATIO_MAX = "train/ratio_max"
SUCCESS = "rollout/success_rate"
WELL_FORMED = "rollout/well_formed_rate"
FOLLOWS = "rollout/hint_direction_agreement"  # read from older files' rollout/feedback_follow_rate too
# Every episode of the iteration earned the same reward: group- or batch-normalised advantages are all
# zero and nothing moves the policy (the absorbing floor, whatever the reward is).
REWARD_STD = "rollout/reward_std"
ZERO_SPREAD = 1e-9
# An iteration is "collapsed" when its mean reward is within this of the format-failure floor (all
# or nearly all episodes failed to write a parseable action) and, where it was logged, fewer than
# COLLAPSE_WELL_FORMED of its turns were well-formed (`floor_iterations`).
COLLAPSE_MARGIN = 0.01
COLLAPSE_WELL_FORMED = 0.5
SIGNIFICANCE_METRICS = {"final": "final reward", "lowest": "lowest reward", "collapsed": "iterations at the floor",
                        "well_formed_min": "lowest well-formed rate (after the first window)"}
# (file stem, metric, what it shows, log y-axis: for values that fall by orders of magnitude)
FIGURES = (("reward", REWARD, "reward (rollout/reward_mean)", False),
           ("kept", KEPT, "kept fraction (train/kept_frac)", False),
           ("mismatch", PRE_UPDATE_MISMATCH, "training–inference mismatch |π − μ| (train/mismatch_mean)", True),
           ("drift", MISMATCH, "|π − μ| over the update, mismatch + drift (train/prob_diff_mean)", True),
           ("entropy", ENTROPY, "entropy of π at the response tokens (train/entropy)", True))


def _quiet(_msg: str) -> None:
    pass


# ---- one run ------------------------------------------------------------------------------------


@dataclass
class RunResult:
    run: RunSpec
    iterations: int
    final: float
    best: float
    reach: float  # NaN when the threshold was never reached (or no threshold)
    auc: float
    kept: float
    mismatch: float
    eval: float
    lowest: float  # min of R
    collapsed: int  # iterations at the env's format-failure floor
    entropy_min: float
    engine_mismatch: float  # mean train/mismatch_mean: |pi - mu| before the update's first step
    entropy_final: float = math.nan  # mean entropy over the final window (a policy turned deterministic: ~0)
    ratio_max: float = math.nan  # the largest pi/mu of any token trained on, masked or not
    finished: bool = True  # every iteration the run asks for is logged (False: still running, or cut)
    machine: str = "not recorded"  # `machine_label` of its config.json's `_machine` provenance
    # Over the logged sample episodes of the final window (NaN / "" where the run logged none):
    final_response: str = ""  # the most common response
    final_response_share: float = math.nan  # its share of the turns
    repeat_rate: float = math.nan  # share of an episode's turns that repeat its previous turn's response
    final_response_reward: float = math.nan  # the env's reward for saying final_response every turn
    success_first: float = math.nan  # mean rollout/success_rate over the first final window
    success_final: float = math.nan  # ... and over the final window
    # the lowest rollout/well_formed_rate after the first final window: a dip of the format short of
    # the floor, once the policy has learned it (the first window holds the untrained model's misses)
    well_formed_min: float = math.nan
    # Games that declare a probe: the share of follow-up turns that moved the way the env's reply said
    # (rollout/hint_direction_agreement: agreement, which a blind ascending sweep also reaches, not
    # feedback use), over the final window, and the success no feedback-blind policy can beat.
    follows_final: float = math.nan
    blind_success: float = math.nan
    # The last evaluation's eval/reply_effect (how much a reply moves the policy: 0 blind, 1 a reader;
    # NaN where the env declares no counterfactual) and its correct placements per episode
    # (eval/outcome_correct, Sudoku; NaN elsewhere).
    reply_effect: float = math.nan
    eval_correct: float = math.nan
    # Iterations whose rollout rewards had no spread (`zero_spread_iterations`; NaN where the run logged
    # no rollout/reward_std).
    zero_spread: float = math.nan


def _finite(table: MetricTable, key: str) -> tuple[np.ndarray, np.ndarray]:
    y = table.column(key)
    ok = np.isfinite(y)
    return table.iterations[ok], y[ok]


def _mean(y: np.ndarray) -> float:
    return float(np.mean(y)) if len(y) else math.nan


def at_floor(reward: np.ndarray, well_formed: np.ndarray, floor: float) -> np.ndarray:
    """Per iteration, whether it collapsed to the format-failure floor: a mean reward within
    `COLLAPSE_MARGIN` of it and, where the iteration logged its well-formed rate, fewer than half of
    its turns well-formed. The second condition keeps apart an environment whose wrong answers earn
    the floor too (math: 0 for a wrong answer as for an unparseable one): a batch of well-formed wrong
    answers is not a collapse. `reward`, `well_formed`: [iterations], NaN where not logged."""
    low = np.isfinite(reward) & (reward <= floor + COLLAPSE_MARGIN)
    formed = np.isfinite(well_formed) & (well_formed >= COLLAPSE_WELL_FORMED)
    return low & ~formed


def floor_iterations(reward: np.ndarray, well_formed: np.ndarray, floor: float) -> int:
    """How many iterations collapsed to the format-failure floor (`at_floor`)."""
    return int(np.sum(at_floor(reward, well_formed, floor)))


def zero_spread_iterations(reward_std: np.ndarray) -> float:
    """How many iterations' rollout rewards had zero spread (std <= `ZERO_SPREAD`): every episode
    earned the same, so normalised advantages are all 0 and the update moves nothing. Counts only
    the iterations that logged the std; NaN when none did. `reward_std`: [iterations], NaN where not logged."""
    logged = np.isfinite(reward_std)
    return float(np.sum(reward_std[logged] <= ZERO_SPREAD)) if logged.any() else math.nan


def run_result(run: RunSpec, table: MetricTable, threshold: float | None, final_window: int = 3) -> RunResult:
    its, r = _finite(table, REWARD)
    reach = math.nan
    if threshold is not None:
        hit = np.nonzero(r >= threshold)[0]
        reach = float(its[hit[0]]) if len(hit) else math.nan
    _, ev = _finite(table, EVAL)
    _, ent = _finite(table, ENTROPY)
    _, ratios = _finite(table, RATIO_MAX)
    _, success = _finite(table, SUCCESS)
    _, well_formed = _finite(table, WELL_FORMED)
    _, follows = _finite(table, FOLLOWS)
    return RunResult(
        run=run,
        iterations=len(table),
        final=_mean(r[-final_window:]),
        best=float(np.max(r)) if len(r) else math.nan,
        reach=reach,
        auc=_mean(r),
        kept=_mean(_finite(table, KEPT)[1]),
        mismatch=_mean(_finite(table, MISMATCH)[1]),
        eval=float(ev[-1]) if len(ev) else math.nan,
        lowest=float(np.min(r)) if len(r) else math.nan,
        collapsed=floor_iterations(table.column(REWARD), table.column(WELL_FORMED), format_failure_floor(run)),
        entropy_min=float(np.min(ent)) if len(ent) else math.nan,
        engine_mismatch=_mean(_finite(table, PRE_UPDATE_MISMATCH)[1]),
        finished=len(table) >= run.config.iterations,
        entropy_final=_mean(ent[-final_window:]),
        ratio_max=float(np.max(ratios)) if len(ratios) else math.nan,
        success_first=_mean(success[:final_window]),
        success_final=_mean(success[-final_window:]),
        well_formed_min=float(np.min(well_formed[final_window:])) if len(well_formed) > final_window else math.nan,
        follows_final=_mean(follows[-final_window:]),
        zero_spread=zero_spread_iterations(table.column(REWARD_STD)),
        reply_effect=_last(table, "eval/reply_effect"),
        eval_correct=_last(table, "eval/outcome_correct"),
    )


def _last(table: MetricTable, key: str) -> float:
    _, y = _finite(table, key)
    return float(y[-1]) if len(y) else math.nan


# ---- groups -------------------------------------------------------------------------------------


@dataclass
class Stat:
    mean: float
    std: float
    n: int

    @staticmethod
    def of(values: Sequence[float]) -> "Stat":
        v = np.array([x for x in values if math.isfinite(x)], dtype=np.float64)
        if not len(v):
            return Stat(math.nan, math.nan, 0)
        return Stat(float(v.mean()), float(v.std()), len(v))


@dataclass
class Group:
    family: str
    model: str
    env: str
    trust_region: str
    extra: dict[str, str]  # other options the grid varies -> value shown
    runs: list[RunSpec] = field(default_factory=list)  # every run of the group
    results: list[RunResult] = field(default_factory=list)  # the ones with metrics

    @property
    def label(self) -> str:
        """The legend label: trust region, plus the other varied options."""
        extra = ", ".join(f"{k}={v}" for k, v in self.extra.items())
        return f"{self.trust_region} [{extra}]" if extra else self.trust_region

    def stat(self, metric: str) -> Stat:
        return Stat.of([getattr(r, metric) for r in self.results])


def varied_keys(runs: Sequence[RunSpec]) -> list[str]:
    """Options (other than model, env, trust region, seed and bookkeeping) that differ across runs."""
    ignore = set(IGNORED_CONFIG_KEYS) | set(NAME_KEYS) | {"backend"}
    dicts = [to_dict(r.config) for r in runs]
    keys = list(dicts[0]) if dicts else []
    return [k for k in keys if k not in ignore and len({repr(d[k]) for d in dicts}) > 1]


def _family(model: str) -> str:
    from oat_dppo.models import model_family  # torch + transformers: only when a report is made

    return model_family(model)


def build_groups(runs: Sequence[RunSpec], loaded: dict[str, Run], threshold: float | None,
                 final_window: int = 3) -> list[Group]:
    """Groups in display order: family, model, env, trust region (each by first appearance), then
    the other varied options. `loaded`: the runs that have metrics (`load_runs`), by name."""
    extra_keys = varied_keys(runs)
    groups: dict[tuple, Group] = {}
    order: dict[str, dict] = {k: {} for k in ("family", "model", "env", "trust_region", "extra")}
    families: dict[str, str] = {}
    for run in runs:
        cfg = run.config
        fam = families.setdefault(cfg.model, _family(cfg.model))
        extra = {k: "-" if getattr(cfg, k) is None else format_value(getattr(cfg, k)) for k in extra_keys}
        key = (fam, cfg.model, cfg.env, cfg.trust_region, tuple(extra.items()))
        for dim, value in zip(order, key):
            order[dim].setdefault(value, len(order[dim]))
        g = groups.setdefault(key, Group(fam, cfg.model, cfg.env, cfg.trust_region, extra))
        g.runs.append(run)
        if run.name in loaded and len(loaded[run.name].metrics):
            result = run_result(run, loaded[run.name].metrics, threshold, final_window)
            result.machine = machine_label(loaded[run.name].config.get("_machine"))
            set_final_responses(result, episodes_file(loaded[run.name].path), final_window)
            if result.final_response:
                result.final_response_reward = constant_response_reward(cfg, result.final_response)
            result.blind_success = feedback_blind_success(cfg)
            g.results.append(result)
    return [groups[k] for k in sorted(groups, key=lambda k: tuple(order[d][v] for d, v in zip(order, k)))]


def set_final_responses(result: RunResult, path: Path | None, final_window: int) -> None:
    """What the policy says at the end, from the sample episodes logged in the run's last
    `final_window` iterations: its most common response (share of the turns) and how often a turn
    repeats the response of the episode's turn before (1.0: the same words every turn, whatever the
    environment answered)."""
    episodes = read_episodes(path) if path is not None else []
    if not episodes:
        return
    last = max(e["iteration"] for e in episodes)
    turns = [[str(t.get("response", "")) for t in e.get("turns", [])]
             for e in episodes if e["iteration"] > last - final_window]
    said = [r for episode in turns for r in episode]
    if not said:
        return
    text, count = Counter(said).most_common(1)[0]
    pairs = [(a, b) for episode in turns for a, b in zip(episode, episode[1:])]
    result.final_response, result.final_response_share = text, count / len(said)
    result.repeat_rate = sum(a == b for a, b in pairs) / len(pairs) if pairs else math.nan


def load_runs(runs: Sequence[RunSpec]) -> dict[str, Run]:
    """The runs that have a metrics.jsonl (config and metrics), by name, from their run directory or
    their committed copy (whichever holds more iterations)."""
    loaded = {}
    for run in runs:
        where = metrics_dir(run)
        if (where / "metrics.jsonl").is_file():
            loaded[run.name] = load_run(where, warn=_quiet)
    return loaded


# ---- tables -------------------------------------------------------------------------------------


def _num(v: float, metric: str) -> str:
    if not math.isfinite(v):
        return "-"
    if metric == "reach":
        return f"{v:.1f}"
    if metric in ("mismatch", "engine_mismatch", "entropy_final"):
        return f"{v:.3g}"
    if metric == "ratio_max":
        return f"{v:.4g}"
    if metric in ("collapsed", "zero_spread"):
        return f"{v:.1f}"
    return f"{v:.3f}"


def cell(g: Group, metric: str) -> str:
    """`mean ± std` over the seeds (just the mean for one seed); reach adds `(k/n)` when not every
    seed reached the threshold."""
    s = g.stat(metric)
    if s.n == 0:
        return "-"
    text = _num(s.mean, metric) if s.n == 1 else f"{_num(s.mean, metric)} ± {_num(s.std, metric)}"
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
               cell(g, "entropy_final"), _num(largest, "ratio_max"), cell(g, "repeat_rate"), cell(g, "zero_spread")]
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

    def num(v: float) -> str:
        return repr(v) if math.isfinite(v) else ""

    for g in groups:
        ns = [r.iterations for r in g.results]
        row = [study_name, g.family, g.model, g.env, g.trust_region, *g.extra.values(), len(g.runs), len(g.results),
               " ".join(str(r.run.seed) for r in g.results), min(ns, default=""), max(ns, default=""),
               "" if threshold is None else repr(threshold)]
        for metric in CSV_METRICS:
            s = g.stat(metric)
            row += [num(s.mean), num(s.std)]
        row.append(g.stat("reach").n if threshold is not None else "")
        w.writerow(row)
    return buf.getvalue()


RUN_CSV_COLUMNS = ("name", "model", "env", "engine", "trust_region", "seed", "iterations", "final_reward",
                   "min_reward", "collapsed_iterations", "kept_frac_mean", "prob_diff_mean", "entropy_min",
                   "eval_reward", "mismatch_mean", "entropy_final", "ratio_max", "machine", "final_response",
                   "final_response_share", "repeat_rate_final", "final_response_reward", "success_first",
                   "success_final", "well_formed_min", "blind_success", "hint_direction_agreement_final",
                   "zero_spread_iterations", "eval_reply_effect", "eval_correct_per_episode")


def format_failure_floor(run: RunSpec) -> float:
    """The mean episode reward of a batch in which every episode failed its first turn's format."""
    return get_preset(run.config.env).format_failure_reward + run.config.format_penalty


def runs_csv_text(groups: Sequence[Group]) -> str:
    """One row per run with metrics: `RUN_CSV_COLUMNS`, then the other options the grid varies."""
    extra_keys = [k for k in (groups[0].extra if groups else {}) if k not in RUN_CSV_COLUMNS]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*RUN_CSV_COLUMNS, *extra_keys])

    def num(v: float) -> str:
        return repr(float(v)) if math.isfinite(v) else ""

    for g in groups:
        for res in g.results:
            cfg = res.run.config
            w.writerow([res.run.name, cfg.model, cfg.env, cfg.engine, cfg.trust_region, cfg.seed, res.iterations,
                        num(res.final), num(res.lowest), res.collapsed, num(res.kept), num(res.mismatch),
                        num(res.entropy_min), num(res.eval), num(res.engine_mismatch), num(res.entropy_final),
                        num(res.ratio_max), res.machine, res.final_response, num(res.final_response_share),
                        num(res.repeat_rate), num(res.final_response_reward), num(res.success_first),
                        num(res.success_final), num(res.well_formed_min), num(res.blind_success),
                        num(res.follows_final), num(res.zero_spread), num(res.reply_effect), num(res.eval_correct),
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
                         f" | `{text}` | {r.final_response_share:.2f} | {_num(r.repeat_rate, 'final')} | "
                         f"{_num(r.final_response_reward, 'final')} | {_num(r.final, 'final')} | "
                         f"{_num(r.success_first, 'final')} → {_num(r.success_final, 'final')} | "
                         f"{_num(r.blind_success, 'final')} | {_num(r.follows_final, 'final')} |")
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


# ---- draws: every GPU window's runs, and the control ---------------------------------------------
# A GPU does not repeat a run from its seed, so a grid point run in two GPU windows is two draws, not
# one run twice. setup/land_gpu_window.py keeps each window's record beside the study's committed
# results (`WINDOW_RECORDS`: per iteration, the rollout reward and well-formed rate of every run the
# window ran, finished or stopped at its deadline); the report counts collapses over all of them.
# A study `X.toml` with a file `X_control.toml` beside it (the same regime, rollouts without the
# mismatch) is compared with it arm by arm.
WINDOW_RECORDS = "gpu_window_*.csv"
Z95 = 1.959964  # the normal quantile of a two-sided 95% interval


@dataclass
class Draw:
    """One run of one grid point in one window (or, for a study no window ran, in this checkout)."""

    window: str
    trust_region: str
    seed: int
    iterations: int  # logged
    planned: int  # the grid point's iterations
    collapsed: int  # iterations at the format-failure floor
    stuck_from: int | None  # the first of the floor iterations that last to its end, when there are >= final_window
    final: float  # mean reward over the last final_window logged iterations

    @property
    def finished(self) -> bool:
        return self.iterations >= self.planned


def make_draw(window: str, run: RunSpec, iterations: np.ndarray, reward: np.ndarray, final_window: int) -> Draw:
    """A draw's floor is judged from its reward alone, the environment's own verdict: the turns'
    well-formed flag calls an empty `\\boxed{}` well formed where GuessTheNumber scores it as a format
    failure (-0.1). (In an env whose wrong answers earn the floor, a batch of them counts here too; the
    GPU windows' studies play GuessTheNumber, where a well-formed guess earns at least 0.)"""
    floor = at_floor(reward, np.full_like(reward, np.nan), format_failure_floor(run))
    streak = len(floor) - int(np.flatnonzero(~floor)[-1]) - 1 if not floor.all() else len(floor)
    stuck = int(iterations[-streak]) if streak >= final_window else None
    return Draw(window, run.config.trust_region, run.seed, len(iterations), run.config.iterations, int(floor.sum()),
                stuck, _mean(reward[-final_window:]))


def study_draws(study: Study, runs: Sequence[RunSpec]) -> tuple[list[Draw], bool]:
    """The study's draws from the window records beside its committed results (rows of its name;
    a grid point is told by its trust region and seed), or, where no window ran it, from its runs
    with metrics; and whether they came from window records."""
    by_point = {(r.config.trust_region, r.seed): r for r in runs}
    draws: list[Draw] = []
    if study.results is not None and len(by_point) == len(runs):
        for path in sorted(study.results.parent.glob(WINDOW_RECORDS)):
            rows: dict[tuple[str, int], list[dict]] = {}
            with open(path, newline="", encoding="utf-8") as f:
                for row in csv.DictReader(f):
                    if row["study"] == study.name and (row["trust_region"], int(row["seed"])) in by_point:
                        rows.setdefault((row["trust_region"], int(row["seed"])), []).append(row)
            for point, its in rows.items():
                its.sort(key=lambda r: int(r["iteration"]))
                iterations, reward = (np.array([float(r[k]) for r in its]) for k in ("iteration", "rollout_reward_mean"))
                draws.append(make_draw(path.stem.removeprefix("gpu_window_"), by_point[point], iterations, reward,
                                       study.final_window))
    if draws:
        return draws, True
    loaded = load_runs(runs)
    for run in runs:
        table = loaded[run.name].metrics if run.name in loaded else None
        if table is not None and len(table):
            draws.append(make_draw("-", run, table.iterations, table.column(REWARD), study.final_window))
    return draws, False


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n (NaN, NaN for n = 0)."""
    if n == 0:
        return math.nan, math.nan
    p, z2 = k / n, z * z
    center, half = (p + z2 / (2 * n)) / (1 + z2 / n), z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, center - half), min(1.0, center + half)


def _arm_cells(draws: Sequence[Draw]) -> list[str]:
    """Finished draws: stuck k/n [Wilson 95%], iterations at the floor, final reward; stopped ones apart."""
    done = [d for d in draws if d.finished]
    stopped = [d for d in draws if not d.finished]
    if not done and not stopped:
        return ["not run yet"] * 5
    k = sum(d.stuck_from is not None for d in done)
    lo, hi = wilson(k, len(done))
    early = ", ".join(f"{d.iterations}/{d.planned}" + (" (stuck)" if d.stuck_from is not None else "") for d in stopped)
    return [f"{k}/{len(done)}" if done else "-", f"{lo:.2f}-{hi:.2f}" if done else "-",
            cell_of([d.collapsed for d in done], "collapsed"), cell_of([d.final for d in done], "final"), early or "-"]


def cell_of(values: Sequence[float], metric: str) -> str:
    s = Stat.of(values)
    if s.n == 0:
        return "-"
    return _num(s.mean, metric) if s.n == 1 else f"{_num(s.mean, metric)} ± {_num(s.std, metric)}"


def _stuck_p(a: Sequence[Draw], b: Sequence[Draw]) -> str:
    """Two-sided exact p of the stuck shares of two sets of finished draws (permutation test on the
    0/1 outcomes: Fisher's exact test, ordered by the difference of the shares)."""
    x = [float(d.stuck_from is not None) for d in a if d.finished]
    y = [float(d.stuck_from is not None) for d in b if d.finished]
    return f"{significance.permutation_p(x, y):.3f}" if x and y else "-"


def _rollouts(run: RunSpec) -> str:
    cfg = run.config
    dtype = cfg.engine_dtype if cfg.engine_dtype not in (None, "auto") else cfg.dtype
    return f"{cfg.engine} {dtype}"


def draws_markdown(study: Study, runs: Sequence[RunSpec]) -> list[str]:
    """Report lines: every window's draws (where window records exist) and the comparison of each arm
    with its control (where `<study>_control.toml` exists); [] when neither does."""
    draws, windowed = study_draws(study, runs)
    control_path = study.path.with_name(f"{study.path.stem}_control.toml")
    control = load_study(control_path) if control_path.is_file() else None
    if not windowed and control is None:
        return []
    arms = list(dict.fromkeys(r.config.trust_region for r in runs))
    lines: list[str] = []
    if windowed:
        lines += [
            "Every GPU window's runs (`" + WINDOW_RECORDS + "` beside the committed results; a seed does not "
            "repeat a run on a GPU, so a grid point run in two windows is two draws; the tables above hold one "
            "committed run per grid point). **Stuck at the floor from**: the first of the iterations at the "
            f"format-failure floor that last to the run's end, when there are at least {study.final_window}; "
            f"**final reward**: the mean of its last {study.final_window} logged iterations.",
            "",
            "| window | trust region | seed | iterations | stuck at the floor from | iterations at the floor | "
            "final reward |",
            "|---|---|---|---|---|---|---|",
        ]
        for d in sorted(draws, key=lambda d: (arms.index(d.trust_region), d.seed, d.window)):
            its = str(d.iterations) if d.finished else f"{d.iterations} of {d.planned} (stopped)"
            lines.append(f"| {d.window} | {d.trust_region} | {d.seed} | {its} | "
                         f"{'-' if d.stuck_from is None else d.stuck_from} | {d.collapsed} | {d.final:.2f} |")
        lines.append("")
    control_draws = study_draws(control, control.runs)[0] if control is not None else []
    control_label = _rollouts(control.runs[0]) + " (control)" if control is not None else ""
    lines += [
        "Collapses per arm" + (f", beside the control (`{control_path.name}`)" if control is not None else "") +
        ": over the finished draws, how many ended stuck at the floor (k/n, with the Wilson 95% interval), "
        "their iterations at the floor and final reward (mean ± std); draws stopped early apart (iterations "
        "logged of those planned).",
        "",
        "| trust region | rollouts | stuck at the floor | 95% interval | iterations at the floor | final reward | "
        "stopped early |",
        "|---|---|---|---|---|---|---|",
    ]
    by_arm = {a: [d for d in draws if d.trust_region == a] for a in arms}
    control_by_arm = {a: [d for d in control_draws if d.trust_region == a] for a in arms}
    for arm in arms:
        lines.append(f"| {arm} | {_rollouts(runs[0])} | " + " | ".join(_arm_cells(by_arm[arm])) + " |")
        if control is not None:
            lines.append(f"| {arm} | {control_label} | " + " | ".join(_arm_cells(control_by_arm[arm])) + " |")
    lines.append("")
    tests = [f"{a} vs {b}: p = {_stuck_p(by_arm[a], by_arm[b])}" for i, a in enumerate(arms) for b in arms[i + 1:]]
    if control is not None:
        tests += [f"{a} vs its control: " + ("not run yet" if not control_by_arm[a] else
                                             f"p = {_stuck_p(by_arm[a], control_by_arm[a])}") for a in arms]
    if tests:
        lines += ["Stuck or not, two-sided exact p over the finished draws (a permutation test on the 0/1 "
                  "outcomes, Fisher's exact test ordered by the difference of the shares; one p per comparison, "
                  "no correction): " + "; ".join(tests) + ".", ""]
    return lines


# ---- figures ------------------------------------------------------------------------------------


def write_figures(study: Study, groups: Sequence[Group], loaded: dict[str, Run]) -> list[Path]:
    """One figure per `FIGURES` entry that some run logged (reward, kept, mismatch, drift, entropy):
    a grid of panels (rows: models, columns: envs), one line per trust region (and other varied
    options) with a ± std band over seeds."""
    # matplotlib (about 0.5 s): only when figures are drawn
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    from oat_dppo.plot.figures import _save, draw_panel, figure_legend, series_colors
    from oat_dppo.plot.panels import Panel

    groups = [g for g in groups if g.results]
    if not groups:
        return []
    models = list(dict.fromkeys((g.family, g.model) for g in groups))
    envs = list(dict.fromkeys(g.env for g in groups))
    labels = list(dict.fromkeys(g.label for g in groups))
    colors = series_colors(len(labels))
    color_of = dict(zip(labels, colors))
    written = []
    for stem, key, what, log in FIGURES:
        if not any(loaded[r.run.name].metrics.has(key) for g in groups for r in g.results):
            continue
        nrows, ncols = len(models), len(envs)
        fig = Figure(figsize=(max(6.0, 4.8 * ncols), 3.6 * nrows + 1.1), layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=False)
        for i, (fam, model) in enumerate(models):
            for j, env in enumerate(envs):
                ax = axes[i][j]
                here = [g for g in groups if g.model == model and g.env == env]
                if not here:
                    ax.set_visible(False)
                    continue
                series = [Series(g.label, [loaded[r.run.name] for r in g.results]) for g in here]
                panel = Panel(stem, f"{env}\n{model} ({fam})", key)
                draw_panel(ax, panel, series, [color_of[g.label] for g in here], "iteration", "std", 1, 1.0)
                ax.set_title(panel.title, fontsize=9)
                ax.set_ylabel(what if j == 0 else "", fontsize=9)
                ax.set_xlabel("iteration", fontsize=9)
                if log:  # a band reaching below 0 is clipped at the axis
                    ax.set_yscale("log", nonpositive="clip")
        handles = [Line2D([], [], color=color_of[lb], lw=2, label=lb) for lb in labels]
        figure_legend(fig, handles)
        fig.suptitle(f"{study.name}: {what}\nmean ± std over seeds", fontsize=11)
        written.append(_save(fig, study.out / f"{stem}.png"))
    return written


# ---- all of it ----------------------------------------------------------------------------------


@dataclass
class Report:
    groups: list[Group]
    markdown: str
    paths: list[Path]

    @property
    def runs_with_metrics(self) -> int:
        return sum(len(g.results) for g in self.groups)


def write_report(study: Study, runs: Sequence[RunSpec], *, figures: bool = True) -> Report:
    """Aggregate `runs` (those with metrics) into <out>/summary.md, summary.csv and the figures."""
    loaded = load_runs(runs)
    groups = build_groups(runs, loaded, study.threshold, study.final_window)
    study.out.mkdir(parents=True, exist_ok=True)
    pngs = write_figures(study, groups, loaded) if figures and loaded else []
    md = markdown(study, groups, runs, pngs)
    md_path, csv_path, runs_path = study.out / "summary.md", study.out / "summary.csv", study.out / "runs.csv"
    md_path.write_text(md, encoding="utf-8")
    csv_path.write_text(csv_text(groups, study.name, study.threshold), encoding="utf-8")
    runs_path.write_text(runs_csv_text(groups), encoding="utf-8")
    return Report(groups, md, [md_path, csv_path, runs_path, *pngs])

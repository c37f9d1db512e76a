"""A study's per-run and per-group results: each run's numbers, from its metrics.jsonl (read with
`oat_dppo.plot.read_metrics`), and the runs grouped by what the grid varies. R = rollout/reward_mean:

    final      mean of R over the last `[study] final_window` logged iterations (default 3)
    best       max of R
    reach      the first iteration with R >= threshold (None when never)
    auc        mean of R over all logged iterations (area under the curve / iterations)
    kept       mean of train/kept_frac over iterations
    mismatch   mean of train/prob_diff_mean (|pi - mu| over the update: mismatch + drift) over iterations
    eval       the last logged eval/reward_mean (NaN when the run never evaluated)

Runs are grouped by model family, model, env, trust region and any other option the grid varies;
the seeds of a group give mean and population std (ddof 0, as the figures' bands).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from oat_dppo.config import to_dict
from oat_dppo.envs import get_preset
from oat_dppo.plot.data import IGNORED_CONFIG_KEYS, MetricTable, Run, load_run
from oat_dppo.provenance import machine_label
from oat_dppo.study.constant_policy import constant_response_reward, feedback_blind_success
from oat_dppo.study.committed import episodes_file, metrics_dir, read_episodes
from oat_dppo.study.spec import NAME_KEYS, RunSpec, format_value

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


def mean(y: np.ndarray) -> float:
    return float(np.mean(y)) if len(y) else math.nan


def format_failure_floor(run: RunSpec) -> float:
    """The mean episode reward of a batch in which every episode failed its first turn's format."""
    return get_preset(run.config.env).format_failure_reward + run.config.format_penalty


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
        final=mean(r[-final_window:]),
        best=float(np.max(r)) if len(r) else math.nan,
        reach=reach,
        auc=mean(r),
        kept=mean(_finite(table, KEPT)[1]),
        mismatch=mean(_finite(table, MISMATCH)[1]),
        eval=float(ev[-1]) if len(ev) else math.nan,
        lowest=float(np.min(r)) if len(r) else math.nan,
        collapsed=floor_iterations(table.column(REWARD), table.column(WELL_FORMED), format_failure_floor(run)),
        entropy_min=float(np.min(ent)) if len(ent) else math.nan,
        engine_mismatch=mean(_finite(table, PRE_UPDATE_MISMATCH)[1]),
        finished=len(table) >= run.config.iterations,
        entropy_final=mean(ent[-final_window:]),
        ratio_max=float(np.max(ratios)) if len(ratios) else math.nan,
        success_first=mean(success[:final_window]),
        success_final=mean(success[-final_window:]),
        well_formed_min=float(np.min(well_formed[final_window:])) if len(well_formed) > final_window else math.nan,
        follows_final=mean(follows[-final_window:]),
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


def num(v: float, metric: str) -> str:
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


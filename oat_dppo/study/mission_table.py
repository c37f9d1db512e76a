"""The mission table from its CSV alone: each cell's arms with their 95% intervals, and one figure.

    python -m oat_dppo.study.mission experiments/mission_table.toml --report

Every number comes from `docs/results/mission_table.csv` (one row a test evaluation: `oat_dppo.study.mission`);
nothing is copied by hand. The table is written to `mission_table.md` beside the CSV and into docs/results.md
between its `MARK_BEGIN` / `MARK_END` lines; the figure to docs/img/mission_table.png.

The interval of an arm (`summarize`): the mean over seeds of each seed's test mean, +- the half-width
sqrt((t * se_seeds)^2 + (1.96 * se_tasks)^2), where se_seeds = sd(seed means) / sqrt(S) with Student's t at
S - 1 degrees of freedom (0 for one seed), and se_tasks = sqrt(mean of the seeds' episode variances / episodes):
every seed plays the same test tasks, so their spread cannot show how far those tasks are from the env's own
mean; the second term adds that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from oat_dppo.study.mission import ARMS, read_rows

MARK_BEGIN = "<!-- mission-table: begin (python -m oat_dppo.study.mission experiments/mission_table.toml --report) -->"
MARK_END = "<!-- mission-table: end -->"
# Student's t, two-sided 95%, by degrees of freedom (1..10); above 10, 2.23 is within 0.2 of the truth and
# 1.96 is its limit: a wider interval, never a narrower one.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 2.228


@dataclass(frozen=True)
class ArmSummary:
    env: str
    model: str
    backend: str
    arm: str
    seeds: tuple[int, ...]
    seed_means: tuple[float, ...]
    episodes: int  # per seed (the smallest, where they differ)
    mean: float
    half_width: float  # of the 95% interval
    solved: float | None  # mean over seeds of the solved share (None where the game has none)
    se_tasks: float = 0.0  # the test tasks' sampling error of the mean (see the module docstring)

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width


def summarize(rows: Sequence[dict]) -> list[ArmSummary]:
    """One summary per (env, model, backend, arm) of test rows, in the CSV's order of cells and ARMS' of arms."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if row["split"] == "test":
            groups.setdefault((row["env"], row["model"], row["backend"], row["arm"]), []).append(row)
    cells = list(dict.fromkeys(k[:3] for k in groups))
    out = []
    for cell in cells:
        for arm in ARMS:
            group = groups.get((*cell, arm))
            if not group:
                continue
            means = [float(r["mean"]) for r in group]
            variances = [float(r["std"]) ** 2 for r in group if r.get("std") not in ("", None, "nan")]
            episodes = min(int(r["episodes"]) for r in group)
            s = len(means)
            mean = sum(means) / s
            se_seeds = math.sqrt(sum((m - mean) ** 2 for m in means) / (s - 1) / s) if s > 1 else 0.0
            se_tasks = math.sqrt(sum(variances) / len(variances) / episodes) if variances else 0.0
            half = math.sqrt((t975(s - 1) * se_seeds) ** 2 + (1.96 * se_tasks) ** 2) if s > 1 else 1.96 * se_tasks
            solved = [float(r["solved"]) for r in group if r.get("solved") not in ("", None)]
            out.append(ArmSummary(*cell, arm, tuple(int(r["seed"]) for r in group), tuple(means), episodes, mean,
                                  half, sum(solved) / len(solved) if solved else None, se_tasks))
    return out


def separated(a: ArmSummary, b: ArmSummary) -> bool:
    """a's interval lies wholly above b's."""
    return a.low > b.high


def difference(a: ArmSummary, b: ArmSummary) -> tuple[float, float]:
    """(mean of a - b over the seeds both have, its standard error). Arms of a seed start from one warm start
    and play the same test tasks, so the seeds' spread is taken of the paired differences d_s = a_s - b_s:
    se = sqrt(sd(d)^2 / S + se_tasks(a)^2 + se_tasks(b)^2) (the tasks' term as if independent: a wider error
    than the paired one, never a narrower; sd(d) is 0 for one seed)."""
    mine, theirs = dict(zip(a.seeds, a.seed_means)), dict(zip(b.seeds, b.seed_means))
    diffs = [mine[s] - theirs[s] for s in mine if s in theirs]
    if not diffs:
        raise ValueError(f"{a.arm} and {b.arm} share no seed")
    n = len(diffs)
    mean = sum(diffs) / n
    var_seeds = sum((d - mean) ** 2 for d in diffs) / (n - 1) / n if n > 1 else 0.0
    return mean, math.sqrt(var_seeds + a.se_tasks ** 2 + b.se_tasks ** 2)


LEARNED_OVER_BLIND = 0.15  # issue 68: RL at least this far over the best blind bound,
LEARNED_SE = 2.0  # and above its warm start and its control by more than this many standard errors,
LEARNED_SEEDS = 2  # each paired over at least this many seeds (one seed's gap has no seed spread to weigh)


def learned(arms: dict[str, ArmSummary]) -> bool | None:
    """Issue 68's "learned": RL's test mean at least `LEARNED_OVER_BLIND` over the blind bound and above its warm
    start and its control by more than `LEARNED_SE` standard errors (`difference`), each paired over at least
    `LEARNED_SEEDS` seeds; None without those arms or seeds (not judged yet)."""
    if not all(arm in arms for arm in ("rl", "control", "warm_start", "blind")):
        return None
    rl = arms["rl"]
    if any(len(set(rl.seeds) & set(arms[arm].seeds)) < LEARNED_SEEDS for arm in ("warm_start", "control")):
        return None
    over = [difference(rl, arms[arm]) for arm in ("warm_start", "control")]
    return rl.mean >= arms["blind"].mean + LEARNED_OVER_BLIND and all(d > LEARNED_SE * se for d, se in over)


def comparisons(summaries: Sequence[ArmSummary]) -> list[str]:
    """One line a cell: RL against its control, its warm start and the blind bound, each as the paired difference
    in standard errors (`difference`) and whether the arms' 95% intervals are apart (`separated`), then issue 68's
    `learned`, saying where it rests on the paired test alone; a cell without RL rows yet says what it lacks."""
    lines = []
    for cell in dict.fromkeys((s.env, s.model, s.backend) for s in summaries):
        arms = {s.arm: s for s in summaries if (s.env, s.model, s.backend) == cell}
        name = f"{cell[0]}, {cell[1]} ({cell[2]})"
        rl = arms.get("rl")
        if rl is None:
            lines.append(f"- {name}: no RL row yet ({', '.join(arms)} measured).")
            continue
        # an Oat cell's RL starts from a local cell's warm start: that cell's warm start and blind rows are its own
        borrowed = {s.arm: s for s in summaries if (s.env, s.model) == cell[:2] and s.backend != cell[2]
                    and s.arm in ("warm_start", "blind") and s.arm not in arms}
        arms = {**borrowed, **arms}
        said = [f"RL {rl.mean:.3f} on {len(rl.seeds)} seed(s)"]
        for arm, label in (("control", "its shuffled-advantage control"), ("warm_start", "its warm start"),
                           ("blind", "the blind bound")):
            other = arms.get(arm)
            if arm in borrowed:
                label += f" ({other.backend})"
            if other is None:
                said.append(f"no row yet for {label}")
            else:
                intervals = "95% intervals apart" if separated(rl, other) else "95% intervals overlap"
                gap, se = difference(rl, other)
                said.append(f"{label} {other.mean:.3f}: RL {gap:+.3f}, {gap / se:+.1f} SE paired by seed, {intervals}"
                            if se > 0 else f"{label} {other.mean:.3f}: {intervals}")
        verdict = learned(arms)
        if verdict is None and all(arm in arms for arm in ("control", "warm_start", "blind")):
            said.append(f"learned: not judged yet (issue 68's test pairs RL with its warm start and control over "
                        f"at least {LEARNED_SEEDS} seeds)")
        if verdict is not None:
            said.append(f"learned: {'yes' if verdict else 'no'} (issue 68's test: RL >= blind + {LEARNED_OVER_BLIND}, "
                        f"> {LEARNED_SE:g} paired SE over warm start and control"
                        + ("; the per-arm intervals, the stricter test, overlap" if verdict and not all(
                            separated(rl, arms[a]) for a in ("warm_start", "control")) else "") + ")")
        lines.append(f"- {name}: " + "; ".join(said) + ".")
    return lines


def markdown(summaries: Sequence[ArmSummary]) -> str:
    lines = ["| env | model | backend | arm | seeds | test episodes a seed | mean [95% interval] | solved | seeds' means |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        solved = f"{s.solved:.3f}" if s.solved is not None else ""
        lines.append(f"| {s.env} | {s.model} | {s.backend} | {s.arm} | {len(s.seeds)} | {s.episodes} | "
                     f"**{s.mean:.3f}** [{s.low:.3f}, {s.high:.3f}] | {solved} | "
                     f"{', '.join(f'{m:.3f}' for m in s.seed_means)} |")
    return "\n".join(lines) + "\n\n" + "\n".join(comparisons(summaries)) + "\n"


FIGURE_COLUMNS = 4  # panels per row of the figure


def figure(summaries: Sequence[ArmSummary], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(dict.fromkeys((s.env, s.model, s.backend) for s in summaries))
    cols = min(len(cells), FIGURE_COLUMNS)  # a grid, so that the panels stay readable as cells are added
    rows = -(-len(cells) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.8 * rows), squeeze=False)
    colors = {"blind": "#999999", "demonstrator": "#4c72b0", "warm_start": "#dd8452", "rl": "#55a868",
              "control": "#c44e52"}
    for ax in axes.flat[len(cells):]:
        ax.set_visible(False)
    for ax, cell in zip(axes.flat, cells):
        arms = [s for s in summaries if (s.env, s.model, s.backend) == cell]
        for i, s in enumerate(arms):
            ax.bar(i, s.mean, color=colors.get(s.arm, "#333333"), alpha=0.8)
            ax.errorbar(i, s.mean, yerr=s.half_width, color="black", capsize=4)
            ax.scatter([i] * len(s.seed_means), s.seed_means, color="black", s=10, zorder=3)
        ax.set_xticks(range(len(arms)), [s.arm for s in arms], rotation=30)
        ax.set_ylim(0, 1.05)
        env_id, _, options = cell[0].partition("[")  # the options on a line of their own
        name = env_id.split(":")[-1] + (f"\n[{options}" if options else "")
        ax.set_title(f"{name}\n{cell[1]} ({cell[2]})", fontsize=9)
        ax.set_ylabel("test mean reward")
    fig.suptitle("Mission table: test split, 95% intervals over seeds and tasks (dots: seeds)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def replace_block(text: str, block: str) -> str:
    """`text` with what lies between the markers replaced by `block` (the markers kept)."""
    if MARK_BEGIN not in text or MARK_END not in text:
        raise ValueError(f"the page has no {MARK_BEGIN!r} ... {MARK_END!r} block")
    head, rest = text.split(MARK_BEGIN, 1)
    _, tail = rest.split(MARK_END, 1)
    return f"{head}{MARK_BEGIN}\n{block}{MARK_END}{tail}"


def write_report(csv_path: Path, *, page: Path = Path("docs/results.md"),
                 image: Path = Path("docs/img/mission_table.png")) -> list[Path]:
    """The table beside the CSV and in `page` (where it has the markers), the figure at `image`."""
    summaries = summarize(read_rows(csv_path))
    if not summaries:
        raise SystemExit(f"{csv_path}: no test rows yet")
    table = markdown(summaries)
    written = [csv_path.with_suffix(".md")]
    written[0].write_text(f"# The mission table\n\nFrom `{csv_path}` by `python -m oat_dppo.study.mission "
                          f"experiments/mission_table.toml --report`; intervals: `oat_dppo.study.mission_table`.\n\n"
                          f"{table}")
    written.append(figure(summaries, image))
    if page.is_file() and MARK_BEGIN in page.read_text():
        page.write_text(replace_block(page.read_text(), table))
        written.append(page)
    return written

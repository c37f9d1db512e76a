"""The learner loop of both backends: a packed rollout batch -> several trust-region optimizer steps.

    for each of `epochs`: a permutation of the rows, cut into optimizer steps of `step_rows` rows,
        each cut into micro-batches of `micro_rows` rows (sorted by length first where the backend
        wants less padding):
            trust_region_loss(micro-batch) -> hooks.backward(loss)     (gradients accumulate)
        hooks.step()                                                   (clip + optimizer step)

A rollout batch gives several optimizer steps: the paper's setting, where the trust region matters
from the second step on (pi has moved away from mu). The loss normalizers cover a whole optimizer
step, so that accumulating micro-batches equals one big batch; with several data-parallel ranks
they cover every rank's rows of the step (`UpdateHooks.normalizers`), so that the ranks' averaged
gradient equals one process stepping on all of them.

What differs between the backends is passed in, nothing else: how rows are permuted (a seeded
`random.Random` locally, Oat's `np.random.permutation` on Oat, so that stock Oat is reproduced
exactly) and what `backward`/`step` do (`UpdateHooks`: a torch optimizer locally, DeepSpeed's engine
on Oat). The optional pi_old forward (`recompute_old_logp`) and `--mu-source recompute` live here too.
"""

from __future__ import annotations

import math
from typing import Callable, Literal, Protocol, Sequence

import numpy as np
import torch
from torch import Tensor

from oat_dppo.learner.batch import TokenBatch
from oat_dppo.learner.logprobs import policy_logprobs
from oat_dppo.learner.step import MetricAccumulator, trust_region_loss
from oat_dppo.learner.timing import OnTiming, timed
from oat_dppo.trust_region import requirements

MuSource = Literal["rollout", "recompute"]
# An optimizer step's micro-batches, each a list of row indices into the packed batch.
StepPlan = list[list[int]]


def needs_pi_old(trust_region, mu_source: MuSource) -> bool:
    """Whether the learner recomputes log pi_old before the update: the strategy anchors its mask on
    it (`requirements(...).needs_old_logp`), or mu itself is replaced by it (`--mu-source recompute`)."""
    return requirements(trust_region).needs_old_logp or mu_source == "recompute"


def plan_steps(
    n_rows: int,
    *,
    epochs: int,
    step_rows: int,
    micro_rows: int,
    permutation: Callable[[int], Sequence[int]],
    sort_keys: Sequence | None = None,
    groups: Sequence[int] | None = None,
    step_counts: Literal["rows", "groups"] = "rows",
    split_groups: bool = False,
    lengths: Sequence[int] | None = None,
    micro_tokens: int = 0,
) -> list[StepPlan]:
    """Optimizer steps (each a list of micro-batches of row indices) for `epochs` passes over `n_rows`.

    `permutation(n)` gives each epoch's row order. With `sort_keys` (one per row: its length, which keeps
    padding small; or its tokens, which puts rows sharing a prompt into one micro-batch, where the prefix
    layout computes it once), a step's rows are sorted by them before they are cut into micro-batches
    (stable: ties keep the permutation's order).

    `groups` (one id per row, e.g. its episode): rows of a group go into one optimizer step. Groups are
    permuted instead of rows. `step_counts` says what `step_rows` counts: "rows" (a step takes whole
    groups until it holds `step_rows` rows or more) or "groups" (a step takes `step_rows` whole groups,
    so the number of steps does not depend on how many rows each group has). Without `split_groups` a
    micro-batch also takes whole groups, up to `micro_rows` rows (a larger group alone), so that a
    strategy deciding per episode sees the whole episode; with it the step's rows are cut into
    micro-batches like ungrouped rows.

    `micro_tokens > 0` (with `lengths`, one per row): micro-batches are cut by a token budget instead of
    `micro_rows`: consecutive rows (or groups) join a micro-batch while its padded grid, rows x the longest
    row, stays within `micro_tokens` (a longer row or group alone). Short rows then share few, large
    forwards; long ones are never stacked past what fits.
    """
    if micro_tokens > 0 and lengths is None:
        raise ValueError("micro_tokens needs the length of each row (lengths)")
    cut = _Cutter(micro_rows, lengths, micro_tokens)
    if groups is not None:
        return _plan_grouped_steps(groups, epochs=epochs, step_rows=step_rows, cut=cut,
                                   permutation=permutation, sort_keys=sort_keys, step_counts=step_counts,
                                   split_groups=split_groups)
    plan: list[StepPlan] = []
    for _ in range(epochs):
        order = list(permutation(n_rows))
        for start in range(0, n_rows, step_rows):
            plan.append(_micro_batches(order[start : start + step_rows], cut, sort_keys))
    return plan


class _Cutter:
    """Consecutive units (lists of rows) into micro-batches: up to `micro_rows` rows, or with `micro_tokens` while
    rows x the longest row stays within it; a unit over the limit alone."""

    def __init__(self, micro_rows: int, lengths: Sequence[int] | None, micro_tokens: int):
        self.micro_rows, self.lengths, self.micro_tokens = micro_rows, lengths, micro_tokens

    def __call__(self, units: list[list[int]]) -> list[list[list[int]]]:
        if not self.micro_tokens:
            return _pack(units, self.micro_rows, at_most=True)
        bins: list[list[list[int]]] = [[]]
        rows = longest = 0
        for unit in units:
            unit_longest = max(self.lengths[i] for i in unit)
            grown = (rows + len(unit)) * max(longest, unit_longest)
            if bins[-1] and grown > self.micro_tokens:
                bins.append([])
                rows = longest = 0
            bins[-1].append(unit)
            rows, longest = rows + len(unit), max(longest, unit_longest)
        return [b for b in bins if b]


def _micro_batches(rows: list[int], cut: _Cutter, sort_keys: Sequence | None) -> StepPlan:
    if sort_keys is not None:
        rows = sorted(rows, key=lambda i: sort_keys[i])
    return [[r for unit in micro for r in unit] for micro in cut([[r] for r in rows])]


def _plan_grouped_steps(groups, *, epochs, step_rows, cut, permutation, sort_keys, step_counts,
                        split_groups) -> list[StepPlan]:
    if step_counts not in ("rows", "groups"):
        raise ValueError(f"step_counts={step_counts!r}: 'rows' or 'groups'")
    members: dict[int, list[int]] = {}
    for row, group in enumerate(groups):
        members.setdefault(int(group), []).append(row)
    units = list(members.values())  # [G] rows of each group, in row order
    plan: list[StepPlan] = []
    for _ in range(epochs):
        order = [units[g] for g in permutation(len(units))]
        if step_counts == "groups":
            steps = [order[i : i + step_rows] for i in range(0, len(order), step_rows)]
        else:
            steps = _pack(order, step_rows)
        for step in steps:
            if split_groups:
                plan.append(_micro_batches([r for rows in step for r in rows], cut, sort_keys))
                continue
            if sort_keys is not None:
                step = sorted(step, key=lambda rows: max(sort_keys[i] for i in rows))
            plan.append([[r for rows in micro for r in rows] for micro in cut(step)])
    return plan


def _pack(units: list[list[int]], rows: int, at_most: bool = False) -> list[list[list[int]]]:
    """Consecutive units into bins: each bin closes once it holds >= `rows` rows, or (`at_most`) before
    a unit would take it past `rows` (a unit larger than `rows` gets a bin of its own)."""
    bins: list[list[list[int]]] = [[]]
    size = 0
    for unit in units:
        if at_most and bins[-1] and size + len(unit) > rows:
            bins.append([])
            size = 0
        bins[-1].append(unit)
        size += len(unit)
        if not at_most and size >= rows:
            bins.append([])
            size = 0
    return [b for b in bins if b]


def row_sort_keys(layout: str, turns: Sequence) -> list[list[int]] | None:
    """How both learners sort a step's rows (`plan_update`'s `sort_keys`) under `layout` (`sequence_layout`): by their
    tokens under "prefix", which puts a group's samples (one prompt) and an episode's turns in one micro-batch, so that
    their shared prefix runs once (`benchmarks layouts` on the peers job's turns: 0.52x the padded time sorted, 1.21x
    in Oat's shuffled order); by length otherwise (None: less padding). A step's loss normalizers cover the whole step,
    so the order changes only the summation order."""
    return [list(t.prompt_ids) + list(t.response_ids) for t in turns] if layout == "prefix" else None


def plan_update(
    lengths: Sequence[int],
    episode_ids: Sequence[int] | None,
    *,
    trajectory_sequences: bool,
    mini_batch_unit: Literal["turns", "episodes", "groups"],
    epochs: int,
    step_rows: int,
    micro_rows: int,
    permutation: Callable[[int], Sequence[int]],
    sort_keys: Sequence | None = None,
    chain_of: Sequence[int] | None = None,
    micro_tokens: int = 0,
    group_ids: Sequence[int] | None = None,
) -> tuple[list[StepPlan], list[int] | None]:
    """Both backends' plan for one rollout batch of turns: (optimizer steps, the sequence id of each row
    or None). `episode_ids` (one per turn) say which turns are one episode:

    * `mini_batch_unit="episodes"`: a step takes `step_rows` whole episodes (`step_counts="groups"`);
    * `mini_batch_unit="groups"`: a step takes `step_rows` whole groups (`group_ids`, one per turn: the episodes
      played from one start state), so that a group's samples of one prompt share a step and, sorted by their
      tokens, a micro-batch, where the prefix layout computes the prompt once; not with episodes kept whole
      (the two cases below that keep an episode's turns in one micro-batch);
    * a strategy that decides per episode (`trajectory_sequences`) on episodes of several turns: an
      episode's turns share a micro-batch and are one sequence (the returned ids);
    * `chain_of` (the row of each turn, `batch.chains`) with rows of several turns: an episode's turns
      share a micro-batch, and the plan's indices are rows, not turns;
    * otherwise turns are rows like any other (an episode is not kept together).

    `permutation(n)` orders the n units (turns, or the episodes or groups kept together) of each epoch. A
    step's units are sorted by `sort_keys` (one per turn; default: `lengths`).
    `micro_tokens > 0`: micro-batches by a token budget over `lengths` (`plan_steps`; an episode kept together
    counts its turns' rows, which overcounts a chained episode's one row: the budget stays an upper bound).
    """
    if mini_batch_unit == "episodes" and episode_ids is None:
        raise ValueError("mini_batch_unit='episodes' needs the episode of each turn (episode_ids)")
    groups = None if episode_ids is None else [int(e) for e in episode_ids]
    # The whole episode is one sequence only where the strategy decides per episode and an episode has
    # several turns (one turn per episode: the turn is the trajectory, the usual plan serves).
    episode_sequences = trajectory_sequences and groups is not None and len(set(groups)) < len(groups)
    by_episode = mini_batch_unit == "episodes"
    packed = chain_of is not None and len(set(chain_of)) < len(chain_of)
    if packed and groups is None:
        raise ValueError("rows of several turns (chain_of) need the episode of each turn (episode_ids)")
    together = episode_sequences or packed
    by_group = mini_batch_unit == "groups"
    if by_group:
        if group_ids is None or len(group_ids) != len(lengths):
            raise ValueError("mini_batch_unit='groups' needs the group of each turn (group_ids)")
        if together:
            raise ValueError("mini_batch_unit='groups' keeps groups, not episodes, whole: not with a strategy that "
                             "decides per episode on multi-turn episodes, nor with rows of several turns (chat history)")
    units = [int(g) for g in group_ids] if by_group else (groups if (together or by_episode) else None)
    plan = plan_steps(len(lengths), epochs=epochs, step_rows=step_rows, micro_rows=micro_rows,
                      permutation=permutation,
                      sort_keys=list(lengths) if sort_keys is None else sort_keys,
                      groups=units, step_counts="groups" if (by_episode or by_group) else "rows",
                      split_groups=not together, lengths=list(lengths), micro_tokens=micro_tokens)
    if not packed:
        return plan, (groups if episode_sequences else None)
    plan = [[list(dict.fromkeys(int(chain_of[t]) for t in micro)) for micro in step] for step in plan]
    first = {}
    for turn, row in enumerate(chain_of):
        first.setdefault(int(row), turn)
    return plan, ([groups[first[row]] for row in range(len(first))] if episode_sequences else None)


def equalize_plan(plan: Sequence[StepPlan], agree_max: Callable[[list[int]], list[int]]) -> list[StepPlan]:
    """The plan of one data-parallel rank, padded so that every rank takes the same number of optimizer
    steps and, in each step, the same number of micro-batches: ranks whose episodes hold fewer turns
    get empty micro-batches (`[]`), which `run_update` runs as a pass of zero loss. DeepSpeed's
    accumulation boundary, the per-step reduction of the loss normalizers and ZeRO-3's parameter
    gathers are collective: a rank that took fewer passes would hang the others.
    `agree_max(counts)`: the element-wise maximum of `counts` over the ranks (one rank: `counts`)."""
    steps = agree_max([len(plan)])[0]
    padded = [list(step) for step in plan] + [[] for _ in range(steps - len(plan))]
    sizes = agree_max([len(step) for step in padded])
    return [step + [[] for _ in range(size - len(step))] for step, size in zip(padded, sizes)]


def chunks(rows: Sequence[int], size: int) -> list[list[int]]:
    return [list(rows[i : i + size]) for i in range(0, len(rows), size)]


@torch.no_grad()
def recompute_old_logp(model, batch: TokenBatch, micro_batches: Sequence[Sequence[int]], *, device,
                       logits_chunk_tokens: int = 0) -> Tensor:
    """[B, T] log pi_old at every response position (0 elsewhere): one no-grad forward over the
    batch in the given micro-batches, before any update."""
    old = torch.zeros_like(batch.behavior_logp)  # [B, T]
    for rows in micro_batches:
        sub = batch.rows(rows)
        sub.topk_ids = sub.topk_behavior_logp = sub.topk_valid = None  # pi_old needs no top-K
        logp = policy_logprobs(model, sub.to(device), with_entropy=False, chunk_tokens=logits_chunk_tokens).logp
        old[torch.as_tensor(rows), : logp.shape[1]] = logp.float().cpu()  # [rows, width]
    return old


def use_mu_source(batch: TokenBatch, mu_source: MuSource) -> None:
    """`--mu-source recompute`: mu := pi_old at the response tokens (the on-policy assumption of
    stock PPO code); "rollout" keeps the engine's mu (the paper)."""
    if mu_source == "recompute":
        if batch.old_logp is None:
            raise ValueError("mu_source 'recompute' needs batch.old_logp (run recompute_old_logp first)")
        batch.behavior_logp = torch.where(batch.response_mask, batch.old_logp, batch.behavior_logp)


class UpdateHooks(Protocol):
    """What a backend does with the loss of one micro-batch and at the end of an optimizer step."""

    def backward(self, loss: Tensor) -> None:
        """Accumulate the gradient of `loss` (already normalized for the whole optimizer step)."""

    def step(self) -> float:
        """Apply the accumulated gradient (clipping included) and clear it; the gradient norm
        (not finite: the step was skipped)."""

    def begin_step(self, micro_batches: int) -> None:
        """An optimizer step of `micro_batches` micro-batches begins (DeepSpeed: where its accumulation
        boundary falls)."""

    def agree_max(self, counts: list[int]) -> list[int]:
        """The element-wise maximum of `counts` over the data-parallel ranks (one rank: `counts`)."""

    def normalizers(self, tokens: float, sequences: float) -> tuple[float, float]:
        """The loss normalizers of one optimizer step whose rows hold `tokens` response tokens and
        `sequences` rows on this rank. With data-parallel ranks whose gradients are averaged
        (DeepSpeed), the counts summed over the ranks / the number of ranks: then the average of the
        ranks' gradients is the gradient of one process holding every rank's rows. One rank: unchanged."""


def run_update(
    model,
    batch: TokenBatch,
    plan: Sequence[StepPlan],
    trust_region,
    hooks: UpdateHooks,
    *,
    device,
    aggregation: str = "token_mean",
    constant_length: int | None = None,
    logits_chunk_tokens: int = 0,
    layout: str | None = None,
    on_timing: OnTiming | None = None,
) -> dict[str, float]:
    """Run `plan` over `batch` (micro-batches moved to `device` one at a time; `layout`: `policy_logprobs`'s).
    Returns the update's metrics: the trust region's (token-weighted over micro-batches), `entropy`, `loss` (mean
    per step), `grad_norm` (mean over steps) and `grad_norm_max`, `optimizer_steps`, `skipped_steps`,
    `train_tokens` (response tokens trained, epochs counted), `turns_in_loss` (the turns with a token in a loss this
    rank computed: where "every turn played is trained" is counted), and `mismatch_mean` / `mismatch_max`:
    |pi - mu| on the first optimizer step's tokens, where pi is still pi_old, so the
    training-inference mismatch alone (`prob_diff_*` also hold the later steps' policy drift).

    The plan is first padded so that every rank runs as many steps and micro-batches as the others
    (`equalize_plan`): an empty micro-batch runs one row of the batch with its loss multiplied by 0 (a
    backward that changes no gradient but takes part in the ranks' collectives).

    `on_timing(name, seconds)` (optional) gets the wall time of every piece: "collate" (a micro-batch cut
    and moved), "forward", "trust_region", "backward" and "optimizer" (`learner.timing`)."""
    plan = equalize_plan(plan, hooks.agree_max)
    acc = MetricAccumulator()
    before_update = MetricAccumulator()  # the first step's micro-batches: no optimizer step yet
    losses, norms, tokens = [], [], 0.0
    in_loss: set[int] = set()
    for index, step in enumerate(plan):
        rows = [r for micro in step for r in micro]
        step_tokens = float(batch.response_mask[torch.as_tensor(rows, dtype=torch.long)].sum())
        n_tok, n_seq = hooks.normalizers(step_tokens, float(batch.num_turns(rows)))  # every rank's, not this one's
        n_tok = n_tok if n_tok > 0 else 1.0  # a step of loss-masked rows trains nothing
        step_loss = 0.0
        hooks.begin_step(len(step))
        for micro in step:
            # An empty micro-batch (this rank's share of the step is spent) runs row 0 as any pass runs,
            # the same modules in the same order (ZeRO-3 gathers each on entry), and trains on 0 x its loss.
            with timed(on_timing, "collate"):
                mb = batch.rows(micro or [0]).to(device)
            loss, metrics = trust_region_loss(
                model, mb, trust_region, aggregation=aggregation, constant_length=constant_length,
                num_tokens=n_tok, num_sequences=n_seq, logits_chunk_tokens=logits_chunk_tokens, layout=layout,
                on_timing=on_timing,
            )
            with timed(on_timing, "backward"):
                hooks.backward(loss if micro else loss * 0.0)
            if not micro:
                continue
            step_loss += float(loss.detach())
            in_loss |= batch.trained_turns(micro)
            acc.add(metrics, float(mb.num_tokens))
            if index == 0:
                before_update.add(metrics, float(mb.num_tokens))
        with timed(on_timing, "optimizer"):
            norms.append(float(hooks.step()))
        losses.append(step_loss)
        tokens += step_tokens
    out = acc.result()
    first = before_update.result()
    for stat in ("mean", "max"):
        if f"prob_diff_{stat}" in first:
            out[f"mismatch_{stat}"] = first[f"prob_diff_{stat}"]
    finite = [n for n in norms if math.isfinite(n)]
    out.update(
        loss=float(np.mean(losses)) if losses else math.nan,
        grad_norm=float(np.mean(finite)) if finite else math.nan,
        grad_norm_max=max(finite) if finite else math.nan,
        optimizer_steps=float(len(plan)),
        skipped_steps=float(len(norms) - len(finite)),
        train_tokens=tokens,
        turns_in_loss=float(len(in_loss)),
    )
    return out

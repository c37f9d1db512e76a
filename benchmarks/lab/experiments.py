"""The experiments registry: which strategies each figure compares, in which simulator regime, and
what it plots. A run is keyed by (strategy label, seed); runs shared by several figures (same
strategy, params and config) are computed once and cached in the output folder."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from benchmarks.lab.config import SimConfig

# The regime every figure uses (docs/lab.md explains each choice). lr 1e-2 is the "stress" learning
# rate at which the unconstrained baselines break down in this simulator; at 1e-3 nothing collapses.
BASE = SimConfig(
    vocab=2048,
    seq_len=8,
    n_problems=16,
    max_target_rank=16,
    prompts_per_batch=8,
    group_size=8,
    grad_steps=4,
    minibatch=False,
    lr=1e-2,
    iterations=100,
)


@dataclass(frozen=True)
class StrategySpec:
    label: str  # legend / CSV key
    name: str  # registered trust-region name
    params: dict[str, Any] = field(default_factory=dict)
    color: str | None = None
    style: str = "-"


@dataclass(frozen=True)
class Experiment:
    key: str
    title: str
    paper: str  # what the paper's figure shows
    strategies: tuple[StrategySpec, ...]
    panels: tuple[tuple[str, str], ...]  # (metric, y label)
    config: SimConfig = BASE
    log_panels: tuple[str, ...] = ("mismatch", "prob_diff_mean")


PG_IS = StrategySpec("PG-IS", "pg_is", {}, "tab:red")
CISPO = StrategySpec("CISPO (C=3)", "cispo", {"C": 3.0}, "tab:orange")
GRPO = StrategySpec("GRPO clip-higher", "ppo_clip", {}, "tab:blue")
MINIRL = StrategySpec("MiniRL (recompute)", "ppo_clip", {"anchor": "recompute"}, "tab:purple")
DPPO_TV = StrategySpec("DPPO-TV (0.15)", "dppo_binary_tv", {"delta": 0.15}, "tab:green")
DPPO_KL = StrategySpec("DPPO-KL (0.05)", "dppo_binary_kl", {"delta": 0.05}, "tab:olive")

REWARD = ("reward", "training reward")
MISMATCH = ("mismatch", "mismatch |pi_old - mu| (pre-update)")
PROB_DIFF = ("prob_diff_mean", "|pi - mu| during updates")

EXPERIMENTS: dict[str, Experiment] = {
    "fig3": Experiment(
        key="fig3",
        title="Fig. 3: trust region necessity",
        paper="PG-IS / CISPO / MiniRL: mismatch grows, reward collapses; DPPO-TV/KL stable near 100%",
        strategies=(PG_IS, CISPO, GRPO, MINIRL, DPPO_TV, DPPO_KL),
        panels=(REWARD, MISMATCH, PROB_DIFF, ("entropy", "policy entropy (nats)")),
    ),
    "fig4": Experiment(
        key="fig4",
        title="Fig. 4: anchor on mu vs on a recomputed pi_old",
        paper="DPPO-KL anchored on recomputed pi_old: mismatch grows and reward collapses",
        strategies=(
            DPPO_KL,
            StrategySpec("DPPO-KL recompute", "dppo_binary_kl", {"delta": 0.05, "anchor": "recompute"}, "tab:olive", "--"),
            DPPO_TV,
            StrategySpec("DPPO-TV recompute", "dppo_binary_tv", {"delta": 0.15, "anchor": "recompute"}, "tab:green", "--"),
        ),
        panels=(REWARD, MISMATCH, PROB_DIFF, ("kept_frac", "kept fraction")),
    ),
    "fig5": Experiment(
        key="fig5",
        title="Fig. 5: minimal negative-sample mask on PG-IS",
        paper="mask delta 0.5 stabilizes PG-IS; delta 0.8 and mask-0.5-recompute do not; bad updates <= 0.5%",
        strategies=(
            PG_IS,
            StrategySpec("Mask-0.5", "neg_tv_mask", {"delta": 0.5}, "tab:green"),
            StrategySpec("Mask-0.8", "neg_tv_mask", {"delta": 0.8}, "tab:orange"),
            StrategySpec("Mask-0.5-recompute", "neg_tv_mask", {"delta": 0.5, "anchor": "recompute"}, "tab:purple"),
        ),
        panels=(REWARD, ("bad_update_frac", "bad-update fraction (A<0, mu-pi>0.5)"), MISMATCH, ("kept_frac", "kept fraction")),
        log_panels=("mismatch",),
    ),
    "fig3_lowlr": Experiment(
        key="fig3_lowlr",
        title="Fig. 3 at lr 1e-3 (control: the regime where nothing collapses here)",
        paper="(not in the paper) the same comparison at a 10x smaller learning rate",
        strategies=(PG_IS, CISPO, DPPO_KL),
        panels=(REWARD, MISMATCH, PROB_DIFF, ("entropy", "policy entropy (nats)")),
        config=BASE.replace(lr=1e-3),
    ),
    "fig3_bigmismatch": Experiment(
        key="fig3_bigmismatch",
        title="Fig. 3 with an fp8-like engine (4 mantissa bits), lr 3e-3 (control: 20x larger mismatch)",
        paper="(not in the paper) the same comparison with a much larger training-inference mismatch",
        strategies=(PG_IS, CISPO, GRPO, DPPO_KL),
        panels=(REWARD, MISMATCH, PROB_DIFF, ("entropy", "policy entropy (nats)")),
        config=BASE.replace(lr=3e-3, mantissa_bits=4),
    ),
    "fig6": Experiment(
        key="fig6",
        title="Fig. 6/7: relaxing the ratio clip for low-probability tokens (alpha 0.1)",
        paper="relaxing tokens with mu < 0.1 learns faster; clipped tokens have low mu (< ~0.15) and high entropy",
        strategies=(
            GRPO,
            StrategySpec("Relax-low", "ppo_clip_relaxed", {"alpha": 0.1, "direction": "low"}, "tab:cyan"),
            StrategySpec("Relax-high", "ppo_clip_relaxed", {"alpha": 0.1, "direction": "high"}, "tab:pink"),
            StrategySpec("Relax-both", "ppo_clip_relaxed", {"alpha": 0.1, "direction": "both"}, "tab:brown"),
        ),
        panels=(
            REWARD,
            ("masked_mu_mean", "mean mu of masked (clipped) tokens"),
            ("masked_entropy_mean", "entropy at masked tokens (nats)"),
            ("entropy", "policy entropy (nats)"),
        ),
        log_panels=(),
        config=BASE.replace(lr=3e-3),
    ),
}

# The masks other frameworks ship (oat_dppo/trust_region/framework_masks.py), each at its source's defaults, beside
# PG-IS and DPPO-TV, in figure 3's regime and in its 20x-mismatch control.
PEERS = (
    PG_IS,
    DPPO_TV,
    StrategySpec("IPO (0.3)", "ipo", {}, "tab:blue"),
    StrategySpec("IcePop [0.2, 5]", "icepop", {}, "tab:purple"),
    StrategySpec("KPop (0.1)", "kpop", {}, "tab:brown"),
    StrategySpec("TIS token (C=2)", "tis", {}, "tab:orange"),
    StrategySpec("TIS seq (C=2)", "tis", {"level": "sequence"}, "tab:orange", "--"),
    StrategySpec("MIS token [0.5, 2]", "mis", {}, "tab:pink"),
    StrategySpec("MIS geo (1.001)", "mis", {"level": "geometric"}, "tab:pink", "--"),
    StrategySpec("TRM max (0.05)", "trm", {}, "tab:cyan"),
    StrategySpec("TRM mean (0.05)", "trm", {"reduce": "mean"}, "tab:cyan", "--"),
)
PEER_PANELS = (REWARD, MISMATCH, PROB_DIFF, ("kept_frac", "kept fraction"))
EXPERIMENTS["peers"] = Experiment(
    key="peers", title="The peers' masks in figure 3's regime (lr 1e-2, bf16-like engine)",
    paper="(not in the paper) every mask the frameworks ship, at its source's defaults",
    strategies=PEERS, panels=PEER_PANELS,
)
EXPERIMENTS["peers_bigmismatch"] = Experiment(
    key="peers_bigmismatch", title="The peers' masks with an fp8-like engine (4 mantissa bits), lr 3e-3",
    paper="(not in the paper) the same masks under a 20x larger training-inference mismatch",
    strategies=PEERS, panels=PEER_PANELS, config=BASE.replace(lr=3e-3, mantissa_bits=4),
)

FIGURES = ("fig3", "fig4", "fig5", "fig6")  # the paper's figures
CONTROLS = ("fig3_lowlr", "fig3_bigmismatch")  # regimes not in the paper; "all" runs both
PEER_EXPERIMENTS = ("peers", "peers_bigmismatch")  # "all" runs them too

"""What is plotted: named panels (reward, kept_frac, prob_diff, entropy, ...) and raw metric keys."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Sequence

from oat_dppo.plot.data import Warn, warn_stderr


@dataclass(frozen=True)
class Panel:
    name: str  # file stem: <name>.png
    title: str
    key: str  # solid line
    dashed: str | None = None  # the eval/ counterpart, dashed, where a run logged it
    reference: str | None = None  # a config.json key drawn as a horizontal line where runs recorded it
    reference_label: str = ""  # the line's label

    def keys(self) -> tuple[str, ...]:
        return (self.key,) if self.dashed is None else (self.key, self.dashed)


NAMED_PANELS: dict[str, Panel] = {
    p.name: p
    for p in (
        Panel("reward", "Reward", "rollout/reward_mean", "eval/reward_mean"),
        Panel("kept_frac", "Kept fraction (tokens not masked by the trust region)", "train/kept_frac"),
        # The engine's mismatch alone: |pi - mu| on the update's first optimizer step, before pi moves.
        Panel("mismatch", "Training–inference mismatch |π − μ| (before the update)", "train/mismatch_mean"),
        # Over the whole update: the mismatch plus the policy's drift over the later optimizer steps.
        Panel("prob_diff", "|π − μ| over the update (mismatch + policy drift)", "train/prob_diff_mean"),
        Panel("entropy", "Policy entropy", "train/entropy"),
        # The dotted line: the most success a policy that ignores the env's replies can reach.
        Panel("success", "Success rate", "rollout/success_rate", "eval/success_rate",
              reference="_feedback_blind_success", reference_label="feedback-blind bound"),
        # Games with a feedback probe: after "higher", a higher guess. Agreement with the hint's direction,
        # not feedback use: a blind ascending sweep reaches 1.0 (older runs' feedback_follow_rate, renamed).
        Panel("feedback", "Agrees with the hint's direction (share of follow-up turns; a blind sweep reaches 1)",
              "rollout/hint_direction_agreement", "eval/hint_direction_agreement"),
        # How much the reply moves the policy (counterfactual, at evaluation): 0 blind, 1 follows replies.
        Panel("reply_effect", "Reply effect: p(move the reply favours | reply) − p(same | reply reversed)",
              "eval/reply_effect"),
    )
}
DEFAULT_PANELS = ("reward", "kept_frac", "mismatch", "prob_diff", "entropy")


def _stem(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", key).strip("_") or "metric"


def panel_for_key(key: str) -> Panel:
    """A raw key as a panel; rollout/X gets eval/X dashed."""
    dashed = "eval/" + key[len("rollout/") :] if key.startswith("rollout/") else None
    return Panel(_stem(key), key, key, dashed)


def resolve_panels(specs: Sequence[str], available: Sequence[str], warn: Warn | None = None) -> list[Panel]:
    """Panels for --metrics entries: a panel name, a full key (train/grad_norm) or a key's last part
    (grad_norm). Entries that no run logged are skipped with a warning."""
    warn = warn or warn_stderr
    avail = set(available)
    panels: list[Panel] = []
    for spec in specs:
        spec = spec.strip()
        if not spec:
            continue
        if spec in NAMED_PANELS:
            panel = NAMED_PANELS[spec]
        elif spec in avail or "/" in spec:
            panel = panel_for_key(spec)
        else:
            matches = sorted(k for k in avail if k.rsplit("/", 1)[-1] == spec)
            if len(matches) > 1 and any(m.startswith("rollout/") for m in matches):
                matches = [m for m in matches if m.startswith("rollout/")]
            if len(matches) > 1:
                warn(f"metric {spec!r} is ambiguous ({', '.join(matches)}): skipped; give the full key")
                continue
            panel = panel_for_key(matches[0] if matches else spec)
        if not any(k in avail for k in panel.keys()):
            close = difflib.get_close_matches(spec, sorted(avail), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            what = f"metric {spec!r}" if panel.keys() == (spec,) else f"metric {spec!r} ({' / '.join(panel.keys())})"
            warn(f"{what} is in no run: skipped{hint}")
            continue
        if panel.name in {p.name for p in panels}:
            continue
        panels.append(panel)
    return panels

"""reasoning-gym tasks through GEM (`rg:*`): single-turn questions, answer in `\\boxed{}`."""

from __future__ import annotations

from .preset import EnvPreset, frozen

PRESETS = (
    EnvPreset(
        env_id="rg:arc_1d",
        family="rg",
        multi_turn=False,
        max_turns=1,
        # arc_1d generates items lazily, so a huge pool costs nothing and never repeats.
        env_kwargs=frozen(size=1_000_000),
        first_class=True,
        split_key="observation",
        description="reasoning-gym 1D ARC: infer the rule, output the test grid (single-turn)",
    ),
    EnvPreset(
        env_id="rg:acre",
        family="rg",
        multi_turn=False,
        max_turns=1,
        # ACRE generates its whole pool up front (about 0.3 s per 2000 items).
        env_kwargs=frozen(size=2000),
        first_class=True,
        split_key="observation",
        description="reasoning-gym ACRE blicket causal induction: on/off/undetermined (single-turn)",
    ),
)

# Tasks that build their whole pool up front: the default pool size would take minutes.
EAGER_TASKS = ("rg:word_ladder", "rg:composite")


def family_preset(env_id: str) -> EnvPreset:
    """Any other task: most reasoning-gym datasets are lazy, so a large pool by default."""
    kwargs = {} if env_id in EAGER_TASKS else {"size": 1_000_000}
    return EnvPreset(env_id, "rg", multi_turn=False, max_turns=1, env_kwargs=frozen(**kwargs),
                     split_key="observation")

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


# ---- reading ACRE's text: what the listed trials allow (one reading for the bound and the demonstrator) ----

ACRE_LABELS = ("on", "off", "undetermined")


def acre_trials(question: str) -> tuple[list[tuple[frozenset[str], str]], list[str]]:
    """The listed experiments `[(objects, "on"|"off"), ...]` and the new test case's objects, in its order."""
    trials_text = question.split("Previous experimental results:", 1)[1].split("New test case:", 1)[0]
    trials = []
    for line in trials_text.strip().splitlines():
        if "→" in line:
            objects, outcome = line.rsplit("→", 1)
            trials.append((frozenset(o.strip() for o in objects.split(",")), outcome.strip()))
    test_text = question.split("New test case:", 1)[1].strip().splitlines()[0]
    return trials, list(dict.fromkeys(o.strip() for o in test_text.split(",")))


def acre_evidence(question: str) -> tuple[list[tuple[str, str]], str]:
    """Each test object with what the trials say of it, and the label that follows:

    * "off": it was on the detector in a trial whose light stayed off (not a blicket);
    * "blicket": the one object of an "on" trial not ruled out that way (it turned the light on);
    * "unknown": neither.

    The label: "on" if a test object is a blicket, "off" if every one is ruled out, else "undetermined"
    (0.98 of reasoning-gym's ACRE labels: `python -m benchmarks.reasoning_bounds --env rg:acre`)."""
    trials, test = acre_trials(question)
    ruled_out = set().union(*(objs for objs, outcome in trials if outcome == "off"))
    blickets: set[str] = set()
    for objs, outcome in trials:
        candidates = objs - ruled_out
        if outcome == "on" and len(candidates) == 1:
            blickets |= candidates
    evidence = [(o, "off" if o in ruled_out else "blicket" if o in blickets else "unknown") for o in test]
    kinds = {kind for _, kind in evidence}
    label = "on" if "blicket" in kinds else "off" if kinds == {"off"} else "undetermined"
    return evidence, label

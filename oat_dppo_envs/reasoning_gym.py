"""reasoning-gym tasks through GEM (`rg:*`): single-turn questions, answer in `\\boxed{}`."""

from __future__ import annotations

from .preset import EnvPreset, frozen

ACRE_LABELS = ("on", "off", "undetermined")

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
        answer_labels=ACRE_LABELS,
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


def acre_trial_lines(question: str) -> list[str]:
    """The listed experiments as the prompt writes them, one line each ("red rubber cube, gray metal cube → on")."""
    trials_text = question.split("Previous experimental results:", 1)[1].split("New test case:", 1)[0]
    return [line.strip() for line in trials_text.strip().splitlines() if "→" in line]


def acre_line_objects(line: str) -> list[str]:
    """One experiment line's objects, in the line's order."""
    return [o.strip() for o in line.rsplit("→", 1)[0].split(",")]


def acre_trial(line: str) -> tuple[frozenset[str], str]:
    """One experiment line's (objects, "on"|"off")."""
    return frozenset(acre_line_objects(line)), line.rsplit("→", 1)[1].strip()


def acre_trials(question: str) -> tuple[list[tuple[frozenset[str], str]], list[str]]:
    """The listed experiments `[(objects, "on"|"off"), ...]` and the new test case's objects, in its order."""
    test_text = question.split("New test case:", 1)[1].strip().splitlines()[0]
    return ([acre_trial(line) for line in acre_trial_lines(question)],
            list(dict.fromkeys(o.strip() for o in test_text.split(","))))


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


# ---- reading Arc1D's text, and the rules of reasoning-gym's arc_1d families that fit its examples ----------

def arc_rows(question: str) -> tuple[list[tuple[list[str], list[str]]], list[str]]:
    """The examples `[(input digits, output digits), ...]` and the test input's digits."""
    import re  # noqa: PLC0415

    examples = re.findall(r"Input:\s*([\d ]+)\nOutput:\s*([\d ]+)", question)
    test = re.search(r"Input:\n([\d ]+)", question)
    return [(i.split(), o.split()) for i, o in examples], (test.group(1).split() if test else [])


def _shift(row: list[int], k: int, wrap: bool) -> list[int]:
    return row[-k:] + row[:-k] if wrap else ([0] * k + row[:-k])[: len(row)]


def _gravity(row: list[int]) -> list[int]:
    kept = [x for x in row if x]
    return kept + [0] * (len(row) - len(kept))


def _one_step(row: list[int]) -> list[int]:
    out = list(row)
    for i in range(1, len(out)):
        if out[i] and not out[i - 1]:
            out[i - 1], out[i] = out[i], 0
    return out


def _by_own_size(row: list[int]) -> list[int]:
    cells = [i for i, x in enumerate(row) if x]
    if not cells:
        return list(row)
    size = cells[-1] - cells[0] + 1
    return _shift(row, size, wrap=False)


def _fill_between(row: list[int]) -> list[int]:
    cells = [i for i, x in enumerate(row) if x]
    if len(cells) != 2 or row[cells[0]] != row[cells[1]]:
        return list(row)
    return [row[cells[0]] if cells[0] <= i <= cells[1] else x for i, x in enumerate(row)]


# name -> the rule, on a row of ints (the families of reasoning-gym's arc_1d this solver knows; each also tried
# mirrored: the row reversed, the rule, reversed back)
ARC_RULES: dict[str, object] = {
    "the same": lambda r: list(r),
    **{f"shift right by {k}": (lambda r, k=k: _shift(r, k, False)) for k in range(1, 6)},
    **{f"rotate right by {k}": (lambda r, k=k: _shift(r, k, True)) for k in range(1, 6)},
    "colors fall to the start": _gravity,
    "count the colors as ones": lambda r: [1] * sum(1 for x in r if x) + [0] * sum(1 for x in r if not x),
    "2s to the start, 1s to the end": lambda r: ([2] * r.count(2) + [0] * (len(r) - r.count(1) - r.count(2))
                                                + [1] * r.count(1)),
    "each color one step to the start": _one_step,
    "every color becomes 5": lambda r: [5 if x else 0 for x in r],
    "the block moves by its own size": _by_own_size,
    "fill between the two dots": _fill_between,
    "reverse the row": lambda r: list(reversed(r)),
}


def arc_rule(examples: list[tuple[list[str], list[str]]]):
    """(name, rule) of the first known rule (`ARC_RULES`, plain then mirrored) that maps every example's input to
    its output; None where none does."""
    rows = [([int(x) for x in i], [int(x) for x in o]) for i, o in examples]
    if not rows:
        return None
    for name, rule in ARC_RULES.items():
        for mirrored in (False, True):
            apply = (lambda r, rule=rule: list(reversed(rule(list(reversed(r)))))) if mirrored else rule
            if all(len(i) == len(o) and apply(i) == o for i, o in rows):
                return (f"{name}, mirrored" if mirrored else name), apply
    return None

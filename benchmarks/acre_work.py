"""ACRE: which step of a worked answer a run's policy gets wrong (`demo:acre_worked`'s format).

    python -m benchmarks acre-work RUN_DIR

A worked answer names each test object with what the trials say of it, then the label: "gray rubber cube: in an
off trial. red rubber cube: the one candidate of an on trial, a blicket. So on. \\boxed{on}". Reads
RUN_DIR/episodes.jsonl (`--log-episodes`) and prints, for each kind of evidence the rules give an object (in an
off trial; the blicket of an on trial; no evidence), how many test objects had it and the share the policy named
rightly, then per answer:

* form: every test object named with one of the three verdicts, then "So LABEL. \\boxed{LABEL}";
* follows: the label is the one its own written verdicts give (the last step, on the model's own work);
* right: the label is the rules' (what reasoning-gym grades, 0.96 of its labels).

An answer whose verdicts are right but whose label does not follow needs the last step trained; wrong verdicts
of one kind name the lookup the policy has not learned.

An answer in `demo:acre_cited`'s format quotes a trial line before each verdict ("See: brown rubber cube → off.
brown rubber cube: in an off trial."); for those quotes it also prints how many copy a trial line of the prompt
that holds the object (the copy; beside it, how often a line picked at random would hold it: the blind share), and
how many verdicts agree with the quoted line's outcome (an off line gives "in an off trial", an on line either of
the other two: the step after the copy; a consistency check, which a quote of any line passes).
"""

from __future__ import annotations

import re
from collections import Counter

from benchmarks.logged import logged_episodes
from oat_dppo.agent.demonstrations import ACRE_SAYS
from oat_dppo.cli import stdout_may_close
from oat_dppo_envs.reasoning_gym import acre_evidence, acre_trial, acre_trial_lines

KINDS = tuple(ACRE_SAYS)  # off, blicket, unknown
LABEL = re.compile(r"So (on|off|undetermined)\. \\boxed\{(on|off|undetermined)\}\s*$")
QUOTE = re.compile(r"See: (.*?)\. ([^.;]+): (in an off trial|the one candidate|no evidence)")


def label_of(kinds: list[str]) -> str:
    """ACRE's label from each test object's evidence (as `acre_evidence` gives it)."""
    return "on" if "blicket" in kinds else "off" if kinds and set(kinds) == {"off"} else "undetermined"


def check(prompt: str, response: str) -> tuple[list[tuple[str, bool]], dict[str, bool]]:
    """([(the rules' kind of each test object, named rightly?)], {form, follows, right}) of one answer."""
    evidence, label = acre_evidence(prompt.split("Question:", 1)[-1])
    said_by_text = {text: kind for kind, text in ACRE_SAYS.items()}
    stated = []
    for obj, _ in evidence:
        found = re.search(rf"(?:^|\. ){re.escape(obj)}: ([^.]*)\.", response)
        stated.append(said_by_text.get(found.group(1)) if found else None)
    objects = [(kind, said == kind) for (_, kind), said in zip(evidence, stated)]
    end = LABEL.search(response)
    form = end is not None and end.group(1) == end.group(2) and None not in stated
    return objects, {"form": form, "follows": form and end.group(1) == label_of(stated),
                     "right": end is not None and end.group(2) == label}


def check_quotes(prompt: str, response: str) -> Counter:
    """Of a cited answer's quotes: {quotes, copied: a trial line of the prompt holding the object, agrees: the
    verdict the quoted line's outcome allows, chance: the share of the prompt's trial lines that hold the object
    (summed: what quoting a line at random would copy rightly)}. Empty for an answer that quotes nothing."""
    holding = {line: acre_trial(line)[0] for line in acre_trial_lines(prompt.split("Question:", 1)[-1])}
    counts = Counter()
    for quoted, obj, verdict in QUOTE.findall(response):
        line = quoted.split("; ", 1)[0]  # a blicket's quote goes on with the other objects' verdicts
        counts["quotes"] += 1
        counts["chance"] += sum(obj in objs for objs in holding.values()) / max(len(holding), 1)
        if line == "no trial":  # right where no line holds the object; then only "no evidence" follows
            counts["copied"] += not any(obj in objs for objs in holding.values())
            counts["agrees"] += verdict == ACRE_SAYS["unknown"]
        else:
            counts["copied"] += obj in holding.get(line, ())
            counts["agrees"] += line.endswith("→ off") == (verdict == ACRE_SAYS["off"])
    return counts


def tally(episodes: list[dict]) -> tuple[Counter, Counter, Counter, int]:
    """(objects per kind, rightly named per kind, answers per step held and quotes per check, answers)."""
    objects, named, steps, answers = Counter(), Counter(), Counter(), 0
    for e in episodes:
        for t in e["turns"]:
            answers += 1
            per_object, held = check(t["prompt"], t["response"])
            for kind, right in per_object:
                objects[kind] += 1
                named[kind] += right
            steps.update(step for step, ok in held.items() if ok)
            steps.update(check_quotes(t["prompt"], t["response"]))
    return objects, named, steps, answers


def main(argv: list[str]) -> int:
    read = logged_episodes("acre-work", __doc__, "rg:acre, worked answers", argv)
    if isinstance(read, int):
        return read
    run_dir, episodes = read
    objects, named, steps, answers = tally(episodes)
    with stdout_may_close():
        print(f"{answers} logged answers of {run_dir}\n")
        print("| the rules' evidence | test objects | named rightly |\n|---|---|---|")
        for kind in KINDS:
            share = f"{named[kind] / objects[kind]:.2f}" if objects[kind] else "-"
            print(f"| {ACRE_SAYS[kind]} | {objects[kind]} | {named[kind]} ({share}) |")
        print("\n| answers | form | follows | right |\n|---|---|---|---|")
        print(f"| {answers} | " + " | ".join(f"{steps[s] / max(answers, 1):.2f}" for s in ("form", "follows", "right"))
              + " |")
        if steps["quotes"]:
            print(f"\n{steps['quotes']} quoted trial lines (demo:acre_cited's format): a trial line holding the object "
                  f"{steps['copied'] / steps['quotes']:.2f} (a line picked at random: "
                  f"{steps['chance'] / steps['quotes']:.2f}), the verdict its outcome allows "
                  f"{steps['agrees'] / steps['quotes']:.2f}")
    return 0

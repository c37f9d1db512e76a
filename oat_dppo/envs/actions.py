r"""Action parsing: what the policy's answer is, and whether it is in the expected shape.

`extract_action` follows GEM 0.1.0's `extract_last_boxed_answer` (the rule its reasoning-gym and
math envs grade with) so that `well_formed` agrees with what the environment actually scores:
only the LAST occurrence of `\boxed` counts; it must be followed at once by `{` and closed by a
balanced `}`. If that last box is broken, the answer is None even when an earlier box is fine
(GEM scores such text as unanswered too).
"""

from __future__ import annotations

import re

_BOX = "\\boxed"

# How a response shows that it answered, per environment family. "boxed" is the project's
# convention (games, reasoning-gym, math); the others exist for GEM families that grade differently.
ACTION_FORMATS = ("boxed", "code", "answer_tag", "any")

_CODE_BLOCK = re.compile(r"```(?:\w+)?\n(.*?)```", re.DOTALL)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_action(text: str) -> str | None:
    r"""Content of the last `\boxed{...}` in `text` (braces balanced), or None."""
    start = text.rfind(_BOX)
    if start < 0:
        return None
    open_at = start + len(_BOX)
    if open_at >= len(text) or text[open_at] != "{":
        return None
    depth = 0
    for i in range(open_at, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None


def is_well_formed(text: str, action_format: str = "boxed", pattern: str | None = None) -> bool:
    """Whether `text` carries an answer in `action_format`; `pattern` (a regex) must then match
    the whole answer, e.g. Sudoku's `row col digit`."""
    if action_format == "any":
        return True
    if action_format == "boxed":
        answer = extract_action(text)
    elif action_format == "code":
        blocks = _CODE_BLOCK.findall(text)
        answer = blocks[-1] if blocks else None
    elif action_format == "answer_tag":
        tags = _ANSWER_TAG.findall(text)
        answer = tags[-1].strip() if tags else None
    else:
        raise ValueError(f"unknown action_format {action_format!r}; choose from {ACTION_FORMATS}")
    if answer is None:
        return False
    return pattern is None or re.fullmatch(pattern, answer) is not None

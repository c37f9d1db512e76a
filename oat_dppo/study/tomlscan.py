"""Line numbers for a TOML file: `tomllib` parses but gives no positions, so this scans the text.

    spans = TomlSpans(text)
    spans.line(("grid", "trust_region"))                    # the line of `trust_region = [...]` in [grid]
    spans.line(("grid", "trust_region"), value="ppo_clp")   # the line inside that value naming ppo_clp
    spans.line(("grid", "variant"), key="delta", value=0.2) # `delta = 0.2` inside an inline table

The scanner knows only what is needed to find statements: table headers, `key =` at the start of a
statement (dotted and quoted keys too), strings of all four kinds (which may hold brackets, `#` and
newlines) and bracket depth (a value spans lines until its brackets close). It never rejects input;
tomllib has already checked the syntax.
"""

from __future__ import annotations

import re
from typing import Any

_KEY_PART = re.compile(r'"((?:[^"\\]|\\.)*)"|\'([^\']*)\'|([A-Za-z0-9_-]+)')


def _key_parts(text: str) -> tuple[str, ...]:
    parts = []
    for m in _KEY_PART.finditer(text):
        parts.append(next(g for g in m.groups() if g is not None))
    return tuple(parts)


class TomlSpans:
    """For every table header and every `key = value` statement: its first and last line (1-based)."""

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.spans: dict[tuple[str, ...], tuple[int, int]] = {}
        self._scan(text)

    # -- scanning ----------------------------------------------------------------------------------
    def _scan(self, text: str) -> None:
        n = len(text)
        i = 0
        line = 1
        table: tuple[str, ...] = ()
        while i < n:
            # At the start of a statement: skip blanks, comments and empty lines.
            c = text[i]
            if c in " \t\r":
                i += 1
                continue
            if c == "\n":
                line += 1
                i += 1
                continue
            if c == "#":
                i = self._to_eol(text, i)
                continue
            if c == "[":  # a table header, on one line
                end = text.find("\n", i)
                end = n if end < 0 else end
                header = text[i:end].split("#", 1)[0].strip().strip("[]")
                table = _key_parts(header)
                self.spans.setdefault(table, (line, line))
                i = end
                continue
            # `key = value`
            eq = self._find_eq(text, i)
            if eq < 0:
                i = self._to_eol(text, i)
                continue
            path = table + _key_parts(text[i:eq])
            start = line
            i, line = self._skip_value(text, eq + 1, line)
            self.spans.setdefault(path, (start, line))

    @staticmethod
    def _to_eol(text: str, i: int) -> int:
        end = text.find("\n", i)
        return len(text) if end < 0 else end

    @staticmethod
    def _find_eq(text: str, i: int) -> int:
        """The `=` ending the key that starts at i (outside quotes, on the same line), or -1."""
        n = len(text)
        while i < n and text[i] != "\n":
            c = text[i]
            if c in "\"'":
                close = text.find(c, i + 1)
                while c == '"' and close > 0 and text[close - 1] == "\\":
                    close = text.find(c, close + 1)
                if close < 0:
                    return -1
                i = close + 1
                continue
            if c == "=":
                return i
            i += 1
        return -1

    @staticmethod
    def _skip_value(text: str, i: int, line: int) -> tuple[int, int]:
        """Skip one value (strings, comments, nested brackets); returns (index of the newline that
        ends it, the line number of that newline)."""
        n = len(text)
        depth = 0
        while i < n:
            c = text[i]
            if c == "\n":
                if depth <= 0:
                    return i, line
                line += 1
                i += 1
            elif c == "#":
                i = TomlSpans._to_eol(text, i)
            elif c in "[{":
                depth += 1
                i += 1
            elif c in "]}":
                depth -= 1
                i += 1
            elif text.startswith('"""', i) or text.startswith("'''", i):
                q = text[i : i + 3]
                j = i + 3
                while True:
                    close = text.find(q, j)
                    if close < 0:
                        close = n
                        break
                    if q == '"""' and _escaped(text, close):
                        j = close + 1
                        continue
                    break
                while close + 3 < n and text[close + 3] == q[0]:  # """a"""" ends at the last quotes
                    close += 1
                line += text.count("\n", i, close)
                i = close + 3
            elif c == '"':
                j = i + 1
                while j < n and text[j] != "\n":
                    if text[j] == "\\":
                        j += 2
                        continue
                    if text[j] == '"':
                        break
                    j += 1
                i = j + 1
            elif c == "'":
                close = text.find("'", i + 1)
                i = n if close < 0 else close + 1
            else:
                i += 1
        return n, line

    # -- lookup ------------------------------------------------------------------------------------
    def line(self, path: tuple[str, ...], *, key: str | None = None, value: Any = None) -> int | None:
        """The line of the statement at `path` (a table: its header), or, when `key` and/or `value`
        are given, the first line of that statement mentioning them (`key = value` first, then the
        key, then the value). None when the path is not in the text."""
        span = self.spans.get(tuple(path))
        if span is None:
            return None if not path else self.line(tuple(path[:-1]))
        first, last = span
        if key is None and value is None:
            return first
        window = [(no, self.lines[no - 1]) for no in range(first, min(last, len(self.lines)) + 1)]
        vpat = None if value is None else _value_pattern(value)
        kpat = None if key is None else r"(?<![\w-])[\"']?" + re.escape(key) + r"[\"']?\s*="
        tries = []
        if kpat and vpat:
            tries.append(kpat + r"\s*" + vpat)
        if kpat:
            tries.append(kpat)
        if vpat:
            tries.append(vpat)
        for pat in tries:
            for no, text in window:
                if re.search(pat, text):
                    return no
        return first


def _escaped(text: str, i: int) -> bool:
    k = 0
    while i - 1 - k >= 0 and text[i - 1 - k] == "\\":
        k += 1
    return k % 2 == 1


def _value_pattern(value: Any) -> str:
    if isinstance(value, bool):
        return r"(?<![\w.])" + ("true" if value else "false") + r"(?![\w.])"
    if isinstance(value, str):
        return r"[\"']" + re.escape(value.replace("\\", "\\\\")) + r"[\"']|[\"']" + re.escape(value) + r"[\"']"
    if isinstance(value, (int, float)):
        texts = {repr(value), str(value)}
        if isinstance(value, float) and value.is_integer():
            texts.add(str(int(value)))
        alts = "|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True))
        return r"(?<![\w.])(?:" + alts + r")(?![\w.])"
    return re.escape(str(value))

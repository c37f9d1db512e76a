r"""Oat 0.2.4's own PPO program on `bench peers`' job: `oat.experiment.run_math_rl`, as Oat ships it.

    .venv-oat/bin/python -m benchmarks.oat_stock JOB.json      # written by `bench peers --sides oat-stock`

What runs is Oat's script itself, in a child process: `python -m oat.experiment.run_math_rl FLAGS`, with its
own `ZeroMathLearner` (Oat's `PPOLearner`) and `ZeroMathActor` (`PPOActor` + `MATHOracle`), launchpad and
DeepSpeed, launched and ended by Oat. Nothing of Oat's or launchpad's is replaced. This module:

* **Writes the command line.** Every Oat field exactly as the `--backend oat` side resolves it for the same
  job (the one mapping, `backends/oat/args.py`: model, batch, micro-batch, max tokens, learning rate, dtype,
  ...), then the script's own: `prompt_template="no"` and a dataset on disk of the job's prompt texts (chat
  template and `\boxed{` prefix included, the same strings every other side trains on). Oat's
  `get_default_args` parses `sys.argv` with tyro; `script_flags` writes the fields that differ from the
  script's defaults as tyro's flags, and `check_flags` parses them back with tyro before anything starts.
* **On a machine without CUDA, the CPU stand-ins** (`oat_dppo/patches.py`, the runtime's own CPU
  port) in every process of the program: launchpad's node processes unpickle the script's classes by value
  and import no project module that would apply them, so a `sitecustomize` on PYTHONPATH does
  (`prepare_node`); in the launcher also `gpu_slots` (--gpus counts process slots, for Oat's GPU-count check
  and `get_program`).
* **Reads Oat's own output.** Oat's learner prints each log row (`eval_and_log`: `strategy.pprint(logs_dict)`,
  rich's pretty print of the dict it hands wandb) on stdout, which launchpad prefixes with the node's name (`[learner_...]`).
  `LogRows` takes the learner's rows back from that stream and writes them to SAVE_PATH/oat_log_rows.jsonl,
  which the benchmark reads (`benchmarks/peers.py`). Every process of the program writes unbuffered and
  line-buffered (`PYTHONUNBUFFERED`, `stdbuf -oL` for launchpad's `sed` decorators), so lines of two nodes
  never mix within a line and no row is lost when a node is stopped.
* **Watches the program** (`run_program`): its own process group, ended (SIGTERM, then SIGKILL) at the
  timeout, on a stop signal to this process, and after the program ends (anything left behind); a SIGKILLed
  watchdog's program ends by `oat_dppo.stopping`'s watchdog. Oat's own end is the normal end: the learner's
  `lp.stop()` (a SIGTERM to the launcher) after its last round. The exit status is 0 when every round of the
  job was logged, whatever status that end leaves, and 1 otherwise (Oat's program on this CPU: a learner that
  fails leaves the actor and the launcher waiting, so the timeout ends it).

Rewards: Oat's `boxed_reward_fn` looks for `\boxed{...}` in the response, which this job pre-fills in the
prompt, so every reward and advantage is 0. The step's work does not depend on them (Oat's PPO learner
runs the same forward, backward and optimizer step for a zero advantage); its rewards are not the job's.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import typing
from pathlib import Path

NODE_FLAG = "OAT_DPPO_STOCK_NODE"  # set for the program's processes: `sitecustomize` prepares them
LAUNCHER_SLOTS = "OAT_DPPO_STOCK_GPU_SLOTS"  # the launcher's --gpus; it takes it out before starting a node
SITECUSTOMIZE = f"""import os
if os.environ.get({NODE_FLAG!r}):
    from benchmarks.oat_stock import prepare_node
    prepare_node()
"""
ROWS_FILE = "oat_log_rows.jsonl"  # under the save path: the learner's log rows, as it printed them
COMMAND_FILE = "oat_command.json"  # under the save path: the program's argv, and its process group
DEFAULT_TIMEOUT_S = 3600.0
END_GRACE_S = 600.0  # after the last round: Oat's final evaluation, its model save, and its lp.stop()
_held: list = []  # the launcher's `gpu_slots`, held for its life


def prepare_node() -> None:
    """In every process of the program (through `sitecustomize`): the CPU stand-ins; in the launcher (the
    one process started with LAUNCHER_SLOTS, which it removes so that its nodes do not inherit it) also
    `gpu_slots`."""
    from oat_dppo import patches

    patches.apply()
    slots = os.environ.pop(LAUNCHER_SLOTS, None)
    if slots:
        slot = patches.gpu_slots(int(slots))
        slot.__enter__()
        _held.append(slot)


def write_prompts(directory: Path, prompts: list[str]) -> tuple[Path, Path]:
    """(train, eval) datasets on disk, `problem`/`answer` columns: the job's prompts, one row to evaluate."""
    from datasets import Dataset, DatasetDict

    rows = {"problem": prompts, "answer": ["0"] * len(prompts)}
    train, evaluation = directory / "train", directory / "eval"
    DatasetDict({"train": Dataset.from_dict(rows)}).save_to_disk(str(train))
    DatasetDict({"bench": Dataset.from_dict({k: v[:1] for k, v in rows.items()})}).save_to_disk(str(evaluation))
    return train, evaluation


def stock_values(args, train: Path, evaluation: Path, prompts: int) -> dict:
    """The script's arguments: Oat's fields as the adapter resolved them, then the script's own."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    values.update(prompt_template="no", prompt_data=str(train), eval_data=str(evaluation), input_key="problem",
                  output_key="answer", eval_input_key="", eval_output_key="", train_split="train",
                  test_split="all", max_train=str(prompts))
    return values


def oat_arguments(cls, values: dict):
    """`cls` (the script's `ZeroMathArgs`) with `values` for its fields. A None where Oat has a default keeps
    Oat's: the adapter leaves such fields (`cliprange`) to its trust region, and Oat's PPO needs them."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in values and not (values[f.name] is None and f.default is not None):
            out[f.name] = values[f.name]
    return cls(**out)


# ---------------------------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------------------------


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def script_flags(wanted) -> list[str]:
    """tyro's flags that make the script's `get_default_args(type(wanted))` return `wanted`: one per field
    that differs from its default. A plain `bool` is `--name` / `--no-name`; None (an Optional's) is `--name
    None`; a tuple or list is `--name` and its items (none: an empty one); anything else `--name str(value)`
    (floats by `repr`, exact)."""
    cls = type(wanted)
    hints = typing.get_type_hints(cls)
    flags: list[str] = []
    for f in dataclasses.fields(cls):
        value = getattr(wanted, f.name)
        if value == _default(f) and type(value) is type(_default(f)):
            continue
        name = "--" + f.name.replace("_", "-")
        if hints.get(f.name) is bool:
            flags.append(name if value else "--no-" + f.name.replace("_", "-"))
        elif value is None:
            flags += [name, "None"]
        elif isinstance(value, (list, tuple)):
            flags += [name, *(_text(v) for v in value)]
        else:
            flags += [name, _text(value)]
    return flags


def _text(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def check_flags(wanted, flags: list[str]) -> None:
    """Parse `flags` as the script will (tyro, the script's dataclass) and require every field to come back
    as `wanted` has it."""
    import warnings

    import tyro

    with warnings.catch_warnings():  # Oat's own fields annotated `str` with a default None: the script warns too
        warnings.simplefilter("ignore", UserWarning)
        got = tyro.cli(type(wanted), args=flags)
    wrong = [f.name for f in dataclasses.fields(wanted) if not _same(getattr(got, f.name), getattr(wanted, f.name))]
    if wrong:
        raise ValueError(f"the script's command line does not give back {', '.join(wrong)}: "
                         + ", ".join(f"{n}={getattr(got, n)!r} (want {getattr(wanted, n)!r})" for n in wrong))


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b


# ---------------------------------------------------------------------------------------------
# Oat's output: the learner's log rows
# ---------------------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NODE = re.compile(r"^\[(?P<node>[A-Za-z0-9_./-]+)\] ?(?P<text>.*)$")
_GUIDES = re.compile(r"^[\s\u2502]+")  # rich's indent guides (`│   `) and indentation
_NUMBER_NAMES = {"nan": math.nan, "inf": math.inf}


def _number(node: ast.AST):
    """A number from pprint's text of one (an int, a float, nan, inf, with a sign), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NUMBER_NAMES:
        return _NUMBER_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _number(node.operand)
        if inner is not None:
            return -inner if isinstance(node.op, ast.USub) else inner
    return None


def parse_row(text: str) -> dict | None:
    """The dict pprint printed as `text` (string keys, number values; other values left out), or None."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.Dict):
        return None
    row = {}
    for key, value in zip(tree.keys, tree.values):
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            number = _number(value)
            if number is not None:
                row[key.value] = number
    return row or None


class LogRows:
    """The learner's log rows, from the program's output line by line: lines launchpad marked as a learner
    node's (`[learner_...] text`), each `{...}` block among them that parses as a dict (Oat's
    `strategy.pprint(logs_dict)`, rich's pretty print: one entry a line behind indent guides). Lines of other
    nodes and of the launcher may come between; a block that does not parse is skipped, and so are entries
    that are not numbers (a tensor's)."""

    def __init__(self, on_row=None) -> None:
        self.rows: list[dict] = []
        self.on_row = on_row
        self._block: list[str] | None = None

    def feed(self, line: str) -> None:
        match = _NODE.match(_ANSI.sub("", line).rstrip("\r\n"))
        if not match or not match["node"].startswith("learner"):
            return
        text = _GUIDES.sub("", match["text"]).rstrip()
        if text.startswith("{"):
            self._block = []
        if self._block is None:
            return
        self._block.append(text)
        if text.endswith("}"):
            row = parse_row("\n".join(self._block))
            self._block = None
            if row is not None:
                self.rows.append(row)
                if self.on_row:
                    self.on_row(row)

    def rounds(self) -> int:
        """Learning rounds logged (rows with the learner's update time, one per policy step)."""
        return len({r.get("misc/policy_sgd_step") for r in self.rows if "train/learn_batch_time" in r})


# ---------------------------------------------------------------------------------------------
# the watchdog
# ---------------------------------------------------------------------------------------------


class _Stop(BaseException):
    def __init__(self, sig: int):
        super().__init__(signal.Signals(sig).name)
        self.signal = sig


def end_group(pgid: int, grace_s: float = 20.0, leader: subprocess.Popen | None = None) -> None:
    """SIGTERM to process group `pgid`, SIGKILL to what is left `grace_s` later; returns once it is gone
    (`leader`, the group's first process if it is this process's child, is reaped on the way)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if leader is not None:
                leader.poll()
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


@dataclasses.dataclass
class Ended:
    status: int | None  # the program's exit status (None: the watchdog ended it, or a stop signal did)
    pgid: int | None = None  # its process group (gone when `run_program` returns)
    timed_out: bool = False  # the watchdog ended it: the timeout, or the grace after `done`
    stop_signal: int | None = None  # a stop signal this process received


def run_program(argv: list[str], env: dict, timeout_s: float, on_line, *, done=lambda: False,
                end_grace_s: float = 600.0, kill_after_s: float = 20.0, out=None) -> Ended:
    """Run `argv` in its own process group; each line of its output (stdout and stderr) goes to `on_line`
    and to `out` (default: this process's stdout). The group is ended at `timeout_s`, `end_grace_s` after
    `done()` first holds (the program has done its work and should end by itself), on SIGTERM, SIGINT or
    SIGHUP to this process, and after the program's own end (whatever it left in its group): SIGTERM, then
    SIGKILL to what is left `kill_after_s` later."""
    out = out or sys.stdout.buffer
    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def on_signal(sig, frame=None):
        raise _Stop(sig)

    previous = {s: signal.signal(s, on_signal) for s in stops}
    proc = reader = None
    try:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)

        def pump():
            for raw in proc.stdout:
                try:
                    out.write(raw)
                    out.flush()
                except (OSError, ValueError):
                    pass
                on_line(raw.decode("utf-8", errors="replace"))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout_s
        graced = False
        status = None
        while status is None and time.monotonic() < deadline:
            try:
                status = proc.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                if not graced and done():
                    graced, deadline = True, min(deadline, time.monotonic() + end_grace_s)
        end_group(proc.pid, kill_after_s, leader=proc)  # the program's end leaves nothing running (its nodes share its group)
        proc.wait()
        reader.join(30)
        return Ended(status, pgid=proc.pid, timed_out=status is None)
    except _Stop as stop:
        if proc is not None:
            end_group(proc.pid, kill_after_s, leader=proc)
            proc.wait()
        return Ended(None, pgid=proc.pid if proc else None, stop_signal=stop.signal)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def verdict(ended: Ended, rounds: int, expected: int) -> tuple[int, str]:
    """(exit status, the line that says why) of the benchmark's run of the program: 0 once every expected
    round was logged, however the program then ended (Oat's end is the learner's `lp.stop()`, a SIGTERM to its
    launcher); else 1, or 128 + n for a stop signal this process received."""
    if ended.stop_signal is not None:
        return 128 + ended.stop_signal, f"oat_stock: stopped by {signal.Signals(ended.stop_signal).name}"
    if rounds >= expected:
        how = "was ended by the watchdog after" if ended.timed_out else f"exited with status {ended.status} after"
        return 0, f"oat_stock: Oat's program {how} logging all {expected} rounds"
    if ended.timed_out:
        return 1, f"oat_stock: Oat's program logged {rounds} of {expected} rounds before the timeout"
    return 1, f"oat_stock: Oat's program exited with status {ended.status} after logging {rounds} of {expected} rounds"


# ---------------------------------------------------------------------------------------------
# the job
# ---------------------------------------------------------------------------------------------


def program_env(base: dict, site: Path, repo: Path, extra: dict, gpus: int) -> dict:
    env = dict(base, **extra)
    env.update({NODE_FLAG: "1", LAUNCHER_SLOTS: str(gpus), "PYTHONUNBUFFERED": "1"})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), str(repo), base.get("PYTHONPATH")) if p)
    return env


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    from oat.experiment.run_math_rl import ZeroMathArgs  # its classes only: the script runs in the child

    from oat_dppo.backends.oat.args import finalize, parse
    from oat_dppo.backends.oat.program import cpu_environment, resolve_model
    from oat_dppo.stopping import end_children_with_this_process

    args = parse(job["argv"])
    finalize(args)
    save = Path(args.save_path)
    save.mkdir(parents=True, exist_ok=True)
    resolve_model(args)  # `smollm2` -> a directory Oat's transformers reads
    train, evaluation = write_prompts(save / "prompts", job["prompts"])
    wanted = oat_arguments(ZeroMathArgs, stock_values(args, train, evaluation, len(job["prompts"])))
    flags = script_flags(wanted)
    check_flags(wanted, flags)

    site = save / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    end_children_with_this_process()  # if this watchdog is SIGKILLed, the program ends too
    env = program_env(dict(os.environ), site, Path(__file__).resolve().parents[1], cpu_environment(args), args.gpus)
    command = [sys.executable, "-m", "oat.experiment.run_math_rl", *flags]
    stdbuf = shutil.which("stdbuf")
    if stdbuf:  # launchpad's `sed` decorators write whole lines
        command = [stdbuf, "-oL", "-eL", *command]

    rows_file = (save / ROWS_FILE).open("w")

    def on_row(row: dict) -> None:
        rows_file.write(json.dumps(row) + "\n")
        rows_file.flush()

    rows = LogRows(on_row)
    expected = int(job["rounds"])
    timeout_s = float(job.get("timeout_s") or DEFAULT_TIMEOUT_S)
    print(f"oat_stock: {args.pretrain}, {len(job['prompts'])} prompts, {expected} rounds, save path {save}; "
          f"{' '.join(command)}", file=sys.stderr, flush=True)
    started = {"argv": command, "timeout_s": timeout_s}
    (save / COMMAND_FILE).write_text(json.dumps(started))
    with rows_file:
        ended = run_program(command, env, timeout_s, rows.feed, done=lambda: rows.rounds() >= expected,
                            end_grace_s=float(job.get("end_grace_s") or END_GRACE_S))
    (save / COMMAND_FILE).write_text(json.dumps(dict(started, status=ended.status, pgid=ended.pgid,
                                                     timed_out=ended.timed_out, rounds=rows.rounds())))
    status, line = verdict(ended, rows.rounds(), expected)
    print(line, file=sys.stderr, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

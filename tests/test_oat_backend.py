"""The Oat backend's command line: `DPPOArgs` (Oat's PPOArgs + the local options), its validation,
`--backend oat --help` without vLLM, the launch path up to the GPU check, and the experiment
scripts' dry runs. Learner and actor: tests/test_oat_backend_{learner,actor}.py.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.child import child_env

if importlib.util.find_spec("oat") is None:
    pytest.skip("oat-llm is not installed; `make setup-oat` (docs/dev_oat_cpu.md)", allow_module_level=True)

import oat_harness as H  # noqa: E402,F401  (imports Oat)
from oat.algorithms.ppo import PPOArgs  # noqa: E402

from oat_dppo.backends.oat import args as A  # noqa: E402
from oat_dppo.backends.oat.availability import missing, missing_packages  # noqa: E402
from oat_dppo.config import ConfigError, TrainConfig  # noqa: E402
from oat_dppo.main import wants_oat  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "experiments" / "paper_g3").glob("*.sh"))
SCRIPTS = [s for s in SCRIPTS if s.name != "common.sh"]


def resolve(*argv: str, world_size: int | None = None):
    args = A.parse(list(argv))
    notes = A.finalize(args, world_size=world_size)
    return args, notes


# ---------------------------------------------------------------------------------------------
# DPPOArgs: one command line for both backends
# ---------------------------------------------------------------------------------------------


def _non_default(f: dataclasses.Field):
    """A command-line value for TrainConfig field `f` that differs from its default."""
    special = {"env": "rg:acre", "model": "org/m", "template": "qwen3", "trust_region": "ppo_clip", "run_dir": "out/r",
               "math_data": "m.jsonl", "system_prompt": "be brief", "response_prefix": "X", "wandb_project": "p",
               "dtype": "bfloat16", "aggregation": "seq_mean_token_mean", "advantage": "batch_norm", "log": "wandb",
               "direction": "low", "anchor": "recompute", "mu_source": "recompute", "tr_param": ("mode=x",),
               "engine": "hf", "engine_dtype": "float32", "env_option": ("max_number=50",), "resume": "runs/x",
               "device": "cpu", "backend": "oat"}
    if f.name in special:
        return special[f.name]
    default = f.default
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 2
    if isinstance(default, float):
        return default / 2 if default else 0.5
    return 3  # Optional[int] / Optional[float] fields default to None


def test_every_local_option_reaches_oat_or_is_noted_or_refused():
    """Each TrainConfig option set to a non-default value on the Oat command line: it arrives in the
    TrainConfig the shared components see, or a local-only option is ignored with a note or refused."""
    for f in dataclasses.fields(TrainConfig):
        if f.name in ("backend", "episodes_per_iteration", "group_size", "mini_batch_size", "iterations"):
            continue  # batch arithmetic and the backend itself: covered by test_derived_settings
        value = _non_default(f)
        args = A.DPPOArgs()
        setattr(args, A.OAT_NAMES.get(f.name, f.name), value)
        if f.name in A.LOCAL_ONLY:
            refused, _ = A.LOCAL_ONLY[f.name]
            if refused:
                with pytest.raises(ConfigError, match="local-backend only"):
                    A.finalize(args, world_size=1)
            continue
        cfg = A.to_train_config(args)
        assert getattr(cfg, f.name) == value, f.name
        back = A.from_train_config(cfg)
        assert getattr(back, A.OAT_NAMES.get(f.name, f.name)) == value, f.name


def test_mini_batches_of_whole_groups_are_refused_with_the_unit_that_serves():
    """Oat's learner receives episodes without their group: `--mini-batch-unit groups` is refused, naming
    `episodes` (the same step count)."""
    args = A.DPPOArgs()
    args.mini_batch_unit = "groups"
    with pytest.raises(ConfigError, match="groups is local-backend only.*--mini-batch-unit episodes"):
        A.finalize(args, world_size=1)


def test_dppo_args_extend_the_real_ppo_args():
    assert A.OAT_ARGS_MISSING is None and issubclass(A.DPPOArgs, PPOArgs)
    helps = [f.metadata.get("help") for f in dataclasses.fields(A.DPPOArgs) if f.name in {"env", "trust_region"}]
    assert all(helps)  # the local options keep their help on Oat
    assert A.DPPOArgs.__module__ == "oat_dppo.backends.oat.args"  # launchpad pickles it by reference
    args = A.DPPOArgs()
    assert pickle.loads(pickle.dumps(args)) == args


def test_without_oat_at_all_the_local_options_still_parse():
    """What --help shows where oat-llm is not installed: the class stands on an empty base."""
    code = ("import sys, dataclasses; sys.modules['oat'] = None\n"  # every `import oat...` fails
            "from oat_dppo.backends.oat import args as A\n"
            "assert A.OAT_ARGS_MISSING.startswith(\"Oat's PPO module does not import\"), A.OAT_ARGS_MISSING\n"
            "names = {f.name for f in dataclasses.fields(A.DPPOArgs)}\n"
            "assert {'env', 'trust_region', 'delta', 'topk', 'pretrain', 'vllm_max_logprobs'} <= names, names\n"
            "print(A.parse(['--trust-region', 'dppo_topk_kl', '--topk', '8', '--model', 'm']).topk)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "8", out.stderr[-2000:]


def test_a_local_command_line_parses_with_the_same_names():
    args, notes = resolve(
        "--model", "org/m", "--max-new-tokens", "8", "--group-size", "4", "--mini-batch-size", "64",
        "--micro-batch-size", "2", "--max-grad-norm", "0.5", "--eval-every", "10", "--save-every", "5",
        "--run-dir", "out/r", "--wandb-project", "p", "--env", "rg:arc_1d", "--trust-region", "dppo_binary_kl",
        "--delta", "0.04", "--C", "3", "--template", "qwen3", "--advantage", "group", "--threads", "1",
        "--no-progress", "--log", "wandb", "--learning-rate", "2e-6", "--seed", "7", "--gpus", "8", "--collocate",
    )
    assert (args.pretrain, args.generate_max_length, args.num_samples) == ("org/m", 8, 4)
    assert (args.train_batch_size, args.train_batch_size_per_device, args.max_norm) == (64, 2, 0.5)
    assert (args.eval_steps, args.save_steps, args.save_path, args.wb_project) == (10, 5, "out/r", "p")
    assert (args.trust_region, args.delta, args.clip_c, args.advantage) == ("dppo_binary_kl", 0.04, 3.0, "group")
    assert (args.learning_rate, args.seed, args.use_wb) == (2e-6, 7, True)
    assert any("--progress" in n for n in notes) and not any("--threads" in n for n in notes)  # threads: per node
    assert args.threads == 1


def test_repeated_options_add_up_as_on_the_local_backend():
    """`--env-option` and `--tr-param` are repeatable on both backends. (Found by `bench peers`: on Oat only the
    last `--env-option` survived, and `math:procedural` trained on GEM's default problems, not the asked ones.)"""
    from oat_dppo.main import parse as local_parse

    argv = ["--env", "math:procedural", "--env-option", "tasks=basic_arithmetic", "--env-option", "max_digits=1",
            "--env-option", "answer=number", "--trust-region", "trm", "--tr-param", "delta=0.1", "--tr-param",
            "sequence=turn"]
    args, _ = resolve(*argv, "--gpus", "8", "--collocate")
    assert args.env_option == ("tasks=basic_arithmetic", "max_digits=1", "answer=number")
    assert args.tr_param == ("delta=0.1", "sequence=turn")
    local = local_parse(argv)
    assert (local.env_option, local.tr_param) == (args.env_option, args.tr_param)
    assert A.to_train_config(args).env_option == local.env_option


def test_oat_spellings_work_too():
    args, _ = resolve("--pretrain", "org/m", "--generate_max_length", "16", "--num_samples", "2",
                      "--train_batch_size", "32", "--trust_region", "ppo_clip", "--cliprange", "0.1", "--gpus", "8",
                      "--collocate", "--rollout_batch_size", "64", "--rollout-batch-size-per-device", "8",
                      "--pi-buffer-maxlen-per-device", "16")
    assert (args.pretrain, args.generate_max_length, args.num_samples, args.train_batch_size) == ("org/m", 16, 2, 32)
    assert (args.eps_low, args.eps_high) == (0.1, 0.1)  # Oat's symmetric clip


def test_derived_settings():
    args, _ = resolve("--env", "game:Sudoku-v0-easy", "--trust-region", "dppo_topk_kl", "--gpus", "8", "--collocate")
    assert args.generate_max_length == 4096 and args.eval_generate_max_length == 4096  # GEM's budget
    assert args.gamma == 0.9  # games
    assert args.aggregation == "seq_sum_constant_length"  # Oat's drgrpo
    assert args.vllm_max_logprobs == 20
    assert (args.tis_c, args.beta, args.use_fused_lm_head, args.algo) == (None, 0.0, False, "PPO")
    # Oat's learners get whole episodes: the episode as the sequence and as the step's unit run on games
    for extra in (("--trust-region", "trm"), ("--trust-region", "trm", "--tr-param", "sequence=turn"),
                  ("--mini-batch-unit", "episodes", "--train-batch-size", "64")):
        resolve("--env", "game:Sudoku-v0-easy", "--gpus", "8", "--collocate", *extra)
    with pytest.raises(ConfigError, match="every optimizer step is full"):  # 64 episodes a round, steps of 48
        resolve("--env", "game:Sudoku-v0-easy", "--gpus", "8", "--collocate", "--mini-batch-unit", "episodes",
                "--train-batch-size", "48")
    resolve("--env", "game:Sudoku-v0-easy", "--gpus", "8", "--collocate", "--train-batch-size", "48")  # turns vary
    args, _ = resolve("--env", "rg:arc_1d", "--trust-region", "trm", "--gpus", "8", "--collocate")  # single-turn
    args, _ = resolve("--env", "rg:arc_1d", "--critic-type", "grpo", "--gpus", "8", "--collocate")
    assert (args.gamma, args.aggregation) == (1.0, "seq_mean_token_mean")
    args, notes = resolve("--episodes-per-iteration", "256", "--group-size", "8", "--gpus", "8")  # 4 learners
    assert (args.rollout_batch_size, args.rollout_batch_size_per_device) == (32, 8)
    assert args.pi_buffer_maxlen_per_device == 64  # one learning round per learner
    args, _ = resolve("--iterations", "3", "--gpus", "8", "--collocate")
    assert args.max_train > 10**12
    # LM-head blocks: on by default, off where ZeRO-3 partitions a frozen head (LoRA) before the recompute
    for argv, chunk in [((), 4096), (("--zero-stage", "3"), 4096), (("--lora-rank", "8"), 4096),
                        (("--logits-chunk-tokens", "512"), 512),
                        (("--zero-stage", "3", "--lora-rank", "8", "--logits-chunk-tokens", "0"), 0)]:
        args, _ = resolve("--gpus", "8", "--collocate", *argv)
        assert args.logits_chunk_tokens == chunk == A.to_train_config(args).logits_chunk_tokens, argv
    for frozen in (("--lora-rank", "8"), ("--trainable-layers", "2")):  # a frozen head, either way
        args, notes = resolve("--gpus", "8", "--collocate", "--zero-stage", "3", *frozen)
        assert args.logits_chunk_tokens == 0 and any(f"{frozen[0]}: the LM head runs in one block" in n for n in notes)
    args, _ = resolve("--gpus", "8", "--collocate", "--trainable-layers", "6")  # as on the local backend
    assert args.trainable_layers == 6 == A.to_train_config(args).trainable_layers


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--temperature", "0.7"], "use temperature 1, top_p 1, top_k -1"),
        (["--top-p", "0.9"], "use temperature 1, top_p 1, top_k -1"),
        (["--top-k", "50"], "use temperature 1, top_p 1, top_k -1"),
        (["--trust-region", "dppo_topk_tv", "--topk", "64", "--vllm-max-logprobs", "20"], "raise it to at least 64"),
        (["--tis-c", "2"], "--mu-source recompute for Oat's TIS"),
        (["--critic-type", "ppo"], "--critic-type ppo"),
        (["--beta", "0.1"], "no reference model"),
        (["--reinforce-update"], "--trust-region pg_is"),
        (["--trust-region", "dppo_binary_tv", "--cliprange", "0.2"], "--cliprange sets the ratio clip"),
        (["--trust-region", "dppo_binary_tvv"], "did you mean 'dppo_binary_tv'"),
        (["--trust-region", "ppo_clip", "--delta", "0.2"], "does not take 'delta'"),
        (["--trainable-layers", "2", "--lora-rank", "8"], "LoRA puts"),
        (["--resume", "runs/x"], "--resume-dir"),
        (["--env", "math"], "--math-data"),
        (["--pi-buffer-maxlen-per-device", "8"], "would drop data"),
        (["--rollout-batch-size", "100"], "must be a multiple of 8 learner GPUs"),
        (["--train-batch-size", "12"], "must be a multiple of"),
        (["--env", "rg:arc_1d", "--train-batch-size", "256"], "every optimizer step is full"),
        (["--episodes-per-iteration", "100", "--group-size", "8"], "must be a multiple of --group-size 8"),
        (["--zero-stage", "3", "--lora-rank", "8", "--logits-chunk-tokens", "1024"], "DeepSpeed#8148"),
        (["--logits-chunk-tokens", "-1"], "--logits-chunk-tokens must be >= 0"),
    ],
)
def test_each_violation_is_one_clear_message(argv, needle):
    with pytest.raises(ConfigError) as e:
        resolve("--gpus", "8", "--collocate", *argv)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg


# ---------------------------------------------------------------------------------------------
# The command line in a fresh process (no fakes: this machine has no vLLM, launchpad or GPU)
# ---------------------------------------------------------------------------------------------


def run_cli(*argv: str, module: str = "oat_dppo.main", timeout: float = 120, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=child_env(with_tests=False, **env))  # no tests/ on the path: no fakes


def test_backend_oat_help_lists_oat_ppo_and_local_options():
    p = run_cli("--backend", "oat", "--help")
    assert p.returncode == 0, p.stderr[-2000:]
    for flag in ("--vllm-gpu-ratio", "--collocate", "--vllm-sleep", "--zero-stage", "--lora-rank", "--tis-c",
                 "--cliprange", "--num-ppo-epochs", "--model", "--pretrain", "--env", "--trust-region", "--delta",
                 "--topk", "--group-size", "--template", "--vllm-max-logprobs", "--max-new-tokens", "--check-sync",
                 "--gpus"):
        assert flag in p.stdout, flag


def test_without_the_stack_backend_oat_names_what_is_missing(monkeypatch):
    from oat_dppo.backends.oat import availability

    monkeypatch.setattr(availability, "_installed", lambda name: name == "oat-llm")
    with pytest.raises(ConfigError) as e:
        availability.require()
    assert "vllm==0.8.4" in str(e.value) and "dm-launchpad" in str(e.value) and "docs/oat.md" in str(e.value)


def test_the_stack_is_here_and_cuda_is_not_required():
    import torch

    assert missing_packages() == []
    assert missing() == ([] if torch.cuda.is_available() else ["a CUDA GPU"])
    assert wants_oat(["--backend", "oat"])
    assert not wants_oat(["--backend", "local"])
    if not torch.cuda.is_available():
        assert not wants_oat(["--env", "rg:arc_1d"])  # auto: Oat only with CUDA; the local backend on a laptop


def test_on_a_cpu_gpus_counts_processes():
    import torch

    if torch.cuda.is_available():
        pytest.skip("with CUDA, --gpus counts GPUs")
    args, notes = resolve("--env", "smoke:digits")
    assert args.gpus == 2 and A.learner_world_size(args) == 1
    args, _ = resolve("--env", "smoke:digits", "--gpus", "4", "--zero-stage", "3")
    assert A.learner_world_size(args) == 2


def test_threads_reach_every_node_process_on_a_cpu():
    """--threads is each node's torch threads (OMP_NUM_THREADS, which every node inherits); 0 splits the cores
    between the actors and learners (before: --threads was ignored on Oat, and bench peers' matched threads
    never reached Oat's nodes)."""
    import os

    import torch

    from oat_dppo.backends.oat.program import cpu_environment

    if torch.cuda.is_available():
        pytest.skip("with CUDA, nodes get GPUs")
    args, notes = resolve("--env", "smoke:digits", "--threads", "1")
    assert cpu_environment(args)["OMP_NUM_THREADS"] == "1" and not any("--threads" in n for n in notes)
    args, _ = resolve("--env", "smoke:digits", "--gpus", "4")
    assert cpu_environment(args)["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 4))


@pytest.mark.parametrize("cuda", [False, True])
def test_machine_settings_are_decided_on_the_node_not_the_launcher(cuda):
    """flash-attention and --check-sync auto travel unresolved (a launcher without CUDA must not ship a
    CPU-shaped config to GPU nodes); each learner resolves them for the machine it runs on."""
    args, notes = resolve("--env", "smoke:digits")
    assert args.flash_attn is True and args.check_sync == "auto"  # Oat's default, as the user left it
    assert not any("eager attention" in n for n in notes)
    node_notes = A.resolve_on_node(args, cuda=cuda)
    assert args.flash_attn is cuda and args.check_sync == ("off" if cuda else "on")
    assert any("eager attention" in n for n in node_notes) is not cuda
    for extra in (["--zero-stage", "3"], ["--asynchronous"]):
        args, _ = resolve("--env", "smoke:digits", *extra)
        A.resolve_on_node(args, cuda=False)
        assert args.check_sync == "off", extra


@pytest.mark.parametrize("native", [False, True])
def test_on_a_cpu_without_native_bf16_the_default_is_float32(monkeypatch, native):
    import torch

    if torch.cuda.is_available():
        pytest.skip("with CUDA, Oat's bf16 default stands")
    monkeypatch.setattr(A, "cpu_has_native_bf16", lambda: native)
    args, notes = resolve("--env", "smoke:digits")
    assert args.bf16 is native and not args.fp16
    assert any("float32" in n for n in notes) is not native
    args, _ = resolve("--env", "smoke:digits", "--dtype", "bfloat16")  # chosen: kept
    assert args.bf16 is True


def test_eval_temperature_has_the_local_backends_default_and_meaning():
    args, _ = resolve("--env", "smoke:digits")
    assert args.eval_temperature == TrainConfig.eval_temperature == 1.0  # Oat's own default is 0 (greedy)
    args, _ = resolve("--env", "smoke:digits", "--eval-temperature", "0")
    assert args.eval_temperature == 0.0 and A.to_train_config(args).eval_temperature == 0.0
    with pytest.raises(ConfigError, match="--eval-temperature -1.0: must be >= 0"):
        resolve("--env", "smoke:digits", "--eval-temperature", "-1")


def test_check_sync_on_is_refused_with_asynchronous_actors():
    with pytest.raises(ConfigError, match="--check-sync asks the actor's vLLM .* --asynchronous"):
        resolve("--env", "smoke:digits", "--check-sync", "on", "--asynchronous")


def test_launch_accepts_a_train_config():
    from oat_dppo.backends.oat.program import from_train_config

    cfg = TrainConfig(env="rg:acre", model="org/m", group_size=4, mini_batch_size=32, trust_region="ppo_clip",
                      eps_high=0.3, max_new_tokens=64)
    args = from_train_config(cfg)
    assert (args.env, args.pretrain, args.num_samples, args.train_batch_size) == ("rg:acre", "org/m", 4, 32)
    assert (args.trust_region, args.eps_high, args.generate_max_length) == ("ppo_clip", 0.3, 64)


def test_node_classes_live_in_importable_modules():
    from oat_dppo.backends.oat.actor import DPPOActor
    from oat_dppo.backends.oat.learner import DPPOLearner

    for cls in (DPPOActor, DPPOLearner, A.DPPOArgs):
        assert cls.__module__.startswith("oat_dppo.backends.oat.")
        assert pickle.loads(pickle.dumps(cls)) is cls  # by reference


# ---------------------------------------------------------------------------------------------
# experiments/paper_g3: every script's --dry-run resolves every arm
# ---------------------------------------------------------------------------------------------

EXPECTED = {
    "sudoku.sh": ("game:Sudoku-v0-easy", "Qwen/Qwen3-1.7B-Base", {"ppo_clip", "dppo_binary_tv"}),
    "arc1d.sh": ("rg:arc_1d", "Qwen/Qwen3-1.7B-Base", {"ppo_clip", "dppo_binary_tv"}),
    "acre.sh": ("rg:acre", "Qwen/Qwen3-1.7B-Base", {"ppo_clip", "dppo_binary_tv"}),
    "math_octothinker.sh": ("math:Math12K", "OctoThinker/OctoThinker-3B-Hybrid-Base", {"ppo_clip", "dppo_binary_tv"}),
    "sanity_test.sh": ("math", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
                       {"pg_is", "cispo", "ppo_clip", "dppo_binary_tv", "dppo_binary_kl"}),
}


def parse_dry_run(out: str) -> list[dict[str, str]]:
    configs, cur = [], None
    for line in out.splitlines():
        if line.startswith("# oat_dppo --backend oat"):
            cur = {}
            configs.append(cur)
        elif cur is not None and " = " in line and not line.startswith("#"):
            k, v = line.split(" = ", 1)
            cur[k] = v
    return configs


def test_every_script_is_covered():
    assert {s.name for s in SCRIPTS} == set(EXPECTED)


def dry_run_env() -> dict[str, str]:
    """A dry run resolves each arm with Oat's real PPOArgs (which imports vLLM), a child process per arm."""
    return child_env(with_tests=False, PYTHON=sys.executable)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_experiment_script_dry_run(script):
    env = dry_run_env()
    p = subprocess.run(["bash", str(script), "--dry-run"], capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    configs = parse_dry_run(p.stdout)
    env_id, model, strategies = EXPECTED[script.name]
    commands = [line for line in p.stdout.splitlines() if line.startswith(f"# {script.stem} / ")]
    assert len(commands) == len(configs) >= 2
    assert {c["trust_region"].strip("'") for c in configs} == strategies
    for c in configs:
        assert c["env"] == repr(env_id) and c["pretrain"] == repr(model)
        assert (c["temperature"], c["top_p"], c["top_k"]) == ("1.0", "1.0", "-1")
        assert c["gpus"] == "8" and c["collocate"] == "True" and c["beta"] == "0.0"
        if c["trust_region"] == "'dppo_binary_tv'" and script.name != "sanity_test.sh":
            assert c["delta"] == "0.2"  # the paper's G.3 threshold
    # The printed command of each arm parses as a full command line here (no GPU needed to parse).
    first = commands[0].split(": ", 1)[1].split()
    assert first[:5] == [sys.executable, "-m", "oat_dppo.main", "--backend", "oat"]
    args = A.parse(first[5:])
    assert args.env == env_id


def test_script_arm_selection_and_unknown_arm():
    env = dry_run_env()
    script = str(REPO / "experiments" / "paper_g3" / "arc1d.sh")
    p = subprocess.run(["bash", script, "--dry-run", "--arm", "dppo_binary_tv", "--seed", "3"], capture_output=True,
                       text=True, timeout=120, cwd=REPO, env=env)
    configs = parse_dry_run(p.stdout)
    assert p.returncode == 0 and len(configs) == 1 and configs[0]["seed"] == "3"
    p = subprocess.run(["bash", script, "--dry-run", "--arm", "nope"], capture_output=True, text=True, timeout=60,
                       cwd=REPO, env=env)
    assert p.returncode == 2 and "unknown arm 'nope'" in p.stderr

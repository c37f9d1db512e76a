"""`python -m oat_dppo.export RUN OUT`: the trained policy as a plain Hugging Face directory."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from oat_dppo.backends.local.checkpoint import best_weights, trained_weights
from oat_dppo.backends.local.trainer import LocalTrainer, build_policy
from oat_dppo.config import TrainConfig, from_dict
from oat_dppo.export import main as export_main
from oat_dppo.main import main
from oat_dppo.rundir import RunDir, atomic_write_text

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("extra", [[], ["--lora-rank", "4"]], ids=["full", "lora"])
def test_export_loads_with_transformers_and_computes_the_trained_policy(tmp_path, extra):
    run_dir, out = tmp_path / "run", tmp_path / "model"
    assert main(["--env", "smoke:digits", "--model", "tiny-qwen3", "--engine", "hf", "--iterations", "2", "--episodes-per-iteration", "4",
                 "--learning-rate", "1e-2", "--eval-every", "0", "--threads", "1", "--no-progress", "--log", "none",
                 "--run-dir", str(run_dir), *extra]) == 0
    assert export_main([str(run_dir), str(out)]) == 0
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    assert AutoTokenizer.from_pretrained(out)("12")["input_ids"]
    # Oat's stack (transformers 4.51) loads it too: 5.x's class name and list-valued extra tokens are not 4.x's.
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert not isinstance(tokenizer_config.get("extra_special_tokens"), list)
    config = json.loads((out / "config.json").read_text())  # and its RoPE base (4.x reads only rope_theta)
    assert config["rope_theta"] == config.get("rope_parameters", config)["rope_theta"]
    # The trained policy, rebuilt from the run (LoRA adapters unmerged), computes the same logits.
    cfg = from_dict(RunDir(run_dir, create=False).read_config())
    trained, tok = build_policy(cfg, torch.device("cpu"))
    trained.load_state_dict(trained_weights(run_dir / "checkpoint"), strict=False)
    untrained, _ = build_policy(cfg, torch.device("cpu"))
    ids = torch.tensor([tok("Reply with digits only.")["input_ids"]])
    with torch.no_grad():
        want, got, before = (m(input_ids=ids).logits for m in (trained.eval(), exported, untrained.eval()))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (want - before).abs().max() > 1e-3  # training moved the policy: the check can fail


def test_export_refuses_a_non_empty_target_and_a_run_without_checkpoint(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("x")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text('{"model": "tiny-qwen3"}')
    assert export_main([str(tmp_path / "run"), str(tmp_path / "out")]) == 2
    assert "not empty" in capsys.readouterr().err
    assert export_main([str(tmp_path / "run"), str(tmp_path / "new")]) == 2
    assert "no usable checkpoint" in capsys.readouterr().err


def test_export_help_names_its_two_directories(capsys):
    with pytest.raises(SystemExit) as exit_:
        export_main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(" RUN_DIR OUT_DIR"), out.splitlines()[0]
    assert "STR" not in out


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path) -> str:
    return oct(stat.S_IMODE(path.stat().st_mode))


def test_run_and_export_files_get_the_mode_open_gives_under_the_umask(tmp_path, umask_022):
    """config.json (written through tempfile.mkstemp) and the safetensors of a checkpoint and of an export
    (safetensors' save_file writes a private temporary file) are 0644 under umask 022, like the files
    open() creates; a rewrite keeps the mode a user gave the file."""
    run_dir, out = tmp_path / "run", tmp_path / "model"
    assert main(["--env", "rg:arc_1d", "--model", "tiny-qwen3", "--engine", "hf", "--iterations", "1",
                 "--episodes-per-iteration", "2", "--max-new-tokens", "8", "--eval-every", "0", "--threads", "1",
                 "--no-progress", "--log", "none", "--run-dir", str(run_dir)]) == 0
    assert export_main([str(run_dir), str(out)]) == 0
    files = [run_dir / "config.json", *(run_dir / "checkpoint").iterdir(), *out.iterdir()]
    assert {"trainable.safetensors", "state.safetensors", "model.safetensors"} <= {p.name for p in files}
    modes = {str(p.relative_to(tmp_path)): _mode(p) for p in files}
    assert set(modes.values()) == {"0o644"}, modes
    (run_dir / "config.json").chmod(0o640)
    atomic_write_text(run_dir / "config.json", "{}")
    assert _mode(run_dir / "config.json") == "0o640"


class ScriptedEvaluations(LocalTrainer):
    """A real run whose held-out scores are scripted, with the trained weights at each evaluation recorded."""

    SCORES = [0.25, 0.75, 0.5, 0.75]  # iterations -1, 0, 1, 2: the best (first of a tie) is iteration 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.weights_at: dict[int, dict[str, torch.Tensor]] = {}

    def evaluate(self, iteration, split="validation"):
        if split != "validation":  # the run's test evaluation at its end: played for real
            return super().evaluate(iteration, split)
        self.weights_at[iteration] = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
        return {"eval/reward_mean": self.SCORES[iteration + 1], "eval/success_rate": 0.0}


def test_keep_best_keeps_and_exports_the_policy_of_the_best_evaluation(tmp_path, capsys):
    cfg = TrainConfig(model="tiny-qwen3", env="smoke:digits", engine="hf", iterations=3, episodes_per_iteration=4,
                      learning_rate=1e-2, eval_every=1, eval_episodes=2, threads=1, progress=False, log="none",
                      keep_best=True)
    trainer = ScriptedEvaluations(cfg, tmp_path / "run")
    assert trainer.run() == 0
    assert "best held-out policy: iteration 0 (eval/reward_mean 0.750)" in capsys.readouterr().err
    best = json.loads((tmp_path / "run" / "best" / "best.json").read_text())
    assert (best["iteration"], best["value"]) == (0, 0.75)
    kept = best_weights(tmp_path / "run" / "best")
    for name, value in trainer.weights_at[0].items():
        torch.testing.assert_close(kept[name], value, rtol=0, atol=0)
    last = trained_weights(tmp_path / "run" / "checkpoint")
    assert any((last[n] - v).abs().max() > 0 for n, v in kept.items())  # it is not the last policy
    # export --best gives that policy; a run without --keep-best has none to give
    assert export_main([str(tmp_path / "run"), str(tmp_path / "best_model"), "--best"]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "best_model")
    name = next(iter(kept))
    torch.testing.assert_close(exported.state_dict()[name], kept[name])
    (tmp_path / "run" / "best" / "best.json").unlink()
    assert export_main([str(tmp_path / "run"), str(tmp_path / "none"), "--best"]) == 2
    assert "no usable best policy" in capsys.readouterr().err


def test_a_resumed_run_keeps_its_best_so_far(tmp_path):
    cfg = TrainConfig(model="tiny-qwen3", env="smoke:digits", engine="hf", iterations=2, episodes_per_iteration=4,
                      learning_rate=1e-2, eval_every=1, eval_episodes=2, threads=1, progress=False, log="none",
                      keep_best=True, run_dir=str(tmp_path / "run"))
    assert ScriptedEvaluations(cfg, tmp_path / "run").run() == 0  # scores 0.25, 0.75: iteration 0 kept
    cfg.iterations, cfg.resume = 3, str(tmp_path / "run")
    resumed = ScriptedEvaluations(cfg, tmp_path / "run", resume=True)
    assert resumed.best["iteration"] == 0
    assert resumed.run() == 0  # iteration 2 scores 0.75, a tie: the first stays
    assert json.loads((tmp_path / "run" / "best" / "best.json").read_text())["iteration"] == 0

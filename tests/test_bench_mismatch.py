"""`python -m benchmarks mismatch` on CPU: HF rows with a tiny model (a bf16 copy against the float32
learner, and the learner sampling itself), the table, and one error line for a bad row."""

from __future__ import annotations

import pytest

from benchmarks import mismatch

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = ["--model", "tiny-qwen3", "--prompts", "4", "--new-tokens", "6", "--topk", "3", "--no-fresh-processes"]


def test_hf_rows_measure_the_copy_against_the_learner(tmp_path):
    out = tmp_path / "mismatch.md"
    assert mismatch.main([*SMALL, "--rows", "hf:bfloat16:float32", "hf:float32:float32", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("Device: **") and "model tiny-qwen3" in text
    rows = [line for line in text.splitlines() if line.startswith("| HF ")]
    assert [r.split(" | ")[0] for r in rows] == ["| HF bf16 -> HF fp32", "| HF fp32 -> HF fp32"]

    cfg = mismatch.Config(model="tiny-qwen3", prompts=4, new_tokens=6, topk=3, fresh_processes=False,
                          rows=("hf:bfloat16:float32", "hf:float32:float32"))
    bf16, fp32 = mismatch.run(cfg)
    assert bf16["tokens"] > 0 and fp32["tokens"] > 0
    assert fp32["max"] < 1e-6 < bf16["mean"]  # rounding to bf16 is a real mismatch; the learner itself is not
    assert 0 < bf16["topk_tv_mean"] <= bf16["topk_tv_max"]


def test_default_rows_are_what_this_machine_runs(monkeypatch):
    monkeypatch.setattr(mismatch.vllm_engine, "vllm_unavailable", lambda: "the vllm package")
    assert mismatch.default_rows() == mismatch.HF_ROWS  # no vLLM: the HF rows alone
    monkeypatch.setattr(mismatch.vllm_engine, "vllm_unavailable", lambda: None)
    assert mismatch.default_rows() == mismatch.VLLM_ROWS + mismatch.HF_ROWS
    assert all(mismatch.check_row(r) is None for r in mismatch.VLLM_ROWS + mismatch.HF_ROWS)


@pytest.mark.parametrize("row, message", [("hf:bf16:float32", "expected ENGINE:ENGINE_DTYPE:LEARNER_DTYPE"),
                                          ("hf:float32", "expected ENGINE:ENGINE_DTYPE:LEARNER_DTYPE"),
                                          ("vllm:bfloat16:float32", "vllm rows need")])
def test_a_bad_row_is_one_error_line(row, message, capsys, monkeypatch):
    monkeypatch.setattr(mismatch.vllm_engine, "vllm_unavailable", lambda: "the vllm package")
    assert mismatch.main([*SMALL, "--rows", row]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]

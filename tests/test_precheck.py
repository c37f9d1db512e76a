"""Bad options are found before anything heavy is built, all at once: a mistyped model name (with a
suggestion), a model path to nowhere, an unknown env id or trust region; and a hub id that the hub
does not have, or a hub that cannot be reached, is one quick error, not ~50 s of download retries."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub.errors import RepositoryNotFoundError
from helpers.child import child_env

from oat_dppo.precheck import model_problem

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("name", "expected"), [
    ("smolm2", "did you mean 'smollm2'?"),
    ("SmolLM-2", "did you mean 'smollm2'?"),
    ("tiny-qwen", "did you mean 'tiny-qwen3'?"),
    ("HuggingFaceTB/SmolLM2-135M-Instruc", "did you mean 'HuggingFaceTB/SmolLM2-135M-Instruct'?"),
    ("./models/nothere", "no such directory"),
    ("/nonexistent/model", "no such directory"),
])
def test_model_names_that_cannot_be(name, expected):
    assert expected in model_problem(name)


@pytest.mark.parametrize("name", ["smollm2", "tiny-llama", "TINY-QWEN3", "gpt2", "Qwen/Qwen3-1.7B-Base",
                                  "HuggingFaceTB/SmolLM2-135M-Instruct"])
def test_model_names_that_can_be(name):
    assert model_problem(name) is None


def test_an_existing_directory_is_a_model_name(tmp_path):
    assert model_problem(str(tmp_path)) is None


def test_main_reports_every_problem_before_building():
    p = subprocess.run([sys.executable, "-m", "oat_dppo.main", "--model", "smolm2", "--env", "game:GuessNumber",
                        "--trust-region", "ppo_clp", "--engine", "hf"], capture_output=True, text=True, cwd=REPO,
                       env=child_env(), timeout=300)
    assert p.returncode == 2
    errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 3, p.stderr
    assert "did you mean 'smollm2'" in errors[0]
    assert "unknown environment 'game:GuessNumber'" in errors[1] and "game:GuessTheNumber-v0-easy" in errors[1]
    assert "unknown trust region 'ppo_clp' (did you mean 'ppo_clip'?)" in errors[2]
    assert "building:" not in p.stderr and "Traceback" not in p.stderr


def _not_found() -> RepositoryNotFoundError:
    e = RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # its __init__ wants an HTTP response
    Exception.__init__(e, "404 Repository Not Found")
    return e


@pytest.mark.parametrize(("raised", "expected"), [
    (_not_found(), "the Hugging Face hub has no such model"),
    (ConnectionError("Name or service not known"), "the Hugging Face hub cannot be reached (ConnectionError"),
])
def test_a_hub_id_the_hub_cannot_give_fails_at_once(monkeypatch, raised, expected):
    from oat_dppo.models import common, loading

    def model_info(name, timeout):
        raise raised

    monkeypatch.setattr(huggingface_hub, "model_info", model_info)
    monkeypatch.setattr(common, "hub_offline", lambda: False)
    monkeypatch.setattr(common, "in_hf_cache", lambda name: False)
    monkeypatch.setattr(loading, "_load_dir", lambda *a: pytest.fail("the download must not be tried"))
    with pytest.raises(common.ModelNotFoundError, match=re.escape(expected)):
        loading.load_policy("someone/not-a-model")


def test_a_directory_that_is_not_a_model_is_one_clear_error(tmp_path):
    from oat_dppo.models import ModelNotFoundError, load_policy

    with pytest.raises(ModelNotFoundError, match="the directory is not a model transformers can load"):
        load_policy(str(tmp_path))

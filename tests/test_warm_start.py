"""The warm start (`--warm-start`): demonstrators that see only the prompt, the supervised objective by hand,
demonstrations from a file, and a run that warm-starts, evaluates before its first update and resumes."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from oat_dppo.agent import PromptFormat, play_episodes
from oat_dppo.agent.demonstrations import DEMONSTRATORS, ScriptedEngine, guess_interval, read_episodes, successful
from oat_dppo.config import TrainConfig
from oat_dppo.envs.registry import make_env
from oat_dppo.learner.batch import collate
from oat_dppo.learner.step import trust_region_loss
from oat_dppo.learner.supervised import NegativeLogLikelihood
from oat_dppo.backends.local.checkpoint import trained_weights
from oat_dppo.backends.local.trainer import LocalTrainer
from oat_dppo.main import main
from oat_dppo.main import parse as parse_train_config
from oat_dppo.models import load_policy
from oat_dppo.warm_start import end_of_turn_ids, supervise, warm_learner

GTN = "game:GuessTheNumber-v0-easy"


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny-qwen3", seed=0)


def play(name: str, env_id: str, tok, n: int, seed: int = 0, max_new_tokens: int = 32, response_prefix: str = ""):
    prompt = PromptFormat(tok, "chatml", None, response_prefix)
    envs = [make_env(env_id, seed=0) for _ in range(n)]
    engine = ScriptedEngine(DEMONSTRATORS[name], prompt, end_of_turn_ids(prompt), seed=seed)
    episodes, stats = play_episodes(engine, envs, list(range(1000, 1000 + n)), prompt, max_new_tokens=max_new_tokens)
    assert stats.env_errors == 0
    return episodes


def success(episodes) -> float:
    return len(successful(episodes)) / len(episodes)


def test_guessing_demonstrators_score_what_their_reading_allows(tiny):
    """On GEM's GuessTheNumber-easy (1-10, 4 turns) through the agent loop and the chatml prompt: the bisector
    always wins; a random guess inside the interval the hints leave wins about 0.76 (the issue's measure); a
    guess that ignores the hints wins about 0.4 (the best blind guesser's 4/10 needs distinct guesses; a
    random one repeats). They are shown the prompt text only, so only the reading differs."""
    _, tok = tiny
    assert success(play("bisect", GTN, tok, 64)) == 1.0
    assert 0.75 <= success(play("noisy_bisect", GTN, tok, 200)) <= 0.92  # weaker than the goal of 0.9
    reader = success(play("random_reader", GTN, tok, 200))
    blind = success(play("blind_guesser", GTN, tok, 200))
    assert 0.65 <= reader <= 0.88, reader
    assert 0.2 <= blind <= 0.5, blind


def test_a_demonstrator_is_shown_exactly_the_models_prompt(tiny):
    """What `act` receives is the decoded prompt ids of the turn (the model's input), nothing of the env."""
    _, tok = tiny
    prompt = PromptFormat(tok, "chatml")
    shown = []
    demo = DEMONSTRATORS["bisect"]
    spy = type(demo)(lambda text, rng: shown.append(text) or demo.act(text, rng), demo.env_prefix, "")
    engine = ScriptedEngine(spy, prompt, end_of_turn_ids(prompt), seed=0)
    episodes, _ = play_episodes(engine, [make_env(GTN, seed=0)], [5], prompt, max_new_tokens=32)
    assert shown == [tok.decode(t.prompt_ids) for t in episodes[0].turns]


def test_guess_interval_reads_every_hint():
    text = ("guess the number between 1 and 10 (inclusive)\nAt turn 1, you guessed 5, and the target number is "
            "higher than 5.\nAt turn 2, you guessed 8, and the target number is lower than 8.")
    assert guess_interval(text) == (6, 7)


def test_turns_record_the_observation_they_answered(tiny):
    """`Turn.observation` is the observation before the move (GiGPO's anchor state): the same first one for
    every episode of a seed, then the env's reply to the previous move."""
    _, tok = tiny
    prompt = PromptFormat(tok, "chatml")
    engine = ScriptedEngine(DEMONSTRATORS["random_reader"], prompt, end_of_turn_ids(prompt), seed=0)
    episodes, _ = play_episodes(engine, [make_env(GTN, seed=0) for _ in range(3)], [7, 7, 7], prompt, max_new_tokens=32)
    first, _ = make_env(GTN, seed=0).reset(seed=7)
    assert {e.turns[0].observation for e in episodes} == {first}
    replay = make_env(GTN, seed=0)
    obs, _ = replay.reset(seed=7)
    for t in episodes[0].turns:
        assert t.observation == obs
        obs, *_ = replay.step(t.response_text)


def test_sudoku_board_rules_demonstrator_solves_boards_within_the_runs_token_budget():
    """The rules player solves every easy board, also when the move ("r c d}" after the pre-filled `\\boxed{`)
    fills the run's whole --max-new-tokens: the demonstration is cut where a model's generation would be, so
    the end of turn, not the move's closing brace, is what a full budget drops."""
    _, tok = load_policy("tiny-qwen3", seed=0)
    budget = len(tok("4 3 2}", add_special_tokens=False)["input_ids"])  # the move alone, no room for the end
    for max_new_tokens in (32, budget):
        episodes = play("board_rules", "game:Sudoku-v0-easy", tok, 4, max_new_tokens=max_new_tokens,
                        response_prefix="\\boxed{")
        assert all(t.well_formed for e in episodes for t in e.turns)
        assert success(episodes) == 1.0, (max_new_tokens, [e.episode_return for e in episodes])


def test_sudoku_worked_demonstrator_copies_its_cells_view_line_names_what_it_leaves_and_solves(tiny):
    """`board_rules_worked` writes its work before the move: the chosen cell's line exactly as the prompt's
    `{board_view}` shows it, then "lacks" and the digits 1-4 that line does not name (read here from the
    line's text alone), then a move on that cell with one of those digits, the last `\\boxed{}` GEM parses.
    It solves every board it plays, with no pre-filled prefix."""
    _, tok = tiny
    prompt = PromptFormat(tok, "chatml")
    suffix = "\n{board_view}\nAnswer with one move."
    envs = [make_env("game:Sudoku-v0-easy", seed=0, history="last", obs_suffix=suffix) for _ in range(4)]
    engine = ScriptedEngine(DEMONSTRATORS["board_rules_worked"], prompt, end_of_turn_ids(prompt), seed=0)
    episodes, stats = play_episodes(engine, envs, [11, 12, 13, 14], prompt, max_new_tokens=64)
    assert stats.env_errors == 0 and success(episodes) == 1.0
    worked = re.compile(r"^((\d) (\d): row [-\d ]+, column [-\d ]+, box [-\d ]+); lacks ([\d ]+)\. "
                        r"\\boxed\{(\d) (\d) (\d)\}$")
    for turn in (t for e in episodes for t in e.turns):
        found = worked.match(turn.response_text.strip())
        assert found, turn.response_text
        line, r, c, lacks, *move = found.groups()
        assert f"\n{line}\n" in turn.prompt_text  # a copy of the view's line for that cell
        named = {int(d) for d in line.split(":")[1].replace(",", " ").split() if d.isdigit()}
        assert [int(d) for d in lacks.split()] == sorted({1, 2, 3, 4} - named)
        assert move[:2] == [r, c] and int(move[2]) in {1, 2, 3, 4} - named


def test_negative_log_likelihood_is_the_mean_nll_of_the_demonstrated_tokens(tiny):
    """Through the learner's step (token_mean): the loss is -mean log pi over response tokens, and its gradient
    is the gradient of that mean computed by hand with the model's own forward."""
    model, tok = tiny
    model = model.float()
    episodes = play("bisect", GTN, tok, 2)
    turns = [t for e in episodes for t in e.turns][:3]
    batch = collate(turns, tok.pad_token_id or 0, 0)
    model.zero_grad()
    loss, metrics = trust_region_loss(model, batch, NegativeLogLikelihood())
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    by_hand, count = 0.0, 0
    for t in turns:
        ids = torch.tensor([t.prompt_ids + t.response_ids])
        logp = model(input_ids=ids).logits[0, len(t.prompt_ids) - 1:-1].float().log_softmax(-1)  # [L, V]
        by_hand = by_hand - logp.gather(-1, torch.tensor(t.response_ids)[:, None]).sum()
        count += len(t.response_ids)
    (by_hand / count).backward()
    assert float(loss.detach()) == pytest.approx(float(by_hand.detach() / count), rel=1e-5)
    assert metrics["nll"] == pytest.approx(float(by_hand / count), rel=1e-5)
    for g, p in zip(grads, model.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-6, rtol=1e-4)


def test_supervised_steps_lower_the_nll(tiny):
    model, tok = load_policy("tiny-qwen3", seed=1)
    episodes = play("bisect", GTN, tok, 8)
    rows = []
    cfg = TrainConfig(env=GTN, warm_start="demo:bisect", warm_start_steps=30, warm_start_lr=1e-3, micro_batch_size=4)
    learner = warm_learner(model, cfg, pad_id=tok.pad_token_id or 0, device="cpu")
    summary = supervise(learner, episodes, cfg, on_step=lambda row, progress: rows.append(row))
    assert [r["step"] for r in rows] == list(range(30))
    assert summary["nll_last"] < 0.5 * summary["nll_first"]


def test_demonstrations_from_a_file(tmp_path, tiny):
    _, tok = tiny
    prompt = PromptFormat(tok, "chatml")
    text, ids = prompt.encode("Guess a number between 1 and 10.")
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps({"turns": [{"prompt": text, "response": "\\boxed{5}"}]}) + "\n\n")
    (episode,) = read_episodes(path, prompt, [2])
    assert episode.turns[0].prompt_ids == ids and episode.turns[0].response_ids == prompt._ids("\\boxed{5}") + [2]
    path.write_text('{"turns": [{"prompt": "x"}]}\n')
    with pytest.raises(ValueError, match="demos.jsonl:1: not an episode"):
        read_episodes(path, prompt, [2])


TINY = ["--model", "tiny-qwen3", "--engine", "hf", "--threads", "1", "--no-progress", "--log", "none",
        "--env", GTN, "--max-new-tokens", "16", "--episodes-per-iteration", "4"]


def test_a_warm_started_run_evaluates_before_rl_and_resumes_after_the_warm_start(tmp_path):
    run = tmp_path / "run"
    assert main([*TINY, "--run-dir", str(run), "--iterations", "1", "--eval-every", "1", "--eval-episodes", "2",
                 "--warm-start", "demo:bisect", "--warm-start-episodes", "4", "--warm-start-steps", "3"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [-1, 0]
    assert rows[0]["warm_start/steps"] == 3 and rows[0]["warm_start/demo_success_rate"] == 1.0
    assert "eval/success_rate" in rows[0] and "train/loss" not in rows[0]
    assert len((run / "warm_start.jsonl").read_text().splitlines()) == 3
    assert main(["--resume", str(run), "--iterations", "2"]) == 0  # RL continues; no second warm start
    assert len((run / "warm_start.jsonl").read_text().splitlines()) == 3
    assert [json.loads(line)["iteration"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [-1, 0, 1]


def test_the_warm_start_alone_is_a_run_that_exports_and_resumes_into_rl(tmp_path):
    """--iterations 0: the warm start, its evaluation and its checkpoint, no RL step; the checkpoint exports as
    the model an Oat run starts from, and --resume continues the same directory with RL."""
    from oat_dppo.export import main as export

    run = tmp_path / "run"
    assert main([*TINY, "--run-dir", str(run), "--iterations", "0", "--eval-every", "1", "--eval-episodes", "2",
                 "--warm-start", "demo:bisect", "--warm-start-episodes", "4", "--warm-start-steps", "2"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [-1] and "eval/success_rate" in rows[0]
    assert export([str(run), str(tmp_path / "model")]) == 0
    assert (tmp_path / "model" / "config.json").exists()
    assert main(["--resume", str(run), "--iterations", "1"]) == 0
    assert [json.loads(line)["iteration"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [-1, 0]
    assert main([*TINY, "--run-dir", str(tmp_path / "r"), "--iterations", "0"]) == 2  # 0 needs a warm start


@pytest.mark.parametrize("argv, needle", [
    (["--warm-start", "demo:board_rules"], "plays game:Sudoku* environments"),
    (["--warm-start", "demo:nope"], "no such demonstrator"),
    (["--warm-start", "missing.jsonl"], "not demo:NAME, self, or an existing JSONL file"),
    (["--warm-start", "self", "--warm-start-steps", "0"], "--warm-start-steps must be >= 1"),
])
def test_bad_warm_start_options_are_one_line(tmp_path, capsys, argv, needle):
    assert main([*TINY, "--run-dir", str(tmp_path / "r"), *argv]) == 2
    assert needle in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_a_warm_start_from_own_successes_without_any_is_one_line(tmp_path, capsys):
    """`self` keeps the model's successful episodes; an untrained tiny model has none: exit 2, one line."""
    assert main([*TINY, "--run-dir", str(tmp_path / "r"), "--iterations", "1", "--eval-every", "0",
                 "--warm-start", "self", "--warm-start-episodes", "4"]) == 2
    assert "the model succeeded in none of the 4 episodes it played" in capsys.readouterr().err


def test_seeded_demonstrators_repeat(tiny):
    _, tok = tiny
    a = [t.response_text for e in play("random_reader", GTN, tok, 6, seed=3) for t in e.turns]
    b = [t.response_text for e in play("random_reader", GTN, tok, 6, seed=3) for t in e.turns]
    assert a == b  # same seed, same demonstrations


def test_no_episode_is_sampled_with_the_same_request_seed_at_two_turns(tiny):
    """vLLM seeds request i of a call with seed + i (`VLLMEngine.requests`, the real parameters), and an episode's
    place in the call moves down as earlier episodes end. Played by the bisector (games end at turns 1-4), every
    episode's requests must carry a new seed at every turn: the old per-turn seed (generation_seed * 1000 + turn)
    gave an episode one place down its previous turn's seed, hence the same noise (the same guess, mostly)."""
    from oat_dppo.engine.vllm import VLLMEngine

    _, tok = tiny
    prompt = PromptFormat(tok, "chatml")
    scripted = ScriptedEngine(DEMONSTRATORS["bisect"], prompt, end_of_turn_ids(prompt), seed=0)
    params = VLLMEngine(lambda prompts, p: [], dict, temperature=1.0, top_p=1.0, top_k=-1, max_context=4096,
                        stop_token_ids=[0])
    seen: list[list[int]] = []  # per call: the seed of each request, in the call's order

    class Recording:
        def generate(self, prompt_ids, max_new_tokens, topk=0, *, seed=None, temperature=None):
            seen.append([p["seed"] for p in params.requests(prompt_ids, max_new_tokens, topk, seed=seed)[1]])
            return scripted.generate(prompt_ids, max_new_tokens, topk, seed=seed)

    n = 12
    episodes, _ = play_episodes(Recording(), [make_env(GTN, seed=0) for _ in range(n)], list(range(2000, 2000 + n)),
                                prompt, max_new_tokens=32, generation_seed=7)
    lengths = [len(e.turns) for e in episodes]
    assert len(set(lengths)) > 1  # episodes end at different turns: places shift
    per_episode: dict[int, list[int]] = {i: [] for i in range(n)}
    for call in seen:
        live = [i for i in range(n) if lengths[i] > len(per_episode[i])]
        for i, s in zip(live, call):
            per_episode[i].append(s)
    assert all(len(set(s)) == len(s) for s in per_episode.values()), per_episode
    assert len({s for call in seen for s in call}) == sum(lengths)  # and no two requests share one at all


class StoppedAfterFirstWarmStartCheckpoint(LocalTrainer):
    """Ctrl-C right after the warm start's first checkpoint (step 20 of 30)."""

    def _save_warm_start(self, progress):
        super()._save_warm_start(progress)
        raise KeyboardInterrupt


def test_a_stopped_warm_start_resumes_at_its_last_checkpoint_and_ends_as_an_unbroken_one(tmp_path, capsys):
    argv = [*TINY, "--iterations", "0", "--eval-every", "1", "--eval-episodes", "2", "--warm-start", "demo:bisect",
            "--warm-start-episodes", "4", "--warm-start-steps", "30", "--warm-start-lr", "1e-3"]
    assert main([*argv, "--run-dir", str(tmp_path / "whole")]) == 0
    cfg = parse_train_config([*argv, "--run-dir", str(tmp_path / "stopped")])
    assert StoppedAfterFirstWarmStartCheckpoint(cfg, tmp_path / "stopped").run() == 130
    assert "the warm start's first 20 of 30 supervised steps saved" in capsys.readouterr().err
    assert not (tmp_path / "stopped" / "metrics.jsonl").exists()  # no evaluation yet
    assert main(["--resume", str(tmp_path / "stopped")]) == 0
    assert "warm start: resumed after step 20" in capsys.readouterr().err

    def steps(run):
        return [json.loads(line) for line in (run / "warm_start.jsonl").read_text().splitlines()]

    whole, stopped = steps(tmp_path / "whole"), steps(tmp_path / "stopped")
    assert [r["step"] for r in stopped] == list(range(30))
    assert [r["nll"] for r in stopped] == pytest.approx([r["nll"] for r in whole], rel=1e-6)
    a, b = (trained_weights(tmp_path / run / "checkpoint") for run in ("whole", "stopped"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-6, atol=1e-7)
    rows = [json.loads(line) for line in (tmp_path / "stopped" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [-1] and rows[0]["warm_start/steps"] == 30

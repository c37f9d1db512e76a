"""The agent loop: plays a batch of episodes, one batched `generate` per turn over all live episodes.

Engine-agnostic: it needs `engine.generate(prompt_ids, max_new_tokens, topk, seed=...)` returning
`Generation`s (HF here, vLLM in the Oat actor) and text environments with the `TextEnv` contract.
It owns prompt rendering, tokenization, action text, multi-turn bookkeeping and the capture of mu.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from oat_dppo.agent.types import Episode, Turn
from oat_dppo.engine.base import Engine, Generation, PromptTooLongError
from oat_dppo.envs import EnvError, chat_turn, render_prompt, stop_strings
from oat_dppo.seeds import derive_seed


@dataclass
class RolloutStats:
    """Counts of what went wrong (or was cut) while playing, for the run's metrics."""

    env_errors: int = 0
    context_truncations: int = 0  # episodes ended because the next prompt no longer fit the context
    generate_calls: int = 0
    generate_seconds: float = 0.0
    env_seconds: float = 0.0
    error_messages: list[str] = field(default_factory=list)


@dataclass
class PromptFormat:
    """How an observation becomes model input ids."""

    tokenizer: Any
    template: str
    system: str | None = None
    response_prefix: str = ""  # pre-filled start of every response: in the prompt, not trained

    def encode(self, obs: str) -> tuple[str, list[int]]:
        text = render_prompt(self.template, obs, self.tokenizer, self.system) + self.response_prefix
        # Templates write their own special tokens (BOS, chat markup) as text.
        return text, list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def continue_chat(self, prompt_ids: Sequence[int], response_ids: Sequence[int], reply: str) -> tuple[str, list[int]]:
        """`history=chat`: the next turn's prompt as token ids, token in, token out: the previous prompt's ids,
        the ids the engine sampled (never re-tokenized), the end of the assistant's turn where the response did
        not sample it (cut by the budget), then the reply as the next user turn, tokenized on its own."""
        end, turn = chat_turn(self.template, reply)
        ids = list(prompt_ids) + list(response_ids)
        end_ids = self._ids(end)
        if ids[len(ids) - len(end_ids):] != end_ids:
            ids += end_ids
        ids += self._ids(turn + self.response_prefix)
        return self.tokenizer.decode(ids), ids

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def stop_token_ids(self) -> list[int]:
        """Ids of the template's end-of-turn markers that are single tokens of this tokenizer
        (engines stop there too, not only at the tokenizer's eos)."""
        ids = []
        for marker in stop_strings(self.template):
            toks = self.tokenizer(marker, add_special_tokens=False)["input_ids"]
            if len(toks) == 1:
                ids.append(int(toks[0]))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The action text the environment sees: the pre-filled prefix plus the sampled tokens."""
        return self.response_prefix + self.tokenizer.decode(list(ids), skip_special_tokens=True)


def play_episodes(
    engine: Engine,
    envs: Sequence[Any],
    seeds: Sequence[int],
    prompt: PromptFormat,
    *,
    max_new_tokens: int,
    topk: int = 0,
    generation_seed: int | None = None,
    temperature: float | None = None,
    clock: Callable[[], float] | None = None,
) -> tuple[list[Episode], RolloutStats]:
    """Play episode i on `envs[i]` from start seed `seeds[i]` until every episode has ended.

    An env that raises loses that episode only (counted in `env_errors`, not trained on). A prompt
    that outgrows the model's context ends its episode (counted in `context_truncations`); the turns
    played before it stay trainable. `temperature`: None samples as the engine does (training);
    evaluations pass --eval-temperature.
    """
    clock = clock or time.perf_counter
    if len(envs) != len(seeds):
        raise ValueError(f"one seed per env: got {len(envs)} envs and {len(seeds)} seeds")
    stats = RolloutStats()
    episodes = [Episode(env_index=i, seed=int(s)) for i, s in enumerate(seeds)]
    observations: dict[int, str] = {}
    counterfactuals: dict[int, dict | None] = {}  # the newest reply's, from its step's info
    t0 = clock()
    for i, (env, ep) in enumerate(zip(envs, episodes)):
        try:
            observations[i], info = env.reset(seed=ep.seed)
            ep.info["task_seed"] = int(info.get("episode_seed", ep.seed))  # the draw in the env's split (splits.py)
        except EnvError as e:
            _fail(ep, stats, e)
    stats.env_seconds += clock() - t0

    turn_index = 0
    while True:
        live = [i for i, ep in enumerate(episodes) if not ep.finished]
        if not live:
            break
        encoded = {i: _next_prompt(prompt, envs[i], episodes[i], observations[i]) for i in live}
        gens = _generate(engine, live, encoded, episodes, stats, max_new_tokens, topk,
                         turn_seed(generation_seed, turn_index), temperature, clock)
        t0 = clock()
        for i, gen in gens.items():
            ep = episodes[i]
            text = prompt.decode(gen.response_ids)
            try:
                obs, reward, terminated, truncated, info = envs[i].step(text)
            except EnvError as e:
                _fail(ep, stats, e)
                continue
            seen, observations[i] = observations[i], obs
            counterfactual, counterfactuals[i] = counterfactuals.get(i), info.get("counterfactual")
            if counterfactual is not None:  # this prompt with the changed reply, built as the real one was
                changed = _next_prompt(prompt, envs[i], ep, counterfactual["changed_observation"])[0]
                counterfactual = {**counterfactual, "changed_prompt": changed}
            ep.turns.append(
                Turn(
                    prompt_ids=encoded[i][1],
                    response_ids=list(gen.response_ids),
                    behavior_logprobs=np.asarray(gen.logprobs, dtype=np.float32),
                    reward=float(reward),
                    done=bool(terminated or truncated),
                    truncated=bool(truncated),
                    well_formed=bool(info.get("well_formed", True)),
                    finish_reason=gen.finish_reason,
                    topk_ids=gen.topk_ids,
                    topk_logprobs=gen.topk_logprobs,
                    prompt_text=encoded[i][0],
                    response_text=text,
                    follows_feedback=info.get("follows_feedback"),
                    counterfactual=counterfactual,
                    outcome=info.get("outcome"),
                    observation=seen,
                )
            )
            if "success" in info:
                ep.info["success"] = bool(info["success"])
            if info.get("outcome_kinds"):
                ep.info["outcome_kinds"] = tuple(info["outcome_kinds"])
        stats.env_seconds += clock() - t0
        turn_index += 1
    return episodes, stats


def turn_seed(generation_seed: int | None, turn_index: int) -> int | None:
    """The seed of one turn's generate call. Engines seed request i of a call with seed + i (`VLLMEngine`), and an
    episode's place among the live ones moves down as earlier episodes end, so consecutive turns' seeds must not be
    consecutive numbers: with generation_seed * 1000 + turn (before 2026-11-29) an episode one place down at the
    next turn got its previous turn's seed, the same noise, and at the first token mostly the same guess (vLLM
    0.8.5 evaluations of one GuessTheNumber model: success 0.31 against 0.45 unseeded, repeated guesses 0.22
    against 0.11; docs/warm_start.md). A hash of (generation_seed, turn) puts the turns' seed ranges apart."""
    return None if generation_seed is None else derive_seed(generation_seed, "turn", turn_index)


def _next_prompt(prompt: PromptFormat, env: Any, episode: Episode, observation: str) -> tuple[str, list[int]]:
    """This turn's (prompt text, ids): the observation rendered whole, or under `history=chat` the episode so
    far continued by the newest reply (`PromptFormat.continue_chat`)."""
    if getattr(env, "history", None) == "chat" and episode.turns:
        last = episode.turns[-1]
        return prompt.continue_chat(last.prompt_ids, last.response_ids, observation)
    return prompt.encode(observation)


def _generate(engine, live, encoded, episodes, stats, max_new_tokens, topk, seed, temperature,
              clock) -> dict[int, Generation]:
    """One batched generate over `live`; prompts that do not fit end their episodes and the rest
    are generated again."""
    todo = list(live)
    while todo:
        t0 = clock()
        try:
            # an engine's own sampling unless an evaluation asks for a temperature
            extra = {} if temperature is None else {"temperature": temperature}
            gens = engine.generate([encoded[i][1] for i in todo], max_new_tokens, topk, seed=seed, **extra)
        except PromptTooLongError as e:
            for j in e.indices:
                ep = episodes[todo[j]]
                ep.truncated_by_context = True
                if ep.turns:
                    ep.turns[-1].done = True
                    ep.turns[-1].truncated = True
                stats.context_truncations += 1
            todo = [i for j, i in enumerate(todo) if j not in set(e.indices)]
            continue
        finally:
            stats.generate_seconds += clock() - t0
        stats.generate_calls += 1
        return dict(zip(todo, gens))
    return {}


def _fail(ep: Episode, stats: RolloutStats, e: Exception) -> None:
    ep.error = f"{type(e).__name__}: {e}"
    stats.env_errors += 1
    if len(stats.error_messages) < 5:
        stats.error_messages.append(ep.error)

"""`TextEnv`: one gymnasium-style text environment, as the agent loop sees it."""

from __future__ import annotations

import contextlib
import math
import random
import threading
import weakref
from typing import Any, Callable

from oat_dppo_envs.preset import EnvPreset

from oat_dppo.envs.actions import is_well_formed
from oat_dppo.envs.errors import EnvResetError, EnvStepError
from oat_dppo.envs.imports import accepts_keyword as _accepts, load_object
from oat_dppo.envs.seeding import PrivateGlobalRNG, draw_episode_seed, episode_seed_stream
from oat_dppo.envs.splits import MAX_DRAWS, SplitExhausted, check_split, redraw_seed, split_of, task_key

HISTORY_MODES = ("concat", "concat_with_action", "last", "chat")


def _with_newline(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def _release(inner: Any) -> None:
    # GEM 0.1.0's MathEnv.close() assumes a process pool even when use_mp=False.
    if getattr(inner, "use_mp", None) is False and not hasattr(inner, "mp_pool"):
        return
    close = getattr(inner, "close", None)
    if callable(close):
        close()
    pool = getattr(inner, "mp_pool", None)
    if pool is not None:
        pool.terminate()  # close() alone leaves the grader process to the garbage collector


def _feedback_probe(inner: Any, preset: EnvPreset) -> tuple[Callable | None, Callable | None]:
    """(follows(observation, action), blind_success(max_turns)) for `inner`: its own
    `follows_feedback` / `feedback_blind_success` methods, else the preset's probe, else (None, None)."""
    if callable(getattr(inner, "follows_feedback", None)):
        blind = getattr(inner, "feedback_blind_success", None)
        return inner.follows_feedback, blind if callable(blind) else None
    if preset.feedback_probe is None:
        return None, None
    probe = load_object(preset.feedback_probe)
    return probe.follows, lambda max_turns: probe.blind_success(inner, max_turns)


def _reply_probe(inner: Any, preset: EnvPreset) -> tuple[Callable | None, Callable | None]:
    """(changed_reply(observation) -> str | None, reply_moves(observation) -> moves) for `inner`, the
    counterfactual of `oat_dppo.agent.reply_effect`: its own `changed_reply` / `reply_moves` methods,
    else the preset probe's `changed` / `moves(env, observation)`, else (None, None)."""
    if callable(getattr(inner, "changed_reply", None)) and callable(getattr(inner, "reply_moves", None)):
        return inner.changed_reply, inner.reply_moves
    probe = load_object(preset.feedback_probe) if preset.feedback_probe else None
    if probe is None or not callable(getattr(probe, "changed", None)):
        return None, None
    return probe.changed, lambda observation: probe.moves(inner, observation)


EXAMPLE_FIELD = "{example}"  # in obs_suffix: replaced every turn by the env's example move, if it has one
# ... the same move with its free part (Sudoku: the digit) drawn at random, from the episode's seed and
# the turn, so a run reproduces and a counterfactual prompt shows the same example as the real one.
RANDOM_EXAMPLE_FIELD = "{random_example}"


# ... the board laid out by cell: each empty cell's "row column" and what its row, column and box hold.
BOARD_VIEW_FIELD = "{board_view}"


def _text_probe(inner: Any, preset: EnvPreset, own: str, probed: str) -> Callable | None:
    """A method of the observation text for a field of `obs_suffix`: `inner`'s own `own`, else the preset
    probe's `probed`, else None. `{example}`: move_example / example (-> an action text | None);
    `{board_view}`: board_view / board_view (-> a text | None)."""
    if callable(getattr(inner, own, None)):
        return getattr(inner, own)
    probe = load_object(preset.feedback_probe) if preset.feedback_probe else None
    method = getattr(probe, probed, None) if probe is not None else None
    return method if callable(method) else None


def _outcome_probe(inner: Any, preset: EnvPreset) -> tuple[Callable | None, tuple[str, ...]]:
    """(reply_outcome(observation, reward) -> kind | None, every kind it can return) for `inner` (counted
    per episode in the `outcome_*` metrics, zeros included): its own `reply_outcome` and
    `REPLY_OUTCOMES`, else the preset probe's `outcome` and `OUTCOMES`, else (None, ())."""
    if callable(getattr(inner, "reply_outcome", None)):
        return inner.reply_outcome, tuple(getattr(inner, "REPLY_OUTCOMES", ()))
    probe = load_object(preset.feedback_probe) if preset.feedback_probe else None
    if probe is None or not callable(getattr(probe, "outcome", None)):
        return None, ()
    return probe.outcome, tuple(getattr(probe, "OUTCOMES", ()))


class TextEnv:
    """A text environment: `reset(seed=None) -> (obs, info)`, `step(action) -> (obs, reward,
    terminated, truncated, info)`, `close()`.

    * `obs` is the complete text the policy sees this turn: the instruction prefix, the episode's
      observations concatenated (GEM's `concat` wrapper; `history="last"` keeps only the newest),
      GEM's `info["prefix"]`/`info["suffix"]` (Sudoku's board) and the instruction suffix.
    * `info` keeps the env's own keys. The adapter adds `turn`, on reset `episode_seed` (the seed
      the episode started from), and on each step `well_formed` (the response holds an answer in
      the expected format) and `env_reward` (the reward before the adapter's `format_penalty`,
      which is added when the response is not well formed). Where the env declares how to read its
      feedback (`EnvPreset.feedback_probe`, or the env's own `follows_feedback`), steps after a reply
      that gave a direction also carry `follows_feedback` (the action moved the way it said). Where
      it also declares how a reply changes (`changed_reply` / `reply_moves`, or the probe's `changed` /
      `moves`), a step whose reply carries a direction adds `counterfactual`: the next observation
      had the reply said the other way, the moves to score and those the real reply favours
      (`oat_dppo.agent.reply_effect`). Where it classifies its replies (`reply_outcome`, or the
      probe's `outcome`), every step carries `outcome` (Sudoku: correct, filled, violates, ...).
    * `truncated` is set by the adapter after `max_turns` steps if the env has not ended the episode.
    * Seeding: every reset passes an explicit seed to the wrapped env. `reset()` draws it from a
      generator seeded by the instance seed, so an instance replays the same episodes;
      `reset(seed=k)` starts the same episode in every instance of the same id and options (group
      baselines rely on this) and reseeds that generator. Envs that use the global `random` /
      `np.random` (GEM's games) get a private copy of that state (see `seeding.py`), so they are
      reproducible and leave the caller's global generators alone.
    * Splits (`oat_dppo.envs.splits`): an instance built for a split (`split="train"`, `"validation"`,
      `"test"`) plays only tasks of that split: reset draws again, from seeds derived from the one asked
      for, until the task's key falls in it; `info["episode_seed"]` is the seed that drew the task
      (`reset(seed=info["episode_seed"])` replays it in any instance). `split=None` plays every task.
    * Errors: if the wrapped env raises in `step` (or breaks the return contract) the adapter
      raises `EnvStepError` (`EnvResetError` for `reset`), chained to the cause. The episode is
      then over: the caller drops it (counting `env_errors`) and calls `reset()` again.
    """

    def __init__(
        self,
        inner: Any,
        *,
        env_id: str,
        seed: int,
        preset: EnvPreset,
        max_turns: int,
        format_penalty: float = 0.0,
        history: str = "concat",
        obs_prefix: str = "",
        obs_suffix: str = "",
        action_format: str = "boxed",
        action_pattern: str | None = None,
        isolate_step_rng: bool = False,
        partial_credit: bool = True,
        global_rng: PrivateGlobalRNG | None = None,
        split: str | None = None,
    ):
        if history not in HISTORY_MODES:
            raise ValueError(f"history must be one of {HISTORY_MODES}, got {history!r}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.env_id = env_id
        self.seed = seed
        self.preset = preset
        self.max_turns = max_turns
        self.format_penalty = float(format_penalty)
        self.partial_credit = bool(partial_credit)
        self.history = history
        self.obs_prefix = obs_prefix
        self.obs_suffix = obs_suffix
        self.action_format = action_format
        self.action_pattern = action_pattern
        self.split = check_split(split)
        task_key(preset.split_key, seed=0, observation="")  # a bad preset fails here, not at the first reset
        self._inner = inner
        self._isolate_step_rng = isolate_step_rng
        self._global_rng = global_rng or PrivateGlobalRNG(seed)
        self._episode_seeds = episode_seed_stream(seed)
        self._turn = 0
        self._done = True
        self._closed = False
        self._observations: list[str] = []
        self._actions: list[str] = []
        self._lock = threading.Lock()  # one episode at a time per instance
        self._follows_feedback, self._blind_success = _feedback_probe(inner, preset)
        self._changed_reply, self._reply_moves = _reply_probe(inner, preset)
        self._reply_outcome, self._outcome_kinds = _outcome_probe(inner, preset)
        self._move_example = _text_probe(inner, preset, "move_example", "example")
        self._board_view = _text_probe(inner, preset, "board_view", "board_view")
        for field in (EXAMPLE_FIELD, RANDOM_EXAMPLE_FIELD):
            if field in obs_suffix and (self._move_example is None or (
                    field == RANDOM_EXAMPLE_FIELD and not _accepts(self._move_example, "rng"))):
                raise ValueError(f"obs_suffix uses {field}, a move drawn from the observation"
                                 f"{' at random' if field == RANDOM_EXAMPLE_FIELD else ''}, which {env_id} "
                                 "does not provide (game:Sudoku-* do)")
        if BOARD_VIEW_FIELD in obs_suffix and self._board_view is None:
            raise ValueError(f"obs_suffix uses {BOARD_VIEW_FIELD}, the board laid out by cell, which {env_id} "
                             "does not provide (game:Sudoku-* do)")
        self._episode_seed: int | None = None
        # Also release on garbage collection / interpreter exit: an unclosed GEM math env's pool
        # otherwise prints "Exception ignored in Pool.__del__" at exit.
        self._finalizer = weakref.finalize(self, _release, inner)

    # -- public API ---------------------------------------------------------------------------
    @property
    def unwrapped(self) -> Any:
        """The wrapped environment (a GEM env, or the user's object)."""
        return self._inner

    @property
    def feedback_blind_success(self) -> float:
        """The most success a policy that ignores the env's replies can reach here (NaN where the env
        declares no feedback probe): success above it needs the feedback."""
        return self._blind_success(self.max_turns) if self._blind_success else math.nan

    @property
    def turn(self) -> int:
        """Steps taken in the current episode."""
        return self._turn

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if self._closed:
            raise RuntimeError(f"{self.env_id}: reset() after close()")
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
                raise ValueError(f"reset seed must be a non-negative int, got {seed!r}")
            self._episode_seeds = episode_seed_stream(seed)
            episode_seed = seed
        else:
            episode_seed = draw_episode_seed(self._episode_seeds)
        with self._lock:
            obs, info, episode_seed = self._reset_in_split(episode_seed)
            self._turn = 0
            self._done = False
            self._episode_seed = episode_seed
            self._observations = [obs]
            self._actions = []
            info = dict(info)
            info.update(turn=0, episode_seed=episode_seed)
            return self._compose(info), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(f"action must be str, got {type(action).__name__}")
        with self._lock:
            if self._done:
                raise RuntimeError(f"{self.env_id}: step() outside an episode; call reset() first")
            well_formed = is_well_formed(action, self.action_format, self.action_pattern)
            follows = self._follows_feedback(self._observations[-1], action) if self._follows_feedback else None
            try:
                with self._global_rng.active() if self._isolate_step_rng else contextlib.nullcontext():
                    result = self._inner.step(action)
                obs, env_reward, terminated, truncated, info = self._unpack_step(result)
            except Exception as e:
                self._done = True
                raise EnvStepError(self._step_error_message(e), env_id=self.env_id,
                                   turn=self._turn + 1) from e
            self._turn += 1
            self._observations.append(obs)
            self._actions.append(action)
            if not (terminated or truncated) and self._turn >= self.max_turns:
                truncated = True
            self._done = terminated or truncated
            if not self.partial_credit and 0.0 < env_reward < 1.0:
                env_reward = 0.0  # a near miss (GuessTheNumber's 1 - distance / range at the end) earns nothing
            reward = env_reward + (0.0 if well_formed else self.format_penalty)
            info = dict(info)
            info.update(well_formed=well_formed, turn=self._turn, env_reward=env_reward)
            if follows is not None:
                info.setdefault("follows_feedback", bool(follows))
            outcome = self._reply_outcome(obs, env_reward) if self._reply_outcome else None
            if outcome is not None:
                info.setdefault("outcome", str(outcome))
                info.setdefault("outcome_kinds", self._outcome_kinds)
            if not self._done and self._changed_reply is not None and self._follows_feedback is not None:
                counterfactual = self._counterfactual(obs, info)
                if counterfactual is not None:
                    info["counterfactual"] = counterfactual
            return self._compose(info), reward, terminated, truncated, info

    def close(self) -> None:
        """Release the env's resources (GEM's math grader pool). Safe to call twice."""
        self._closed = True
        self._done = True
        self._finalizer()

    def __enter__(self) -> "TextEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TextEnv({self.env_id!r}, seed={self.seed}, max_turns={self.max_turns})"

    # -- internals ----------------------------------------------------------------------------
    def _reset_in_split(self, seed: int) -> tuple[str, dict[str, Any], int]:
        """(observation, info, seed that drew it) of the first draw for `seed` whose task is in the split."""
        by_seed = self.preset.split_key == "seed"
        for attempt in range(MAX_DRAWS if self.split is not None else 1):
            episode_seed = redraw_seed(seed, attempt)
            if self.split is not None and by_seed and split_of(task_key("seed", seed=episode_seed, observation="")) \
                    != self.split:
                continue  # the seed names the task: no reset for a draw that is not in the split
            try:
                with self._global_rng.active():
                    result = self._inner.reset(seed=episode_seed)
            except Exception as e:
                self._done = True
                raise EnvResetError(
                    f"{self.env_id}: reset(seed={episode_seed}) raised {type(e).__name__}: {e}",
                    env_id=self.env_id, turn=0,
                ) from e
            obs, info = self._unpack_reset(result, episode_seed)
            if self.split is None:
                return obs, info, episode_seed
            shown = f"{info.get('prefix', '')}{obs}{info.get('suffix', '')}"
            if split_of(task_key(self.preset.split_key, seed=episode_seed, observation=shown)) == self.split:
                return obs, info, episode_seed
        self._done = True
        raise SplitExhausted(
            f"{self.env_id}: no {self.split} task in {MAX_DRAWS} draws from seed {seed}: its first observation "
            f"does not vary with the seed; give its preset split_key=\"seed\" (oat_dppo_envs.preset.EnvPreset)")

    def _counterfactual(self, reply: str, info: dict[str, Any]) -> dict[str, Any] | None:
        """What the next turn's prompt would be had `reply` (the newest observation) said the other
        thing, everything else equal, with the moves to score and which of them `reply` favours
        (`oat_dppo.agent.reply_effect`); None when the reply carries no such information."""
        changed = self._changed_reply(reply)
        if changed is None:
            return None
        moves = [str(m) for m in self._reply_moves(reply)]
        self._observations[-1] = changed
        try:
            changed_observation = self._compose(info)
        finally:
            self._observations[-1] = reply
        return {"changed_observation": changed_observation, "moves": moves,
                "favoured": [bool(self._follows_feedback(reply, m)) for m in moves]}

    def _compose(self, info: dict[str, Any]) -> str:
        if self.history in ("last", "chat"):  # chat: the agent loop keeps the conversation, as token ids
            body = _with_newline(self._observations[-1])
        elif self.history == "concat":
            body = "".join(_with_newline(o) for o in self._observations)
        else:  # concat_with_action: obs, action, obs, action, ..., obs
            parts = []
            for o, a in zip(self._observations, self._actions):
                parts += [_with_newline(o), _with_newline(a)]
            body = "".join(parts) + _with_newline(self._observations[-1])
        body = f"{info.get('prefix', '')}{body}{info.get('suffix', '')}"
        suffix = self.obs_suffix
        if EXAMPLE_FIELD in suffix:  # a move drawn from this turn's observation (Sudoku: an empty cell)
            suffix = suffix.replace(EXAMPLE_FIELD, self._move_example(body) or "")
        if RANDOM_EXAMPLE_FIELD in suffix:  # the same, its digit at random (seeded: episode and turn)
            rng = random.Random(f"{self._episode_seed}:{self._turn}")
            suffix = suffix.replace(RANDOM_EXAMPLE_FIELD, self._move_example(body, rng=rng) or "")
        if BOARD_VIEW_FIELD in suffix:  # the same board, by cell
            suffix = suffix.replace(BOARD_VIEW_FIELD, self._board_view(body) or "")
        return f"{self.obs_prefix}{body}{suffix}"

    def _unpack_reset(self, result: Any, episode_seed: int) -> tuple[str, dict[str, Any]]:
        # gymnasium returns (obs, info); a bare observation is accepted too.
        obs, info = result if isinstance(result, tuple) and len(result) == 2 else (result, {})
        if not isinstance(obs, str) or not isinstance(info, dict):
            self._done = True
            raise EnvResetError(
                f"{self.env_id}: reset(seed={episode_seed}) must return (str, dict), got "
                f"({type(obs).__name__}, {type(info).__name__})",
                env_id=self.env_id, turn=0,
            )
        return obs, info

    @staticmethod
    def _unpack_step(result: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not (isinstance(result, tuple) and len(result) == 5):
            raise TypeError(
                "step() must return (obs: str, reward: float, terminated, truncated, info: dict), "
                f"got {type(result).__name__}"
                + (f" of length {len(result)}" if isinstance(result, tuple) else "")
            )
        obs, reward, terminated, truncated, info = result
        if not isinstance(obs, str):
            raise TypeError(f"step() returned an observation of type {type(obs).__name__}, not str")
        if info is None:
            info = {}
        if not isinstance(info, dict):
            raise TypeError(f"step() returned info of type {type(info).__name__}, not dict")
        return obs, float(reward), bool(terminated), bool(truncated), info

    def _step_error_message(self, e: Exception) -> str:
        msg = f"{self.env_id}: step() at turn {self._turn + 1} raised {type(e).__name__}: {e}"
        if isinstance(e, ValueError) and "signal only works in main thread" in str(e):
            msg += " (GEM's math grader uses SIGALRM when use_mp=False; pass use_mp=True to step from threads)"
        return msg

"""`make_env`: environment id -> `TextEnv`.

An id is one of: a GEM registered id (`game:Sudoku-v0-easy`, `rg:arc_1d`, `math:Math12K`, ...),
`math` (a local file), `math:procedural`, or `package.module:Factory` for a gymnasium-style text
env of your own. `python -m oat_dppo.envs --list` prints the known ids.
"""

from __future__ import annotations

import copy
import difflib
import functools
import importlib
import inspect
from typing import Any, Callable

from oat_dppo_envs.math import DEFAULT_PROCEDURAL_SIZE, DEFAULT_PROCEDURAL_TASKS, procedural_math_dataset

from oat_dppo.envs import hub
from oat_dppo.envs._gem import FixedPoolReasoningGym, gem_registry, import_gem
from oat_dppo.envs.actions import ACTION_FORMATS
from oat_dppo.envs.adapter import HISTORY_MODES, TextEnv
from oat_dppo.envs.errors import DatasetUnavailableError, EnvOptionError, UnknownEnvError
from oat_dppo.envs.imports import ImportPathError, load_object
from oat_dppo.envs.imports import accepts_keyword as _accepts
from oat_dppo.envs.math_data import MATH_DATA_HINT, load_math_file, make_math_env, with_shared_grader
from oat_dppo.envs.retry import RetryAnswer
from oat_dppo.envs.presets import (
    LOCAL_MATH_ID,
    OWN_ENV_IDS,
    PROCEDURAL_MATH_ID,
    EnvPreset,
    family_of,
    get_preset,
    known_env_ids,
    takes_math_data,
)
from oat_dppo.envs.seeding import PrivateGlobalRNG
from oat_dppo.envs.splits import BUCKETS, EVAL_SPLITS, check_split

_LIST_HINT = "Run `python -m oat_dppo.envs --list` to see every id"


def _unknown_env_error(env_id: str, reason: str | None = None) -> UnknownEnvError:
    known = known_env_ids()
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(env_id.lower(), list(by_lower), n=5, cutoff=0.5)
    suggestions = [by_lower[c] for c in close]
    lines = [f"unknown environment id {env_id!r}" + (f" ({reason})" if reason else "") + "."]
    if suggestions:
        lines.append("Closest known ids: " + ", ".join(suggestions) + ".")
    lines.append(
        f"{_LIST_HINT}; your own gymnasium-style text env can be given as 'package.module:Class'."
    )
    return UnknownEnvError(" ".join(lines))


def _check_constructor_options(env_id: str, spec: Any, kwargs: dict[str, Any]) -> None:
    """GEM's constructors end in `**_`, which would swallow a misspelt or unsupported option: refuse
    any option that is not one of the constructor's named parameters. (A `**kwargs` that may pass
    options on, as MathEnv's, is left alone.)"""
    entry = spec.entry_point
    if isinstance(entry, str):
        module_name, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module_name), attr)
    try:
        params = inspect.signature(entry).parameters.values()
    except (TypeError, ValueError):  # no signature to check against
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD and p.name != "_" for p in params):
        return
    named = {p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                  inspect.Parameter.KEYWORD_ONLY)}
    unknown = sorted(set(kwargs) - named - {"seed"})  # gem.make takes seed= for every env
    if unknown:
        raise EnvOptionError(f"{env_id} has no option {', '.join(unknown)}; its constructor takes "
                             f"{', '.join(sorted(named - {'self', 'seed'}))} (GEM would ignore the rest silently)")


def load_factory(env_id: str) -> Callable[..., Any]:
    """The class or factory that `package.module:Name` names (an `UnknownEnvError` when nothing is there)."""
    try:
        obj = load_object(env_id)
    except ImportPathError as e:
        raise _unknown_env_error(env_id, str(e)) from None
    if not callable(obj):
        raise UnknownEnvError(f"{env_id!r} is not a class or factory (got {type(obj).__name__})")
    return obj


def _make_user_env(env_id: str, seed: int, kwargs: dict[str, Any], max_turns: int | None) -> Any:
    factory = load_factory(env_id)
    if _accepts(factory, "seed"):
        kwargs = {"seed": seed, **kwargs}
    if max_turns is not None and _accepts(factory, "max_turns"):  # its own limit (and prompt) moves too
        kwargs = {**kwargs, "max_turns": int(max_turns)}
    env = factory(**kwargs)
    if not (callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))):
        raise TypeError(f"{env_id!r} built a {type(env).__name__}, which has no reset()/step()")
    if not _accepts(env.reset, "seed"):
        raise TypeError(f"{env_id!r}: reset() must accept seed= (gymnasium API: reset(seed=None))")
    return env


@functools.lru_cache(maxsize=8)
def _rg_prototype(env_id: str, frozen_kwargs: tuple[tuple[str, Any], ...]) -> Any:
    # Every instance with the same options shares one question pool (ACRE builds its pool
    # eagerly: 0.3 s per 2000 items), so build it once and hand out shallow copies.
    return import_gem().make(env_id, **dict(frozen_kwargs))


def _make_gem_env(env_id: str, spec: Any, data_seed: int, kwargs: dict[str, Any],
                  math_options: dict[str, Any]) -> Any:
    gem = import_gem()
    family = family_of(env_id)
    if family == "rg":
        kwargs = {"seed": data_seed, **kwargs}
        _check_constructor_options(env_id, spec, kwargs)
        try:
            env = copy.copy(_rg_prototype(env_id, tuple(sorted(kwargs.items()))))
        except TypeError:  # unhashable option values: no sharing
            env = gem.make(env_id, **kwargs)
        return FixedPoolReasoningGym(env)
    math_data = math_options.pop("math_data", None)
    if math_data is not None:
        dataset = load_math_file(math_data, question_key=math_options["question_key"],
                                 answer_key=math_options["answer_key"])
        return make_math_env(dataset, data_seed=data_seed, use_mp=math_options["use_mp"],
                             env_id=env_id, **kwargs)
    if "dataset_name" in spec.kwargs and "dataset" not in kwargs:
        return _make_hub_env(env_id, spec, data_seed, kwargs, math_options)
    if takes_math_data(env_id):
        kwargs["use_mp"] = False  # grading off the main thread: the shared grader, not a pool per env
    _check_constructor_options(env_id, spec, kwargs)
    env = gem.make(env_id, seed=data_seed, **kwargs)
    return with_shared_grader(env, math_options["use_mp"]) if takes_math_data(env_id) else env


def _make_hub_env(env_id: str, spec: Any, data_seed: int, kwargs: dict[str, Any],
                  math_options: dict[str, Any]) -> Any:
    name = spec.kwargs["dataset_name"]
    if takes_math_data(env_id):
        hint = MATH_DATA_HINT + f" (make_env({env_id!r}, seed=..., math_data=FILE) keeps this id)"
        kwargs["use_mp"] = False  # as above: the shared grader, attached below
    else:
        hint = f"pass a local datasets.Dataset: make_env({env_id!r}, seed=..., dataset=...)"

    def unavailable(why: str) -> DatasetUnavailableError:
        return DatasetUnavailableError(
            f"{env_id!r} downloads the dataset {name!r} from the Hugging Face hub, and {why}. "
            f"Offline, {hint}."
        )

    offline = hub.hub_offline()
    if not offline and not hub.hub_reachable():
        raise unavailable("the hub cannot be reached from this machine (no network? a copy already "
                          "in the local cache is used with HF_HUB_OFFLINE=1)")
    try:
        env = import_gem().make(env_id, seed=data_seed, **kwargs)
    except OSError as e:  # ConnectionError, OfflineModeIsEnabled, DatasetNotFoundError
        why = ("offline mode is on (HF_HUB_OFFLINE) and it is not in the local cache" if offline
               else f"loading it failed ({type(e).__name__}: {e})")
        raise unavailable(why) from e
    return with_shared_grader(env, math_options["use_mp"]) if takes_math_data(env_id) else env


def make_env(env_id: str, *, seed: int, **options: Any) -> TextEnv:
    """Build the text environment `env_id`, seeded by `seed`.

    Adapter options (defaults from `get_preset(env_id)`):
      max_turns, format_penalty (added to the reward of a step without a well-formed answer;
      give a negative number), history ("concat" | "concat_with_action" | "last" | "chat"), obs_prefix,
      obs_suffix (instruction text around the observation; "" for none), action_format,
      action_pattern, isolate_step_rng, partial_credit (false: a reward between 0 and 1, a game's credit
      for a near miss, counts 0; a success and a format penalty stay), data_seed (seed of the shared question pool / math
      shuffle), split ("train" | "validation" | "test": play only that split's tasks, `oat_dppo.envs.splits`;
      validation shifts the instance seed and data_seed by the preset's eval_seed_offset, test by twice it;
      default None: every task, unshifted), attempts (a single-turn question answered in up to N turns, the
      grader's reply between: `oat_dppo.envs.retry`; max_turns follows), answer_labels (with attempts: the few
      answers a question allows, "|"-separated, e.g. "1|2|3", where the preset names none: the reply then
      declares its counterfactual, so `eval/reply_effect` is measured).
    Math options: math_data (file for `math`, `math:*`, `eval:*`), question_key, answer_key,
      use_mp (grade in a subprocess; needed when stepping from threads), and for
      `math:procedural` size, tasks, answer (any | number: only a plain number in the box is graded) and
      any setting of those reasoning-gym tasks (max_digits=1).
    Anything else goes to the environment's constructor (GEM's `gem.make` kwargs, checked against
    the constructor's parameters, or your factory).
    """
    if not isinstance(env_id, str) or not env_id.strip():
        raise UnknownEnvError(f"environment id must be a non-empty string, got {env_id!r}. {_LIST_HINT}.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    env_id = env_id.strip()
    family = family_of(env_id)

    spec = None
    own = env_id in OWN_ENV_IDS  # the project's own environments (oat_dppo_envs), not GEM's
    if env_id not in (LOCAL_MATH_ID, PROCEDURAL_MATH_ID) and family != "import" and not own:
        spec = gem_registry().get(env_id)
        if spec is None:
            raise _unknown_env_error(env_id)
    preset: EnvPreset = get_preset(env_id)

    split = check_split(options.pop("split", None))
    shift = preset.eval_seed_offset * {"validation": 1, "test": 2}.get(split, 0)  # each split its own pool
    data_seed = options.pop("data_seed", None)
    if data_seed is None:
        data_seed = preset.data_seed + shift
    if isinstance(data_seed, bool) or not isinstance(data_seed, int) or not 0 <= data_seed < 2**32:
        raise ValueError(f"data_seed must be an int in [0, 2**32), got {data_seed!r}")
    seed += shift
    attempts = int(options.pop("attempts", 1))
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    if attempts > 1 and preset.multi_turn:
        raise ValueError(f"attempts retries a single-turn question; {env_id} is multi-turn already")
    answer_labels = options.pop("answer_labels", None)
    if answer_labels is None:
        answer_labels = preset.answer_labels
    else:
        if attempts < 2:
            raise ValueError("answer_labels names what a retry's reply may refuse: give it with attempts >= 2")
        answer_labels = tuple(label.strip() for label in str(answer_labels).split("|") if label.strip())
        if len(answer_labels) < 2 or len(set(answer_labels)) != len(answer_labels):
            raise ValueError(f"answer_labels must name 2 or more distinct answers, '|'-separated, got {answer_labels}")
    max_turns = options.pop("max_turns", None)
    if max_turns is None and attempts > 1:
        max_turns = attempts
    adapter_options = dict(
        max_turns=preset.max_turns if max_turns is None else int(max_turns),
        format_penalty=float(options.pop("format_penalty", 0.0)),
        history=options.pop("history", "concat"),
        obs_prefix=options.pop("obs_prefix", None),
        obs_suffix=options.pop("obs_suffix", None),
        action_format=options.pop("action_format", preset.action_format),
        action_pattern=options.pop("action_pattern", preset.action_pattern),
        isolate_step_rng=bool(options.pop("isolate_step_rng", preset.isolate_step_rng)),
        partial_credit=_flag(options.pop("partial_credit", True), "partial_credit"),
    )
    # Check the adapter's options before building the env (a math env starts a grader process).
    if adapter_options["history"] not in HISTORY_MODES:
        raise ValueError(f"history must be one of {HISTORY_MODES}, got {adapter_options['history']!r}")
    if adapter_options["action_format"] not in ACTION_FORMATS:
        raise ValueError(f"action_format must be one of {ACTION_FORMATS}, got {adapter_options['action_format']!r}")
    if adapter_options["max_turns"] < 1:
        raise ValueError(f"max_turns must be >= 1, got {adapter_options['max_turns']}")
    if adapter_options["obs_prefix"] is None:
        adapter_options["obs_prefix"] = preset.obs_prefix
    if adapter_options["obs_suffix"] is None:
        adapter_options["obs_suffix"] = preset.obs_suffix
    math_options = dict(
        math_data=options.pop("math_data", None),
        question_key=options.pop("question_key", "problem"),
        answer_key=options.pop("answer_key", "answer"),
        use_mp=bool(options.pop("use_mp", False)),
    )
    if math_options["math_data"] is not None and not takes_math_data(env_id):
        raise ValueError(
            f"math_data applies to 'math' and the GEM ids graded by MathEnv (math:Math12K, "
            f"eval:MATH500, ...), not {env_id!r}"
        )
    env_kwargs = {**preset.env_kwargs, **options}
    # A held-out split keeps 1 task in BUCKETS of its pool: a pool BUCKETS times larger gives it as many distinct
    # tasks as a training pool has (a generated pool: reasoning-gym's, math:procedural's; a file stays as it is).
    pool_scale = BUCKETS if split in EVAL_SPLITS else 1
    if pool_scale > 1 and "size" in env_kwargs:
        env_kwargs["size"] = int(env_kwargs["size"]) * pool_scale
    # A GEM game stops by itself at its registered max_turns: move that limit too.
    if max_turns is not None and family == "game" and spec is not None and "max_turns" in spec.kwargs:
        env_kwargs["max_turns"] = int(max_turns)

    global_rng = PrivateGlobalRNG(seed)
    # Constructors may draw from the global RNG too (Sudoku builds a first board).
    with global_rng.active():
        if env_id == LOCAL_MATH_ID:
            if math_options["math_data"] is None:
                raise DatasetUnavailableError("environment 'math' needs a data file: " + MATH_DATA_HINT)
            dataset = load_math_file(math_options["math_data"], question_key=math_options["question_key"],
                                     answer_key=math_options["answer_key"])
            inner = make_math_env(dataset, data_seed=data_seed, use_mp=math_options["use_mp"], **env_kwargs)
        elif env_id == PROCEDURAL_MATH_ID:
            size = int(env_kwargs.pop("size", DEFAULT_PROCEDURAL_SIZE * pool_scale))
            tasks = env_kwargs.pop("tasks", DEFAULT_PROCEDURAL_TASKS)
            answer = env_kwargs.pop("answer", "any")
            # Every other option is a setting of the reasoning-gym tasks (checked there).
            dataset = procedural_math_dataset(seed=data_seed, size=size, tasks=tasks, **env_kwargs)
            inner = make_math_env(dataset, data_seed=data_seed, use_mp=math_options["use_mp"], answer=answer)
        elif own:
            inner = _make_user_env(preset.factory, seed, env_kwargs, max_turns)
        elif family == "import":
            inner = _make_user_env(env_id, seed, env_kwargs, max_turns)
        else:
            inner = _make_gem_env(env_id, spec, data_seed, env_kwargs, math_options)
    if attempts > 1:
        inner = RetryAnswer(inner, attempts, answer_labels)

    return TextEnv(inner, env_id=env_id, seed=seed, preset=preset, global_rng=global_rng, split=split,
                   **adapter_options)


def _flag(value: Any, name: str) -> bool:
    """A boolean option as a command line gives it (`--env-option partial_credit=false`) or Python does."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


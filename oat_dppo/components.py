"""The run's parts built from a `TrainConfig`, the same way on both backends: environments, the
trust region, the prompt template. (A fix here reaches the local trainer and the Oat actor/learner.)"""

from __future__ import annotations

import inspect
from typing import Any

from oat_dppo.config import ConfigError, TrainConfig, assignments, env_options, trust_region_params
from oat_dppo.seeds import derive_seed
from oat_dppo.trust_region import make_trust_region
from oat_dppo.trust_region.registry import get_factory

TINY_MODEL_NAMES = ("tiny-qwen3", "tiny-llama")


def build_trust_region(cfg: TrainConfig):
    """The strategy `--trust-region` names, with its parameters; a bad name or parameter is a
    `ConfigError` (one line)."""
    try:
        params = trust_region_params(cfg)
        check_tr_param_numbers(cfg)
        return make_trust_region(cfg.trust_region, **params)
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"--trust-region {cfg.trust_region}: {e}") from e


def check_tr_param_numbers(cfg: TrainConfig) -> None:
    """A --tr-param NAME=TEXT whose TEXT is no number where the strategy takes one is a `ConfigError`
    naming both (the strategy's own float() would name neither)."""
    texts = {name: value for name, value in assignments(cfg.tr_param, "--tr-param", example="delta=0.1").items()
             if isinstance(value, str)}
    if not texts:
        return
    try:
        parameters = inspect.signature(get_factory(cfg.trust_region)).parameters
    except (TypeError, ValueError):  # no signature to read (or an unknown name: make_trust_region says so)
        return
    for name, text in texts.items():
        p = parameters.get(name)
        if p is None:  # a parameter the strategy does not take: make_trust_region says so
            continue
        numeric_default = isinstance(p.default, (int, float)) and not isinstance(p.default, bool)
        if numeric_default or p.annotation in (int, float, "int", "float"):
            raise ConfigError(f"--tr-param {name}={text}: {text!r} is not a number")


def build_envs(cfg: TrainConfig, n: int, *, split: str) -> list:
    """`n` environment instances of `--env` that play the tasks of `split` ("train", "validation", "test":
    `oat_dppo.envs.splits`)."""
    from oat_dppo.envs import DatasetUnavailableError, UnknownEnvError, make_env  # GEM is imported by make_env

    options: dict[str, Any] = {"format_penalty": cfg.format_penalty, **env_options(cfg)}
    if cfg.max_turns is not None:
        options["max_turns"] = cfg.max_turns
    if cfg.math_data:
        options.update(math_data=cfg.math_data, question_key=cfg.math_question_key, answer_key=cfg.math_answer_key)
    try:
        return [make_env(cfg.env, seed=derive_seed(cfg.seed, "env", i), split=split, **options)
                for i in range(n)]
    except ValueError as e:  # the environment refused an option (EnvOptionError, a bad setting)
        if isinstance(e, (UnknownEnvError, DatasetUnavailableError)):  # already one clear line
            raise
        raise ConfigError(str(e) if str(e).startswith(cfg.env) else f"--env {cfg.env}: {e}") from e


def resolve_template(cfg: TrainConfig, model_or_tokenizer: Any) -> str:
    """`--template`, or (auto) the template of the model's family: qwen3, llama3, chatml, else raw. With
    `--env-option history=chat` it must be a chat template (a `ConfigError` otherwise)."""
    template = cfg.template
    if template == "auto":
        from oat_dppo.models import model_family  # transformers: only where a model is at hand anyway

        family = model_family(cfg.model)
        if family == "raw" and cfg.model not in TINY_MODEL_NAMES:
            family = model_family(model_or_tokenizer)
        template = {"qwen3": "qwen3", "llama3": "llama3", "chatml": "chatml"}.get(family, "raw")
    if env_options(cfg).get("history") == "chat":
        from oat_dppo.envs import chat_turn

        try:
            chat_turn(template, "")
        except ValueError as e:
            raise ConfigError(f"--env-option history=chat with {cfg.model}: {e}") from None
    return template


# TrainConfig option -> the attribute a built-in strategy keeps it in.
_STRATEGY_ATTRIBUTES = {"delta": "delta", "eps_low": "eps_low", "eps_high": "eps_high", "alpha": "alpha",
                        "direction": "direction", "clip_c": "C", "anchor": "anchor", "topk": "K"}


def effective_trust_region_options(cfg: TrainConfig, trust_region) -> dict[str, Any]:
    """The trust-region options left at None (the strategy's default) with the value the strategy
    actually uses, for the options the strategy has (a run's config.json records what ran)."""
    out = {}
    for option, attribute in _STRATEGY_ATTRIBUTES.items():
        if getattr(cfg, option) is None and hasattr(trust_region, attribute):
            out[option] = getattr(trust_region, attribute)
    return out

"""What a run's options can be checked for before anything heavy is built: the model name, the
environment id and the trust region with its parameters. Every problem is reported at once, in a few
seconds (GEM's registry and the trust-region registry, which imports torch), where building the run
would find them one at a time after 5-70 s of imports, model loading and hub retries.

`python -m oat_dppo.main` runs `problems(cfg)` first; the study runner checks every run of a study
file with the same functions.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from oat_dppo.config import ConfigError, TrainConfig
from oat_dppo.model_names import KNOWN_MODELS


def model_problem(name: str) -> str | None:
    """Why `name` cannot be a model, as far as can be told without the hub: a path to nowhere, or a
    near miss of a name oat_dppo knows (`smolm2`). Hub ids are left to the loader."""
    key = name.strip().lower()
    if key in (m.lower() for m in KNOWN_MODELS) or Path(name).expanduser().is_dir():
        return None
    if name.startswith(("/", "./", "../", "~")) or name.endswith("/"):
        return f"--model {name}: no such directory (a local model is a directory with config.json)"
    close = difflib.get_close_matches(key, [m.lower() for m in KNOWN_MODELS], n=1, cutoff=0.75)
    if close:
        match = next(m for m in KNOWN_MODELS if m.lower() == close[0])
        return (f"--model {name}: unknown model; did you mean {match!r}? (known without the hub: "
                f"{', '.join(KNOWN_MODELS)}; or a local directory, or a Hugging Face hub id)")
    return None


def env_problem(env: str) -> str | None:
    """Why `env` is not a known environment id, or None (also when GEM is not installed)."""
    # gem_registry() imports GEM (~1-3 s), for GEM ids only
    from oat_dppo.envs._gem import gem_registry  # noqa: PLC0415
    from oat_dppo.envs.presets import FIRST_CLASS_ENV_IDS, LOCAL_MATH_ID, PROCEDURAL_MATH_ID, family_of  # noqa: PLC0415

    if env in FIRST_CLASS_ENV_IDS or env in (LOCAL_MATH_ID, PROCEDURAL_MATH_ID) or family_of(env) == "import":
        return None
    try:
        ids = set(gem_registry())
    except Exception:  # no GEM here: the run itself will say
        return None
    if env in ids:
        return None
    close = difflib.get_close_matches(env, sorted(ids), n=3, cutoff=0.6)
    hint = f" did you mean {', '.join(close)}?" if close else ""
    return (f"unknown environment {env!r};{hint} valid: any GEM id (python -m oat_dppo.envs --list), math, "
            "math:procedural, or package.module:EnvClass")


def trust_region_problem(cfg: TrainConfig) -> str | None:
    """An unknown trust region name, or parameters its strategy refuses (the strategy is built)."""
    from oat_dppo.trust_region.registry import available, get_factory  # noqa: PLC0415 (torch)

    tr = cfg.trust_region
    if ":" not in tr and tr not in available():
        try:
            get_factory(tr)
        except ValueError as e:  # the registry's message: the closest name and the valid ones
            return str(e)
    from oat_dppo.components import build_trust_region  # noqa: PLC0415 (torch)

    try:
        build_trust_region(cfg)  # as the run builds it: its parameters checked, --tr-param text named
    except ConfigError as e:
        return str(e)
    except Exception as e:  # a parameter the strategy does not take, or a bad value
        return f"trust region {tr}: {e}"
    return None


def problems(cfg: TrainConfig) -> list[str]:
    """Every problem the checks above find in `cfg`, cheapest first."""
    found = [model_problem(cfg.model), env_problem(cfg.env), trust_region_problem(cfg)]
    return [p for p in found if p]

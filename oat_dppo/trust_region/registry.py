"""Names -> strategy factories: `available()`, `register()`, `make_trust_region()`."""

from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Any, Callable

from oat_dppo.trust_region import strategies as S
from oat_dppo.trust_region.framework_masks import FRAMEWORK_STRATEGIES

TrustRegionFactory = Callable[..., Any]

_REGISTRY: dict[str, TrustRegionFactory] = {}


def register(name: str, factory: TrustRegionFactory | None = None, *, overwrite: bool = False):
    """Register `factory(**params) -> strategy` under `name`. Usable as a decorator.

    A strategy is any callable `(TrustRegionInputs) -> TrustRegionOutput`; subclassing
    `MaskedPolicyGradient` and overriding `blocked` gives validation, loss and metrics for free.
    """

    def _add(f: TrustRegionFactory) -> TrustRegionFactory:
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"a trust-region name must be a non-empty string without ':', got {name!r}")
        if name in _REGISTRY and not overwrite:
            raise ValueError(f"trust region {name!r} is already registered (pass overwrite=True to replace it)")
        if not callable(f):
            raise ValueError(f"the factory for {name!r} must be callable, got {type(f).__name__}")
        _REGISTRY[name] = f
        return f

    return _add(factory) if factory is not None else _add


def available() -> list[str]:
    """Registered strategy names, built-ins first."""
    return list(_REGISTRY)


def _load_by_path(path: str) -> TrustRegionFactory:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"an import path must look like 'package.module:factory', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import module {module_name!r} for trust region {path!r}: {e}") from e
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r} (trust region {path!r})") from None
    if not callable(factory):
        raise ValueError(f"{path!r} is not callable")
    return factory


def factory_params(factory: TrustRegionFactory) -> dict[str, Any]:
    """The keyword parameters a factory accepts, with their defaults (for help texts and checks)."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return {}
    return {
        n: p.default
        for n, p in sig.parameters.items()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and n != "self"
    }


def get_factory(name: str) -> TrustRegionFactory:
    """The factory registered as `name`, or the one an import path 'package.module:factory' names;
    an unknown name is a `ValueError` that suggests the closest registered one."""
    if ":" in name:
        return _load_by_path(name)
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown trust region {name!r}{hint}; valid: {', '.join(_REGISTRY)} "
                         "(or an import path package.module:factory)")
    return _REGISTRY[name]


def make_trust_region(name: str, **params: Any):
    """Build a strategy by registered name or by import path 'package.module:factory'."""
    factory = get_factory(name)
    accepted = factory_params(factory)
    takes_kwargs = any(
        p.kind is p.VAR_KEYWORD for p in _safe_parameters(factory)
    )
    unknown = [k for k in params if k not in accepted]
    if unknown and not takes_kwargs:
        raise ValueError(
            f"trust region {name!r} does not take {', '.join(map(repr, unknown))}; "
            f"it takes: {', '.join(accepted) or 'no parameters'}"
        )
    return factory(**params)


def _safe_parameters(factory: TrustRegionFactory):
    try:
        return list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return []


for _cls in (
    S.MaskedPolicyGradient,
    S.CISPO,
    S.RatioClip,
    S.RelaxedRatioClip,
    S.NegativeTVMask,
    S.DPPOBinaryTV,
    S.DPPOBinaryKL,
    S.DPPOTopKTV,
    S.DPPOTopKKL,
    *FRAMEWORK_STRATEGIES,
):
    register(_cls.name, _cls)

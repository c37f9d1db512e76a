"""A user-written trust region, loaded by import path in tests ("helpers.user_trust_regions:make")."""

from oat_dppo.trust_region import MaskedPolicyGradient


class SymmetricTV(MaskedPolicyGradient):
    """Blocks any token whose probability moved by more than delta, whatever the advantage sign."""

    name = "symmetric_tv"

    def __init__(self, *, delta: float = 0.1, C: float = float("inf")):
        super().__init__(C=C)
        self.delta = delta

    def blocked(self, p, divergence):
        return (p.logp.exp() - p.behavior_logp.exp()).abs() > self.delta


def make(delta: float = 0.1):
    return SymmetricTV(delta=delta)

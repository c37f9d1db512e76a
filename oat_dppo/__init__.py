"""oat_dppo: LLM agent RL with a pluggable trust region (DPPO and its baselines).

The trust region (`oat_dppo.trust_region`) is pure torch and the public contract; everything else
(environments, agent loop, local and Oat backends) calls it.
"""

__version__ = "0.1.0"

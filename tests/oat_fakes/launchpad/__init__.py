"""Import-boundary fake of ``launchpad`` (dm-launchpad has no Python 3.11 wheel and needs TensorFlow).

Only what Oat 0.2.4 names at import time or through ``lp.<name>`` exists. Nothing runs: building a
node or a program, ``launch`` and ``stop`` raise, so a test can never pretend a distributed run happened.
"""

__oat_dppo_fake__ = True

_MSG = "fake launchpad (tests/oat_fakes): programs cannot be built or launched on this machine"


class Program:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(_MSG)


class CourierNode:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(_MSG)


class PyClassNode:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(_MSG)


def launch(*args, **kwargs):
    raise NotImplementedError(_MSG)


def stop(*args, **kwargs):
    raise NotImplementedError(_MSG)

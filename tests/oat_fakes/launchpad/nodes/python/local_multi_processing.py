"""``PythonProcess`` (``oat.interface`` imports this module at module level)."""

from launchpad import _MSG


class PythonProcess:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(_MSG)

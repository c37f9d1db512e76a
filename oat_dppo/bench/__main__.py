"""`python -m oat_dppo.bench <benchmark> [options]`: measured ratios, printed as Markdown tables."""

from __future__ import annotations

import sys

BENCHMARKS = {
    "trust-region": "oat_dppo.bench.trust_region",
    "engine": "oat_dppo.bench.engine",
    "local": "oat_dppo.bench.local",
    "oat": "oat_dppo.bench.oat",
    "head": "oat_dppo.bench.head",
    "gpu": "oat_dppo.bench.gpu",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHMARKS:
        print("usage: python -m oat_dppo.bench {" + ",".join(BENCHMARKS) + "} [--help | options]")
        if argv and argv[0] not in ("-h", "--help"):
            print(f"unknown benchmark {argv[0]!r}", file=sys.stderr)
            return 2
        return 0
    import importlib

    return importlib.import_module(BENCHMARKS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

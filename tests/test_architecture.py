"""The layout's promises (docs/architecture.md), checked on the source: the backends never import
each other, the trust region is pure torch, the environment definitions import nothing of the
package, and the Oat adapter reads no source code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "oat_dppo"


def imported_modules(folder: Path) -> dict[str, set[str]]:
    """file -> every module it imports (absolute names; relative ones resolved against the file)."""
    out = {}
    for path in folder.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: the package of this file, `level` steps up
                    base = path.relative_to(REPO).with_suffix("").parts[: -node.level]
                    names.add(".".join(base + ((node.module,) if node.module else ())))
                else:
                    names.add(node.module)
        out[str(path.relative_to(REPO))] = names
    return out


@pytest.mark.parametrize("folder, forbidden", [
    (PACKAGE / "backends" / "local", "oat_dppo.backends.oat"),
    (PACKAGE / "backends" / "oat", "oat_dppo.backends.local"),
])
def test_the_backends_never_import_each_other(folder, forbidden):
    for file, names in imported_modules(folder).items():
        assert not [n for n in names if n == forbidden or n.startswith(forbidden + ".")], file


def test_the_trust_region_is_pure_torch():
    for file, names in imported_modules(PACKAGE / "trust_region").items():
        roots = {n.split(".")[0] for n in names}
        assert not roots & {"oat", "vllm", "gem", "transformers", "oat_dppo_envs"}, file
        assert not [n for n in names if n.startswith("oat_dppo.") and not n.startswith("oat_dppo.trust_region")], file


def test_the_environment_definitions_import_nothing_of_the_package():
    for file, names in imported_modules(REPO / "envs").items():
        assert not [n for n in names if n.split(".")[0] in ("oat_dppo", "gem")], file


def test_the_oat_adapter_reads_no_source_code():
    for path in (PACKAGE / "backends" / "oat").rglob("*.py"):
        text = path.read_text()
        assert "ast.parse" not in text and not re.search(r"(?<![\w.])eval\(", text), path


def test_the_study_runner_is_python_3_10_code():
    """The Oat profile runs Python 3.10: the study runner must parse as 3.10 and read TOML with tomli
    where tomllib (3.11+) is missing. (Checked importing on a real 3.10 too: see the closing note.)"""
    for path in (PACKAGE / "study").rglob("*.py"):
        ast.parse(path.read_text(), feature_version=(3, 10))
    spec = (PACKAGE / "study" / "spec.py").read_text()
    assert "import tomli as tomllib" in spec and "except ModuleNotFoundError" in spec


def test_the_runtime_package_imports_no_benchmark():
    """benchmarks/ (benchmarks, scripted bounds, the lab, the determinism study) sits beside the package and
    measures through the hooks it offers: nothing a run imports may depend on it."""
    for file, names in imported_modules(PACKAGE).items():
        assert not [n for n in names if n and n.split(".")[0] == "benchmarks"], file


def test_the_oat_adapter_stays_small():
    """The Oat backend is an adapter (issue 48's bar: at most 1,600 lines); the logic it needs lives in the
    shared packages (agent, learner, trust_region), where both backends run it."""
    lines = sum(len(p.read_text().splitlines()) for p in (PACKAGE / "backends" / "oat").rglob("*.py"))
    assert lines <= 1600, f"oat_dppo/backends/oat/ is {lines} lines: move shared logic out, or say why it grew"


def test_no_module_of_the_package_is_over_800_lines():
    """A room a reader can hold (issue 69): a module that outgrows it is split by what it does."""
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 800}
    assert not long, long


#: Settings a package documents as assignments (torch's reproducibility notes): not patches.
DOCUMENTED_SETTINGS = {"torch.backends.cudnn.deterministic", "torch.backends.cudnn.benchmark"}


def foreign_attribute_assignments(path: Path) -> list[str]:
    """`line: target` for each assignment to (or `setattr` on) an attribute reached from a name that another
    package's import bound in `path` (`import torch`, `import oat.learners.base as base`, `from gem... import X`)."""
    tree = ast.parse(path.read_text())
    foreign: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            foreign.update(a.asname or a.name.split(".")[0] for a in node.names if not a.name.startswith("oat_dppo"))
        elif isinstance(node, ast.ImportFrom) and not node.level and not node.module.startswith(("oat_dppo", "__future__")):
            foreign.update(a.asname or a.name for a in node.names)

    def root(expr) -> str | None:
        while isinstance(expr, ast.Attribute):
            expr = expr.value
        return expr.id if isinstance(expr, ast.Name) else None

    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                targets.extend(t.elts if isinstance(t, ast.Tuple) else [t])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            targets = node.args[:1]
        on_object = isinstance(node, ast.Call)  # setattr's first argument is the object, an assignment's the attribute
        for t in targets:
            if (on_object or isinstance(t, ast.Attribute)) and root(t) in foreign and ast.unparse(t) not in DOCUMENTED_SETTINGS:
                found.append(f"{node.lineno}: {ast.unparse(t)}")
    return found


def test_only_the_patches_module_changes_another_package_at_run_time():
    """Issue 69: every run-time change to Oat, launchpad, vLLM or torch lives in oat_dppo/patches.py, with its
    reason and upstream version; elsewhere in the runtime package nothing assigns to another package's attributes."""
    found = {str(p.relative_to(REPO)): hits for p in PACKAGE.rglob("*.py") if p.name != "patches.py"
             if (hits := foreign_attribute_assignments(p))}
    assert found == {}


def test_the_patch_finder_sees_a_patch(tmp_path):
    """The scan above can fail: module attributes, a `from` import's class, setattr and a tuple target."""
    source = tmp_path / "m.py"
    source.write_text("import torch\nimport oat.learners.base as base\nfrom gem.envs import MathEnv\n"
                      "from oat_dppo.config import TrainConfig\n"
                      "torch.set_num_threads = print\nreal, base.lp = 1, 2\nsetattr(MathEnv, 'x', 1)\n"
                      "TrainConfig.x = 1\ntorch.backends.cudnn.benchmark = False\nlocal = torch\n")
    assert foreign_attribute_assignments(source) == ["5: torch.set_num_threads", "6: base.lp", "7: MathEnv"]

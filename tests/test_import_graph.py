"""The package reads top-down: no import cycle between modules or between packages.

Every ``import`` of a heatmap3d module counts, those inside functions included (a lazy
import that dodges a cycle is a cycle still); only imports under ``if TYPE_CHECKING:``
are left out (they never run). Pure ``ast``: nothing is imported to find the edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "heatmap3d"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported(path: Path, modules: set[str], here: str | None = None) -> set[str]:
    """The heatmap3d modules that ``path`` (the module ``here``) imports, anywhere but
    under TYPE_CHECKING."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = here or module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # a submodule by name
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    out = set()
    for name in found:
        while name and name not in modules:  # heatmap3d.io.landmarks.Landmarks -> module
            name = name.rpartition(".")[0]
        if name and name != here:
            out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    edges = {module_name(p): imported(p, modules) for p in paths}
    # A package's __init__ that a module passes through is not an edge of that module.
    return {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in edges.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def package_of(module: str) -> str:
    """``heatmap3d.io.landmarks`` -> ``heatmap3d.io``; a top-level module is its own."""
    parts = module.split(".")
    return ".".join(parts[:2])


def package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, targets in edges.items():
        if m == "heatmap3d":
            continue  # the top __init__ re-exports the API: it sits above everything
        src = package_of(m)
        out.setdefault(src, set()).update(
            package_of(t) for t in targets if package_of(t) != src and t != "heatmap3d"
        )
    return out


def _explain(found: list[list[str]], edges: dict[str, set[str]]) -> str:
    lines = []
    for comp in found:
        members = set(comp)
        ties = [f"{a} -> {b}" for a in comp for b in sorted(edges.get(a, ())) if b in members]
        lines.append(" <-> ".join(comp) + "\n    " + "\n    ".join(ties))
    return "\n".join(lines)


def test_no_module_imports_back_round_a_cycle():
    edges = graph()
    found = cycles(edges)
    assert not found, "import cycles between modules:\n" + _explain(found, edges)


def test_no_package_imports_back_round_a_cycle():
    edges = package_graph(graph())
    found = cycles(edges)
    assert not found, "import cycles between packages:\n" + _explain(found, edges)


def test_the_checker_sees_lazy_and_relative_imports_and_skips_type_checking(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from heatmap3d.io import landmarks\n"
        "def f():\n    from heatmap3d.geometry import Volume\n    return Volume\n"
        "from . import atomic\n"
    )
    modules = {"heatmap3d.io.landmarks", "heatmap3d.geometry", "heatmap3d.io.atomic"}
    seen = imported(probe, modules, here="heatmap3d.io.probe")
    assert seen == {"heatmap3d.geometry", "heatmap3d.io.atomic"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def python_says(script: str) -> list[str]:
    """The lines a fresh interpreter prints running ``script`` (which must succeed)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def test_the_command_lines_parser_and_help_need_no_torch():
    """``heatmap3d COMMAND --help`` answers at once: building every subcommand's arguments
    imports neither torch nor the models (it took 3 s when it did)."""
    script = (
        "import sys\n"
        "from heatmap3d.commands.parser import build_parser\n"
        "build_parser()\n"
        "print(sorted(m for m in ('torch', 'scipy', 'heatmap3d.api.runs') if m in sys.modules))\n"
    )
    assert python_says(script) == ["[]"]


def test_predicting_imports_no_plotting_until_a_picture_or_report_is_asked_for():
    """matplotlib is 0.4 s of every ``heatmap3d predict``'s start: only ``--snapshots``
    and ``--report`` need it."""
    script = "import sys, heatmap3d.api.predict_files\nprint('matplotlib' in sys.modules)\n"
    assert python_says(script) == ["False"]


def test_predicting_imports_no_scipy_spatial():
    """scipy.spatial (0.3 s of a start) fits a pose in training; predicting needs none of
    it."""
    script = "import sys, heatmap3d.api.predict_files\nprint('scipy.spatial' in sys.modules)\n"
    assert python_says(script) == ["False"]


def test_a_forward_pass_does_not_import_torchs_onnx_exporter():
    """The convolutions ask whether an ONNX export is running; asking ``torch.onnx``
    would import it (85 ms of every prediction's start) when nothing has."""
    script = (
        "import sys, torch\n"
        "from heatmap3d.config import ModelConfig\n"
        "from heatmap3d.model import build_model\n"
        "with torch.no_grad():\n"
        "    build_model(ModelConfig(channels=2, depth=2), 3)(torch.zeros(1, 1, 8, 8, 8))\n"
        "print('torch.onnx' in sys.modules)\n"
    )
    assert python_says(script) == ["False"]

"""demo/ uses b2b through its public API (`import b2b` / `from b2b import ...`) and leaves mlx
to b2b: no `from b2b.summarize import ...`, no module-level `import mlx`."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[1] / "demo"


def _module_imports(path: Path) -> list[str]:
    """Modules imported by the module-level statements of a file (not inside functions)."""
    names = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("path", sorted(DEMO.glob("*.py")), ids=lambda p: p.name)
def test_demo_imports_b2b_public_api_only_and_no_mlx(path):
    imports = _module_imports(path)
    assert not [m for m in imports if m.startswith("b2b.")], f"{path.name} reaches into b2b's modules"
    assert not [m for m in imports if m == "mlx" or m.startswith("mlx.")], f"{path.name} imports mlx at module level"

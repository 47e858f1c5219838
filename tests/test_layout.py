"""The package layout's contracts: layers, no cycles, no hidden imports (docs/architecture.md).

The contracts themselves live in pyproject.toml (``[tool.importlinter]``) and `make lint` runs
them (``lint-imports``). These tests prove the checks can fail: each copies the packages into a
temporary directory, plants one violation (a deliberate ``import loadtest`` inside ``router/``,
a new cycle), runs the real ``lint-imports`` with the repository's own contracts, and expects the
contract that guards it to break. What a static import graph cannot see - a module named in a
string for ``importlib`` or ``__import__`` - is checked here on the sources.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
PACKAGES: list[str] = CONFIG["root_packages"]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
# layer -> the packages above it, which it must not name even in a string
ABOVE = {"router": ("loadtest",), "templates_audit": ("loadtest", "router"),
         "prefix_asgi": ("loadtest", "router", "templates_audit")}


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", str(root / "pyproject.toml")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the packages and pyproject.toml that a test may break."""
    root = tmp_path_factory.mktemp("layout")
    shutil.copy(ROOT / "pyproject.toml", root)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, root / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return root


def plant(path: Path, line: str) -> str:
    """Append ``line`` to a module; return the original text (to restore it)."""
    text = path.read_text()
    path.write_text(text + "\n" + line + "\n")
    return text


def broken_contracts(output: str) -> list[str]:
    return re.findall(r"^(.+) BROKEN$", output, flags=re.MULTILINE)


def test_contracts_pass_on_the_repository(tree: Path) -> None:
    result = lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("module", "line", "broken"), [
    # the load-test kit may use the router, never the other way round
    ("router/keys.py", "import loadtest  # noqa", {
        "layers: loadtest -> router -> templates_audit | prefix_asgi",
        "router never imports the load-test kit"}),
    # a lazy import inside a function counts as much as a top-level one
    ("router/ring/base.py", "def _f():\n    import loadtest.fleet  # noqa", {
        "layers: loadtest -> router -> templates_audit | prefix_asgi",
        "router never imports the load-test kit"}),
    # the auditor is a library of its own
    ("templates_audit/blocks.py", "import router.settings  # noqa", {
        "layers: loadtest -> router -> templates_audit | prefix_asgi",
        "templates_audit imports neither router nor loadtest"}),
    # the ASGI plumbing sits below the replica and the router
    ("prefix_asgi/body.py", "import templates_audit  # noqa", {
        "layers: loadtest -> router -> templates_audit | prefix_asgi",
        "prefix_asgi imports no other package of the project"}),
    # a file-level cycle: the ring's shared base importing one of the rings that use it
    ("router/ring/base.py", "import router.ring.nginx  # noqa", {
        "no import cycles among the modules or subpackages of a package"}),
    # a cycle even when one side imports only for type checking
    ("loadtest/replica/admin.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .server import Replica  # noqa",
     {"no import cycles among the modules or subpackages of a package"}),
    # a package-level cycle: router.policy uses router.ring, so ring must not use policy
    ("router/ring/hashring.py", "import router.policy  # noqa", {
        "no import cycles among the modules or subpackages of a package"}),
])  # fmt: skip
def test_a_planted_violation_breaks_its_contract(tree: Path, module: str, line: str,
                                                 broken: set[str]) -> None:
    original = plant(tree / module, line)
    try:
        result = lint_imports(tree)
    finally:
        (tree / module).write_text(original)
    assert result.returncode != 0
    assert set(broken_contracts(result.stdout)) == broken, result.stdout


def _strings_naming(tree: ast.AST, packages: tuple[str, ...]) -> list[tuple[int, str]]:
    """String constants that are a module path (``pkg.mod`` or ``pkg.mod:attr``) of
    ``packages``, docstrings aside: what ``importlib.import_module``, ``__import__`` or
    uvicorn's ``"module:app"`` would load at run time."""
    pattern = re.compile(rf"^({'|'.join(packages)})(\.\w+)*(:\w+)?$")
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings and pattern.match(node.value))


def hidden_imports(package: str) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for lineno, value in _strings_naming(tree, ABOVE[package]):
            found.append(f"{path.relative_to(ROOT)}:{lineno}: {value!r}")
    return found


@pytest.mark.parametrize("package", sorted(ABOVE))
def test_no_module_of_a_higher_layer_is_named_for_a_dynamic_import(package: str) -> None:
    assert hidden_imports(package) == []


def test_the_dynamic_import_check_sees_an_importlib_path() -> None:
    # the shape the quick-start demo had in router/cli.py before it moved to loadtest/demo.py
    source = '"""Mentions loadtest.fleet in a docstring: fine."""\n' \
             'import importlib\nfleet = importlib.import_module("loadtest.fleet")\n' \
             'app = "loadtest.passthrough:PassThrough"\n'
    assert _strings_naming(ast.parse(source), ("loadtest",)) == [
        (3, "loadtest.fleet"), (4, "loadtest.passthrough:PassThrough")]


def test_every_package_is_installed_checked_and_shipped() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(include) == sorted(f"{p}*" for p in PACKAGES)
    assert sorted(pyproject["tool"]["mypy"]["packages"]) == sorted(PACKAGES)
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in PACKAGES:
        assert f"COPY {package} ./{package}" in dockerfile

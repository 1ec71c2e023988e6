"""The conda environments of envs/, checked statically rule by rule (conda channels cannot be reached here):
the env a rule names lists every third-party package its `python -m pmlm <command>` imports, each pinned
exactly, and each pin inside pyproject.toml's range for that package.

What a command imports is read from the source with ast: `python -m pmlm` imports pmlm.cli and, at module
level, every command module (for their arguments); the command's own module (pmlm/commands/<name>.py) is then
followed through all its imports, those inside functions included (its run imports the engine when it runs,
and engines import optional dependencies where they need them). The command modules themselves must import
nothing heavy at module level, not even transitively: that keeps `pmlm fetch` free of torch.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.version import Version
from workflow_rules import REPO, read_rules

from pmlm.cli import SUBCOMMANDS, command_module

STDLIB = set(sys.stdlib_module_names)
# what a command module (pmlm/commands) may import besides the standard library: numpy, which the light
# contracts (pmlm.alphabet) use; torch, pyarrow, pandas, safetensors and the rest are the engines'
LIGHT = {"numpy"}
COMMAND_MODULES = sorted(
    f"pmlm.commands.{p.stem}" for p in (REPO / "pmlm" / "commands").glob("*.py") if p.stem != "__init__"
)
# imported name (or a dotted prefix of one) -> conda package that provides it
CONDA_PACKAGE = {
    "Bio": "biopython",
    "isal": "python-isal",
    "lmdb": "python-lmdb",
    "matplotlib": "matplotlib-base",
    "numpy": "numpy",
    "pandas": "pandas",
    "pyarrow": "pyarrow",
    "safetensors": "safetensors",
    "torch": "pytorch",
    "torch.utils.tensorboard": "tensorboard",  # torch imports the tensorboard package behind this module
    "yaml": "pyyaml",
    "jsonschema": "jsonschema",
    "transformers": "transformers",
    "peft": "peft",
}
# conda package -> the PyPI distribution pyproject.toml names (where they differ)
PYPI_NAME = {"pytorch": "torch", "python-isal": "isal", "python-lmdb": "lmdb", "matplotlib-base": "matplotlib"}
NOT_PYTHON = {"python", "mmseqs2"}


def _module_file(name: str) -> Path | None:
    path = REPO / Path(*name.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@cache
def _imports(module: str, module_level: bool) -> frozenset[str]:
    """Dotted names a pmlm module imports: at module level (also inside top-level try / if), or anywhere."""
    tree = ast.parse(_module_file(module).read_text())
    if module_level:
        nodes = [
            n
            for top in tree.body
            if not isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            for n in ast.walk(top)
        ]
    else:
        nodes = list(ast.walk(tree))
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{module}: relative import"
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(names)


def third_party_imports(roots: list[str], module_level: bool) -> set[str]:
    """Third-party dotted names imported by ``roots`` and, transitively, by the pmlm modules they import."""
    seen, todo, found = set(), list(roots), set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        # the package root's functions are the Python API (pmlm.load), which no command calls: only what
        # `import pmlm` itself runs counts
        for name in _imports(module, module_level or module == "pmlm"):
            parts = name.split(".")
            if parts[0] == "pmlm":  # pmlm.a.b is a module, or a name inside module pmlm.a
                prefixes = [".".join(parts[:k]) for k in range(len(parts), 0, -1)]
                todo += [p for p in prefixes if _module_file(p)]  # the module and the packages it sits in
            elif parts[0] not in STDLIB:
                found.add(name)
    return found


def packages_needed(command: str) -> set[str]:
    cli = ["pmlm.__main__", "pmlm.cli", *(command_module(name) for name in SUBCOMMANDS)]
    names = third_party_imports(cli, module_level=True) | third_party_imports([command_module(command)], False)
    needed = set()
    for name in names:
        prefixes = [".".join(name.split(".")[:k]) for k in range(name.count(".") + 1, 0, -1)]
        provided = [CONDA_PACKAGE[p] for p in prefixes if p in CONDA_PACKAGE]
        assert provided, f"`pmlm {command}` imports {name}: add its conda package to CONDA_PACKAGE"
        needed.update(provided)
    return needed


def env_pins(path: Path) -> dict[str, str | None]:
    """conda package -> exact version (None when the entry is not an exact `name==version` pin)."""
    pins = {}
    for entry in map(str, yaml.safe_load(path.read_text())["dependencies"]):
        if "==" in entry:
            name, version = entry.split("==", 1)
            pins[name.strip()] = version.strip() or None
        else:
            pins[re.split(r"[=<>!~\s]", entry, maxsplit=1)[0]] = None
    return pins


def pyproject_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    return {Requirement(r).name.lower(): Requirement(r) for r in requirements}


def env_problems(env: Path, commands: list[str]) -> list[str]:
    """What is wrong with ``env`` for a rule running ``commands``: missing packages, loose pins, pins
    outside pyproject.toml's range. Empty when the env is right."""
    pins, ranges, problems = env_pins(env), pyproject_requirements(), []
    needed = set().union(*(packages_needed(c) for c in commands)) | ({"python"} if commands else set())
    problems += [
        f"{env.name} lacks {pkg} (imported by pmlm {' / '.join(commands)})" for pkg in sorted(needed - pins.keys())
    ]
    for pkg, version in sorted(pins.items()):
        if version is None:
            problems.append(f"{env.name}: {pkg} is not pinned exactly (name==version)")
        elif pkg not in NOT_PYTHON:
            requirement = ranges.get(PYPI_NAME.get(pkg, pkg))
            if requirement is None:
                problems.append(f"{env.name}: {pkg} is not a dependency in pyproject.toml")
            elif Version(version) not in requirement.specifier:
                problems.append(f"{env.name}: {pkg}=={version} is outside pyproject.toml's {requirement}")
    return problems


def _job_rules():
    return sorted((name, rule) for name, rule in read_rules().items() if rule.conda_env is not None)


@pytest.mark.parametrize("name, rule", _job_rules(), ids=[name for name, _ in _job_rules()])
def test_rule_env_holds_what_its_command_imports(name, rule):
    assert rule.conda_env.is_file(), f"rule {name}: {rule.conda_env} does not exist"
    assert env_problems(rule.conda_env, rule.pmlm_commands) == []


def test_python_pin_satisfies_requires_python():
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    for env in sorted((REPO / "envs").glob("*.yaml")):
        assert Version(env_pins(env)["python"]) in Requirement(f"python{requires}").specifier, env.name


def test_what_each_command_needs():
    """The import walk itself: known needs of a few commands (so the check above cannot pass vacuously)."""
    assert {"numpy", "biopython", "python-isal"} <= packages_needed("split")  # pmlm.cli's own imports
    assert {"pytorch", "safetensors", "pyarrow", "tensorboard", "pyyaml"} <= packages_needed("pretrain")
    assert "pandas" in packages_needed("tables") and "matplotlib-base" in packages_needed("kl")
    assert {"pytorch", "pandas", "matplotlib-base", "pyyaml"} <= packages_needed("report")  # every item's engine
    assert "pytorch" not in packages_needed("split") and "pytorch" not in packages_needed("fetch")
    for command in ("embed", "contacts", "score"):  # the model-use engines run the encoder
        assert {"pytorch", "safetensors"} <= packages_needed(command), command


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_command_modules_import_nothing_heavy(module):
    """A command module is light: its module-level imports, followed through pmlm, reach no third-party package
    beyond LIGHT; it defines the parser's arguments and the command's run."""
    assert third_party_imports([module], module_level=True) - LIGHT == set()
    defined = {n.name for n in ast.parse(_module_file(module).read_text()).body if isinstance(n, ast.FunctionDef)}
    assert {"add_arguments", "run"} <= defined, module


def test_every_command_module_is_a_subcommand():
    """pmlm/commands holds exactly the subcommands of pmlm.cli, one module each, named after its command."""
    assert set(COMMAND_MODULES) == {command_module(name) for name in SUBCOMMANDS}


def test_the_parser_and_fetch_load_no_engine_dependencies(tmp_path):
    """At run time: building every parser, and a whole `pmlm fetch` of a local file, import no torch,
    pyarrow, pandas or safetensors."""
    source = tmp_path / "source.txt"
    source.write_text("ACDE\n")
    code = (
        "import sys\n"
        "from pmlm.cli import build_parser, main\n"
        "build_parser()\n"
        f"code = main(['fetch', {source.as_uri()!r}, '-o', {str(tmp_path / 'dest.txt')!r}])\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'pyarrow', 'pandas', 'safetensors'})\n"
        "print(code, ' '.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0].strip() == "0"
    assert (tmp_path / "dest.txt").read_text() == "ACDE\n"


def test_an_incomplete_or_loose_env_is_reported(tmp_path):
    """The checker fails an env like the old envs/mmseqs2.yaml (MMseqs2 only) and one with ranges, not pins."""
    old = tmp_path / "mmseqs2.yaml"
    old.write_text("channels: [conda-forge, bioconda]\ndependencies:\n  - mmseqs2=14.7e284\n")
    problems = env_problems(old, ["split"])
    assert {
        "mmseqs2.yaml lacks numpy (imported by pmlm split)",
        "mmseqs2.yaml lacks biopython (imported by pmlm split)",
        "mmseqs2.yaml: mmseqs2 is not pinned exactly (name==version)",
    } <= set(problems), problems
    loose = tmp_path / "pmlm.yaml"
    loose.write_text("dependencies:\n  - python==3.11.7\n  - numpy>=1.26\n  - pandas==1.5.3\n")
    problems = env_problems(loose, ["tables"])
    assert "pmlm.yaml: numpy is not pinned exactly (name==version)" in problems
    assert "pmlm.yaml: pandas==1.5.3 is outside pyproject.toml's pandas>=2.1" in problems
    assert "pmlm.yaml lacks pytorch (imported by pmlm tables)" in problems


def test_function_local_imports_say_why():
    """An import inside a function (the command layer's engines, optional or slow dependencies) has its reason
    written beside it: a comment between the function's first line and the import, or in its docstring."""
    unexplained = []
    for path in sorted((REPO / "pmlm").rglob("*.py")):
        lines = path.read_text().splitlines()
        for function in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            docstring = ast.get_docstring(function) or ""
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    before = lines[function.lineno - 1 : node.lineno]
                    if not any("#" in line for line in before) and "import" not in docstring.lower():
                        unexplained.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert unexplained == []

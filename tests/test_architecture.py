"""The statements of ARCHITECTURE.md that a test can check, read from the source with ast (nothing is imported but
pmlm.vocabulary): every module sits on one floor of the floors table and imports nothing from a floor above it; the
import graph has no cycle; module base names are unique outside pmlm/commands/; objective names and features are
compared through pmlm.vocabulary's constants, never as string literals; no module is over 400 lines and no
function over 120 unless a docstring says why it must be one piece; every path ARCHITECTURE.md names exists."""

from __future__ import annotations

import ast
import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from pmlm import vocabulary

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "pmlm"
ARCHITECTURE = REPO / "ARCHITECTURE.md"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 120
ONE_PIECE = "one piece"  # the words a docstring uses to say why a module or function is longer than the bars


def _dotted(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_dotted(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@cache
def _tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))


def _relative(name: str) -> str:
    """pmlm/train/loop.py -> "train/loop.py"; a package's __init__ as its folder's file."""
    return MODULES[name].relative_to(PACKAGE).as_posix()


@cache
def floors() -> list[tuple[int, str, list[str]]]:
    """(floor, name, entries) of ARCHITECTURE.md's floors table: the rows ``| N name | `path`, ... | ... |``
    under the heading that names the floors; entries are paths under pmlm/ (a folder ends with /)."""
    text = ARCHITECTURE.read_text()
    section = re.search(r"^## Floors.*?$(.*?)^## ", text, flags=re.M | re.S)
    assert section, "ARCHITECTURE.md has no '## Floors' section"
    rows = []
    for line in section.group(1).splitlines():
        m = re.match(r"\|\s*(\d+)\s+([^|]+?)\s*\|([^|]*)\|", line)
        if m:
            entries = [e.removeprefix("pmlm/") for e in re.findall(r"`([^`]+)`", m.group(3))]
            rows.append((int(m.group(1)), m.group(2), entries))
    assert rows, "ARCHITECTURE.md's floors table has no rows"
    return rows


def floor_of(name: str) -> int:
    """The floor of the table's most specific entry holding the module (a file, else its nearest folder)."""
    path = _relative(name)
    best = None
    for floor, _, entries in floors():
        for entry in entries:
            holds = path == entry or (entry.endswith("/") and path.startswith(entry))
            if holds and (best is None or len(entry) > len(best[1])):
                best = (floor, entry)
    if best is None:
        raise LookupError(f"pmlm/{path} is on no floor of ARCHITECTURE.md's table")
    return best[0]


def _target(node: ast.ImportFrom | ast.Import, alias: ast.alias) -> str | None:
    """The pmlm module an import names: ``from pmlm.x import y`` is pmlm.x.y when that is a module, else pmlm.x."""
    if isinstance(node, ast.Import):
        name = alias.name
    else:
        assert node.level == 0, "relative import in pmlm/"  # the package imports itself by absolute names
        name = f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module
    return name if name in MODULES else None


@cache
def imports(name: str) -> frozenset[tuple[str, int]]:
    """(pmlm module, line) of every import of the module, those inside functions included."""
    found = set()
    for node in ast.walk(_tree(name)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                target = _target(node, alias)
                if target is not None and target != name:
                    found.add((target, node.lineno))
    return frozenset(found)


def test_every_module_is_on_one_floor():
    unplaced = []
    for name in MODULES:
        try:
            floor_of(name)
        except LookupError as exc:
            unplaced.append(str(exc))
    assert not unplaced, "\n".join(unplaced)


def test_floors_table_names_existing_paths():
    missing = [e for _, _, entries in floors() for e in entries if not (PACKAGE / e).exists()]
    assert not missing, f"ARCHITECTURE.md's floors table names what pmlm/ does not hold: {missing}"


def test_no_module_imports_from_a_floor_above_its_own():
    upward = [
        f"pmlm/{_relative(name)}:{line} (floor {floor_of(name)}) imports {target} (floor {floor_of(target)})"
        for name in MODULES
        for target, line in sorted(imports(name))
        if floor_of(target) > floor_of(name)
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), imports inside functions included."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in sorted(imports(v)):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in MODULES:
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_cycle():
    assert _cycles() == []


def test_module_base_names_are_unique_outside_commands():
    names = Counter(
        p.name
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" and "commands" not in p.relative_to(PACKAGE).parts
    )
    repeated = {
        n: sorted(str(p.relative_to(REPO)) for p in PACKAGE.rglob(n) if "commands" not in p.parts)
        for n, k in names.items()
        if k > 1
    }
    assert not repeated, f"module base names repeated outside pmlm/commands/: {repeated}"


def vocabulary_names() -> set[str]:
    """The objective names and the features, as pmlm.vocabulary spells them."""
    features = {v for k, v in vars(vocabulary).items() if k.startswith("FEATURES") and isinstance(v, str)}
    features |= set(getattr(vocabulary, "FEATURES", ()))
    return set(vocabulary.OBJECTIVES) | features


def _string_constants(node: ast.AST):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for element in node.elts:
            yield from _string_constants(element)


def literal_comparisons(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, literal) of every comparison (==, !=, in, not in, ...) with a string literal in ``names``, also one
    inside a tuple, list or set literal."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                found += [(node.lineno, s) for s in _string_constants(operand) if s in names]
    return found


def test_the_literal_check_finds_what_it_should():
    names = vocabulary_names()
    caught = ast.parse(
        'a == "mlm"\nif "tmlm" != b: pass\nc in ("pmlm", "x")\n"M+" in d\ne == vocabulary.PMLM\nf = {"mlm": 1}\n'
    )
    assert literal_comparisons(caught, names) == [(1, "mlm"), (2, "tmlm"), (3, "pmlm"), (4, "M+")]


def test_objectives_and_features_are_compared_as_constants():
    names = vocabulary_names()
    found = [
        f"pmlm/{_relative(name)}:{line}: {literal!r}"
        for name in MODULES
        if name != "pmlm.vocabulary"
        for line, literal in literal_comparisons(_tree(name), names)
    ]
    assert not found, "compare through pmlm.vocabulary's constants:\n" + "\n".join(found)


def _says_one_piece(node: ast.AST) -> bool:
    return ONE_PIECE in (ast.get_docstring(node) or "").lower()


def test_modules_and_functions_within_the_size_bars():
    over = []
    for name, path in MODULES.items():
        tree = _tree(name)
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES and not _says_one_piece(tree):
            over.append(f"pmlm/{_relative(name)}: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES and not (_says_one_piece(node) or _says_one_piece(tree)):
                    over.append(f"pmlm/{_relative(name)}:{node.lineno} {node.name}: {length} lines")
    assert not over, f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function, no docstring " + (
        f"saying why it is {ONE_PIECE}:\n" + "\n".join(over)
    )


@pytest.mark.parametrize("path", sorted(set(re.findall(r"`(pmlm/[\w/.]+)`", ARCHITECTURE.read_text()))))
def test_paths_architecture_names_exist(path):
    assert (REPO / path).exists(), f"ARCHITECTURE.md names {path}, which does not exist"

"""The statements of ARCHITECTURE.md that a test can check, read from the source with ast (nothing is imported but
pmlm.vocabulary): every module sits on one floor of the floors table and imports nothing from a floor above it; the
import graph has no cycle; module base names are unique outside pmlm/commands/; objective names, features and table
names are compared through pmlm.vocabulary's constants, never as string literals, in pmlm/ and in the workflow (the
Snakefile, workflow/rules/*.smk and workflow/lib, read as tokens; task names too), and the workflow config schema's
enums are the vocabulary's; no module is over 400 lines and no function over 120 unless a docstring says why it must
be one piece; every path ARCHITECTURE.md names exists. And of the tests: no test module imports another."""

from __future__ import annotations

import ast
import io
import keyword
import re
import tokenize
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
import yaml

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


def _features() -> tuple[str, ...]:
    features = {v for k, v in vars(vocabulary).items() if k.startswith("FEATURES") and isinstance(v, str)}
    return tuple(sorted(features | set(getattr(vocabulary, "FEATURES", ()))))


# The vocabularies compared through pmlm.vocabulary's constants, never as string literals: a tuple of names each.
# In pmlm/ the comparisons are checked; in the workflow every string literal.
CHECKED_VOCABULARIES = [
    vocabulary.OBJECTIVES,
    _features(),
    # the tables (also checked wherever pmlm/ spells them, test_table_names_are_spelled_once)
    vocabulary.TABLE_KINDS,
    (*vocabulary.RESULT_TABLES, vocabulary.TABLE_PRETRAIN_SCORES, vocabulary.TABLE_PRECISION_BY_SEPARATION),
]
# the downstream tasks: compared through the constants too (the task types hold their own names)
CHECKED_VOCABULARIES.append(vocabulary.TASKS)
WORKFLOW_VOCABULARIES = CHECKED_VOCABULARIES
WORKFLOW = REPO / "workflow"
WORKFLOW_SOURCES = [REPO / "Snakefile", *sorted(WORKFLOW.glob("rules/*.smk")), *sorted(WORKFLOW.glob("lib/*.py"))]
SCHEMA = WORKFLOW / "schemas" / "config.schema.yaml"


def vocabulary_names(vocabularies=CHECKED_VOCABULARIES) -> set[str]:
    """The names of ``vocabularies`` (tuples of pmlm.vocabulary), as it spells them."""
    return {name for names in vocabularies for name in names}


def _string_constants(node: ast.AST):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for element in node.elts:
            yield from _string_constants(element)


def literal_comparisons(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, literal) of every comparison (==, !=, in, not in, ...) with a string literal in ``names``, also one
    inside a tuple, list or set literal, and of every pandas ``.isin(...)`` of such literals."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = (node.left, *node.comparators)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "isin":
            operands = tuple(node.args)
        else:
            continue
        for operand in operands:
            found += [(node.lineno, s) for s in _string_constants(operand) if s in names]
    return found


def test_the_literal_check_finds_what_it_should():
    names = vocabulary_names()
    caught = ast.parse(
        'a == "mlm"\nif "tmlm" != b: pass\nc in ("pmlm", "x")\n"M+" in d\ne == vocabulary.PMLM\nf = {"mlm": 1}\n'
        'g == "ablation"\nh.isin(["tape_contact"])\n'
    )
    assert literal_comparisons(caught, names) == [
        (1, "mlm"),
        (2, "tmlm"),
        (3, "pmlm"),
        (4, "M+"),
        (7, "ablation"),
        (8, "tape_contact"),
    ]


def test_objectives_features_and_tables_are_compared_as_constants():
    names = vocabulary_names()
    found = [
        f"pmlm/{_relative(name)}:{line}: {literal!r}"
        for name in MODULES
        if name != "pmlm.vocabulary"
        for line, literal in literal_comparisons(_tree(name), names)
    ]
    assert not found, "compare through pmlm.vocabulary's constants:\n" + "\n".join(found)


def _subscript(tokens: list[tokenize.TokenInfo], i: int) -> bool:
    """Whether token ``i`` is alone between the brackets of a subscript (``x["key"]``, not a list ``["name"]``)."""
    if not (1 < i < len(tokens) - 1 and tokens[i - 1].string == "[" and tokens[i + 1].string == "]"):
        return False
    before = tokens[i - 2]
    return before.string in (")", "]") or (before.type == tokenize.NAME and not keyword.iskeyword(before.string))


def _string_value(literal: str) -> str | None:
    """The value of a plain string literal's token; None for an f-string."""
    node = ast.parse(literal.strip(), mode="eval").body
    return node.value if isinstance(node, ast.Constant) else None


# Table names are spelled once in pmlm/, whatever the use (a comparison, an argument, a file name): modules where a
# string equal to one means something else, with the names it spells
NOT_TABLE_NAMES = {
    # TAPE's own dataset names, in its archives' member names (secondary_structure/secondary_structure_train.json)
    "pmlm.tasks.tape": {vocabulary.TABLE_SECONDARY_STRUCTURE, vocabulary.TABLE_REMOTE_HOMOLOGY},
}


def test_table_names_are_spelled_once():
    """Every string of pmlm/ that names a table is pmlm.vocabulary's constant (the workflow's: the test below)."""
    names = vocabulary_names(CHECKED_VOCABULARIES[2:4])
    found = [
        f"pmlm/{_relative(name)}:{node.lineno}: {node.value!r}"
        for name in MODULES
        if name != "pmlm.vocabulary"
        for node in ast.walk(_tree(name))
        if isinstance(node, ast.Constant) and node.value in names - NOT_TABLE_NAMES.get(name, set())
    ]
    assert not found, "name tables through pmlm.vocabulary's constants:\n" + "\n".join(found)


def workflow_literals(text: str, names: set[str], config_keys: frozenset[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, literal) of every string literal of a Snakefile, .smk or Python text that is a name of ``names`` or a
    regex alternation naming one (``"mlm|pmlm"``, a wildcard constraint), f-strings' literal parts included; but a
    subscript that is one of ``config_keys`` is a key of the config (``COEVOLUTION["tmlm"]``), not a name. The
    workflow's files are not Python, but they are Python's tokens: each string token is parsed on its own."""
    found = []
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type != tokenize.NL]
    for i, token in enumerate(tokens):
        if token.type != tokenize.STRING:
            continue
        if _subscript(tokens, i) and _string_value(token.string) in config_keys:
            continue
        for node in ast.walk(ast.parse(token.string.strip(), mode="eval")):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if node.value in names or ("|" in node.value and names & set(node.value.split("|"))):
                found.append((token.start[0], node.value))
    return found


def test_the_workflow_literal_check_finds_what_it_should():
    names = vocabulary_names(WORKFLOW_VOCABULARIES)
    text = (
        'rule a:\n    wildcard_constraints:\n        objective="mlm|pmlm",\n    shell:\n        "python -m pmlm x"\n'
        'X = ["tmlm"] if c else f"{d}/contact"\nif t == "ss3": pass\nY = f"{g(\'secondary_structure\')}.tsv"\n'
        'Z = pmlm.vocabulary.MLM\nif C["tmlm"]: pass\nW = E["mlm"]\n'
    )
    assert workflow_literals(text, names, frozenset({"tmlm"})) == [
        (3, "mlm|pmlm"),
        (6, "tmlm"),
        (7, "ss3"),
        (8, "secondary_structure"),
        (11, "mlm"),
    ]


def test_the_workflow_spells_no_vocabulary_name():
    """The Snakefile, the rules and workflow/lib name objectives, features, tables and tasks through pmlm.vocabulary."""
    names = vocabulary_names(WORKFLOW_VOCABULARIES)
    keys = frozenset(path[-1] for path in _schema_keys(yaml.safe_load(SCHEMA.read_text())))
    found = [
        f"{path.relative_to(REPO)}:{line}: {literal!r}"
        for path in WORKFLOW_SOURCES
        for line, literal in workflow_literals(path.read_text(), names, keys)
    ]
    assert not found, "use pmlm.vocabulary's constants:\n" + "\n".join(found)


def _schema_nodes(node, path=()):
    """(key path, node) of every node of the schema, the path of property names leading to it."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            if key in ("properties", "patternProperties"):
                for name, child in value.items():
                    yield from _schema_nodes(child, (*path, name))
            elif isinstance(value, (dict, list)):
                yield from _schema_nodes(value, path)
    elif isinstance(node, list):
        for child in node:
            yield from _schema_nodes(child, path)


def _schema_keys(schema):
    """The key path of every config key the schema describes."""
    return {path for path, _ in _schema_nodes(schema) if path}


def _schema_enums(schema):
    """(key path, enum) of every enum of the schema."""
    return [(path, tuple(node["enum"])) for path, node in _schema_nodes(schema) if "enum" in node]


# config key -> the values its enum must list: the vocabulary's (auto, for features: the recipe's own choice)
SCHEMA_VOCABULARIES = {
    "objective": vocabulary.OBJECTIVES,
    "table": vocabulary.RUN_TABLE_KINDS,
    "features": ("auto", vocabulary.FEATURES_M, vocabulary.FEATURES_M_PLUS),
    "device": vocabulary.DEVICES,
}


def test_the_schema_enums_are_the_vocabulary():
    """The schema is the description users read, so it lists the names itself; they are the vocabulary's, in its
    order, wherever a key of SCHEMA_VOCABULARIES has an enum (and each of those keys has one)."""
    enums = list(_schema_enums(yaml.safe_load(SCHEMA.read_text())))
    seen = set()
    for path, values in enums:
        key = path[-1] if path else None
        if key in SCHEMA_VOCABULARIES:
            seen.add(key)
            assert values == SCHEMA_VOCABULARIES[key], f"{SCHEMA.name}: {'.'.join(path)}: {values}"
    assert seen == set(SCHEMA_VOCABULARIES), f"no enum in {SCHEMA.name} for {set(SCHEMA_VOCABULARIES) - seen}"


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


# the repository's folders whose paths ARCHITECTURE.md names (`pmlm/...`, `workflow/lib/...`, `tests/...`; not config/:
# the page names pmlm/config/ modules as `config/...` too)
NAMED_ROOTS = ("pmlm", "workflow", "tests", "profiles", "bench", "docs", "envs", "scripts")
NAMED_PATH = rf"`((?:{'|'.join(NAMED_ROOTS)})/[\w/.-]*)"


@pytest.mark.parametrize("path", sorted(set(re.findall(NAMED_PATH, ARCHITECTURE.read_text()))))
def test_paths_architecture_names_exist(path):
    assert (REPO / path).exists(), f"ARCHITECTURE.md names {path}, which does not exist"


# -- the tests themselves: shared helpers live in tests/conftest.py and tests/tiny_models.py, never in a test module


def imports_of_test_modules(tree: ast.AST, test_modules: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every import of one of ``test_modules`` in ``tree``, those inside functions included."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] in test_modules]
    return found


def test_the_test_import_check_finds_what_it_should():
    tree = ast.parse(
        "import test_a\nfrom test_b import x\nfrom conftest import y\nimport tiny_models\n"
        "def f():\n    from test_a.sub import z\nimport test_other_name_not_a_module\n"
    )
    assert imports_of_test_modules(tree, {"test_a", "test_b"}) == [(1, "test_a"), (2, "test_b"), (6, "test_a.sub")]


def test_no_test_module_imports_another():
    """A helper two test files need is defined once, in conftest.py or tiny_models.py: a test module that imports
    another runs the other's module-level code and couples the two files."""
    paths = sorted((REPO / "tests").rglob("*.py"))  # the test modules and the helpers beside them
    test_modules = {path.stem for path in paths if path.name.startswith("test_")}
    found = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in paths
        for line, module in imports_of_test_modules(ast.parse(path.read_text(), filename=str(path)), test_modules)
    ]
    assert not found, "move what is shared to tests/conftest.py or tests/tiny_models.py:\n" + "\n".join(found)


# -- dispatch belongs to the type: a concept's name compared with a literal or a constant is a branch the type owes

# the concepts the project gives a type (pmlm.choices, pmlm.model.objective, pmlm.inference.output_types, the task
# types): a variable or attribute with one of these names, or ending in "_<name>", or its .name / .value
CONCEPT_NAMES = (
    "objective", "attention", "pair_vocab", "precision", "readout", "marginal", "double", "triple", "mode", "norm",
    "output", "kind", "layout",
)  # fmt: skip
MAX_CONCEPT_COMPARISONS = 25  # the three left: hf_remote's norm (remote code imports no pmlm) and the study's MLM arm


def _concept(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute) and node.attr in ("name", "value"):
        node = node.value
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        name = node.slice.value
    else:
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return isinstance(name, str) and any(name == c or name.endswith(f"_{c}") for c in CONCEPT_NAMES)


def _constant(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (str, int))
    if isinstance(node, ast.Name):
        return node.id.isupper()
    return isinstance(node, ast.Attribute) and (
        node.attr.isupper() or (isinstance(node.value, ast.Name) and node.value.id[:1].isupper())
    )


def concept_comparisons(tree: ast.AST) -> list[int]:
    """Lines where a concept's name is compared with == / != to a literal or a constant."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, a, b in zip(node.ops, sides[:-1], sides[1:], strict=True):
                if isinstance(op, (ast.Eq, ast.NotEq)) and (
                    (_concept(a) and _constant(b)) or (_concept(b) and _constant(a))
                ):
                    found.append(node.lineno)
    return found


def test_the_concept_check_finds_what_it_should():
    tree = ast.parse(
        "cfg.objective.name == MLM\nmode != 'batch'\nLayout.PACKED == self.layout\nx['readout'] == AUTO\n"
        "score_mode == Mode.PAIR\nkind is HeadKind.AUTO\nsteps == 3\nobjective == other\nmodel == 'mlm'\n"
    )
    assert concept_comparisons(tree) == [1, 2, 3, 4, 5]


def test_concepts_are_dispatched_by_their_types():
    found = [f"pmlm/{_relative(name)}:{line}" for name in sorted(MODULES) for line in concept_comparisons(_tree(name))]
    assert len(found) <= MAX_CONCEPT_COMPARISONS, (
        f"{len(found)} comparisons of a concept's name (at most {MAX_CONCEPT_COMPARISONS}); give the branch to the "
        "type (pmlm.choices, the objective, the output or the task):\n" + "\n".join(found)
    )


# -- the rule files hold rules; the workflow's Python is workflow/lib/ (under ruff, the size bars and unit tests)

MAX_RULE_FILE_DEFS = 20


def test_rule_files_hold_rules():
    defs = {
        f"{path.relative_to(REPO)}:{i}": line.strip()
        for path in [REPO / "Snakefile", *sorted(WORKFLOW.glob("rules/*.smk"))]
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if re.match(r"\s*def \w+\(", line)
    }
    assert len(defs) <= MAX_RULE_FILE_DEFS, "move these to workflow/lib/:\n" + "\n".join(defs)


def test_workflow_lib_within_the_size_bars():
    over = []
    for path in sorted(WORKFLOW.glob("lib/*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            over.append(f"{path.relative_to(REPO)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            functions = (ast.FunctionDef, ast.AsyncFunctionDef)
            if isinstance(node, functions) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                over.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    assert not over, "\n".join(over)


MAX_COEVOLUTION_LINES = 2000  # one co-evolution study: one configuration, one read-out path, one report


def test_one_coevolution_study():
    """One study in pmlm/coevolution/ within its size bar, and no second path beside it."""
    package = REPO / "pmlm" / "coevolution"
    lines = sum(len(p.read_text().splitlines()) for p in package.glob("*.py"))
    assert lines <= MAX_COEVOLUTION_LINES, f"pmlm/coevolution/ is {lines} lines (at most {MAX_COEVOLUTION_LINES})"
    import argparse

    from pmlm.cli import build_parser

    def subcommands(parser: argparse.ArgumentParser) -> dict:
        found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return found[0].choices if found else {}

    assert set(subcommands(subcommands(build_parser())["coevolution"])) == {"curves", "curves-report"}

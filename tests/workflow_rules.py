"""The workflow's rules as written in Snakefile and workflow/rules/*.smk: name, directives, conda env, the
``pmlm`` commands of the shell, resources; and the local rules. For tests that check every rule (conda envs,
benchmarks, resources). Import with ``from workflow_rules import ...`` (tests/ is on sys.path).

A static reading (the files follow one layout: ``rule name:`` at column 0, directives at 4 spaces, their
bodies deeper), so it needs no config and runs nothing. Also the workflow's own Python (workflow/lib), imported
as the Snakefile imports it: ``from workflow_rules import workflow_config``.
"""

from __future__ import annotations

import importlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAKEFILE = REPO / "Snakefile"
RULE_FILES = [SNAKEFILE, *sorted((REPO / "workflow" / "rules").glob("*.smk"))]
WORKFLOW_LIB = REPO / "workflow" / "lib"  # the workflow's own modules, on the path the Snakefile puts them on

_RULE = re.compile(r"^rule (\w+):\s*$")
_DIRECTIVE = re.compile(r"^    (\w+):\s*(.*)$")
_PMLM_COMMAND = re.compile(r"-m pmlm ([a-z][a-z-]*)")
_STRING = re.compile(r"\"([^\"]*)\"|'([^']*)'")


@dataclass
class Rule:
    name: str
    path: Path  # the file that defines it
    directives: dict[str, str] = field(default_factory=dict)  # directive -> its text (inline part and body)

    @property
    def conda_env(self) -> Path | None:
        """The env file of ``conda:``, resolved as Snakemake does: relative to the rule's file."""
        text = self.directives.get("conda")
        if text is None:
            return None
        match = _STRING.search(text)
        assert match, f"rule {self.name}: conda: is not a plain string: {text!r}"
        return (self.path.parent / (match.group(1) or match.group(2))).resolve()

    @property
    def pmlm_commands(self) -> list[str]:
        """Subcommands the shell runs as ``python -m pmlm <command>`` (or via ``pmlm launch -- -m pmlm ...``)."""
        commands = _PMLM_COMMAND.findall(self.directives.get("shell", ""))
        if "{params.launcher}" in self.directives.get("shell", ""):
            commands.insert(0, "launch")  # common.smk's pretrain_launcher: python -m pmlm launch ... --
        return commands

    @property
    def resources(self) -> set[str]:
        """Names set under ``resources:`` (``name=value`` lines)."""
        return set(re.findall(r"^\s+(\w+)=", self.directives.get("resources", ""), re.M))


def read_rules() -> dict[str, Rule]:
    rules: dict[str, Rule] = {}
    for path in RULE_FILES:
        rule, directive = None, None
        for line in path.read_text().splitlines():
            start = _RULE.match(line)
            if start:
                rule = rules[start.group(1)] = Rule(start.group(1), path)
                directive = None
            elif line and not line[0].isspace():
                rule = directive = None  # anything else at column 0 ends the rule
            elif rule is not None:
                found = _DIRECTIVE.match(line)
                if found:
                    directive = found.group(1)
                    rule.directives[directive] = found.group(2)
                elif directive is not None and line.strip():
                    rule.directives[directive] += "\n" + line
    return rules


def local_rules() -> set[str]:
    """Names listed under the Snakefile's ``localrules:``."""
    text = SNAKEFILE.read_text()
    block = re.search(r"^localrules:\n((?:[ \t]+\S.*\n|\n)+)", text, re.M)
    assert block, "no localrules: block in the Snakefile"
    return set(re.findall(r"(\w+),?", block.group(1)))


def commented_block(path: Path, first_line: str) -> str:
    """A commented-out YAML block of a profile, uncommented: ``first_line`` (e.g. ``  #   pretrain:``) and the
    lines below it that are indented further, with the comment prefix of ``first_line`` removed."""
    lines = path.read_text().splitlines()
    start = lines.index(first_line)
    prefix = first_line[: len(first_line) - len(first_line.lstrip(" #"))]
    body = []
    for line in lines[start + 1 :]:
        if not line.startswith(prefix + "  "):
            break
        body.append(line)
    return "\n".join(line[len(prefix) :] for line in [first_line, *body])


def workflow_module(name: str):
    """Module ``name`` of workflow/lib, imported by path as the Snakefile imports it."""
    if str(WORKFLOW_LIB) not in sys.path:
        sys.path.insert(0, str(WORKFLOW_LIB))
    return importlib.import_module(name)


workflow_config = workflow_module("workflow_config")

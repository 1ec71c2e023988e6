"""pmlm.cli: every subcommand's --help, one-line usage errors, and dispatch to the command's engine."""

from __future__ import annotations

import pytest

from pmlm.cli import SUBCOMMANDS, main


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: pmlm {command}"), out[:200]
    assert SUBCOMMANDS[command].split(" (")[0] in " ".join(out.split())


def test_a_usage_error_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["extract", "archive.tar"])
    assert exit_.value.code == 2
    assert (
        capsys.readouterr().err
        == "pmlm extract: error: the following arguments are required: member, -o/--output (see --help)\n"
    )


def test_the_engine_runs_and_its_errors_are_one_line(tmp_path, capsys):
    """extract's engine (pmlm.data.archive) runs after parsing; its InputError is one line, exit 2."""
    assert main(["extract", str(tmp_path / "missing.tar"), "a.txt", "-o", str(tmp_path / "a.txt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pmlm extract: error: {tmp_path / 'missing.tar'}") and err.count("\n") == 1, err

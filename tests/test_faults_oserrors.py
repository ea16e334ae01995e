"""OS errors through the CLI: each errno class (permission, not a directory, file exists, is
a directory, file too large under a real size limit) stops the command with one line naming
the operation and the path, exit 2, nothing lost; a run stopped by a full file-size limit
resumes once the limit is gone."""

import errno
import json
import os
import resource
import shutil
import subprocess
import sys

import pytest

from fp8rl.cli import main
from fp8rl.errors import StorageError, os_errors, storage_error
from fp8rl.train.checkpoint import list_checkpoints, verify_checkpoint
from fp8rl.train.runlog import read_metrics
from helpers_config import tiny_config
from helpers_runs import one_error_line, snapshot


def _config(tmp_path, run, **sections):
    path = tmp_path / "c.json"  # JSON is YAML
    path.write_text(json.dumps(tiny_config(run, **sections)))
    return path


def _train(cfg_path, *extra):
    return main(["train", "--config", str(cfg_path), "--no-progress", *extra])


def _cli(argv, *, preexec_fn=None, prefix=()):
    """`fp8rl ARGV` in a subprocess (for limits and privileges this process must keep)."""
    cmd = [*prefix, sys.executable, "-m", "fp8rl", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=preexec_fn)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith(f"fp8rl {argv[0]}: error:")]
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, errors, proc.stderr


def test_one_place_words_every_os_error():
    # an OSError with its own filename; the path the caller names wins (a temporary name is
    # no use to the user); two filenames (a rename) are both shown
    e = OSError(errno.EFBIG, os.strerror(errno.EFBIG), "/r/.tmp-1/model.safetensors")
    assert str(storage_error(e, "write checkpoint")) == (
        "cannot write checkpoint /r/.tmp-1/model.safetensors: File too large (errno 27)"
    )
    assert str(storage_error(e, "write checkpoint", "/r/step_1/m", note="older intact")) == (
        "cannot write checkpoint /r/step_1/m: File too large (errno 27); older intact"
    )
    moved = OSError(errno.EXDEV, os.strerror(errno.EXDEV), "a", None, "b")
    assert str(storage_error(moved)) == "a -> b: Invalid cross-device link (errno 18)"
    # safetensors' own error wraps the OS's: its code is found in the message
    wrapped = Exception("Error while serializing: I/O error: No space left on device (os error 28)")
    assert str(storage_error(wrapped, "write", "f")) == (
        "cannot write f: No space left on device (errno 28)"
    )
    assert str(storage_error(FileNotFoundError("no config x.yaml"))) == "no config x.yaml"
    with pytest.raises(StorageError, match=r"^cannot read x: Permission denied \(errno 13\)$"):
        with os_errors("read", "x"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))


def test_a_run_folder_under_a_file_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("mine\n")
    cfg = _config(tmp_path, blocker / "run")
    assert _train(cfg) == 2
    line = one_error_line(capsys, "Not a directory (errno 20)")
    assert f"cannot create folder {blocker / 'run'}" in line
    assert blocker.read_text() == "mine\n"


def test_a_folder_where_the_run_writes_a_file_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "config.json").mkdir(parents=True)  # no run's files: a fresh start in it
    assert _train(_config(tmp_path, run)) == 2
    line = one_error_line(capsys, "Is a directory (errno 21)")
    assert f"cannot write {run / 'config.json'}" in line
    assert sorted(p.name for p in run.rglob("*")) == ["config.json"]


def test_a_report_folder_that_is_a_file_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "rollout/reward": 0.5}\n')
    taken = tmp_path / "taken"
    taken.write_text("mine\n")
    assert main(["report", str(run), "--out", str(taken)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"fp8rl report: error: cannot create the report folder {taken}: File exists (errno 17)"
    ]
    assert taken.read_text() == "mine\n"


def _without_root_overrides():
    """Root ignores permission bits: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the
    child (setpriv, util-linux), so a folder it owns with mode 0555 denies it as it would a
    user. Not root: the bits apply anyway."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: no way to make the OS deny a write")
    return ("setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", "--")


@pytest.mark.parametrize("what", ["run_folder", "config_file"])
def test_permission_denied_is_one_line_naming_path_and_operation(tmp_path, what):
    prefix = _without_root_overrides()
    locked = tmp_path / "locked"
    locked.mkdir()
    cfg = _config(tmp_path, locked / "run")
    if what == "run_folder":
        locked.chmod(0o555)
        expected = (
            f"cannot create folder {locked / 'run'}: Permission denied (errno 13); "
            "fp8rl train needs it"
        )
    else:
        cfg.chmod(0o000)
        expected = f"cannot read config file {cfg}: Permission denied (errno 13)"
    try:
        rc, errors, stderr = _cli(["train", "--config", str(cfg), "--no-progress"], prefix=prefix)
    finally:
        locked.chmod(0o755)
        cfg.chmod(0o644)
    assert rc == 2 and errors == [f"fp8rl train: error: {expected}"], stderr
    assert list(locked.iterdir()) == []


def _file_size_limit(limit):
    def apply():  # in the child; Python ignores SIGXFSZ, so a write past it raises EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_real_file_size_limit_stops_the_run_with_one_line_and_it_resumes(tmp_path, capsys):
    run = tmp_path / "run"
    cfg = _config(tmp_path, run, train={"steps": 3}, log={"checkpoint_every": 1, "eval_size": 0})
    assert _train(cfg, "train.steps=1") == 0
    (first,) = list_checkpoints(run)
    intact = snapshot(first)
    # RLIMIT_FSIZE is per file and every checkpoint has the same sizes, so the limit goes on
    # the process that continues the run: between the model's size and the optimizer's, the
    # second checkpoint fails half-way (its model file written, its optimizer file cut)
    model, opt = ((first / f"{f}.safetensors").stat().st_size for f in ("model", "optimizer"))
    assert model < (model + opt) // 2 < opt
    # train.steps=3: a resume runs to the run's own 1 step unless told to extend it
    argv = ["train", "--config", str(cfg), "--no-progress", "--resume", "train.steps=3"]
    rc, errors, stderr = _cli(argv, preexec_fn=_file_size_limit((model + opt) // 2))
    second = run / "checkpoints" / "step_00000002" / "optimizer.safetensors"
    assert rc == 2 and errors == [
        f"fp8rl train: error: cannot write checkpoint {second}: File too large (errno 27); "
        "the older checkpoints are intact"
    ], stderr
    assert list_checkpoints(run) == [first] and snapshot(first) == intact
    assert not list((run / "checkpoints").glob(".tmp-*"))
    capsys.readouterr()
    assert _train(cfg, "--resume") == 0  # the limit gone, the run finishes (its steps now 3)
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]
    assert [verify_checkpoint(p)["step"] for p in list_checkpoints(run)] == [2, 3]

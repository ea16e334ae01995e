"""bench/gpu_all.sh --smoke run as the GPU machine would run it: a python for which `import fp8rl`
fails unless the script puts the checkout's src/ on sys.path itself, and math_verify, torchao,
trl and verl cannot be imported. Every part must run, say so in its JSON, and trace the
compiled quantizer with at most two graphs per key and no eager fallback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_all.sh"
PARTS = ("gpu_e2e", "gpu_fp8_linear", "gpu_rollout")
BLOCKED = ("math_verify", "torchao", "trl", "verl")

BLOCKER = '''
import importlib.machinery, os, sys
BLOCKED = {blocked!r}
# Whatever provides fp8rl at start-up (an editable install's .pth, PYTHONPATH) is dropped:
# on the GPU machine fp8rl is not installed, so the bench scripts must find src/ themselves.
sys.path[:] = [p for p in sys.path if not os.path.isdir(os.path.join(p or os.getcwd(), "fp8rl"))]


class _Without:
    """A finder that cannot see the blocked packages (find_spec gives None, as for a package
    that is not installed), nor fp8rl except through sys.path."""

    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in BLOCKED or (top == "fp8rl" and self.finder is not importlib.machinery.PathFinder):
            return None
        return self.finder.find_spec(name, path, target)

    def find_distributions(self, *args, **kwargs):  # importlib.metadata: no version of them either
        found = getattr(self.finder, "find_distributions", lambda *a, **k: [])(*args, **kwargs)
        return [d for d in found if (d.name or "").replace("-", "_").lower() not in BLOCKED]

    def __getattr__(self, name):  # invalidate_caches and whatever else importlib asks
        return getattr(self.finder, name)


sys.meta_path[:] = [_Without(f) for f in sys.meta_path]
'''


@pytest.fixture(scope="module")
def device_python(tmp_path_factory) -> Path:
    """A `python` like the H200 machine's: no fp8rl, no math_verify/torchao/trl/verl."""
    d = tmp_path_factory.mktemp("device_python")
    (d / "site").mkdir()
    (d / "site" / "sitecustomize.py").write_text(BLOCKER.format(blocked=BLOCKED))
    wrapper = d / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{d / "site"}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def run_py(python: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_the_device_python_really_lacks_fp8rl_and_the_peers(device_python):
    """Teeth for the test below: what the GPU machine lacks is missing here too."""
    assert "No module named 'fp8rl'" in run_py(device_python, "import fp8rl").stderr
    for name in BLOCKED:
        assert f"No module named '{name}'" in run_py(device_python, f"import {name}").stderr, name
    absent = run_py(
        device_python, f"import importlib.util as u; print([u.find_spec(n) for n in {BLOCKED!r}])"
    )
    assert absent.stdout.strip() == str([None] * len(BLOCKED)), absent.stderr[-2000:]
    no_metadata = run_py(device_python, "import importlib.metadata as m; m.version('torchao')")
    assert "PackageNotFoundError" in no_metadata.stderr
    src = str(ROOT / "src")
    found = run_py(
        device_python,
        f"import sys; sys.path.insert(0, {src!r}); import fp8rl; print(fp8rl.__file__)",
    )
    assert found.returncode == 0 and found.stdout.strip().startswith(src), found.stderr[-2000:]


@pytest.fixture(scope="module")
def smoke_run(device_python, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_all") / "out"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHON"] = str(device_python)
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--smoke", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )
    logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(out.glob("*.log")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs
    return out, proc.stdout


def test_every_part_ran_completed_and_passed(smoke_run):
    out, stdout = smoke_run
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        [f"{p}.{ext}" for p in PARTS for ext in ("json", "log")] + ["summary.json", "summary.md"]
    )  # 8 files, no leftovers
    for part in PARTS:
        res = json.loads((out / f"{part}.json").read_text())
        assert res["script"] == part and res["ran"] is True and res["completed"] is True, part
        assert res["smoke"] is True and res["passed"] is True and res["errors"] == {}, part
        assert res["gpu_numbers_measured"] is False
        assert res["goals"] and all(g["met"] is None for g in res["goals"])  # never judged on a CPU
        assert f"[{part}] exit 0" in stdout


def test_the_compiled_quantizer_path_ran_with_at_most_two_graphs_per_key(smoke_run):
    """The bench's and the GRPO Trainer's quantizer calls, traced by dynamo as on the GPU."""
    out, _ = smoke_run
    for part in PARTS:
        q = json.loads((out / f"{part}.json").read_text())["quantizer"]
        assert q["keys"] and q["fallbacks"] == [], (part, q["status"])
        assert all(k["calls"] > 0 and k["compiles"] is not None for k in q["keys"]), part
        assert q["max_compiles_per_key"] <= 2, (part, q["keys"])
    e2e = json.loads((out / "gpu_e2e.json").read_text())
    layouts = {k["layout"] for k in e2e["quantizer"]["keys"]}
    assert layouts == {"row-major", "column-major"}  # the backward's transposed operands too


def test_odd_token_counts_are_checked_and_torchao_is_absent(smoke_run):
    out, _ = smoke_run
    lin = json.loads((out / "gpu_fp8_linear.json").read_text())
    assert {c["m"] for c in lin["checks"] if c["recipe"] == "blockwise"} >= {37, 130}
    assert all(isinstance(c["error"], float) for c in lin["checks"])  # each check reports its error
    assert lin["torchao"] == "absent"
    peers = [g for g in lin["goals"] if "torchao" in g["goal"]]
    assert peers and all(g["value"] is None and g["peer"] == "absent" for g in peers)
    rows = lin["timing"]["rows"]
    assert rows and all(r["why"]["torchao rowwise"] == "absent" for r in rows)
    log = (out / "gpu_fp8_linear.log").read_text()
    assert "| absent |" in log
    # the block-scaled recipes run emulated off SM100, and the table and JSON say so
    assert lin["emulated"] == {"mxfp8": True, "mxfp4": True, "nvfp4": True}
    assert "| fp8 mxfp8 (emulated) | fp8 mxfp4 (emulated) | fp8 nvfp4 (emulated) |" in log


def test_the_summary_table_covers_every_part(smoke_run):
    out, stdout = smoke_run
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["parts"]) == set(PARTS)
    assert all(p["state"].startswith("completed") for p in summary["parts"].values())
    assert summary["goals_total"] == sum(
        len(json.loads((out / f"{p}.json").read_text())["goals"]) for p in PARTS
    )
    table = (out / "summary.md").read_text()
    for text in (
        "| gpu_e2e | train step rowwise (calibration included) vs bf16 | >= 1.35x |",
        "| gpu_fp8_linear | Fp8Linear rowwise vs torchao rowwise (torchao ms / ours) | >= 1x "
        "| absent |",
        "| gpu_rollout | compiled quantizer | no fallback |",
        "| gpu_rollout | checks before timing |  | 4 of 4 passed; timed: bf16, tensorwise, "
        "rowwise, blockwise |",
        "| gpu_fp8_linear | checks before timing |  | 72 of 72 passed; worst rel err vs the CPU "
        "emulation 0.0e+00; timed: tensorwise, rowwise, blockwise, mxfp8, mxfp4, nvfp4 |",
    ):
        assert text in table and text in stdout, text


def test_a_spent_budget_stops_parts_and_the_summary_says_so(device_python, tmp_path):
    """30 s: the first two shares are under 20 s (not started); gpu_rollout, made to hang
    here, gets what is left (under 30 s, at least 20 s with the slack for interpreter
    start-ups on a loaded machine), is killed inside it and the summary says so."""
    hang = tmp_path / "python"
    hang.write_text(
        '#!/bin/sh\ncase "$1" in *gpu_rollout.py) exec sleep 60;; esac\n'
        f'exec "{device_python}" "$@"\n'
    )
    hang.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHON"] = str(hang)
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--smoke", str(out), "30"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    parts = json.loads((out / "summary.json").read_text())["parts"]
    assert (
        parts["gpu_e2e"]["state"]
        == parts["gpu_fp8_linear"]["state"]
        == "not started: the budget was spent"
    )
    assert parts["gpu_rollout"]["exit"] == 124
    assert re.match(
        r"killed at its time share in \d+ s of a (2\d|30) s share", parts["gpu_rollout"]["state"]
    ), parts["gpu_rollout"]["state"]
    assert "| gpu_rollout | state |  | killed at its time share" in proc.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--smoke"], "usage: bench/gpu_all.sh"),
        (["out", "7m"], "BUDGET_S must be a whole number of seconds"),
    ],
)
def test_bad_usage_is_one_line(tmp_path, args, message):
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30, cwd=tmp_path
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
@pytest.mark.parametrize("part", PARTS)
def test_without_smoke_and_without_cuda_a_gpu_bench_fails_in_one_line(part):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{part}.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert proc.returncode != 0 and last.startswith(f"{part}: error: no CUDA device")
    assert "Traceback" not in proc.stderr and "smoke" not in proc.stdout.lower()


def test_shell_script_is_executable():
    assert os.access(SCRIPT, os.X_OK)  # the device command runs it directly


def test_summary_states_of_a_cut_short_failed_or_missing_part():
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_summary

    share = {"exit": 124, "seconds": 200, "share": 210}
    assert gpu_summary.state("gpu_e2e", {"ran": True, "completed": False}, share) == (
        "cut short (killed at its time share in 200 s of a 210 s share): "
        "the JSON holds what it measured"
    )
    assert gpu_summary.state("gpu_e2e", None, {"exit": 1, "seconds": 3, "share": 210}) == (
        "did not run (exit 1 in 3 s of a 210 s share): see gpu_e2e.log"
    )
    assert gpu_summary.state(
        "gpu_e2e",
        {"ran": True, "completed": True, "passed": False},
        {"exit": 1, "seconds": 90, "share": 210},
    ).endswith("a check FAILED (exit 1)")
    assert gpu_summary.state("gpu_rollout", None, None) == "not run yet"


def test_a_failed_check_is_named_in_the_summary():
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_summary
    from device_bench import check_summary

    items = [
        {"name": "rowwise scaled_matmul", "passed": True, "error": 3e-3, "gate": 1e-2},
        {"name": "blockwise scaled_matmul", "passed": False, "error": 0.4, "gate": 1e-2},
        {"name": "rowwise FP8 really ran", "passed": True, "error": 0.5, "gate": [1e-3, 0.08]},
        {"name": "tiny blockwise graph decoder vs eager", "passed": False},  # no error, no gate
    ]
    res = {"check_summary": check_summary(items, ["rowwise"])}
    assert gpu_summary.checks_line(res) == (
        "2 of 4 passed; worst rel err vs the CPU emulation 4.0e-01; FAILED: blockwise "
        "scaled_matmul; tiny blockwise graph decoder vs eager; timed: rowwise"
    )

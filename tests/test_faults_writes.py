"""Every file fp8rl writes goes through one of three writers in fp8rl.utils (a whole text file
as UTF-8, an append as UTF-8, a whole binary file), each atomic or encoding before it opens:
a source scan fails on any other way of writing a file in src/. A non-UTF-8 locale neither
empties a file it replaces nor makes a traceback of output, and a closed pipe ends a command
quietly."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fp8rl.study.sweep.spec import SPEC_FILE, load_spec, run_dir
from fp8rl.utils import append_text, atomic_write_bytes, atomic_write_text

SRC = Path(__file__).resolve().parents[1] / "src" / "fp8rl"

# The writes that bypass the three writers: how many of each call a file holds, and why they
# are safe. A new one, even of an allowed kind in an allowed file, fails the scan.
ALLOWED = {
    ("utils.py", "open"): (2, "the writers themselves"),
    ("utils.py", "os.open"): (1, "/dev/null over stdout once the pipe's reader left"),
    ("train/checkpoint.py", "open"): (1, "state.json inside a temporary folder renamed whole"),
    ("train/checkpoint.py", "save_model"): (2, "into a temporary folder or name, then renamed"),
    ("train/checkpoint.py", "save_file"): (3, "into a temporary folder renamed whole"),
    ("study/sweep/workers.py", "open"): (1, "a file descriptor for a worker's stdout, stderr"),
    ("tasks/grading_worker.py", "os.fdopen"): (1, "the grader's own stdout, no file"),
    ("train/run_folder.py", "os.open"): (1, "the lock file, never holding data"),
    ("models/gguf_convert.py", "open"): (1, "a wheel's member into a temporary folder, hashed"),
}
WRITE_MODES = set("wax+")


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        base = func.value.id if isinstance(func.value, ast.Name) else ""
        return f"{base}.{func.attr}" if base in ("os", "gzip", "io") else func.attr
    return ""


def _mode(call: ast.Call, position: int) -> str:
    """The mode argument when it is a literal or a conditional of literals; else 'w' for
    open(path, mode) and 'r' for X.open(name) (a zip member's name, not a mode)."""
    node = next((k.value for k in call.keywords if k.arg == "mode"), None)
    if node is None and len(call.args) > position:
        node = call.args[position]
    if node is None:
        return "r"
    consts = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant)]
    if position == 0 and not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return "".join(str(c) for c in consts) if isinstance(node, ast.IfExp) else "r"
    return "".join(str(c) for c in consts) if consts else "w"


def _writes(tree: ast.AST):
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        name = _name(call.func)
        if name in ("open", "io.open", "gzip.open", "os.fdopen"):
            # Path(p).open(mode) has the mode first; open(p, mode) second
            first = isinstance(call.func, ast.Attribute) and name == "open"
            if WRITE_MODES & set(_mode(call, 0 if first else 1)):
                yield call.lineno, name
        elif name == "os.open":
            flags = ast.unparse(call.args[1]) if len(call.args) > 1 else ""
            if any(f in flags for f in ("O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND")):
                yield call.lineno, name
        elif name in ("write_text", "write_bytes", "save_file", "save_model", "tofile"):
            yield call.lineno, name
        elif name in ("copyfile", "copy", "copy2", "save", "savez", "dump") and _module(call):
            yield call.lineno, name
        elif name == "savefig" and not (call.args and isinstance(call.args[0], ast.Name)):
            yield call.lineno, name


def _module(call: ast.Call) -> bool:
    """shutil.copyfile(...), torch.save(...), np.save(...), pickle.dump(...)"""
    f = call.func
    return (
        isinstance(f, ast.Attribute)
        and isinstance(f.value, ast.Name)
        and (f.value.id in ("shutil", "np", "numpy", "torch", "pickle"))
    )


def _scan() -> dict[tuple[str, str], list[int]]:
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for line, name in _writes(ast.parse(path.read_text(encoding="utf-8"))):
            found.setdefault((rel, name), []).append(line)
    return found


def test_every_write_in_src_goes_through_the_atomic_utf8_writers():
    found = _scan()
    other = [
        f"{rel}:{lines} {name}"
        for (rel, name), lines in sorted(found.items())
        if len(lines) != ALLOWED.get((rel, name), (0,))[0]
    ]
    assert not other, (
        "write files through fp8rl.utils (atomic_write_text, append_text, atomic_write_bytes, "
        f"save_figure), or add the case to ALLOWED with why it is safe: {other}"
    )
    # the scan sees writes (it cannot pass by finding nothing), and no exception is stale
    assert sorted(k for k in ALLOWED if k not in found) == []


def test_the_scan_catches_each_way_of_writing():
    caught = {
        'open(p, "w")': "open",
        'open(p, "a" if x else "w")': "open",
        'Path(p).open("w")': "open",
        "p.write_text(t)": "write_text",
        "p.write_bytes(b)": "write_bytes",
        'gzip.open(p, "wt")': "gzip.open",
        "os.open(p, os.O_WRONLY | os.O_CREAT)": "os.open",
        "shutil.copyfile(a, b)": "copyfile",
        'fig.savefig("x.png")': "savefig",
        "torch.save(d, p)": "save",
        "pickle.dump(d, fh)": "dump",
    }
    for code, name in caught.items():
        assert [n for _, n in _writes(ast.parse(code))] == [name], code
    for code in ("open(p)", 'open(p, "rb")', "fig.savefig(buf)", "os.open(p, os.O_RDONLY)"):
        assert list(_writes(ast.parse(code))) == [], code


def test_the_writers_write_utf8_whatever_the_locale(tmp_path):
    code = (
        "import sys; from fp8rl.utils import atomic_write_text, append_text\n"
        "atomic_write_text(sys.argv[1], 'calibr\\xe9 \\xb1 1\\n')\n"
        "append_text(sys.argv[2], '\\xe9\\n')\n"
        "import locale; print(locale.getpreferredencoding())"
    )
    text, log = tmp_path / "v.md", tmp_path / "l.log"
    log.write_bytes(b"old\n")
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0"}
    r = subprocess.run(
        [sys.executable, "-c", code, str(text), str(log)], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "UTF-8" not in r.stdout.upper()  # the locale really was not UTF-8
    assert text.read_bytes() == "calibré ± 1\n".encode()
    assert log.read_bytes() == "old\né\n".encode()


def test_a_text_that_cannot_be_encoded_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / "verdict.md"
    path.write_bytes(b"the committed verdict\n")
    for write in (atomic_write_text, append_text):
        with pytest.raises(UnicodeEncodeError):
            write(path, "a lone surrogate \ud800")
        assert path.read_bytes() == b"the committed verdict\n"
    atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["verdict.md"]


def _sweep(out: Path, arms: dict) -> Path:
    spec = load_spec({"base": {"train": {"steps": 4}}, "arms": arms, "seeds": [0, 1]})
    out.mkdir()
    (out / SPEC_FILE).write_text(json.dumps(spec.to_dict()), encoding="utf-8")
    for arm, seed in spec.runs():
        folder = run_dir(out, arm, seed)
        folder.mkdir(parents=True)
        rows = [
            {"step": s, "rollout/entropy": 0.1 * s + seed, "rollout/reward": 0.5} for s in range(4)
        ]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "done.json").write_text(json.dumps({"wall_s": 1.0, "resumed_at": None}))
    return out


def test_a_study_tool_under_a_c_locale_replaces_its_md_and_prints_no_traceback(tmp_path):
    """The trial's loss: window_gaps opened its .md, then failed to encode a character."""
    out = _sweep(tmp_path / "s", {"bf16": {}, "fp8": {}})
    md = out / "window_gaps.md"
    md.write_bytes(b"an earlier verdict\n")
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0"}
    cmd = [sys.executable, "-m", "fp8rl.study.window_gaps", str(out), "--window", "2"]
    r = subprocess.run(cmd, env=env, capture_output=True)
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr.decode()
    assert "Δ entropy".encode() in md.read_bytes()  # UTF-8 whatever the locale
    assert b"\\u0394 entropy" in r.stdout  # the terminal cannot show it: escaped


@pytest.mark.parametrize("tool", ["fp8rl", "study-tool"])
def test_output_into_a_closed_pipe_is_no_traceback(tmp_path, tool):
    """`fp8rl ... | head -1`: the reader is gone before the command writes."""
    out = _sweep(tmp_path / "s", {"bf16": {}, "fp8": {}})
    cmd = {
        "fp8rl": ["-m", "fp8rl", "report", str(run_dir(out, "fp8", 0)), "--out", str(tmp_path)],
        "study-tool": ["-m", "fp8rl.study.window_gaps", str(out), "--window", "2"],
    }[tool]
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0"}
    p = subprocess.Popen(
        [sys.executable, *cmd], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    p.stdout.close()  # before the interpreter has even started: its first write meets EPIPE
    err = p.stderr.read()
    p.wait(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
    assert p.returncode == 141, err.decode()

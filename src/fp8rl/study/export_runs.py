"""A finished sweep's raw runs, small enough to commit: spec.json, and per run folder its
config.json, done.json, provenance.json and events.log (where recorded), metrics.jsonl.gz and
(where logged) responses.jsonl.gz and samples.jsonl.gz, without checkpoints. Every reader of
run folders (sweep.cells, long_verdict, arm_table via aggregate, response_entropy, learning)
reads the gzipped files in place of the plain ones.

    python -m fp8rl.study.export_runs runs/study-long docs/study-long/runs

The gzip streams carry no time stamp or file name, so re-exporting the same runs gives the
same bytes (a clean diff in git).
"""

from __future__ import annotations

import argparse
import gzip
import io
import shutil
from pathlib import Path

from ..errors import Fp8rlError, one_line, os_errors
from ..train.provenance import FILE as PROVENANCE
from ..train.runlog import METRICS_FILE, RESPONSES_FILE, SAMPLES_FILE, numbered_rows
from ..utils import atomic_write_bytes, run_main
from .run_checks import read_json
from .sweep.spec import DONE_FILE, SPEC_FILE, load_spec, run_dir

COPIED = ("config.json", DONE_FILE)
OPTIONAL = (PROVENANCE, "events.log")  # runs from before they were recorded have none
ZIPPED = (METRICS_FILE, RESPONSES_FILE, SAMPLES_FILE)


def _gzip(src: Path, dst: Path) -> None:
    buf = io.BytesIO()
    with open(src, "rb") as fin:
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as z:
            shutil.copyfileobj(fin, z)
    atomic_write_bytes(dst, buf.getvalue())


def _copy(src: Path, dst: Path) -> None:
    atomic_write_bytes(dst, src.read_bytes())


def export_runs(src_dir, dst_dir, *, finished_only: bool = False) -> list[Path]:
    """Copy what module docstring says from SRC into DST; returns the files written. Every run
    of the spec must be complete (done.json), else Fp8rlError before anything is written;
    `finished_only` exports the finished ones of a sweep still running (a long study commits
    its runs as they come; the tools that conclude refuse the partial copy until it is whole)."""
    src, dst = Path(src_dir), Path(dst_dir)
    spec = load_spec(src / SPEC_FILE)
    missing = [
        run_dir(src, a, s) for a, s in spec.runs() if not (run_dir(src, a, s) / DONE_FILE).is_file()
    ]
    if missing and not finished_only:
        raise Fp8rlError(f"export_runs: {missing[0]} is not complete (no {DONE_FILE})")
    runs = [(run_dir(src, a, s), run_dir(dst, a, s)) for a, s in spec.runs()]
    runs = [(a, b) for a, b in runs if a not in missing]
    for a, _ in runs:  # every file read before any is written: a damaged one exports nothing
        _check_source(a)
    with os_errors("write the export file"):
        dst.mkdir(parents=True, exist_ok=True)
        _copy(src / SPEC_FILE, dst / SPEC_FILE)
        written = [dst / SPEC_FILE]
        for a, b in runs:
            written += _export_run(a, b)
    return written


def _check_source(run: Path) -> None:
    """config.json and done.json are JSON objects; every row file reads to its end (a
    damaged gzip stream is a DataError naming it)."""
    for name in COPIED:
        read_json(run / name)
    for name in ZIPPED:
        for _ in numbered_rows(run / name, quiet=True):
            pass


def _export_run(a: Path, b: Path) -> list[Path]:
    b.mkdir(parents=True, exist_ok=True)
    written = []
    for name in COPIED:
        _copy(a / name, b / name)
        written.append(b / name)
    for name in OPTIONAL:
        if (a / name).is_file():
            _copy(a / name, b / name)
            written.append(b / name)
    for name in ZIPPED:
        if (a / name).is_file():
            _gzip(a / name, b / f"{name}.gz")
        elif (a / f"{name}.gz").is_file():  # an export exported again: copied as it is
            _copy(a / f"{name}.gz", b / f"{name}.gz")
        else:
            continue
        written.append(b / f"{name}.gz")
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8rl.study.export_runs")
    p.add_argument("src", help="a finished sweep's folder (spec.json, ARM/seed-S)")
    p.add_argument("dst", help="where the small copy goes")
    p.add_argument(
        "--finished-only",
        action="store_true",
        help="export the finished runs of a sweep still running (the rest later)",
    )
    a = p.parse_args(argv)
    if not (Path(a.src) / SPEC_FILE).is_file():
        p.error(f"{Path(a.src) / SPEC_FILE} not found: not a sweep folder")
    try:
        written = export_runs(a.src, a.dst, finished_only=a.finished_only)
    except (Fp8rlError, OSError) as e:
        p.error(one_line(e))
    size = sum(f.stat().st_size for f in written)
    print(f"{len(written)} files, {size / 1e6:.2f} MB in {a.dst}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))

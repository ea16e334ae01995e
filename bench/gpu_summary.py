"""One table for a bench/gpu_all.sh run: each part's state, checks, quantizer and goals.

Reads OUT_DIR/gpu_e2e.json, gpu_fp8_linear.json and gpu_rollout.json (whichever exist) and
writes OUT_DIR/summary.md and summary.json; gpu_all.sh calls it after every part, so a run
cut short still has a summary of what it measured. Standard library only: it must work
whatever broke in the parts.

    python bench/gpu_summary.py OUT_DIR [--part NAME:EXIT:SECONDS:SHARE ...] [--quiet]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PARTS = ("gpu_e2e", "gpu_fp8_linear", "gpu_rollout")
KILLED = {124: "killed at its time share", 137: "killed (did not stop after its time share)"}
NOT_STARTED = 125  # gpu_all.sh's code for a part it had no time left to start


def read(out: Path, name: str) -> dict | None:
    p = out / f"{name}.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def state(name: str, res: dict | None, exit_info: dict | None) -> str:
    code = None if exit_info is None else exit_info["exit"]
    took = (
        ""
        if exit_info is None
        else f" in {exit_info['seconds']} s of a {exit_info['share']} s share"
    )
    if res is None or not res.get("ran"):
        if exit_info is None:
            return "not run yet"
        if code == NOT_STARTED:
            return "not started: the budget was spent"
        if code in KILLED:
            return f"{KILLED[code]}{took}, before it wrote any result: see {name}.log"
        return f"did not run (exit {code}{took}): see {name}.log"
    if not res.get("completed"):
        why = KILLED.get(code, f"exit {code}" if code is not None else "still running")
        return f"cut short ({why}{took}): the JSON holds what it measured"
    verdict = "checks passed" if res.get("passed") else "a check FAILED"
    return f"completed{took}, {verdict} (exit {code if code is not None else '?'})"


def checks_line(res: dict) -> str | None:
    c = res.get("check_summary")
    if not c:
        return None
    line = f"{c['passed']} of {c['total']} passed"
    if c.get("worst_error") is not None:
        line += f"; worst rel err vs the CPU emulation {c['worst_error']:.1e}"
    if c["failed"]:
        line += "; FAILED: " + "; ".join(c["failed"][:4]) + (" ..." if len(c["failed"]) > 4 else "")
    return line + f"; timed: {', '.join(c['timed']) or 'none'}"


def fmt_target(g: dict) -> str:
    if g.get("unit") == "%":
        return f"{'>=' if g.get('higher', True) else '<'} {100 * g['target']:g} %"
    return f">= {g['target']:g}x"


def fmt_value(g: dict) -> str:
    if g.get("value") is None:
        return "absent" if g.get("peer") == "absent" else "not measured"
    return f"{100 * g['value']:.2f} %" if g.get("unit") == "%" else f"{g['value']:.2f}x"


def verdict(g: dict, smoke: bool) -> str:
    if g.get("met") is True:
        return "met"
    if g.get("met") is False:
        return "NOT met"
    return "not judged (CPU smoke run)" if smoke else "-"


def summarize(out: Path, exits: dict[str, dict]) -> tuple[list[list[str]], dict]:
    rows, data = [], {"parts": {}}
    for name in PARTS:
        res = read(out, name)
        st = state(name, res, exits.get(name))
        part = {"state": st, "exit": (exits.get(name) or {}).get("exit"), "goals": []}
        data["parts"][name] = part
        rows.append([name, "state", "", st, ""])
        if res is None:
            continue
        smoke = bool(res.get("smoke"))
        part["smoke"], part["passed"], part["completed"] = (
            smoke,
            res.get("passed"),
            res.get("completed"),
        )
        line = checks_line(res)
        if line:
            rows.append([name, "checks before timing", "", line, ""])
        quant = res.get("quantizer") or {}
        if quant.get("status"):
            part["quantizer"] = quant["status"]
            rows.append(
                [
                    name,
                    "compiled quantizer",
                    "no fallback",
                    quant["status"],
                    "FALLBACK" if quant.get("fallbacks") else "ok",
                ]
            )
        for key, why in (res.get("skipped") or {}).items():
            rows.append([name, f"{key} part", "", f"skipped: {why}", ""])
        for key, err in (res.get("errors") or {}).items():
            rows.append([name, f"{key} part", "", f"error: {err}"[:200], "ERROR"])
        for g in res.get("goals") or []:
            part["goals"].append(g)
            rows.append([name, g["goal"], fmt_target(g), fmt_value(g), verdict(g, smoke)])
    goals = [g for p in data["parts"].values() for g in p["goals"]]
    data["goals_met"] = sum(g.get("met") is True for g in goals)
    data["goals_missed"] = sum(g.get("met") is False for g in goals)
    data["goals_total"] = len(goals)
    return rows, data


def markdown(rows: list[list[str]]) -> str:
    lines = ["| part | what | goal | measured | verdict |", "| --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def parse_part(text: str) -> tuple[str, dict]:
    try:
        name, code, seconds, share = text.split(":")
        return name, {"exit": int(code), "seconds": int(seconds), "share": int(share)}
    except ValueError:
        raise SystemExit(
            f"gpu_summary.py: error: --part {text!r} is not NAME:EXIT:SECONDS:SHARE"
        ) from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument(
        "--part", action="append", default=[], help="NAME:EXIT:SECONDS:SHARE of a finished part"
    )
    ap.add_argument("--quiet", action="store_true", help="write the files, print nothing")
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    if not out.is_dir():
        raise SystemExit(f"gpu_summary.py: error: {out} is not a directory")
    exits = dict(parse_part(p) for p in args.part)
    rows, data = summarize(out, exits)
    text = markdown(rows)
    rest = data["goals_total"] - data["goals_met"] - data["goals_missed"]
    tail = (
        f"goals: {data['goals_met']} met, {data['goals_missed']} not met, "
        f"{rest} not judged or not measured (of {data['goals_total']})\n"
    )
    (out / "summary.md").write_text("# bench/gpu_all.sh summary\n\n" + text + "\n" + tail)
    (out / "summary.json").write_text(json.dumps(data, indent=1))
    if not args.quiet:
        print(text + tail, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

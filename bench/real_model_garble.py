"""arithmetic_qa's garble rate on responses of a real chat model, from committed samples.

Reads the 600 sampled responses of the real model's fp32 GRPO run (SmolLM2-135M-Instruct,
arithmetic_qa, 48 new tokens at temperature 1, steps 0-149;
docs/real-model/learn-run/run/samples.jsonl), scores each with the task's reward as a run
does, and prints a markdown report: the garble rate and each kind's rate by step range,
the distributions the thresholds are read from, and examples. No model is run.

    python bench/real_model_garble.py > docs/real-model/garble-rates.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)
from fp8rl.tasks import ArithmeticQATask, Sample
from fp8rl.tasks.arithmetic_qa import (
    FOREIGN_SHARE,
    REPEAT_NGRAM_COUNT,
    REPEAT_RUN,
    foreign_share,
    garble_tokens,
    longest_ngram_count,
    longest_run,
)
from fp8rl.tasks.base import cut_at_stops

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "docs" / "real-model" / "learn-run" / "run" / "samples.jsonl"
COMMAND = "python bench/real_model_garble.py > docs/real-model/garble-rates.md"
BUCKETS = ((0, 9), (10, 49), (50, 99), (100, 149))
KINDS = ("no_number", "repeat", "foreign")
EXAMPLES = 5


def load(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    task = ArithmeticQATask()
    for row in rows:
        sample = Sample(prompt=f"What is {row['question']}?", answer=row["answer"])
        result = task.reward(row["response"], sample)
        text = cut_at_stops(row["response"], task.config.stop_strings)
        tokens = garble_tokens(text)
        row.update(
            score=result.score,
            info=result.info,
            ngram=longest_ngram_count(tokens),
            run=longest_run(tokens),
            foreign=foreign_share(text),
        )
    return rows


def share(x: float) -> str:
    return f"{100 * x:.1f} %"


def pct(part: int, whole: int) -> str:
    return share(part / whole) if whole else "-"


def rates_table(rows: list[dict]) -> list[str]:
    head = "| steps | N | garble rate | " + " | ".join(KINDS)
    out = [
        head + " | not parsed (the old garble rate) | ended before 48 tokens | mean reward |",
        "|---" * (len(KINDS) + 6) + "|",
    ]
    spans = [*BUCKETS, (BUCKETS[0][0], BUCKETS[-1][1])]
    for lo, hi in spans:
        sel = [r for r in rows if lo <= r["step"] <= hi]
        n = len(sel)
        cells = [
            f"{lo}-{hi}" if (lo, hi) in BUCKETS else f"**all {lo}-{hi}**",
            str(n),
            pct(sum(r["info"]["malformed"] for r in sel), n),
            *(pct(sum(k in r["info"]["malformations"] for r in sel), n) for k in KINDS),
            pct(sum(not r["info"]["parsed"] for r in sel), n),
            pct(sum(r["info"]["ended"] for r in sel), n),
            f"{sum(r['score'] for r in sel) / n:.3f}" if n else "-",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def histogram(title: str, rows: list[dict], key, labels) -> list[str]:
    """One table row per (label, predicate) pair: how many responses fall there."""
    out = [f"| {title} | responses |", "|---|---|"]
    out += [f"| {label} | {sum(1 for r in rows if pred(key(r)))} |" for label, pred in labels]
    return out


def listing(rows: list[dict], limit: int | None = EXAMPLES, label=None) -> list[str]:
    """Responses one per line, JSON-quoted (newlines escaped), in a fence of their own,
    each after `label(row)` when given."""
    chosen = rows if limit is None else rows[:limit]
    if not chosen:
        return ["(none)"]
    lines = [
        f"{label(r) if label else ''}step {r['step']}: "
        + json.dumps(r["response"], ensure_ascii=False)
        for r in chosen
    ]
    return ["````text", *lines, "````"]


def calibration(rows: list[dict]) -> list[str]:
    out = ["## What the thresholds are read from", ""]
    out += histogram(
        "most frequent 3-gram's count",
        rows,
        lambda r: r["ngram"],
        [(str(k), lambda v, k=k: v == k) for k in range(REPEAT_NGRAM_COUNT)]
        + [(f">= {REPEAT_NGRAM_COUNT} (repeat)", lambda v: v >= REPEAT_NGRAM_COUNT)],
    )
    out += [""] + histogram(
        "longest run of one token",
        rows,
        lambda r: r["run"],
        [(str(k), lambda v, k=k: v == k) for k in range(REPEAT_RUN)]
        + [(f">= {REPEAT_RUN} (repeat)", lambda v: v >= REPEAT_RUN)],
    )
    edges = (0.0, 0.05, 0.10, 0.15, FOREIGN_SHARE)
    bins = [("0", lambda v: v == 0)]
    bins += [
        (f"over {share(a)} to {share(b)}", lambda v, a=a, b=b: a < v <= b)
        for a, b in zip(edges, edges[1:], strict=False)
    ]
    bins.append((f"over {share(FOREIGN_SHARE)} (foreign)", lambda v: v > FOREIGN_SHARE))
    out += [""] + histogram(
        "foreign share of non-space characters", rows, lambda r: r["foreign"], bins
    )
    below = [r for r in rows if r["ngram"] == REPEAT_NGRAM_COUNT - 1]
    out += [
        "",
        f"Every response whose most frequent 3-gram occurs {REPEAT_NGRAM_COUNT - 1} times, one "
        f"short of `repeat` ({len(below)}):",
        "",
        *listing(below, None),
        "",
        "Every response with a foreign share over 5 %, the share first:",
        "",
    ]
    odd = sorted((r for r in rows if r["foreign"] > 0.05), key=lambda r: r["foreign"])
    out += listing(odd, None, label=lambda r: f"{share(r['foreign'])}, ")
    return out


def examples(rows: list[dict]) -> list[str]:
    out = ["## Examples", ""]
    for kind in KINDS:
        flagged = [r for r in rows if kind in r["info"]["malformations"]]
        out += [f"`{kind}`, the first {EXAMPLES} of {len(flagged)}:", "", *listing(flagged), ""]
    cut = [r for r in rows if not r["info"]["malformed"] and not r["info"]["ended"]]
    out += [
        f"Well-formed and cut at the token limit, the first {EXAMPLES} of {len(cut)}:",
        "",
        *listing(cut),
    ]
    return out


def report(rows: list[dict], source: str) -> str:
    mismatched = sum(r["score"] != r["reward"] for r in rows)
    out = [
        "# arithmetic_qa garble rates of the real model's GRPO run",
        "",
        f"Written by `{COMMAND}` from `{source}` ({len(rows)} responses of SmolLM2-135M-Instruct,"
        " fp32 GRPO, at most 48 new tokens at temperature 1; the run logged 4 per step). Each "
        "response is scored with `arithmetic_qa`'s reward; `malformed` is its garble "
        "definition (`no_number`: no number at all; `repeat`: a 3-gram of words and "
        f"punctuation {REPEAT_NGRAM_COUNT}+ times or one token {REPEAT_RUN}+ times in a row; "
        f"`foreign`: over {share(FOREIGN_SHARE)} of the non-space characters outside ASCII, math "
        "symbols and typographic punctuation; docs/tasks.md). A response may show several "
        "kinds. Rewards that differ from the run's logged ones: "
        f"{mismatched} of {len(rows)}. A kind at 0 % flagged nothing here: its threshold is "
        "read from the unflagged side below, which shows how far ordinary answers go.",
        "",
        *rates_table(rows),
        "",
        *calibration(rows),
        "",
        *examples(rows),
    ]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=Path, default=SAMPLES)
    args = parser.parse_args()
    path = args.samples.resolve()
    source = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    print(report(load(path), str(source)), end="")


if __name__ == "__main__":
    main()

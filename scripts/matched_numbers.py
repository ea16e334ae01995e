"""The numbers behind docs/study-matched.md's corrected prose (issue 45), recomputed from the
committed runs without running a step: the reward gap since step 100, the share of
`matched`'s gaps each of CC and the oracle removes, the degradations of the CC arms against
the others, the entropy gap of steps 0-99, and the 8-bit excess at 8 updates a step against
the long study's 2.

    PYTHONPATH=src python scripts/matched_numbers.py   # writes docs/study-matched/numbers.{json,md}

The matched and long studies share the warm start, the seeds, the learning rate and every
setting but the updates a step and the horizon, so their `fp8` arms are compared over the
steps both ran (1-199), seed by seed.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from fp8rl.study.run_checks import complete_runs, read_json, sweep_spec
from fp8rl.study.sweep.stats import seed_mean, summarize_seeds, write_json
from fp8rl.study.window_gaps import gap
from fp8rl.utils import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
MATCHED = ROOT / "docs" / "study-matched"
LONG = ROOT / "docs" / "study-long" / "runs"
ENTROPY, REWARD = "rollout/entropy", "rollout/reward"
LAST = (250, 300)
COMMON_STEPS = 200  # the long study's horizon


def fisher_two_sided(a: int, b: int, c: int, d: int) -> float:
    """Fisher's exact test of the 2x2 table [[a, b], [c, d]]: the probability, under fixed
    margins, of every table no more likely than the observed one."""
    row, col, n = a + b, a + c, a + b + c + d

    def p(x: int) -> float:
        return math.comb(col, x) * math.comb(n - col, row - x) / math.comb(n, row)

    observed = p(a)
    lo, hi = max(0, row + col - n), min(row, col)
    return math.fsum(p(x) for x in range(lo, hi + 1) if p(x) <= observed * (1 + 1e-9))


def removed_shares(runs: dict) -> dict:
    """Per metric, the last window's gaps to bf16 and the share of `matched`'s gap that CC and
    the oracle remove (1 - arm's mean gap / matched's mean gap), with the within-pair gaps."""
    out = {}
    for key, name in ((ENTROPY, "entropy"), (REWARD, "reward")):
        gaps = {a: gap(runs, a, "bf16", key, *LAST) for a in runs if a.startswith("matched")}
        base = gaps["matched"]["mean"]
        out[name] = {
            "gap_to_bf16": gaps,
            "share_removed": {a: 1 - g["mean"] / base for a, g in gaps.items() if a != "matched"},
            "minus_matched": {
                a: gap(runs, a, "matched", key, *LAST) for a in gaps if a != "matched"
            },
        }
    return out


def degradations(verdict: dict, gate: dict, spec: dict) -> dict:
    """Degraded runs of the CC arms against every other arm's, with Fisher's test, and bf16's
    at the study's rate over the gate and the confirmatory runs."""
    cell = verdict["results"]["cells"][0]
    arms = {"bf16": cell["ref"]["degradation"]}
    arms |= {a: c["degradation"] for a, c in cell["compare"].items()}
    cc = {a for a, o in spec["arms"].items() if (o.get("loss") or {}).get("mode") == "calibrated"}
    count = {a: sum(s["degraded"] for s in d.values()) for a, d in arms.items()}
    runs = {a: len(d) for a, d in arms.items()}
    cc_d, cc_n = sum(count[a] for a in cc), sum(runs[a] for a in cc)
    other_d = sum(count[a] for a in arms if a not in cc)
    other_n = sum(runs[a] for a in arms if a not in cc)
    gate_cell = next(c for c in gate["cells"] if c["lr"] == spec["base"]["train"]["lr"])
    return {
        "per_arm": {a: [count[a], runs[a]] for a in arms},
        "cc_arms": sorted(cc),
        "cc": [cc_d, cc_n],
        "others": [other_d, other_n],
        "fisher_p_two_sided": fisher_two_sided(cc_d, cc_n - cc_d, other_d, other_n - other_d),
        "bf16_at_this_rate": [
            count["bf16"] + len(gate_cell["degraded"]),
            runs["bf16"] + len(gate_cell["reward_gain"]["per_seed"]),
        ],
    }


def eight_vs_two_updates(matched: dict, long: dict) -> dict:
    """The `fp8` arms of both studies over steps 1-199, per seed: the lower-clip excess (mean
    over shadow steps), the probability NMAE (S1) and the FP8 and BF16-shadow clip fractions
    (means over shadow steps: at 2 updates the shadow may clip nothing, so no S3 ratio)."""

    def stats(runs):
        rows = {s: [r for r in v if r["step"] < COMMON_STEPS] for s, v in runs["fp8"].items()}
        keys = {
            "excess": "shadow/lower_clip_excess",
            "nmae_prob": "shadow/nmae_prob",
            "clipfrac_fp8": "shadow/clipfrac_fp8",
            "clipfrac_bf16": "shadow/clipfrac_bf16",
        }
        return {
            name: summarize_seeds([seed_mean(rows[s], key) for s in sorted(rows)])
            for name, key in keys.items()
        }

    eight, two = stats(matched), stats(long)
    per_seed = [
        a / b for a, b in zip(eight["excess"]["per_seed"], two["excess"]["per_seed"], strict=True)
    ]
    return {
        "steps": [1, COMMON_STEPS - 1],
        "updates_8": eight,
        "updates_2": two,
        "excess_ratio_of_means": eight["excess"]["mean"] / two["excess"]["mean"],
        "excess_ratio_per_seed": per_seed,
    }


def compute() -> dict:
    out = MATCHED / "runs"
    spec = sweep_spec(out)
    runs = complete_runs(out, spec, (ENTROPY, REWARD))
    long = complete_runs(LONG, sweep_spec(LONG), (ENTROPY, REWARD))
    return {
        "matched_reward_gap_steps_100_299": gap(runs, "matched", "bf16", REWARD, 100, 300),
        "entropy_gap_steps_0_99": {
            a: gap(runs, a, "bf16", ENTROPY, 0, 100) for a in runs if a != "bf16"
        },
        "removed_last_50": removed_shares(runs),
        "degradations": degradations(
            read_json(out / "verdict-matched.json"),
            read_json(MATCHED / "gate" / "gate.json"),
            read_json(out / "spec.json"),
        ),
        "fp8_8_vs_2_updates": eight_vs_two_updates(runs, long),
    }


def _ci(s: dict, scale: float = 1.0, digits: int = 3) -> str:
    lo, hi = (scale * x for x in s["ci95"])
    return f"{scale * s['mean']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def to_md(r: dict) -> str:
    rm, dg, up = r["removed_last_50"], r["degradations"], r["fp8_8_vs_2_updates"]
    lines = [
        f"- `matched` - bf16 reward, steps 100-299: {_ci(r['matched_reward_gap_steps_100_299'])}",
        "- Δ entropy against bf16, steps 0-99: "
        + "; ".join(f"`{a}` {_ci(g)}" for a, g in r["entropy_gap_steps_0_99"].items()),
    ]
    for name, m in rm.items():
        shares = ", ".join(f"`{a}` {100 * v:.0f} %" for a, v in m["share_removed"].items())
        within = "; ".join(f"`{a}` - `matched` {_ci(g)}" for a, g in m["minus_matched"].items())
        lines.append(
            f"- {name}, steps 250-299: share of `matched`'s gap removed: {shares}; {within}"
        )
    lines += [
        f"- degraded runs: CC arms ({', '.join(dg['cc_arms'])}) {dg['cc'][0]}/{dg['cc'][1]}, "
        f"the other arms {dg['others'][0]}/{dg['others'][1]}, Fisher's exact test (two-sided) "
        f"p = {dg['fisher_p_two_sided']:.3f}; bf16 at the study's rate (gate and confirmatory) "
        f"{dg['bf16_at_this_rate'][0]}/{dg['bf16_at_this_rate'][1]}",
    ]
    for n, s in (("8", up["updates_8"]), ("2", up["updates_2"])):
        lines.append(
            f"- `fp8`, {n} updates a step, steps 1-199: lower-clip excess "
            f"{100 * s['excess']['mean']:.3f} ± {100 * s['excess']['se']:.3f} pp, probability NMAE "
            f"{100 * s['nmae_prob']['mean']:.2f} ± {100 * s['nmae_prob']['se']:.2f} %, "
            f"clip fraction FP8 {100 * s['clipfrac_fp8']['mean']:.3f} %, "
            f"BF16 shadow {100 * s['clipfrac_bf16']['mean']:.3f} %"
        )
    seeds = ", ".join(f"{x:.1f}" for x in up["excess_ratio_per_seed"])
    lines.append(
        f"- excess, 8 over 2 updates: {up['excess_ratio_of_means']:.1f}x (per seed {seeds})"
    )
    return "\n".join(lines)


def main() -> int:
    result = compute()
    write_json(MATCHED / "numbers.json", result)
    text = to_md(result)
    atomic_write_text(MATCHED / "numbers.md", text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

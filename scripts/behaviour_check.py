"""Behaviour unchanged? Fixed-seed tiny runs of the settings a refactor or a speed-up must not
change, recorded to a JSON file and compared to the last bit.

    python scripts/behaviour_check.py record before.json     # on the code before the change
    python scripts/behaviour_check.py record after.json      # after it
    python scripts/behaviour_check.py compare before.json after.json

`compare` prints every metric value that differs (time/* left out) and exits 1 if any does,
or if it compared nothing. The settings cover every loss path a refactor of the step crosses:
the token- and sequence-level (GSPO) shadow paths, an FP8 and a microscaled (NVFP4) recipe,
the per-response rows of `log.response_stats`, a resume, and one process sampling as two
data-parallel ranks (`rollout_shards`).
Bit-exact reruns hold on one machine only: record both files on the same machine.
When results change (on purpose), the docs' demo numbers are stale: rerun `make demo` and
copy its summary into docs/demo/ (tests/test_readme_demo.py shows the lines to update).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
SHADOW = {"interval": 1, "shadow_every": 1, "min_tokens": 2, "diagnostics": True}

# name -> the sections that differ from `base`
SETTINGS: dict[str, dict] = {
    "calibrated-tensorwise-micro": {
        "rollout": {"precision": "fp8-tensorwise"},
        "train": {"precision": "fp8-tensorwise", "micro_batch_size": 3},
        "loss": {"mode": "calibrated"},
        "calibration": SHADOW,
    },
    "calibrated-paper-rule": {
        "loss": {"mode": "calibrated"},
        "calibration": {**SHADOW, "rule": "paper"},
    },
    "dapo-dual-overlong": {
        "loss": {"mode": "dapo", "dual_clip": 3.0, "overlong_buffer": 2},
        "train": {"logprob_micro_batch_size": 4},
    },
    "cispo": {"loss": {"mode": "cispo"}},
    "bapo": {"loss": {"mode": "bapo"}},
    "relax-lower": {"loss": {"mode": "relax_lower"}},
    "grpo-bf16": {"rollout": {"precision": "bf16"}, "train": {"precision": "bf16"}},
    "oracle-clip": {"loss": {"mode": "grpo", "clip_source": "bf16"}, "calibration": SHADOW},
    "ratio-noise": {
        "train": {"precision": "bf16"},
        "loss": {"mode": "grpo", "ratio_noise": {"sd": 0.05, "corr": 0.5}},
        "calibration": SHADOW,
    },
    "blockwise": {  # 128-aligned dims, or every layer would stay high precision
        "model": {"source": "tiny", "tiny": {**TINY, "hidden_size": 128, "intermediate_size": 256}},
        "rollout": {"precision": "fp8-blockwise"},
        "train": {"precision": "fp8-blockwise", "logprob_micro_batch_size": 4},
        "loss": {"mode": "calibrated"},
        "calibration": SHADOW,
    },
    "chain-arithmetic": {
        "task": {"name": "chain_arithmetic", "options": {"train_size": 32, "test_size": 8}},
        "rollout": {"max_new_tokens": 8},
    },
    "gspo-calibrated": {"loss": {"mode": "gspo_calibrated"}, "calibration": SHADOW},
    "nvfp4-calibrated": {  # a microscaled recipe (32-aligned dims) through the shadow path
        "train": {"precision": "nvfp4"},
        "loss": {"mode": "calibrated"},
        "calibration": SHADOW,
    },
    "response-stats": {  # responses.jsonl rows are compared too (RESPONSES below)
        "loss": {"mode": "calibrated"},
        "calibration": SHADOW,
        "log": {"response_stats": True},
    },
}
RESUMED = "calibrated-resume"  # calibrated, 2 steps, then resumed to 4 from its checkpoint
SHARDED = "rollout-shards"  # one process sampling as 2 data-parallel ranks would
RESPONSES = "/responses"  # a setting's responses.jsonl rows are stored under NAME + this


def base(out_dir: Path) -> dict:
    return {
        "name": "behaviour",
        "task": {
            "name": "arithmetic",
            "options": {"digits": 1, "ops": "+", "train_size": 64, "test_size": 16},
        },
        "model": {"source": "tiny", "tiny": dict(TINY)},
        "rollout": {"precision": "fp8-rowwise", "prompts_per_step": 4, "n": 4, "max_new_tokens": 5},
        "train": {"precision": "fp8-rowwise", "steps": 4, "lr": 1e-3, "mini_batches": 2},
        "loss": {"mode": "grpo"},
        "calibration": {"interval": 1, "min_tokens": 2},
        "log": {"out_dir": str(out_dir), "checkpoint_every": 0, "eval_size": 4, "progress": False},
    }


def merged(out_dir: Path, sections: dict) -> dict:
    data = base(out_dir)
    for name, values in sections.items():
        data[name] = {**data[name], **values}
    return data


def fit(data: dict, *, resume: bool = False, rollout_shards: int = 1) -> list[dict]:
    from fp8rl.config import config_from_dict
    from fp8rl.tasks import RewardResult
    from fp8rl.train.trainer import Trainer

    trainer = Trainer(config_from_dict(data), progress=False)
    trainer.rollout_shards = rollout_shards
    # a random tiny model never answers right: the text's parity gives every group mixed
    # rewards, hence non-zero advantages and real updates
    trainer.task.reward = lambda text, sample: RewardResult(
        float(sum(map(ord, text)) % 2), {"parsed": True}
    )
    return trainer.fit(resume=resume)


def strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def responses(run_dir: Path) -> list[dict]:
    from fp8rl.train.runlog import RESPONSES_FILE

    lines = (run_dir / RESPONSES_FILE).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def record(path: str) -> None:
    import torch

    torch.set_num_threads(1)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, sections in SETTINGS.items():
            data = merged(Path(tmp) / name, sections)
            out[name] = strip(fit(data))
            if data["log"].get("response_stats"):
                out[name + RESPONSES] = responses(Path(data["log"]["out_dir"]))
            print(f"{name}: {len(out[name])} steps", flush=True)
        data = merged(Path(tmp) / SHARDED, {"loss": {"mode": "calibrated"}})
        out[SHARDED] = strip(fit(data, rollout_shards=2))
        data = merged(Path(tmp) / RESUMED, {"loss": {"mode": "calibrated"}, "calibration": SHADOW})
        data["train"]["steps"], data["log"]["checkpoint_every"] = 2, 2
        first = fit(data)
        data["train"]["steps"] = 4
        out[RESUMED] = strip(first + fit(data, resume=True))
        print(f"{RESUMED}: {len(out[RESUMED])} steps", flush=True)
    Path(path).write_text(json.dumps(out, indent=1, sort_keys=True))


def compare(a_path: str, b_path: str) -> int:
    a, b = (json.loads(Path(p).read_text()) for p in (a_path, b_path))
    differ = values = 0
    for name in sorted(set(a) | set(b)):
        ra, rb = a.get(name), b.get(name)
        if ra is None or rb is None or len(ra) != len(rb):
            print(f"{name}: only in one file, or another number of steps")
            differ += 1
            continue
        for x, y in zip(ra, rb, strict=True):
            for k in sorted(set(x) | set(y)):
                values += 1
                if x.get(k, "<missing>") != y.get(k, "<missing>"):
                    differ += 1
                    where = f"step {x['step']}" if "step" in x else "row"
                    print(f"{name} {where} {k}: {x.get(k, '<missing>')} -> {y.get(k)}")
    print(f"{differ} of {values} values differ")
    if not values:
        print("nothing was compared: the files hold no rows")
    return 1 if differ or not values else 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "record":
        record(argv[1])
        return 0
    if len(argv) == 3 and argv[0] == "compare":
        return compare(argv[1], argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

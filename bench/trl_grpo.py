"""fp8rl's GRPO step against TRL's `GRPOTrainer` on the real model, same work, fp32, CPU.

Both train SmolLM2-135M-Instruct (the folder `fp8rl model fetch smollm2-135m-instruct`
writes) on the same `arithmetic_qa` prompts of configs/real-model.yaml, rendered by the same
chat template: P prompts x G responses a step, at most T new tokens, temperature 1, one
optimizer update per step (TRL: steps_per_generation 1, num_iterations 1; fp8rl: one
mini-batch), lr 1e-6, no KL term (TRL's beta 0: fp8rl has none), no gradient checkpointing
(TRL's default turns it on; fp8rl keeps activations), float32 (TRL bf16 off;
fp8rl's `bf16` precision is the master dtype, float32 here). A step is sampling, the
old-log-prob pass where it has one, rewards and the update.
The two alternate: after one untimed warm-up step each, each round runs one fp8rl step, then
one TRL step (a `train()` of max_steps 1 on the same objects, timed by a callback from step
begin to step end, so its set-up is not counted). Medians of --rounds rounds, wall
and CPU seconds of this process.

    python bench/trl_grpo.py --out docs/real-model/trl-grpo          # .md and .json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import _srcpath  # noqa: E402, F401  (src/ on sys.path before fp8rl)
from fp8rl.config import load_config  # noqa: E402
from fp8rl.train.trainer import Trainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "real-model.yaml"


def fp8rl_trainer(out: Path, prompts: int, group: int, tokens: int, model: str) -> Trainer:
    overrides = [
        f"log.out_dir={out}",
        f"model.source={model}",
        "rollout.precision=bf16",
        "train.precision=bf16",
        "loss.mode=grpo",
        f"rollout.prompts_per_step={prompts}",
        f"rollout.n={group}",
        f"rollout.max_new_tokens={tokens}",
        "train.mini_batches=1",
        "train.lr=1e-6",
        "train.steps=1000",
        "log.progress=false",
        "log.eval_every=0",
        "log.eval_size=0",
        "log.checkpoint_every=0",
    ]
    return Trainer(load_config(CONFIG, overrides), progress=False)


class _StepClock:
    """A TrainerCallback's timings of each optimizer step (generation included)."""

    def __init__(self):
        self.rows: list[tuple[float, float]] = []

    def callback(self):
        from transformers import TrainerCallback

        clock = self

        class _Cb(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                clock.t0, clock.c0 = time.perf_counter(), time.process_time()

            def on_step_end(self, args, state, control, **kw):
                clock.rows.append((time.perf_counter() - clock.t0, time.process_time() - clock.c0))

        return _Cb()


def trl_trainer(trainer: Trainer, out: Path, prompts: int, group: int, tokens: int, clock):
    """TRL's GRPOTrainer on the fp8rl trainer's own rendered prompts and rewards."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    source = trainer.cfg.model.source
    samples = trainer.train_samples
    by_prompt = {s.prompt: s for s in samples}
    task = trainer.task

    def reward(prompts, completions, **_):
        return [
            task.reward(c, by_prompt[p]).score for p, c in zip(prompts, completions, strict=True)
        ]

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(source)
    args = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        report_to="none",
        max_steps=1,
        logging_steps=1,
        per_device_train_batch_size=prompts * group,
        num_generations=group,
        steps_per_generation=1,
        num_iterations=1,
        max_completion_length=tokens,
        learning_rate=1e-6,
        beta=0.0,
        gradient_checkpointing=False,  # fp8rl keeps activations too: the same work
        seed=0,
        save_strategy="no",
        bf16=False,
        temperature=1.0,
        disable_tqdm=True,
    )
    data = Dataset.from_list([{"prompt": s.prompt} for s in samples])
    return GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        processing_class=tok,
        callbacks=[clock.callback()],
    )


def trl_step(trl, clock) -> tuple[float, float]:
    """One optimizer step: a train() of max_steps 1 (its set-up falls outside the clock)."""
    before = len(clock.rows)
    trl.train()
    if len(clock.rows) != before + 1:
        raise SystemExit(
            f"trl-bench: a train() of max_steps 1 made {len(clock.rows) - before} steps"
        )
    return clock.rows[-1]


def fp8rl_step(trainer: Trainer) -> tuple[float, float]:
    row = trainer.run(1)[0]
    return row["time/wall_step"], row["time/cpu_step"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="models/smollm2-135m-instruct")
    ap.add_argument("--out", type=Path, help="write OUT.md and OUT.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rows = {"fp8rl": [], "trl": []}
    with tempfile.TemporaryDirectory(prefix="fp8rl-trl-bench-") as tmp:
        ours = fp8rl_trainer(Path(tmp) / "fp8rl", a.prompts, a.group, a.tokens, a.model)
        clock = _StepClock()
        trl = trl_trainer(ours, Path(tmp) / "trl", a.prompts, a.group, a.tokens, clock)
        fp8rl_step(ours)
        trl_step(trl, clock)  # warm-ups
        for r in range(a.rounds):
            print(f"[trl-bench] round {r + 1}/{a.rounds}", file=sys.stderr, flush=True)
            rows["fp8rl"].append(fp8rl_step(ours))
            rows["trl"].append(trl_step(trl, clock))
    med = {k: [statistics.median(x[i] for x in v) for i in (0, 1)] for k, v in rows.items()}
    import trl as trl_pkg

    head = (
        f"SmolLM2-135M-Instruct, fp32, {a.prompts} prompts x {a.group} responses, at most "
        f"{a.tokens} new tokens, one update a step; {a.rounds} rounds after a warm-up, "
        f"alternating; torch {torch.__version__}, trl {trl_pkg.__version__}, {a.threads} threads"
    )
    lines = [
        head,
        "",
        "| trainer | step wall s (median) | step CPU s (median) |",
        "|---|---|---|",
        *(f"| {k} | {v[0]:.1f} | {v[1]:.1f} |" for k, v in med.items()),
        "",
        f"TRL / fp8rl: {med['trl'][0] / med['fp8rl'][0]:.2f}x wall, "
        f"{med['trl'][1] / med['fp8rl'][1]:.2f}x CPU.",
    ]
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".md").write_text(text + "\n", encoding="utf-8")
        record = {"header": head, "rounds": rows, "median": med}
        a.out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

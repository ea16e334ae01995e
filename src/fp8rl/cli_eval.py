"""`fp8rl eval`: a policy's accuracy on a task split; `--out` also writes each problem's
result, so two policies' accuracies can be compared paired by problem."""

from __future__ import annotations

from pathlib import Path


def add_eval(sub) -> None:
    from .cli_common import EPILOG_OVERRIDES

    e = sub.add_parser(
        "eval",
        help="accuracy (mean@k, pass@k) of a policy on a task split",
        epilog=EPILOG_OVERRIDES,
    )
    e.add_argument("--config", help="YAML config of the model, task and rollout precision")
    e.add_argument(
        "--checkpoint", help="checkpoint folder, run folder (latest checkpoint) or .safetensors"
    )
    e.add_argument("--split", default="test")
    e.add_argument("--k", type=int, default=1, help="samples per prompt (1: greedy)")
    e.add_argument("--limit", type=int, default=None, help="at most this many problems")
    e.add_argument(
        "--out",
        help="JSON file: the summary and per problem its index, question, answer, k and the "
        "number of correct samples",
    )
    e.add_argument("overrides", nargs="*", metavar="key=value")


def cmd_eval(a) -> int:
    from .cli_common import _at_least, _dumps, _trainer_for
    from .errors import ConfigError, os_errors
    from .train.evaluate import evaluate_policy
    from .utils import atomic_write_text

    _at_least("--limit", a.limit, 1)
    _at_least("--k", a.k, 1)
    # before the model loads: a sampling pass of minutes must not end on a bad path
    if a.out is not None and (Path(a.out).is_dir() or not Path(a.out).parent.is_dir()):
        raise ConfigError("--out", a.out, "a file in an existing folder")
    problems = [] if a.out is not None else None
    with _trainer_for(a) as t:
        result = evaluate_policy(
            t.model,
            t.engine,
            t.task,
            split=a.split,
            limit=a.limit,
            max_new_tokens=t.cfg.rollout.max_new_tokens,
            k=a.k,
            temperature=t.cfg.rollout.temperature,
            seed=t.cfg.train.seed,
            problems=problems,
        )
        setting = {
            "checkpoint": a.checkpoint,
            "split": a.split,
            "k": a.k,
            "limit": a.limit,
            "temperature": t.cfg.rollout.temperature if a.k > 1 else 0.0,
            "seed": t.cfg.train.seed,
            "max_new_tokens": t.cfg.rollout.max_new_tokens,
        }
    if a.out is not None:
        with os_errors("write", a.out):
            atomic_write_text(
                Path(a.out), _dumps({**setting, "summary": result, "problems": problems}) + "\n"
            )
    print(_dumps(result))
    return 0

"""The `fp8rl` command: train | sweep | demo | warmstart | report | diagnose | eval | model.

User errors (bad config values, missing files) and OS errors (permission, full disk, a file
where a folder should be) print one line and exit 2; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._cpu_env import apply_cpu_defaults

apply_cpu_defaults()  # before anything imports torch: libgomp reads it once, at load

from .cli_common import EPILOG_OVERRIDES, _at_least, _dumps, _trainer_for  # noqa: E402
from .cli_eval import add_eval, cmd_eval  # noqa: E402  (after the thread default)
from .cli_model import add_model, cmd_model  # noqa: E402


class _Parser(argparse.ArgumentParser):
    """A callable epilog is built only when the help is shown (the registries import torch)."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fp8rl", description="Full-pipeline FP8 RL of LLMs with Calibrated Clipping."
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for add in (_train, _sweep, _demo, _warmstart, _report, _diagnose, add_eval, add_model):
        add(sub)
    for command in sub.choices.values():  # also after the command: `fp8rl train --debug`
        command.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
    return p


def _train_epilog() -> str:
    """The overrides, with the loss modes and precisions the config accepts (the registries)."""
    from .config.precision import PRECISIONS
    from .rl.loss_modes import LOSS_MODES

    return (
        f"{EPILOG_OVERRIDES} Loss modes (loss.mode): {', '.join(LOSS_MODES)}. Precisions "
        f"(rollout.precision, train.precision): {', '.join(PRECISIONS)}."
    )


def _train(sub) -> None:
    t = sub.add_parser("train", help="run GRPO/DAPO training from a config", epilog=_train_epilog)
    t.add_argument("--config", help="YAML config (see configs/); defaults apply where omitted")
    t.add_argument("--out", help="run folder (overrides log.out_dir)")
    again = t.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="continue from the run folder's newest intact checkpoint, to the train.steps "
        "the run was started with (train.steps=N extends it)",
    )
    again.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in a run folder that holds a run (its files move to RUN/.old-<time>/)",
    )
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("overrides", nargs="*", metavar="key=value")


def _sweep(sub) -> None:
    w = sub.add_parser(
        "sweep",
        help="several arms x seeds in parallel, then mean +- SE over seeds",
        epilog="SPEC holds base (a run config), arms (name -> overrides), seeds, "
        "skip_steps and final_window; see docs/training.md.",
    )
    w.add_argument("spec", metavar="SPEC.yaml", help="the sweep spec")
    w.add_argument("--out", required=True, help="output folder: OUT/ARM/seed-S run folders")
    w.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="runs in parallel (default: the usable cores, or the runs that fit in memory "
        "if fewer)",
    )
    w.add_argument(
        "--threads", type=int, default=1, help="torch threads per run (default 1: bit-stable)"
    )
    w.add_argument("--overwrite", action="store_true", help="rerun complete runs too")
    w.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a spec key before the sweep (repeatable), e.g. --set base.train.steps=2",
    )
    w.add_argument("--no-progress", action="store_true", help="no progress bar")


def _demo(sub) -> None:
    d = sub.add_parser(
        "demo",
        help="warm start a tiny Qwen3, then GRPO in bf16, FP8 and calibrated FP8, "
        "3 seeds each (CPU)",
    )
    d.add_argument("--quick", action="store_true", help="a reduced run (a pipeline smoke test)")
    d.add_argument("--jobs", type=int, default=None, help="runs in parallel (default: CPU cores)")
    d.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    d.add_argument("--config", help="a demo YAML (default: the packaged configs/demo.yaml)")
    d.add_argument("--no-progress", action="store_true")


def _warmstart(sub) -> None:
    s = sub.add_parser(
        "warmstart",
        help="build (or find) the cached supervised warm start of a config's task and model",
        epilog="The warm start `model.warm_start=auto` loads; cached under $FP8RL_CACHE "
        "(default ~/.cache/fp8rl). " + EPILOG_OVERRIDES,
    )
    s.add_argument("--config", help="YAML config (task, model and the warm_start section)")
    s.add_argument(
        "--spec", help="a sweep spec instead: every distinct warm start of its runs, one by one"
    )
    s.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --spec: set a spec key first, as fp8rl sweep --set does",
    )
    s.add_argument(
        "--out",
        help="also copy the weights to this .safetensors file, its info (sha256 included) "
        "beside it as .json: a study's committed start",
    )
    s.add_argument("--no-progress", action="store_true")
    s.add_argument("overrides", nargs="*", metavar="key=value")


def _report(sub) -> None:
    r = sub.add_parser("report", help="plots and a markdown table of one or more run folders")
    r.add_argument("runs", nargs="+", metavar="RUN_DIR")
    r.add_argument("--out", default=None, help="output folder (default: the first run's report/)")


def _diagnose(sub) -> None:
    g = sub.add_parser(
        "diagnose",
        help="BF16 shadow diagnostics of a checkpoint on a task; weights unchanged",
        epilog=EPILOG_OVERRIDES,
    )
    g.add_argument("--config", help="YAML config of the model, task and precisions")
    g.add_argument(
        "--checkpoint", help="checkpoint folder, run folder (latest checkpoint) or .safetensors"
    )
    g.add_argument(
        "--steps", type=int, default=1, help="probe steps to pool (each restores the weights)"
    )
    g.add_argument("overrides", nargs="*", metavar="key=value")


def cmd_train(a) -> int:
    from .config import keep_precision, load_config
    from .errors import Fp8rlError, os_errors
    from .study.report import summarize
    from .train.distributed import DistributedTrainer, init_from_env, shutdown
    from .train.fit_checks import all_updates_skipped
    from .train.run_folder import resume_config
    from .train.runlog import read_metrics
    from .train.trainer import Trainer, install_sigterm_handler
    from .utils import atomic_write_text

    overrides = list(a.overrides) + ([f"log.out_dir={a.out}"] if a.out else [])
    cfg = load_config(a.config, overrides)
    if a.resume:
        given = any(o.split("=", 1)[0].strip() == "train.steps" for o in overrides)
        cfg = resume_config(cfg, lambda o: load_config(a.config, [*overrides, o]), given)
    install_sigterm_handler()
    # under torchrun (WORLD_SIZE > 1) every rank runs the same trainer on its share of the batch
    trainer_cls = DistributedTrainer if init_from_env() else Trainer
    s = None
    try:
        progress = not a.no_progress and cfg.log.progress
        trainer = trainer_cls(cfg, progress=progress, resuming=a.resume)
        # held across fit, the evaluation and final.json: no other process comes in between
        lock = trainer.lock_run_folder("fp8rl train --resume" if a.resume else "fp8rl train")
        try:
            trainer.fit(resume=a.resume, overwrite=a.overwrite)
            final = trainer.evaluate() if cfg.log.eval_size else {}
            if trainer.dp.is_main:
                # the whole metrics.jsonl: a resumed run sums up like an uninterrupted one
                rows = read_metrics(cfg.log.out_dir, quiet=True)
                s = summarize(rows)
                s.update(final)
                s.update(keep_precision.summary(cfg, trainer.conversion))
                if skipped := all_updates_skipped(rows):
                    s["all_updates_skipped"] = skipped
                if trainer.shape_warnings:  # a run named for a recipe that not every layer ran
                    s["fp8_conversion_warning"] = "; ".join(trainer.shape_warnings)
                with os_errors("write the run summary"):
                    atomic_write_text(Path(cfg.log.out_dir) / "final.json", _dumps(s))
        finally:
            if lock is not None:
                lock.release()
        # ranks leave together: rank 1 tearing gloo down while rank 0 still evaluated and
        # wrote final.json aborted a rank (SIGABRT) now and then, failing the torchrun job
        trainer.dp.barrier()
    finally:
        shutdown()
    if s is not None:
        print(_dumps({k: v for k, v in s.items() if not isinstance(v, list)}))
        if s.get("all_updates_skipped"):
            raise Fp8rlError(s["all_updates_skipped"])
    return 0


def cmd_sweep(a) -> int:
    from .study.sweep import run_sweep
    from .study.sweep.plots import plot_sweep, summary_table
    from .study.sweep.spec import load_spec
    from .train.run_folder import held
    from .utils import atomic_write_text

    spec = load_spec(a.spec, a.set)
    with held(a.out, "fp8rl sweep"):  # through the plots and sweep.md (run_sweep holds it too)
        agg = run_sweep(
            spec,
            a.out,
            jobs=a.jobs,
            threads=a.threads,
            overwrite=a.overwrite,
            progress=not a.no_progress,
        )
        plots = plot_sweep(a.out, agg)
        table = summary_table(agg)
        atomic_write_text(
            Path(a.out, "sweep.md"),
            "# fp8rl sweep\n\n"
            + table
            + "\n\n"
            + "\n".join(f"![{p.stem}]({p.name})" for p in plots)
            + "\n",
        )
        chosen = _grid_cells(spec, a.out)
    print(table)
    if chosen:
        print(f"\ncells.md and phase_*.png in {a.out}: {chosen}")
    print(
        f"\nmean ± SE over seeds; aggregate.json, sweep.md and {len(plots)} plots in {a.out}, "
        f"runs in {a.out}/ARM/seed-S"
    )
    return 0


def _grid_cells(spec, out: str) -> str | None:
    """A grid sweep with a `bf16` and an `fp8` arm: its cell table, phase plots and chosen
    cell (study/sweep/phase.py); the line naming the chosen cell (or why none is), or None
    for any other sweep."""
    from .study.sweep.phase import chosen_text, write_cells

    if not spec.grid or not {"bf16", "fp8"} <= set(spec.arm_specs):
        return None
    return chosen_text(write_cells(spec, out)["chosen"])


def cmd_demo(a) -> int:
    from .study.demo import run_demo

    summary = run_demo(
        a.out, quick=a.quick, config=a.config, progress=not a.no_progress, jobs=a.jobs
    )
    print(Path(a.out, "summary.md").read_text())
    return 0 if summary else 1


def cmd_warmstart(a) -> int:
    from .config import load_config
    from .config.warmstart_file import write_with_info
    from .errors import ConfigError, os_errors
    from .train.warmstart import ensure_warm_start

    if a.out and not a.out.endswith(".safetensors"):
        raise ConfigError("--out", a.out, "a path ending in .safetensors")
    if a.spec:
        if a.config or a.overrides:
            raise ConfigError("--spec", a.spec, "alone (no --config or overrides)")
        return _spec_warm_starts(a.spec, a.set, progress=not a.no_progress, out=a.out)
    if a.set:
        raise ConfigError("--set", a.set[0], "used with --spec (a run config takes key=value)")
    cfg = load_config(a.config, list(a.overrides))
    path, info = ensure_warm_start(cfg, progress=not a.no_progress)
    if a.out:
        with os_errors("copy the warm start to", a.out):
            info = write_with_info(path, info, Path(a.out))
    print(_dumps({"weights": str(a.out or path), "cached": str(path), **info}))
    return 0


def _spec_warm_starts(spec_path: str, sets: list[str], progress: bool, out: str | None) -> int:
    """Build or find each distinct `model.warm_start: auto` warm start of a sweep spec's runs
    (in the spec's arm order), printing each one's info as `fp8rl warmstart` does; `out`
    copies the one warm start of such a spec there, with its info (a study's committed
    start). Runs that start from a file name it and its sha256, checked against its info."""
    from .config.warmstart_file import verified_sha256, write_with_info
    from .errors import ConfigError, os_errors
    from .study.sweep.spec import load_spec, run_configs
    from .train.warmstart import ensure_warm_start, warm_start_key

    # run_configs only names the run folders: nothing is written under this path
    configs = run_configs(load_spec(spec_path, sets), Path("runs") / "warmstart-spec")
    built: dict[str, tuple] = {}
    files: set[str] = set()
    for (arm, _), cfg in configs.items():
        if cfg.model.init_weights or cfg.model.warm_start == "none":
            continue
        if cfg.model.warm_start != "auto":
            files.add(cfg.model.warm_start)
            continue
        key = warm_start_key(cfg)
        if key not in built:
            built[key] = ensure_warm_start(cfg, progress=progress)
            print(_dumps({"arm": arm, "cached": str(built[key][0]), **built[key][1]}))
    for f in sorted(files):
        print(_dumps({"weights": f, "sha256": verified_sha256(f)}))
    if out:
        if len(built) != 1:
            need = "a spec with exactly one `model.warm_start: auto` warm start"
            raise ConfigError("--out", out, f"{need} (this one has {len(built)})")
        ((path, info),) = built.values()
        with os_errors("copy the warm start to", out):
            info = write_with_info(path, info, Path(out))
        print(_dumps({"weights": out, "sha256": info["sha256"]}))
    if not built and not files:
        print(f"{spec_path}: no run starts from a warm start")
    return 0


def cmd_report(a) -> int:
    from .study.report import make_report

    out = a.out or str(Path(a.runs[0]) / "report")
    result = make_report(a.runs, out)
    print(result["table"])
    print(f"\nplots and report.md written to {out}")
    return 0


def cmd_diagnose(a) -> int:
    from .study.diagnose import diagnose

    _at_least("--steps", a.steps, 1)
    with _trainer_for(a) as t:
        result = diagnose(t, steps=a.steps)
    print(_dumps(result))
    return 0


COMMANDS = {
    "train": cmd_train,
    "sweep": cmd_sweep,
    "demo": cmd_demo,
    "warmstart": cmd_warmstart,
    "report": cmd_report,
    "diagnose": cmd_diagnose,
    "eval": cmd_eval,
    "model": cmd_model,
}


def main(argv: list[str] | None = None) -> int:
    from .utils import run_main

    return run_main(_main, argv)


def _main(argv: list[str] | None) -> int:
    p = _parser()
    # argparse ends a positional list at the first option: `train.steps=3 --resume rollout.n=2`
    a, rest = p.parse_known_args(argv)
    if stray := [x for x in rest if x[:1] == "-" or "=" not in x or not hasattr(a, "overrides")]:
        p.error(f"unrecognized arguments: {' '.join(stray)}")
    a.overrides = [*a.overrides, *rest] if rest else getattr(a, "overrides", [])
    from .errors import Fp8rlError, one_line

    try:
        return COMMANDS[a.command](a)
    except BrokenPipeError:
        raise  # the reader left: run_main ends the command quietly
    except (Fp8rlError, OSError) as e:
        if a.debug:
            raise
        print(f"fp8rl {a.command}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fp8rl {a.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

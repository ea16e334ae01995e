"""Runs verl 0.9.1's real trainer (`python -m verl.trainer.main_ppo`) on the CPU and checks
fp8rl's integration from verl's logs (scripts/check-verl-e2e.sh runs this in its venv).

Invocations: `stock` (verl's vanilla GRPO and worker, one rank), `fp8rl` (fp8rl's worker
through the plugin, fp8rl_calibrated, FP8 rowwise, shadow passes and refits every step, two
data-parallel ranks, a checkpoint at the last step) and `resume` (the same run resumed from
that checkpoint for two more steps).

Every process an invocation starts carries FP8RL_E2E_TAG in its environment (Ray's and
vLLM's processes inherit it, whatever session or group they put themselves in); after each
invocation, on success, failure or timeout, those processes are ended by pid and the run
fails if any survive. `python e2e_run.py --tag T --reap` does only that (the script's trap).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOMINAL = (0.8, 1.28)  # 1 - clip_ratio_low, 1 + clip_ratio_high
POOL_WINDOW = 5
STEPS_STOCK, STEPS_FP8RL, STEPS_RESUMED = 2, 3, 6


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(") ", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def _tagged(tag: str) -> list[int]:
    """Pids whose environment holds FP8RL_E2E_TAG=tag, never this process or its callers."""
    needle = f"FP8RL_E2E_TAG={tag}".encode()
    found, mine = [], _ancestors()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone, or not ours to read
            continue
    return found


def reap(tag: str, grace: float = 10.0) -> list[int]:
    """SIGTERM every tagged process, SIGKILL what is left after `grace`; returns the pids
    still alive after that (should be none)."""
    pids = _tagged(tag)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            pids = [p for p in _tagged(tag) if _alive(p)]
            if not pids:
                return []
            time.sleep(0.5)
    return [p for p in _tagged(tag) if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"  # a zombie is already dead
    except OSError:
        return False


def overrides(files: dict, work: Path, name: str, *, ranks: int, steps: int, fp8rl: bool):
    """main_ppo's Hydra overrides: the docs/verl.md recipe, plus the CPU-only settings."""
    o = [
        # ---- the recipe (docs/verl.md)
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=2.0",
        # ---- the task and its size
        f"data.train_files={files['train']}",
        f"data.val_files={files['val']}",
        "data.train_batch_size=4",
        "data.max_prompt_length=16",
        "data.max_response_length=16",
        f"actor_rollout_ref.model.path={files['model']}",
        f"reward.custom_reward_function.path={files['reward']}",
        "reward.custom_reward_function.name=compute_score",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=False",
        # large enough that an update pushes some negative-advantage tokens' BF16 ratios below
        # the lower bound: a refit whose tokens hold no such clip keeps the nominal bounds
        "actor_rollout_ref.actor.optim.lr=3e-3",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"trainer.n_gpus_per_node={ranks}",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.logger=[console,file]",
        "trainer.project_name=fp8rl_e2e",
        f"trainer.experiment_name={name}",
        f"trainer.default_local_dir={work / 'ckpt'}",
        "trainer.resume_mode=auto",
        f"trainer.save_freq={STEPS_FP8RL if fp8rl else -1}",
        # ---- CPU-only settings
        "trainer.device=cpu",
        f"+ray_kwargs.ray_init.num_gpus={ranks}",  # Ray's fake GPUs: one per rank
        "+ray_kwargs.ray_init.num_cpus=16",
        "+ray_kwargs.ray_init.include_dashboard=False",
        f"+ray_kwargs.ray_init._temp_dir={work / 'ray'}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "actor_rollout_ref.model.use_remove_padding=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.rollout.enforce_eager=True",
        "+actor_rollout_ref.rollout.enable_sleep_mode=False",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.max_model_len=64",
        "actor_rollout_ref.rollout.max_num_seqs=16",
        "actor_rollout_ref.rollout.max_num_batched_tokens=256",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        "data.dataloader_num_workers=0",
    ]
    if fp8rl:
        o += [
            "actor_rollout_ref.actor.policy_loss.loss_mode=fp8rl_calibrated",
            "+actor_rollout_ref.fp8rl.recipe=rowwise",
            "+actor_rollout_ref.fp8rl.interval=1",  # shadow passes and a refit every step
            f"+actor_rollout_ref.fp8rl.pool_window={POOL_WINDOW}",
            # no step reaches it: a refit pools min(window, step) steps, which the check
            # reads to see that the pool survived the resume
            "+actor_rollout_ref.fp8rl.pool_min_clips=1000000",
        ]
    return o


def run_invocation(name, files, work, tag, timeout, *, ranks, steps, fp8rl, python):
    """One main_ppo invocation, its logs in work/logs; ends every process it started."""
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    env = dict(os.environ)
    modules = ["verl_cpu_plugin"] + (["fp8rl.integrations.verl_plugin"] if fp8rl else [])
    env.update(
        FP8RL_E2E_TAG=tag,
        PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        VERL_USE_EXTERNAL_MODULES=",".join(modules),
        VERL_PLATFORM="cpu",
        VERL_ENGINE_DEVICE="cuda",
        VERL_FILE_LOGGER_PATH=str(logs / f"{name}.jsonl"),
        VLLM_CPU_KVCACHE_SPACE="1",
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "2"),
        TOKENIZERS_PARALLELISM="false",
        WANDB_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
    )
    cmd = [python, "-m", "verl.trainer.main_ppo"]
    cmd += overrides(files, work, name, ranks=ranks, steps=steps, fp8rl=fp8rl)
    console = logs / f"{name}.log"
    print(f"[e2e] {name}: {' '.join(cmd[1:3])} ({ranks} rank(s), to step {steps})", flush=True)
    start = time.monotonic()
    with open(console, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            if proc.poll() is None:  # not reaped yet, so the group is still the driver's
                os.killpg(proc.pid, signal.SIGTERM)
            left = reap(tag)
            proc.wait()
    took = time.monotonic() - start
    print(f"[e2e] {name}: exit {rc}, {took:.0f} s, log {console}", flush=True)
    if left:
        raise RuntimeError(f"{name}: processes {left} survived SIGKILL")
    if rc != 0:
        tail = console.read_text(errors="replace").splitlines()[-40:]
        why = f"timed out after {timeout} s" if rc is None else f"exited {rc}"
        raise RuntimeError(f"{name} {why}; the log's end:\n" + "\n".join(tail))
    return logs / f"{name}.jsonl", console, took


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, help="work folder (default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (kept on failure)")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per invocation")
    ap.add_argument("--only", choices=["stock", "fp8rl"], help="run one part")
    ap.add_argument("--tag", help="the FP8RL_E2E_TAG value to give the runs (default: new)")
    ap.add_argument("--reap", action="store_true", help="only end --tag's processes")
    args = ap.parse_args(argv)
    # given to the runs' environment only: this process and its callers must not carry it
    tag = args.tag or uuid.uuid4().hex
    if args.reap:
        left = reap(tag)
        print(f"[e2e] reap: {'processes left: ' + str(left) if left else 'none left'}")
        return 1 if left else 0

    # `timeout` ends this runner with SIGTERM: exit through the finally below, which reaps
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    sys.path.insert(0, str(HERE))
    import e2e_check as c
    import e2e_fixtures
    import verl_cpu_shims

    verl_cpu_shims.check_versions()
    work = args.work or Path(tempfile.mkdtemp(prefix="fp8rl-verl-e2e-"))
    files = e2e_fixtures.write_all(work)
    py, lines, times = sys.executable, [], {}

    def invoke(name, *, ranks, steps, fp8rl, first=1):
        log, console, took = run_invocation(
            name, files, work, tag, args.timeout, ranks=ranks, steps=steps, fp8rl=fp8rl, python=py
        )
        times[name] = took
        m = c.parse_metric_log(log, name)
        shown = c.parse_console(console.read_text(errors="replace"), name)
        lines.extend(c.check_finished(m, shown, range(first, steps + 1), name))
        return m

    passed = False
    try:
        if args.only in (None, "stock"):
            m = invoke("stock", ranks=1, steps=STEPS_STOCK, fp8rl=False)
            lines += c.check_rollout_sync(m, "stock") + c.check_stock(m, "stock")
        if args.only in (None, "fp8rl"):
            m1 = invoke("fp8rl", ranks=2, steps=STEPS_FP8RL, fp8rl=True)
            lines += c.check_rollout_sync(m1, "fp8rl")
            lines += c.check_calibrated(m1, "fp8rl", NOMINAL, pool_window=POOL_WINDOW)
            step_dir = work / "ckpt" / f"global_step_{STEPS_FP8RL}"
            lines += c.check_checkpoint(step_dir, STEPS_FP8RL, "fp8rl")
            m2 = invoke("resume", ranks=2, steps=STEPS_RESUMED, fp8rl=True, first=STEPS_FP8RL + 1)
            lines += c.check_rollout_sync(m2, "resume")
            lines += c.check_calibrated(
                m2, "resume", NOMINAL, first_update=STEPS_FP8RL, pool_window=POOL_WINDOW
            )
            lines += c.check_resumed(m1, m2, "resume")
            lines += c.check_bounds_moved({"fp8rl": m1, "resume": m2}, NOMINAL)
        passed = True
    finally:
        left = reap(tag)
        if passed and not args.keep and args.work is None:
            shutil.rmtree(work, ignore_errors=True)
        elif not passed:
            print(f"[e2e] failed: the logs are kept in {work / 'logs'}", flush=True)
    for line in lines:
        print(f"[e2e] ok: {line}")
    print("[e2e] times: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()))
    if left:
        print(f"[e2e] processes left after the runs: {left}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

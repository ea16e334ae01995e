"""fp8rl's verl engine worker on the CPU: gloo, one process, a tiny Qwen3 as a local HF folder,
verl's TrainingWorker driving a stand-in engine (tests/_verl_cpu.py; verl 0.9.1 has no CPU
platform and no CPU FSDP engine). Runs where verl is installed (scripts/check-verl.sh)."""

import functools
import json

import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed here: run scripts/check-verl.sh")
pytest.importorskip("verl.workers.engine_workers")

import _verl_cpu  # noqa: E402
from fp8rl.integrations import verl as fv  # noqa: E402
from fp8rl.rl.calibration_state import CalibrationState  # noqa: E402

B, P, R = 8, 4, 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from fp8rl.models import tiny_qwen3
    from fp8rl.tasks import char_tokenizer

    _verl_cpu.setup()
    d = tmp_path_factory.mktemp("verl") / "model"
    tok = char_tokenizer()
    tiny_qwen3(vocab_size=len(tok)).save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def worker(model_dir, cls, loss_mode, **kw):
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config import (
        ActorConfig,
        EngineConfig,
        HFModelConfig,
        OptimizerConfig,
        TrainingWorkerConfig,
    )
    from verl.workers.config.actor import PolicyLossConfig
    from verl.workers.utils.losses import ppo_loss

    engine = EngineConfig(
        strategy=_verl_cpu.BACKEND,
        micro_batch_size_per_gpu=2,
        infer_micro_batch_size_per_gpu=4,
        use_dynamic_bsz=False,
    )
    cfg = TrainingWorkerConfig(
        model_type="language_model",
        model_config=HFModelConfig(path=model_dir, use_remove_padding=False),
        engine_config=engine,
        optimizer_config=OptimizerConfig(lr=3e-3, weight_decay=0.0),
        checkpoint_config=CheckpointConfig(),
    )
    actor = ActorConfig(
        strategy="fsdp",
        ppo_micro_batch_size_per_gpu=2,
        rollout_n=1,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
    )
    w = cls(config=cfg, **kw)
    w.reset()
    w.set_loss_fn(functools.partial(ppo_loss, config=actor))
    return w


def row_steps(step, trainer):
    """The per-row `global_steps` verl's trainers put in the batch at fp8rl step `step`: v0
    rows carry the rollout's weight version (from 0), v1 rows the step their prompt was drawn
    at (from 1); "async": v1 rows drawn up to two steps earlier (mixed ages)."""
    if trainer == "v0":
        return [step] * B
    if trainer == "v1":
        return [step + 1] * B
    return [max(1, step + 1 - i % 3) for i in range(B)]


def rows(step, seed=0):
    """Token ids, left-aligned, with the prompt and response length of each row (both mixed:
    verl stores a field whose rows are all one length dense, not jagged)."""
    g = torch.Generator().manual_seed(seed * 1000 + step)
    prompts = torch.randint(3, 20, (B, P), generator=g)
    responses = torch.randint(3, 20, (B, R), generator=g)
    resp_len = torch.randint(2, R + 1, (B,), generator=g)
    prompt_len = P - torch.arange(B) % 2
    return prompts, responses, prompt_len, resp_len


def padded_batch(step, seed, trainer):
    """verl's legacy (v0) trainer: a padded DataProto, per-row fields from the rollout, turned
    into the no-padding TensorDict the actor gets (ray_trainer._compute_old_log_prob)."""
    import numpy as np
    from verl.protocol import DataProto
    from verl.workers.utils.padding import left_right_2_no_padding

    prompts, responses, prompt_len, resp_len = rows(step, seed)
    resp_mask = (torch.arange(R)[None] < resp_len[:, None]).long()
    prompt_mask = (torch.arange(P)[None] < prompt_len[:, None]).long()
    prompts = torch.stack(
        [p.roll(P - n) for p, n in zip(prompts, prompt_len.tolist(), strict=True)]
    )
    attn = torch.cat([prompt_mask.flip(1), resp_mask], 1)  # prompts left-padded
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attn,
        "position_ids": (attn.cumsum(1) - 1).clamp(min=0),
        "response_mask": resp_mask,
    }
    non_tensors = {}
    if trainer is not None:
        non_tensors["global_steps"] = np.array(row_steps(step, trainer), dtype=object)
    return left_right_2_no_padding(DataProto.from_dict(tensors, non_tensors).to_tensordict())


def jagged_batch(step, seed, trainer):
    """verl's v1 trainer: one row per trajectory, every token field jagged (TransferQueue's
    list_of_dict_to_tensordict of the agent loop's rows)."""
    from verl.utils import tensordict_utils as tu

    prompts, responses, prompt_len, resp_len = rows(step, seed)
    out = []
    lens = zip(prompt_len.tolist(), resp_len.tolist(), strict=True)
    for p, r, (m, n), s in zip(prompts, responses, lens, row_steps(step, trainer), strict=True):
        ids = torch.cat([p[:m], r[:n]])
        out.append(
            {
                "prompts": p[:m],
                "responses": r[:n],
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "position_ids": torch.arange(ids.numel()),
                "response_mask": torch.ones(n, dtype=torch.long),
                "loss_mask": torch.ones(n, dtype=torch.long),
                "global_steps": s,
            }
        )
    return tu.list_of_dict_to_tensordict(out)


def batch(step, seed=0, trainer="v1"):
    if trainer in ("v1", "async"):
        return jagged_batch(step, seed, trainer)
    return padded_batch(step, seed, trainer)


def run_step(w, step, seed=0, trainer="v1"):
    """One verl step as the trainer drives the actor: compute_log_prob, then update_actor
    with the old log-probs and advantages in the trainer's layout."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import (
        no_padding_2_padding,
        response_from_nested,
        response_to_nested,
    )

    td = batch(step, seed, trainer)
    tu.assign_non_tensor(td, calculate_entropy=True, compute_loss=False)
    log_probs = tu.get(w.infer_batch(td), "log_probs")
    g = torch.Generator().manual_seed(step + 77)
    adv = torch.randn(B, 1, generator=g).expand(B, R).contiguous()
    td = batch(step, seed, trainer)
    if td["response_mask"].is_nested:
        mask = td["response_mask"]
        td["old_log_probs"] = response_from_nested(log_probs, mask).float()
        td["advantages"] = response_to_nested(adv, mask)
    else:
        td["old_log_probs"] = no_padding_2_padding(log_probs, td).float()
        td["advantages"] = adv
    tu.assign_non_tensor(
        td,
        calculate_entropy=False,
        global_batch_size=4,
        mini_batch_size=4,
        epochs=1,
        seed=1,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
    )
    return tu.get(w.train_mini_batch(td), "metrics")


def count_high_precision(monkeypatch):
    from fp8rl.integrations import verl_worker

    calls = []
    real = verl_worker.high_precision

    def counting(module):
        calls.append(module)
        return real(module)

    monkeypatch.setattr(verl_worker, "high_precision", counting)
    return calls


@pytest.mark.parametrize("trainer", ["v0", "v1"])
def test_shadow_passes_only_at_shadow_steps_and_bounds_move(
    model_dir, monkeypatch, tmp_path, trainer
):
    from fp8rl.fp8 import fp8_linears
    from fp8rl.integrations.verl_worker import POOL_FILE, STATE_FILE, Fp8rlTrainingWorker

    calls = count_high_precision(monkeypatch)
    settings = dict(interval=2, min_tokens=4, pool_min_clips=1, max_step=[0.3, 0.3])
    w = worker(
        model_dir, Fp8rlTrainingWorker, fv.LOSS_NAME, fp8rl=dict(settings, recipe="tensorwise")
    )
    assert fp8_linears(w.engine.module), "the actor is converted to FP8"
    assert fv.calibration_state() is w.calibration
    seen, bounds = [], [w.calibration.bounds]
    for step in range(5):
        before = len(calls)
        m = run_step(w, step, trainer=trainer)
        seen.append(len(calls) - before)
        bounds.append(w.calibration.bounds)
        assert m["calib/shadow_step"] == float(step % 2 == 0)
        if step % 2 == 0:
            assert "shadow/nmae_prob" in m and m["calib/shadow_tokens"] > 0
            assert "shadow/logprob_err_sd" in m  # the shadow core's metrics, the Trainer's
        else:
            assert "shadow/nmae_prob" not in m
        # calib/lower|upper: the bounds this step clipped with; a refit names the next ones
        assert (m["calib/lower"], m["calib/upper"]) == bounds[-2]
        if step in (2, 4):  # pooled rule, interval 2: refits at steps 2 and 4
            assert m["calib/refit"] == 1.0
            assert (m["calib/next_lower"], m["calib/next_upper"]) == bounds[-1]
        else:
            assert "calib/next_lower" not in m
    # pass 1 once, pass 2 once per mini-batch (8 rows / 4): at steps 0, 2, 4 only
    assert seen == [3, 0, 3, 0, 3]
    assert any(b != bounds[0] for b in bounds[3:]), f"bounds never moved: {bounds}"
    assert bounds[1] == bounds[0]  # pooled: step 0 never refits

    w.save_checkpoint(str(tmp_path / "ckpt"), global_step=5)
    blob = json.loads((tmp_path / "ckpt" / STATE_FILE).read_text())
    assert (tmp_path / "ckpt" / POOL_FILE).exists() and blob["fp8rl_updates"] == 5
    w2 = worker(model_dir, Fp8rlTrainingWorker, fv.LOSS_NAME, fp8rl=dict(settings, recipe=None))
    w2.load_checkpoint(str(tmp_path / "ckpt"))
    assert w2.calibration.bounds == w.calibration.bounds
    assert w2.calibration.history == w.calibration.history
    assert [e["step"] for e in w2.calibration.pool] == [e["step"] for e in w.calibration.pool]
    assert w2.fp8rl_updates == 5


def bf16_response_log_probs(module, step):
    """By hand, per row (keyed by its token ids): the response tokens' log-probs of the
    module with FP8 off, from one plain forward of the unpadded row."""
    from fp8rl.fp8 import high_precision

    prompts, responses, prompt_len, resp_len = rows(step)
    out = {}
    lens = zip(prompt_len.tolist(), resp_len.tolist(), strict=True)
    for p, r, (m, n) in zip(prompts, responses, lens, strict=True):
        ids = torch.cat([p[:m], r[:n]])
        with high_precision(module), torch.no_grad():
            logits = module(input_ids=ids[None]).logits[0].float()
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])[:, 0]
        out[ids.numpy().tobytes()] = lp[m - 1 :]
    return out


def record_loss_inputs(w):
    """The old log-probs and both shadows of every micro-batch the loss pools."""
    from fp8rl.integrations.verl_worker import NEW_REF_KEY, OLD_REF_KEY

    seen = []
    pool = w._pool_micro_batch

    def recording(model_output, data):
        keys = [r.numpy().tobytes() for r in data["input_ids"].unbind()]
        names = ("old_log_probs", OLD_REF_KEY, NEW_REF_KEY)
        seen.append((keys, *(data[k] for k in names)))
        return pool(model_output, data)

    w._pool_micro_batch = recording
    return seen


def test_shadows_travel_in_the_layout_of_the_old_log_probs(model_dir):
    """verl's v1 trainer hands the actor jagged old log-probs (one row per response length),
    the v0 trainer padded ones: both shadows reach the loss in the same layout, row for row
    the BF16 log-probs computed by hand, and the pooled statistics do not depend on it."""
    from fp8rl.integrations.verl_worker import Fp8rlTrainingWorker

    settings = dict(interval=2, min_tokens=4, recipe="tensorwise")
    metrics, hand = {}, None
    for trainer in ("v1", "v0"):
        w = worker(model_dir, Fp8rlTrainingWorker, fv.LOSS_NAME, fp8rl=settings)
        hand = bf16_response_log_probs(w.engine.module, step=0)
        seen = record_loss_inputs(w)
        metrics[trainer] = run_step(w, 0, trainer=trainer)
        assert len(seen) == B // 2  # micro-batches of 2 rows
        for i, (keys, old, old_shadow, new_shadow) in enumerate(seen):
            for shadow in (old_shadow, new_shadow):
                assert shadow.is_nested == old.is_nested == (trainer == "v1")
                if old.is_nested:
                    assert shadow.layout == torch.jagged
                    assert torch.equal(shadow.offsets(), old.offsets())
                else:
                    assert shadow.shape == old.shape
            # mini-batches of 4 rows: pass 2 of the first sees the weights pass 1 saw
            shadows = (old_shadow, new_shadow) if i < 2 else (old_shadow,)
            for shadow in shadows:
                for key, row in zip(keys, shadow.unbind(), strict=True):
                    want = hand[key]
                    torch.testing.assert_close(row[: want.numel()], want, rtol=0, atol=1e-5)
                    assert not row[want.numel() :].any()  # v0's padding stays zero
            fp8, bf16 = (t.to_padded_tensor(0.0) if t.is_nested else t for t in (old, old_shadow))
            assert (fp8 != bf16).any()  # the shadow is BF16, not a copy of the FP8 values
    assert len({len(v) for v in hand.values()}) > 1  # the responses' lengths are mixed
    v1, v0 = metrics["v1"], metrics["v0"]
    assert v1["calib/shadow_tokens"] == v0["calib/shadow_tokens"] > 0
    shadow_keys = sorted(k for k in v0 if k.startswith("shadow/"))
    assert shadow_keys and shadow_keys == sorted(k for k in v1 if k.startswith("shadow/"))
    for k in shadow_keys:
        assert v1[k] == pytest.approx(v0[k], rel=1e-5, abs=1e-7), k


@pytest.mark.parametrize("trainer", ["v0", "v1", "async"])
def test_step_counts_updates_whatever_the_rows_say_and_survives_a_resume(
    model_dir, tmp_path, trainer
):
    """fp8rl's step n is the worker's (n+1)-th update however the trainer numbers its rows
    (v0 from 0, v1 from 1): step 0 is a shadow step in both. A resume from a checkpoint after
    3 updates continues the count: steps 3 and 4 match an uninterrupted run's."""
    from fp8rl.integrations.verl_worker import Fp8rlTrainingWorker

    settings = dict(interval=2, min_tokens=4, pool_min_clips=1, max_step=[0.3, 0.3])
    settings["recipe"] = "tensorwise"

    def fresh():
        return worker(model_dir, Fp8rlTrainingWorker, fv.LOSS_NAME, fp8rl=settings)

    straight = fresh()
    expected = [run_step(straight, k, trainer=trainer) for k in range(5)]
    assert [m["calib/shadow_step"] for m in expected] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert ["calib/refit" in m for m in expected] == [False, False, True, False, True]

    first = fresh()
    for k in range(3):
        run_step(first, k, trainer=trainer)
    first.save_checkpoint(str(tmp_path / "ckpt"), global_step=3)
    resumed = fresh()
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    assert resumed.fp8rl_updates == 3
    for k in (3, 4):
        got, want = run_step(resumed, k, trainer=trainer), expected[k]
        calib = sorted(key for key in want if key.startswith("calib/"))
        assert calib == sorted(key for key in got if key.startswith("calib/"))
        assert [got[key] for key in calib] == [want[key] for key in calib], k
    assert expected[3]["calib/upper"] != 1.28  # the resume carried moved bounds
    assert resumed.calibration.history == straight.calibration.history


def test_nominal_bounds_without_fp8_equal_verl_stock_worker_bit_for_bit(model_dir):
    from verl.workers.engine_workers import TrainingWorker

    from fp8rl.integrations.verl_worker import Fp8rlTrainingWorker

    stock = worker(model_dir, TrainingWorker, "vanilla")
    fv.set_calibration_state(CalibrationState(0.8, 1.28))  # the stock loss ignores it
    state = CalibrationState(0.8, 1.28, interval=2, mode="diagnose", min_tokens=4)
    ours = worker(
        model_dir, Fp8rlTrainingWorker, fv.LOSS_NAME, fp8rl={"recipe": None}, calibration=state
    )
    for step in range(3):  # shadow steps 0 and 2 included
        m_stock = run_step(stock, step, trainer=None)
        m_ours = run_step(ours, step, trainer=None)
        assert m_ours["actor/pg_loss"] == m_stock["actor/pg_loss"]
    for (n, a), (_, b) in zip(
        stock.engine.module.named_parameters(), ours.engine.module.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), n
    assert ours.calibration.bounds == (0.8, 1.28) and ours.calibration.history


def test_separated_trainers_that_drop_fp8rls_worker_are_refused(monkeypatch):
    """verl's separate_async trainer builds its DetachActorWorker whatever worker it was
    given: after install() that actor refuses in one line naming the setting."""
    import verl.experimental.separation.engine_workers as sep
    import verl.workers.engine_workers as ew

    from fp8rl.integrations import verl_worker

    for module, name in ((sep, "DetachActorWorker"), (ew, "ActorRolloutRefWorker")):
        monkeypatch.setattr(module, name, getattr(module, name))  # undone after the test
    verl_worker.install()
    assert ew.ActorRolloutRefWorker is verl_worker.Fp8rlActorRolloutRefWorker
    with pytest.raises(ValueError) as err:
        sep.DetachActorWorker(config=None, role="actor_rollout_ref")
    msg = str(err.value)
    assert "trainer.v1.trainer_mode=separate_async" in msg and "\n" not in msg

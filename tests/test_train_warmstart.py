"""model.warm_start: none | auto | PATH, one cached supervised warm start per key."""

from __future__ import annotations

import json
import os

import pytest
import torch

from fp8rl.errors import ConfigError
from fp8rl.train import warmstart as ws
from helpers_config import FAST_WARM_START, tiny_config, warm_start_config
from helpers_runs import counting_builds


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FP8RL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_auto_builds_once_then_every_run_loads_the_same_weights(tmp_path, cache, monkeypatch):
    from fp8rl.train.trainer import Trainer

    calls = counting_builds(monkeypatch)
    a = Trainer(warm_start_config(tmp_path / "a"), progress=False)
    b = Trainer(
        warm_start_config(tmp_path / "b", train={"seed": 7, "lr": 1e-4}), progress=False
    )  # same key
    assert len(calls) == 1
    path, info = ws.ensure_warm_start(warm_start_config(tmp_path / "a"))
    assert path.parent == cache / "warmstart" and info["steps"] >= 10 and info["key"] == calls[0]
    for p, q in zip(a.model.state_dict().values(), b.model.state_dict().values(), strict=True):
        assert torch.equal(p, q)
    fresh = Trainer(warm_start_config(tmp_path / "c", model={"warm_start": "none"}), progress=False)
    moved = any(
        not torch.equal(p, q)
        for p, q in zip(
            a.model.state_dict().values(), fresh.model.state_dict().values(), strict=True
        )
    )
    assert moved  # the warm start really trained the weights


def test_the_key_follows_task_model_and_settings_not_the_rl_run(tmp_path):
    key = ws.warm_start_key(warm_start_config(tmp_path))
    assert (
        ws.warm_start_key(warm_start_config(tmp_path, train={"seed": 3}, loss={"mode": "dapo"}))
        == key
    )
    assert ws.warm_start_key(warm_start_config(tmp_path, warm_start={"lr": 1e-3})) != key
    assert ws.warm_start_key(warm_start_config(tmp_path, warm_start={"seed": 1})) != key
    task = {"name": "arithmetic", "options": {"digits": 2, "ops": "+", "train_size": 64}}
    assert ws.warm_start_key(warm_start_config(tmp_path, task=task)) != key


def test_init_weights_wins_and_a_path_loads(tmp_path, cache, monkeypatch):
    from fp8rl.train.checkpoint import save_weights
    from fp8rl.train.trainer import Trainer

    calls = counting_builds(monkeypatch)
    donor = Trainer(warm_start_config(tmp_path / "d", model={"warm_start": "none"}), progress=False)
    with torch.no_grad():
        next(donor.model.parameters()).add_(1.0)
    file = tmp_path / "start.safetensors"
    save_weights(donor.model, file)
    for model in ({"init_weights": str(file)}, {"warm_start": str(file)}):
        t = Trainer(warm_start_config(tmp_path / "e", model=model), progress=False)
        assert torch.equal(next(t.model.parameters()), next(donor.model.parameters()))
    assert calls == []  # neither built the auto warm start
    with pytest.raises(ConfigError, match="'none', 'auto' or an existing"):
        warm_start_config(tmp_path, model={"warm_start": str(tmp_path / "missing.safetensors")})


def test_an_incomplete_cache_entry_is_rebuilt(tmp_path, cache, monkeypatch):
    cfg = warm_start_config(tmp_path)
    path, _ = ws.ensure_warm_start(cfg)
    path.with_suffix(".json").unlink()  # as a crash between the two renames leaves it
    calls = counting_builds(monkeypatch)
    again, info = ws.ensure_warm_start(cfg)
    assert again == path and len(calls) == 1 and json.loads(path.with_suffix(".json").read_text())
    assert not [p for p in os.listdir(path.parent) if p.endswith(".tmp")]


def test_cli_warmstart_builds_and_copies(tmp_path, cache, capsys):
    import yaml

    from fp8rl.cli import main

    cfg_file = tmp_path / "cfg.yaml"
    data = tiny_config(tmp_path)
    data["warm_start"] = FAST_WARM_START
    cfg_file.write_text(yaml.safe_dump(data))
    out = tmp_path / "ws.safetensors"
    assert main(["warmstart", "--config", str(cfg_file), "--out", str(out), "--no-progress"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (
        out.is_file()
        and printed["weights"] == str(out)
        and printed["cached"].startswith(str(cache))
    )
    assert main(["warmstart", "--config", str(cfg_file), "--out", str(tmp_path / "x.bin")]) == 2


def test_target_entropy_stops_the_warm_start_at_its_first_check(tmp_path, cache):
    # a random model samples near log(vocab) nats per token: any target above that stops it
    # at the first check, which target_accuracy 1.0 never does
    cfg = warm_start_config(tmp_path, warm_start={"target_entropy": 50.0})
    _, info = ws.build_warm_start(cfg)
    assert (info["steps"], info["stopped_by"]) == (FAST_WARM_START["check_every"], "target_entropy")
    assert 0 < info["train_entropy"] <= 50.0 and 0 < info["eval_sampled_entropy"]
    # a target below any reachable entropy: it runs to warm_start.steps
    _, info = ws.build_warm_start(warm_start_config(tmp_path, warm_start={"target_entropy": 1e-9}))
    assert (info["steps"], info["stopped_by"]) == (FAST_WARM_START["steps"], "steps")
    assert info["train_entropy"] > 1e-9


def test_target_entropy_none_keeps_the_keys_of_earlier_warm_starts(tmp_path):
    cfg = warm_start_config(tmp_path)
    assert cfg.warm_start.target_entropy is None
    key = ws.warm_start_key(cfg)
    assert ws.warm_start_key(warm_start_config(tmp_path, warm_start={"target_entropy": 0.3})) != key
    with pytest.raises(ConfigError, match="warm_start.target_entropy"):
        warm_start_config(tmp_path, warm_start={"target_entropy": 0.0})


def test_sampled_entropy_is_the_mean_entropy_of_the_sampling_distribution(tmp_path):
    """Against a float64 recomputation: the same samples re-scored by a teacher-forced
    forward pass, entropy -sum p log p at every response position, averaged over tokens."""
    from fp8rl.rollout import RolloutEngine, SamplingParams
    from fp8rl.tasks import get_task
    from fp8rl.train.build import build_model
    from fp8rl.train.evaluate import sampled_entropy

    cfg = warm_start_config(tmp_path, model={"warm_start": "none"})
    task = get_task(cfg.task.name, **cfg.task.options)
    torch.manual_seed(0)
    model, tok = build_model(cfg.model, task, torch.device("cpu"))
    engine = RolloutEngine(model, tok)
    got = sampled_entropy(model, engine, task, limit=6, max_new_tokens=4, seed=3)
    gen = torch.Generator().manual_seed(3)
    prompts = [s.prompt for s in task.samples("train")[:6]]
    batch = engine.generate(prompts, SamplingParams(n=1, max_new_tokens=4), generator=gen)
    total, count = 0.0, 0
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            p_ids = tok(prompt)["input_ids"]
            r_ids = batch.response_ids[i][batch.response_mask[i].bool()].tolist()
            logits = model(input_ids=torch.tensor([p_ids + r_ids])).logits[0].double()
            logp = torch.log_softmax(logits[len(p_ids) - 1 : len(p_ids) - 1 + len(r_ids)], -1)
            total += float(-(logp.exp() * logp).sum())
            count += len(r_ids)
    assert got["entropy"] == pytest.approx(total / count, rel=1e-4)
    assert got["response_len"] == pytest.approx(count / 6)
    assert 0.0 <= got["accuracy"] <= 1.0


def test_cli_warmstart_spec_builds_each_distinct_warm_start_once(
    tmp_path, cache, capsys, monkeypatch
):
    import yaml

    from fp8rl.cli import main

    monkeypatch.chdir(tmp_path)  # where a run folder would appear if one were made
    base = tiny_config(tmp_path)
    base["model"]["warm_start"] = "auto"
    base["warm_start"] = FAST_WARM_START
    spec = {
        "base": base,
        "arms": {"a": {}, "b": {"train": {"lr": 1e-4}}},  # one key: the RL lr is not in it
        "grid": {"ws": {"arms": ["a"], "values": {"s0": {}, "s1": {"warm_start": {"seed": 1}}}}},
        "seeds": [0, 1],
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["warmstart", "--spec", str(path), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    infos = [json.loads(chunk) for chunk in printed.replace("}\n{", "}\x00{").split("\x00")]
    assert [i["arm"] for i in infos] == ["a--s0", "a--s1"]  # b shares a--s0's warm start
    assert len({i["key"] for i in infos}) == 2
    assert all(i["cached"].startswith(str(cache)) for i in infos)
    assert not (tmp_path / "runs").exists()
    assert main(["warmstart", "--spec", str(path), "--out", str(tmp_path / "x.safetensors")]) == 2
    capsys.readouterr()
    # --set changes the spec first: base's warm_start seed moves a--s0's key; a--s1's grid
    # value sets its own seed, which wins over base
    args = ["warmstart", "--spec", str(path), "--no-progress", "--set", "base.warm_start.seed=5"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    again = [json.loads(chunk) for chunk in printed.replace("}\n{", "}\x00{").split("\x00")]
    assert [i["arm"] for i in again] == ["a--s0", "a--s1"]
    assert again[0]["key"] != infos[0]["key"] and again[1]["key"] == infos[1]["key"]
    assert main(["warmstart", "--set", "base.warm_start.seed=5"]) == 2  # --set needs --spec


def test_a_committed_warm_start_is_checked_against_the_sha256_beside_it(tmp_path, cache, capsys):
    """`fp8rl warmstart --out X.safetensors` writes X.json with the copy's sha256; a run from
    X verifies it before any folder is made and names it in events.log; a changed X is refused."""
    import hashlib

    import yaml

    from fp8rl.cli import main
    from fp8rl.train.trainer import Trainer

    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(yaml.safe_dump({**tiny_config(tmp_path), "warm_start": FAST_WARM_START}))
    out = tmp_path / "study" / "start.safetensors"
    assert main(["warmstart", "--config", str(cfg_file), "--out", str(out), "--no-progress"]) == 0
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    info = json.loads(out.with_suffix(".json").read_text())
    assert info["sha256"] == digest == json.loads(capsys.readouterr().out)["sha256"]
    assert info["steps"] >= FAST_WARM_START["check_every"] and "key" in info

    run = warm_start_config(
        tmp_path / "run", model={"warm_start": str(out)}, log={"progress": False}
    )
    trainer = Trainer(run, progress=False)
    assert f"start weights {out}: sha256 {digest}" in trainer.startup_events

    data = bytearray(out.read_bytes())
    data[-1] ^= 1  # one flipped bit in the last tensor: still a readable safetensors file
    out.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="model.warm_start.*sha256"):
        warm_start_config(tmp_path / "run2", model={"warm_start": str(out)})
    assert not (tmp_path / "run2").exists()
    out.with_suffix(".json").unlink()  # a file without info beside it is taken as it is
    assert warm_start_config(
        tmp_path / "run3", model={"warm_start": str(out)}
    ).model.warm_start == str(out)


def test_cli_warmstart_spec_out_commits_the_one_warm_start_and_checks_files(
    tmp_path, cache, capsys, monkeypatch
):
    import yaml

    from fp8rl.cli import main

    monkeypatch.chdir(tmp_path)
    base = tiny_config(tmp_path)
    base["model"]["warm_start"] = "auto"
    base["warm_start"] = FAST_WARM_START
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"base": base, "arms": {"a": {}, "b": {}}, "seeds": [0, 1]}))
    out = tmp_path / "start.safetensors"
    assert main(["warmstart", "--spec", str(spec), "--out", str(out), "--no-progress"]) == 0
    recorded = json.loads(out.with_suffix(".json").read_text())["sha256"]
    capsys.readouterr()
    # the spec then starts from the committed file: the command names it and its sha256
    base["model"]["warm_start"] = str(out)
    spec.write_text(yaml.safe_dump({"base": base, "arms": {"a": {}}, "seeds": [0]}))
    assert main(["warmstart", "--spec", str(spec)]) == 0
    assert json.loads(capsys.readouterr().out) == {"weights": str(out), "sha256": recorded}
    assert main(["warmstart", "--spec", str(spec), "--out", str(tmp_path / "y.safetensors")]) == 2
    assert "exactly one" in capsys.readouterr().err

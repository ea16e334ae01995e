"""`log.wandb`: validated keys, an offline W&B run beside metrics.jsonl with the same metric
names and steps, and a one-line error when wandb is missing."""

import json
import sys

import pytest

from fp8rl.config import config_from_dict
from fp8rl.errors import ConfigError, Fp8rlError
from fp8rl.train.runlog import MetricsLog, read_metrics
from fp8rl.train.trainer import Trainer
from helpers_config import tiny_config
from helpers_step import parity_reward


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    # everything wandb writes outside the run folder goes to tmp_path, and nothing to the network
    for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


@pytest.mark.parametrize(
    "value, key",
    [
        (True, "log.wandb"),
        ({"mode": "offline"}, "log.wandb.project"),
        ({"project": "p", "mode": "off"}, "log.wandb.mode"),
        ({"project": "p", "entity": "me"}, "log.wandb.entity"),
    ],
)
def test_bad_wandb_settings_name_the_key(tmp_path, value, key):
    with pytest.raises(ConfigError) as e:
        config_from_dict(tiny_config(tmp_path, log={"wandb": value}))
    assert e.value.key == key


def read_wandb_records(path):
    """The protobuf records of an offline run's .wandb file: a leveldb-style log (a 7-byte file
    header, then 32 KiB blocks of chunks with 7-byte headers: crc, length, kind)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, buf, records = path.read_bytes(), 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        size, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        buf += data[pos + 7 : pos + 7 + size]
        pos += 7 + size
        if kind in (1, 4):  # FULL or LAST: a record is complete
            record = pb.Record()
            record.ParseFromString(buf)
            records.append(record)
            buf = b""
    return records


def test_offline_run_logs_the_jsonl_metrics(tmp_path, wandb_env):
    wandb_module = pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    wandb = {"project": "fp8rl-test", "mode": "offline"}
    cfg = config_from_dict(tiny_config(run_dir, log={"wandb": wandb}, train={"steps": 2}))
    parity_reward(Trainer(cfg)).fit()
    # finish() can return before wandb's service has written the whole file (seen once in
    # five runs); teardown waits for the service to exit
    wandb_module.teardown()
    runs = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, list(run_dir.rglob("*"))
    records = read_wandb_records(runs[0])
    kinds = [r.WhichOneof("record_type") for r in records]
    assert "run" in kinds, (kinds, runs[0].stat().st_size)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.project, run.display_name) == ("fp8rl-test", "t")
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert config["log"]["wandb"] == wandb and config["train"]["steps"] == 2
    history = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = r.history.item
            history.append(
                {i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in items}
            )
    rows = read_metrics(run_dir)
    assert [h["_step"] for h in history] == [r["step"] for r in rows] == [0, 1]
    for h, row in zip(history, rows, strict=True):
        scalars = {k: v for k, v in row.items() if k != "step" and isinstance(v, float)}
        assert "rollout/reward" in scalars and "calib/lower" in scalars
        assert {k: h.get(k) for k in scalars} == pytest.approx(scalars)


def test_missing_wandb_is_one_error_naming_the_key(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    config = {"name": "t", "log": {"wandb": {"project": "p"}}}
    with pytest.raises(Fp8rlError, match="log.wandb") as e:
        MetricsLog(tmp_path, config=config)
    assert "\n" not in str(e.value) and "pip install fp8rl[wandb]" in str(e.value)
    assert not (tmp_path / "metrics.jsonl").exists()  # stopped before any log file

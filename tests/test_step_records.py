"""The step's Timer (step/records.py): wall and CPU seconds per phase."""

import time

import pytest

from fp8rl.step.records import Timer


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_cpu_seconds_count_work_and_not_sleep():
    t = Timer()
    with t("work"):
        _spin(0.05)
    with t("sleep"):
        time.sleep(0.05)
    m = t.metrics()
    assert m["time/cpu_work"] >= 0.05
    assert m["time/cpu_sleep"] < 0.02  # sleeping costs wall time, not CPU time
    assert m["time/sleep"] >= 0.05
    assert m["time/cpu_step"] == pytest.approx(m["time/cpu_work"] + m["time/cpu_sleep"])
    assert m["time/step"] == pytest.approx(m["time/work"] + m["time/sleep"])


def test_a_phase_entered_twice_adds_up():
    t = Timer()
    for _ in range(2):
        with t("work"):
            _spin(0.02)
    assert t.metrics()["time/cpu_work"] >= 0.04

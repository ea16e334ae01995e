"""get_task and the shared Task behaviour."""

import pytest

from fp8rl.errors import ConfigError
from fp8rl.tasks import TASKS, ArithmeticTask, MathTask, Sample, Task, get_task


def test_registry_builds_each_task_from_config_fields():
    assert set(TASKS) == {"arithmetic", "math", "chain_arithmetic", "arithmetic_qa"}
    task = get_task("arithmetic", digits=3, ops="+-", train_size=20, test_size=5, seed=4)
    assert isinstance(task, ArithmeticTask) and isinstance(task, Task)
    assert (task.config.digits, task.config.ops, task.config.seed) == (3, "+-", 4)
    assert len(task.samples("train")) == 20
    math = get_task("math", timeout_s=2)
    assert isinstance(math, MathTask) and math.config.timeout_s == 2
    assert math.tokenizer is None  # uses the checkpoint's


def test_unknown_task_and_unknown_field():
    with pytest.raises(ConfigError, match="config key 'task' = 'gsm8k'.*'arithmetic', 'math'"):
        get_task("gsm8k")
    with pytest.raises(ConfigError, match="config key 'arithmetic.digit' = 3.*digits"):
        get_task("arithmetic", digit=3)


def test_rewards_checks_lengths_and_templates_substitute_literally():
    task = ArithmeticTask(train_size=10, test_size=10)
    with pytest.raises(ValueError, match="2 responses for 1 samples"):
        task.rewards(["1", "2"], [Sample(prompt="1+1=", answer="2")])
    math = MathTask(template="Problem: {question} Put it in \\boxed{}.")
    assert math.format_prompt("1+1?") == "Problem: 1+1? Put it in \\boxed{}."

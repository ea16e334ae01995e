"""scripts/check_real_model.py: what it reads from README.md and what it requires of step 1."""

from pathlib import Path

import pytest

from helpers_scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
crm = load_script("check_real_model")


def test_the_readme_block_is_install_fetch_and_a_two_step_calibrated_run():
    commands = crm.readme_commands(ROOT / "README.md")
    assert len(commands) == 3
    assert "pip install -e '.[gguf]'" in commands[0]
    assert commands[1] == "fp8rl model fetch smollm2-135m-instruct"
    train = commands[2].split()
    assert train[:2] == ["fp8rl", "train"] and "configs/real-model.yaml" in train
    assert {"train.steps=2", "calibration.interval=1"} <= set(train)
    assert crm.run_folder(commands) == ROOT / "runs" / "real-model"


def test_a_readme_without_the_section_or_with_two_blocks_is_refused(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n## Training\n```bash\nfp8rl train\n```\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="no section"):
        crm.readme_commands(readme)
    block = "```bash\nfp8rl model list\n```\n"
    readme.write_text(f"{crm.SECTION}\n{block}{block}## Next\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="exactly one bash block, has 2"):
        crm.readme_commands(readme)


@pytest.mark.parametrize(
    "row, problems",
    [
        ({"calib/updated": 1.0, "shadow/nmae_prob": 0.09}, 0),
        ({"calib/updated": 0.0, "shadow/nmae_prob": 0.09}, 1),  # no refit at step 1
        ({"calib/updated": 1.0, "shadow/nmae_prob": 0.02}, 1),  # below the range
        ({"calib/updated": 1.0, "shadow/nmae_prob": 0.26}, 1),  # above it
        ({"calib/updated": 1.0, "shadow/nmae_prob": float("nan")}, 1),
        ({"calib/updated": 1.0}, 1),  # no shadow pass ran
        ({}, 2),
    ],
)
def test_step_one_needs_a_refit_and_a_noise_in_range(row, problems):
    assert len(crm.check(row)) == problems

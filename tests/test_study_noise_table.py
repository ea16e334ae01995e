"""The noise-by-recipe study: its spec covers the six recipes on the demo's model and warm
start, and its table prints mean +- SE over seeds of the shadow noise statistics."""

from pathlib import Path

import yaml

from fp8rl.config.precision import RECIPE_OF_PRECISION
from fp8rl.fp8 import RECIPES
from fp8rl.study.noise_table import main, noise_table
from fp8rl.study.sweep.spec import load_spec, run_configs

CONFIGS = Path(__file__).parents[1] / "configs"


def test_spec_runs_every_recipe_in_both_phases_from_the_demos_warm_start(tmp_path):
    spec = load_spec(CONFIGS / "noise-by-recipe.yaml")
    configs = run_configs(spec, tmp_path / "out")
    assert sorted(RECIPE_OF_PRECISION[a] for a in spec.arms) == sorted(RECIPES)
    assert configs
    for (arm, _), cfg in configs.items():
        assert cfg.rollout.precision == cfg.train.precision == arm
        assert cfg.loss.mode == "grpo" and cfg.calibration.diagnostics
    demo = yaml.safe_load((CONFIGS / "demo.yaml").read_text())["base"]
    mine = yaml.safe_load((CONFIGS / "noise-by-recipe.yaml").read_text())["base"]
    for key in ("task", "model", "warm_start"):  # the same cached warm start
        assert mine[key] == demo[key], key
    assert list(spec.seeds) == [0, 1, 2]


def test_table_rows_are_mean_and_se_of_each_arm(tmp_path, capsys):
    stats = lambda mean, se: {"mean": mean, "se": se}  # noqa: E731
    agg = {
        "arms": {
            "mxfp8": {
                "seeds": [0, 1, 2],
                "metrics": {
                    "shadow/nmae_prob": stats(0.0123, 0.0004),
                    "shadow/amplification": stats(1.1, 0.02),
                    "shadow/logratio_err_sd": stats(0.03125, 0.001),
                    "shadow/logratio_err_tail": stats(0.0001, None),
                    "shadow/lower_clip_excess": stats(0.0245, 0.0014),
                },
            },
            "nvfp4": {"seeds": [0], "metrics": {}},
        }
    }
    text = noise_table(agg).splitlines()
    assert text[0].startswith("| recipe | seeds | probability NMAE (%) | amplification |")
    assert (
        text[2]
        == "| mxfp8 | 3 | 1.23 ± 0.04 | 1.10 ± 0.02 | 0.0312 ± 0.0010 | 0.010 | 2.45 ± 0.14 |"
    )
    assert text[3] == "| nvfp4 | 1 | - | - | - | - | - |"
    (tmp_path / "aggregate.json").write_text(__import__("json").dumps(agg))
    assert main([str(tmp_path)]) == 0 and "| mxfp8 | 3 |" in capsys.readouterr().out


def test_the_nvfp4_demo_is_the_demo_with_both_precisions_in_nvfp4():
    demo = yaml.safe_load((Path(__file__).parents[1] / "src/fp8rl/configs/demo.yaml").read_text())
    mine = yaml.safe_load((CONFIGS / "demo-nvfp4.yaml").read_text())
    for phase in ("rollout", "train"):
        assert mine["base"][phase].pop("precision") == "nvfp4"
        demo["base"][phase].pop("precision")
    assert mine == demo

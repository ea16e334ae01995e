"""`model.keep_high_precision`: which linear layers a quantized run keeps in high precision.

Its fields alone are checked with the rest of the config; what needs the model (more blocks
than it has, a pattern matching none of its layers) is checked once it is built, before the
warm start and the run folder (the Trainer calls `check_model`). The conversion applies it
(`fp8.convert_to_fp8(..., keep=)`), and `summary` is what final.json records of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from ..errors import ConfigError
from ..fp8 import ConversionReport, KeepHighPrecision
from ..fp8.keep import LM_HEAD, linear_layers
from .checks import between
from .precision import conversion_recipe, recipe_for

KEY = "model.keep_high_precision"


@dataclass
class KeepHighPrecisionConfig:
    lm_head: bool = True  # false: quantize the lm_head too
    first_blocks: int = 0  # every linear layer of the first N decoder blocks
    last_blocks: int = 0  # ... of the last N
    down_proj: bool = False  # every MLP down-projection
    modules: list = field(default_factory=list)  # fnmatch patterns of full module names

    def check(self) -> None:
        between(f"{KEY}.first_blocks", self.first_blocks, 0, 1 << 20)
        between(f"{KEY}.last_blocks", self.last_blocks, 0, 1 << 20)
        if not isinstance(self.modules, list) or not all(
            isinstance(p, str) and p.strip() for p in self.modules
        ):
            raise ConfigError(
                f"{KEY}.modules", self.modules, "a list of module name patterns, e.g. ['*.o_proj']"
            )

    def policy(self) -> KeepHighPrecision:
        return KeepHighPrecision(
            lm_head=self.lm_head,
            first_blocks=self.first_blocks,
            last_blocks=self.last_blocks,
            down_proj=self.down_proj,
            modules=tuple(self.modules),
        )


def check_model(model: torch.nn.Module, cfg, device: torch.device) -> None:
    """ConfigError naming the key for an option this built model cannot honour."""
    keep = cfg.model.keep_high_precision
    recipe = conversion_recipe(cfg.rollout.precision, cfg.train.precision)
    if recipe is None:
        return  # nothing is quantized: nothing to keep
    policy = keep.policy()
    for name, value, allowed in policy.problems(model):
        raise ConfigError(f"{KEY}.{name}", value, allowed)
    if not keep.lm_head:
        a = recipe.alignment
        for name, lin in linear_layers(model):
            if name.rsplit(".", 1)[-1] == LM_HEAD and (lin.in_features % a or lin.out_features % a):
                raise ConfigError(
                    f"{KEY}.lm_head",
                    False,
                    f"true: {name} ({lin.in_features} -> {lin.out_features}) has dims that are "
                    f"not multiples of {a}, the alignment of recipe {recipe.name}",
                )
    rollout = recipe_for(cfg.rollout.precision)
    vllm_fp8 = cfg.rollout.engine == "vllm" and device.type == "cuda"
    if vllm_fp8 and rollout is not None and rollout.block_format is None:
        if policy != KeepHighPrecision():
            # vLLM's own FP8 quantizes every layer but lm_head: the rollout would not keep these
            raise ConfigError(
                KEY,
                dataclasses.asdict(keep),
                "the default with rollout.engine=vllm and an FP8 rollout on CUDA",
            )


def summary(cfg, report: ConversionReport | None) -> dict:
    """What final.json records: the choice, the FP8 coverage, the layers converted and kept."""
    if report is None:
        return {}
    return {
        "fp8_keep_high_precision": dataclasses.asdict(cfg.model.keep_high_precision),
        "fp8_coverage": report.coverage,
        "fp8_layers_converted": len(report.converted) + len(report.updated),
        "fp8_layers_kept": len(report.skipped),
    }

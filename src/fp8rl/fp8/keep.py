"""Which linear layers stay in high precision (`KeepHighPrecision`), and the FP8 coverage a
conversion leaves: the fraction of the linear layers' GEMM FLOPs per token that run in FP8.

The policy is applied at one seam, `convert_to_fp8`: a layer it keeps stays an `nn.Linear`,
so every phase that sets recipes afterwards (`use_recipe` in the rollout and the trainer)
leaves it alone, and rollout and training agree on it.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import torch.nn as nn

LM_HEAD = "lm_head"  # the last name part of the output projection
DOWN_PROJ = "down_proj"  # the last name part of an MLP's down-projection


@dataclass(frozen=True)
class KeepHighPrecision:
    """lm_head: keep the output projection (True: fp8rl's default; False quantizes it too).
    first_blocks / last_blocks: keep every linear layer of the first / last N decoder blocks.
    down_proj: keep every layer named down_proj. modules: fnmatch patterns of full module
    names (`model.layers.1[5-9].*`, `*.o_proj`) to keep."""

    lm_head: bool = True
    first_blocks: int = 0
    last_blocks: int = 0
    down_proj: bool = False
    modules: tuple[str, ...] = ()

    def reasons(self, model: nn.Module) -> dict[str, str]:
        """Name -> why, for every linear layer of `model` this policy keeps."""
        blocks = decoder_blocks(model)
        out = {}
        for name, _ in linear_layers(model):
            why = self.why(name, blocks)
            if why:
                out[name] = "; ".join(why)
        return out

    def why(self, name: str, blocks: tuple[str, int] | None) -> list[str]:
        """Each reason this policy keeps the module `name` (a linear layer, or a fused-experts
        module, which only its block and the name patterns can keep)."""
        last = name.rsplit(".", 1)[-1]
        why = []
        if self.lm_head and last == LM_HEAD:
            why.append("lm_head stays high precision (keep_high_precision.lm_head)")
        why += [f"matches keep_high_precision.modules {p!r}" for p in self.modules_matching(name)]
        index = block_index(name, blocks)
        if index is not None:
            where = f"block {index} of {blocks[1]}"
            if index < self.first_blocks:
                why.append(f"{where} (keep_high_precision.first_blocks={self.first_blocks})")
            if index >= blocks[1] - self.last_blocks:
                why.append(f"{where} (keep_high_precision.last_blocks={self.last_blocks})")
        if self.down_proj and last == DOWN_PROJ:
            why.append("an MLP down-projection (keep_high_precision.down_proj)")
        return why

    def modules_matching(self, name: str) -> list[str]:
        return [p for p in self.modules if fnmatch.fnmatchcase(name, p)]

    def problems(self, model: nn.Module) -> list[tuple[str, object, str]]:
        """(field, value, what it needs) for each option `model` cannot honour: more blocks
        than it has, no down_proj to keep, a pattern that matches no linear layer."""
        names = [name for name, _ in linear_layers(model)]
        blocks = decoder_blocks(model)
        out = []
        for field in ("first_blocks", "last_blocks"):
            n = getattr(self, field)
            if n and blocks is None:
                out.append((field, n, "0: the model has no list of decoder blocks"))
            elif blocks is not None and n > blocks[1]:
                out.append((field, n, f"at most the model's {blocks[1]} decoder blocks"))
        if self.down_proj and not any(n.rsplit(".", 1)[-1] == DOWN_PROJ for n in names):
            out.append(("down_proj", True, "false: the model has no linear layer named down_proj"))
        for p in self.modules:
            if not any(fnmatch.fnmatchcase(n, p) for n in names):
                example = f" (e.g. {names[0]})" if names else ""
                out.append(("modules", p, f"a pattern matching a linear layer's name{example}"))
        return out


def linear_layers(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """(name, layer) of every nn.Linear of the model, each module once."""
    return [(n, m) for n, m in model.named_modules() if n and isinstance(m, nn.Linear)]


def decoder_blocks(model: nn.Module) -> tuple[str, int] | None:
    """(name, length) of the model's decoder blocks: the outermost nn.ModuleList holding
    linear layers (`model.layers` in Llama and Qwen; a MoE's experts lie deeper)."""
    best = None
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.ModuleList) or len(mod) == 0:
            continue
        if not any(isinstance(m, nn.Linear) for m in mod.modules()):
            continue
        depth = name.count(".")
        if best is None or depth < best[0]:
            best = (depth, name, len(mod))
    return None if best is None else (best[1], best[2])


def block_index(name: str, blocks: tuple[str, int] | None) -> int | None:
    """The decoder block a layer's name lies in, or None (lm_head, say)."""
    if blocks is None:
        return None
    prefix = f"{blocks[0]}." if blocks[0] else ""
    if not name.startswith(prefix):
        return None
    head = name[len(prefix) :].split(".", 1)[0]
    return int(head) if head.isdigit() else None


def gemm_macs(in_features: int, out_features: int) -> int:
    """Multiply-adds per token of a linear layer's forward GEMM; its two backward GEMMs have
    as many each, so a share of these is the share of all three."""
    return in_features * out_features

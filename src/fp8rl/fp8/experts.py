"""`Fp8Experts`: a mixture-of-experts block's fused experts whose GEMMs run under a recipe.

`transformers` 5.x stores a MoE layer's experts as two 3-D parameters, `gate_up_proj`
(E, 2I, H: each expert's gate and up projections stacked) and `down_proj` (E, H, I), not as
nn.Linear, so the linear swap never reaches them. Here each expert's two GEMMs are quantized
exactly as an Fp8Linear's (forward, grad input and grad weight, each along its own K) with
that expert's weight, the parameters and their names unchanged. The router stays in high
precision (it is no module of this class): its top-k is a discrete choice that an FP8 error
in its logits flips, swapping a token's whole MLP output, and its GEMM (E outputs) is too
small for FP8 to save anything.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .linear import _Fp8LinearFn, _HpBackwardFn, _what, quantize_operand
from .matmul import scaled_matmul
from .recipe import as_recipe

# Fused-experts classes whose forward is the loop below (gate first, then up, in gate_up_proj)
FUSED_EXPERTS = ("Qwen3MoeExperts", "Qwen2MoeExperts", "MixtralExperts")
PROJECTIONS = ("gate_up_proj", "down_proj")


def is_fused_experts(mod: nn.Module) -> bool:
    """A module of fused 3-D expert weights (any class: unknown ones are reported skipped)."""
    return all(
        isinstance(getattr(mod, n, None), nn.Parameter) and getattr(mod, n).dim() == 3
        for n in PROJECTIONS
    )


class Fp8Experts(nn.Module):
    """The experts of one MoE layer, sharing the original module's parameters (no copy).

    recipe None computes exactly what `transformers`' loop does. Quantized weights are cached
    per expert, keyed by both parameters' versions and the recipe, as Fp8Linear's are.
    """

    def __init__(self, experts: nn.Module, recipe=None):
        super().__init__()
        self.gate_up_proj = experts.gate_up_proj
        self.down_proj = experts.down_proj
        self.act_fn = experts.act_fn
        self.num_experts = int(experts.gate_up_proj.shape[0])
        self.hidden_dim = int(experts.gate_up_proj.shape[2])
        self.intermediate_dim = int(experts.down_proj.shape[2])
        self.recipe = as_recipe(recipe)
        self.weight_quantizations = 0
        self._wcache: tuple | None = None
        self.label: str | None = None
        self.train(experts.training)

    def extra_repr(self) -> str:
        rec = self.recipe.name if self.recipe is not None else "high precision"
        return (
            f"num_experts={self.num_experts}, hidden={self.hidden_dim}, "
            f"intermediate={self.intermediate_dim}, recipe={rec}"
        )

    def invalidate_weight_cache(self) -> None:
        self._wcache = None

    def _apply(self, fn, *args, **kwargs):
        self._wcache = None
        return super()._apply(fn, *args, **kwargs)

    def quantized_weight(self, recipe=None) -> tuple[tuple, tuple]:
        """Per expert, the gate_up and down weights quantized along K (one cached object)."""
        r = recipe or self.recipe
        ws = (self.gate_up_proj, self.down_proj)
        key = (*((w._version, w.data_ptr(), w.device, w.dtype, tuple(w.shape)) for w in ws), r)
        if self._wcache is not None and self._wcache[0] == key:
            cached = self._wcache[1]
            if torch.is_inference_mode_enabled() or not cached[0][0].data.is_inference():
                return cached
        with torch.no_grad():
            cached = tuple(
                tuple(
                    quantize_operand(
                        w[e], r, fmt=r.fwd_fmt, weight=True, name=self._name(f"{n}[{e}]")
                    )
                    for e in range(self.num_experts)
                )
                for n, w in zip(PROJECTIONS, ws, strict=True)
            )
        self._wcache = (key, cached)
        self.weight_quantizations += 1
        return cached

    def _name(self, what: str) -> str:
        return f"{self.label}.{what}" if self.label else what

    def _gemm(self, x: torch.Tensor, weight: torch.Tensor, wq, what: str) -> torch.Tensor:
        """x @ weight^T as Fp8Linear computes it (wq: weight quantized), or F.linear."""
        r = self.recipe
        if r is None:
            return F.linear(x, weight)
        dtype = x.dtype
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
        label = self._name(what)
        with torch.no_grad():
            xq = quantize_operand(x, r, fmt=r.fwd_fmt, weight=False, name=_what(label, "input"))
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            fn = _HpBackwardFn if r.hp_backward else _Fp8LinearFn
            return fn.apply(x, weight, r, wq, dtype, label, xq)
        return scaled_matmul(xq, wq, dtype, use_fast_accum=r.use_fast_accum)

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """hidden_states (N, H); top_k_index, top_k_weights (N, k): the router's choices."""
        final = torch.zeros_like(hidden_states)
        none = (None,) * self.num_experts
        wq_gate_up, wq_down = self.quantized_weight() if self.recipe is not None else (none, none)
        with torch.no_grad():
            # (E + 1, k, N): as transformers' loop, an index of E (no expert) is dropped
            expert_mask = F.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
            hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit[:, 0].tolist():
            if e == self.num_experts:
                continue
            top_k_pos, token_idx = torch.where(expert_mask[e])
            x = hidden_states[token_idx]
            gate_up = self._gemm(x, self.gate_up_proj[e], wq_gate_up[e], f"gate_up_proj[{e}]")
            gate, up = gate_up.chunk(2, dim=-1)
            h = self._gemm(self.act_fn(gate) * up, self.down_proj[e], wq_down[e], f"down_proj[{e}]")
            h = h * top_k_weights[token_idx, top_k_pos, None]
            final.index_add_(0, token_idx, h.to(final.dtype))
        return final

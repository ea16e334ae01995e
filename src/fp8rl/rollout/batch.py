"""`RolloutBatch`: the generated samples of one step, one row per sample."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .masks import position_ids as _position_ids

_ROW_TENSORS = (
    "prompt_ids",
    "prompt_mask",
    "response_ids",
    "response_mask",
    "log_probs",
    "truncated",
    "response_lengths",
    "prompt_index",
)
_OPTIONAL = ("entropy", "full_log_probs")  # None: the engine did not record them
# the (B, T) tensors beside response_ids
_PER_TOKEN = ("response_mask", "log_probs", "entropy", "full_log_probs")


@dataclass
class RolloutBatch:
    """B = prompts x n rows; the n samples of a prompt are consecutive.

    - prompt_ids (B, P) int64, left padded with `pad_token_id`; prompt_mask (B, P) bool.
    - response_ids (B, T) int64, right padded; response_mask (B, T) bool, True for the
      generated tokens including a final EOS, False after it.
    - log_probs (B, T) float32: log-prob of each token under the distribution it was sampled
      from, at `temperature` (0 where the mask is False).
    - entropy (B, T) float32 or None: the entropy of that distribution, computed by the
      engine; None when the engine does not compute it (vLLM: a Python object per vocabulary
      entry and token would cost more than the rollout), and the trainer's old-log-prob pass
      fills it (step/step.py).
    - full_log_probs (B, T) float32 or None: each token's log-prob under the untruncated
      softmax(logits / temperature), what the trainer computes; the same tensor as
      `log_probs` when `top_p == 1`; None when the engine could not record it.
      `comparable_log_probs` reads it.
    - truncated (B,) bool: no EOS within max_new_tokens. response_lengths (B,) int64.
    - prompt_index (B,) int64: which prompt of the `generate` call a row belongs to.
    - texts: decoded responses (masked-in tokens, special tokens and EOS kept) when a
      tokenizer was given.
    - temperature: the one the log-probs are under (pass it to `compute_log_probs`).
    - top_p: the nucleus `log_probs` and `entropy` are of (1.0: no truncation).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    log_probs: torch.Tensor
    entropy: torch.Tensor | None
    truncated: torch.Tensor
    response_lengths: torch.Tensor
    prompt_index: torch.Tensor
    texts: list[str] | None = None
    temperature: float = 1.0
    pad_token_id: int = 0
    full_log_probs: torch.Tensor | None = None
    top_p: float = 1.0

    def __post_init__(self):
        if self.full_log_probs is None and self.top_p == 1.0:
            self.full_log_probs = self.log_probs  # nothing truncated: the same numbers
        b = self.prompt_ids.shape[0]
        for name in self._row_tensors():
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.shape[0] != b:
                raise ValueError(
                    f"RolloutBatch.{name}: expected a tensor with {b} rows, "
                    f"got {getattr(t, 'shape', type(t).__name__)}"
                )
        if self.prompt_mask.shape != self.prompt_ids.shape:
            raise ValueError(
                f"RolloutBatch.prompt_mask: shape {tuple(self.prompt_mask.shape)} "
                f"!= prompt_ids {tuple(self.prompt_ids.shape)}"
            )
        for name in _PER_TOKEN:
            if getattr(self, name) is None:
                continue
            if getattr(self, name).shape != self.response_ids.shape:
                raise ValueError(
                    f"RolloutBatch.{name}: shape {tuple(getattr(self, name).shape)} "
                    f"!= response_ids {tuple(self.response_ids.shape)}"
                )
        if self.texts is not None and len(self.texts) != b:
            raise ValueError(f"RolloutBatch.texts: {len(self.texts)} texts for {b} rows")

    def _row_tensors(self) -> tuple[str, ...]:
        return (*_ROW_TENSORS, *(n for n in _OPTIONAL if getattr(self, n) is not None))

    @property
    def comparable_log_probs(self) -> torch.Tensor:
        """The rollout's log-probs to compare with the trainer's full-softmax ones (TIS, the
        mismatch metrics): `full_log_probs`. Raises when the engine did not record them."""
        if self.full_log_probs is None:
            raise ValueError(
                f"RolloutBatch: top_p={self.top_p} and no full-softmax log-probs recorded: "
                "TIS and the rollout/trainer mismatch need them (docs/rollout.md)"
            )
        return self.full_log_probs

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def device(self) -> torch.device:
        return self.prompt_ids.device

    @property
    def num_tokens(self) -> int:
        """Generated tokens in the batch (masked-in response tokens)."""
        return int(self.response_lengths.sum())

    # ------------------------------------------------------------ the full sequence
    @property
    def input_ids(self) -> torch.Tensor:
        """(B, P + T) prompt then response."""
        return torch.cat([self.prompt_ids, self.response_ids], 1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(B, P + T) int64 0/1, the `transformers` convention."""
        return torch.cat([self.prompt_mask, self.response_mask], 1).long()

    @property
    def position_ids(self) -> torch.Tensor:
        """(B, P + T): 0 at each row's first real prompt token."""
        return _position_ids(torch.cat([self.prompt_mask, self.response_mask], 1))

    # ------------------------------------------------------------ rows
    def select(self, indices) -> RolloutBatch:
        """The rows `indices` (int64 indices or a (B,) bool mask, tensor or list), in that order.

        Shapes along P and T are kept; `prompt_index` keeps pointing at the original prompts.
        """
        if isinstance(indices, (list, tuple, range)) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in indices
        ):
            return self._select_host(list(indices))
        idx = torch.as_tensor(indices)
        if idx.dtype == torch.bool:
            if idx.shape != (len(self),):
                raise ValueError(
                    f"RolloutBatch.select: bool mask of shape {tuple(idx.shape)} "
                    f"for {len(self)} rows"
                )
            idx = idx.nonzero().squeeze(1)
        elif idx.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise TypeError(
                f"RolloutBatch.select: indices of dtype {idx.dtype}: expected integers or bool"
            )
        idx = idx.reshape(-1).long()
        if idx.numel() and (int(idx.min()) < -len(self) or int(idx.max()) >= len(self)):
            raise IndexError(
                f"RolloutBatch.select: indices {idx.tolist()} out of range for {len(self)} rows"
            )
        idx = idx.to(self.device)
        rows = {
            name: getattr(self, name).index_select(0, idx % max(len(self), 1))
            for name in self._row_tensors()
        }
        texts = None if self.texts is None else [self.texts[i] for i in idx.tolist()]
        return replace(self, **rows, texts=texts)

    def _select_host(self, rows: list[int]) -> RolloutBatch:
        # host indices are checked on the host: selecting rows of a GPU batch reads nothing back
        n = len(self)
        if rows and (min(rows) < -n or max(rows) >= n):
            raise IndexError(f"RolloutBatch.select: indices {rows} out of range for {n} rows")
        rows = [i % n for i in rows]
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        picked = {name: getattr(self, name).index_select(0, idx) for name in self._row_tensors()}
        texts = None if self.texts is None else [self.texts[i] for i in rows]
        return replace(self, **picked, texts=texts)

    def to(self, device) -> RolloutBatch:
        return replace(
            self, **{name: getattr(self, name).to(device) for name in self._row_tensors()}
        )

    @classmethod
    def concat(cls, batches: list[RolloutBatch]) -> RolloutBatch:
        """Rows of several batches (e.g. DAPO's over-sampling until enough groups survive).

        Prompts are re-padded on the left and responses on the right to the widest;
        `prompt_index` of each later batch is offset past the previous ones, so rows of
        different `generate` calls never form one group.
        """
        if not batches:
            raise ValueError("RolloutBatch.concat: batches is empty")
        first = batches[0]
        for b in batches[1:]:
            for name in ("temperature", "top_p"):
                if getattr(b, name) != getattr(first, name):
                    raise ValueError(
                        f"RolloutBatch.concat: {name} differs "
                        f"({getattr(first, name)} vs {getattr(b, name)})"
                    )
        p = max(b.prompt_ids.shape[1] for b in batches)
        t = max(b.response_ids.shape[1] for b in batches)
        pad = first.pad_token_id
        optional = [n for n in _OPTIONAL if all(getattr(b, n) is not None for b in batches)]
        out = {name: [] for name in (*_ROW_TENSORS, *optional)}
        offset = 0
        for b in batches:
            dp, dt = p - b.prompt_ids.shape[1], t - b.response_ids.shape[1]
            out["prompt_ids"].append(torch.nn.functional.pad(b.prompt_ids, (dp, 0), value=pad))
            out["prompt_mask"].append(torch.nn.functional.pad(b.prompt_mask, (dp, 0), value=False))
            out["response_ids"].append(torch.nn.functional.pad(b.response_ids, (0, dt), value=pad))
            for name in ("response_mask", "log_probs", *optional):
                out[name].append(torch.nn.functional.pad(getattr(b, name), (0, dt), value=0))
            for name in ("truncated", "response_lengths"):
                out[name].append(getattr(b, name))
            out["prompt_index"].append(b.prompt_index + offset)
            if len(b):
                offset += int(b.prompt_index.max()) + 1
        texts = None
        if all(b.texts is not None for b in batches):
            texts = [s for b in batches for s in b.texts]
        return cls(
            **{**dict.fromkeys(_OPTIONAL), **{k: torch.cat(v, 0) for k, v in out.items()}},
            texts=texts,
            temperature=first.temperature,
            pad_token_id=pad,
            top_p=first.top_p,
        )

"""Supervised examples as tensors: (prompt, target) pairs -> right-padded ids, mask, labels."""

from __future__ import annotations

from collections.abc import Sequence


def encode_pairs(tokenizer, pairs: Sequence[tuple[str, str]], device=None):
    """(input_ids, attention_mask, labels), right-padded; labels are -100 on the prompt and the
    padding, so a causal LM loss covers each target and its <eos> only."""
    import torch  # not at import time: grading workers import this package

    eos = tokenizer.eos_token_id
    rows, labels = [], []
    for prompt, target in pairs:
        # the prompt is encoded exactly as the rollout engine encodes it (special tokens included)
        p = tokenizer(prompt)["input_ids"]
        t = tokenizer(target, add_special_tokens=False)["input_ids"] + [eos]
        rows.append(p + t)
        labels.append([-100] * len(p) + t)
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    att = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, lb) in enumerate(zip(rows, labels, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        lab[i, : len(lb)] = torch.tensor(lb)
        att[i, : len(r)] = 1
    if device is not None:
        ids, att, lab = ids.to(device), att.to(device), lab.to(device)
    return ids, att, lab

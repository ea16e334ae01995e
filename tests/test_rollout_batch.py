"""RolloutBatch helpers: select, to, concat and the full-sequence views."""

import pytest
import torch

from fp8rl.models import tiny_qwen3
from fp8rl.rollout import RolloutBatch, RolloutEngine, SamplingParams, compute_log_probs
from helpers_rollout import hand_batch


def test_full_sequence_views():
    b = hand_batch()
    assert b.input_ids[1].tolist() == [0, 3, 8, 0]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1], [0, 1, 1, 0], [1, 1, 1, 1]]
    assert b.attention_mask.dtype == torch.int64
    assert b.position_ids[1].tolist()[1:3] == [0, 1]  # the first real token is position 0
    assert b.position_ids[0].tolist() == [0, 1, 2, 3]
    assert b.num_tokens == 5 and len(b) == 3


@pytest.mark.parametrize("indices", [[2, 0], torch.tensor([2, 0]), torch.tensor([-1, 0])])
def test_select_rows_in_order(indices):
    s = hand_batch().select(indices)
    assert s.response_ids.tolist() == [[9, 10], [6, 7]]
    assert s.log_probs.tolist() == [[-4.0, -5.0], [-1.0, -2.0]]
    assert s.prompt_index.tolist() == [1, 0] and s.truncated.tolist() == [True, True]
    assert s.texts == ["c", "a"]


def test_select_with_a_bool_mask_and_bad_indices():
    s = hand_batch(texts=False).select(torch.tensor([False, True, True]))
    assert s.prompt_ids.tolist() == [[0, 3], [4, 5]] and s.texts is None
    assert len(hand_batch().select([])) == 0
    with pytest.raises(IndexError, match="out of range"):
        hand_batch().select([3])
    with pytest.raises(ValueError, match="bool mask"):
        hand_batch().select(torch.tensor([True, False]))
    with pytest.raises(TypeError, match="dtype"):
        hand_batch().select(torch.tensor([0.0]))


def test_to_moves_every_row_tensor():
    b = hand_batch().to("meta")
    assert b.log_probs.device.type == "meta" and b.prompt_index.device.type == "meta"
    assert b.texts == ["a", "b", "c"]


def test_shape_checks():
    with pytest.raises(ValueError, match="log_probs"):
        RolloutBatch(**{**hand_batch().__dict__, "log_probs": torch.zeros(3, 5)})
    with pytest.raises(ValueError, match="truncated"):
        RolloutBatch(**{**hand_batch().__dict__, "truncated": torch.zeros(2, dtype=torch.bool)})


def test_concat_repads_and_keeps_groups_apart():
    model = tiny_qwen3(seed=0, initializer_range=0.1).eval()
    eng = RolloutEngine(model, pad_token_id=0, eos_token_id=[])
    gen = torch.Generator().manual_seed(0)
    a = eng.generate([[5, 6], [7]], SamplingParams(n=2, max_new_tokens=3), generator=gen)
    b = eng.generate([[8, 9, 10, 11]], SamplingParams(n=2, max_new_tokens=5), generator=gen)
    c = RolloutBatch.concat([a, b])
    assert c.prompt_ids.shape == (6, 4) and c.response_ids.shape == (6, 5)
    assert c.prompt_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert not c.response_mask[:4, 3:].any() and (c.log_probs[:4, 3:] == 0).all()
    with torch.no_grad():
        lp, _ = compute_log_probs(model, c)
        lp_a, _ = compute_log_probs(model, a)
    torch.testing.assert_close(lp[:4, :3], lp_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(lp, c.log_probs, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="empty"):
        RolloutBatch.concat([])

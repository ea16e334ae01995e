"""A chat checkpoint through the trainer: its tokenizer kept, its chat template applied, its
generation config's EOS list kept whole, and a step that samples from the chat prompts."""

import pytest

from fp8rl.config import config_from_dict
from fp8rl.models import tiny_qwen3
from fp8rl.train.trainer import Trainer
from helpers_chat import CHATML_DEFAULT_SYSTEM, chat_tokenizer
from helpers_config import tiny_config


@pytest.fixture(scope="module")
def chat_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat-model")
    tok = chat_tokenizer(CHATML_DEFAULT_SYSTEM)
    model = tiny_qwen3(vocab_size=len(tok), hidden_size=32, intermediate_size=64)
    end_of_text = tok.convert_tokens_to_ids("<|endoftext|>")
    model.config.eos_token_id = tok.eos_token_id
    model.generation_config.eos_token_id = [tok.eos_token_id, end_of_text]
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, tok, end_of_text


def chat_run(tmp_path, folder, **task):
    return config_from_dict(
        tiny_config(
            tmp_path,
            model={"source": str(folder), "tiny": {}},
            task={
                "name": "arithmetic_qa",
                "options": {"ops": "+", "test_size": 8},
                "system_prompt": "none",
                **task,
            },
            rollout={"prompts_per_step": 2, "n": 2, "max_new_tokens": 3},
            train={"steps": 1, "mini_batches": 1},
            log={"out_dir": str(tmp_path / "run"), "eval_size": 0, "progress": False},
        )
    )


def test_chat_checkpoint_runs_a_step_from_chat_prompts(tmp_path, chat_checkpoint):
    folder, tok, end_of_text = chat_checkpoint
    trainer = Trainer(chat_run(tmp_path, folder))
    assert trainer.engine.eos_token_ids == (tok.eos_token_id, end_of_text)
    assert trainer.model.generation_config.eos_token_id == [tok.eos_token_id, end_of_text]
    s = trainer.train_samples[0]
    assert s.prompt == (
        f"<|im_start|>user\nWhat is {s.question}?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert list(s.prompt_ids) == tok(s.prompt, add_special_tokens=False)["input_ids"]
    rows = trainer.fit()
    assert len(rows) == 1 and isinstance(rows[0]["rollout/reward"], float)
    # the chat wrapper keeps the task's garble kinds, each logged beside the garble rate
    assert trainer.task.garble_kinds == ("no_number", "repeat", "foreign")
    for kind in trainer.task.garble_kinds:
        assert 0.0 <= rows[0][f"rollout/malformed_frac/{kind}"] <= rows[0]["rollout/malformed_frac"]


def test_chat_false_keeps_plain_prompts(tmp_path, chat_checkpoint):
    folder, _, _ = chat_checkpoint
    trainer = Trainer(chat_run(tmp_path, folder, chat=False, system_prompt="default"))
    s = trainer.train_samples[0]
    assert s.prompt == f"What is {s.question}?" and s.prompt_ids is None

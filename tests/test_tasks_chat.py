"""Chat prompts: the template applied with a default / no / given system prompt, one BOS,
the token ids reaching the rollout as they are, and task.chat resolved per task."""

import pytest

from fp8rl.errors import ConfigError
from fp8rl.tasks import ArithmeticQATask, ArithmeticTask, MathTask, Sample, chat_task
from fp8rl.tasks import prompt_inputs as inputs_of
from fp8rl.tasks.chat import ChatTask, chat_text, encode_chat
from helpers_chat import CHATML_DEFAULT_SYSTEM, chat_tokenizer

Q = "What is 7 + 5?"
USER_TURN = "<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\n"
# Qwen3-like: no system turn unless one is given
CHATML_PLAIN = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Llama-like: the template writes the BOS token itself
WITH_BOS = "{{ bos_token }}" + CHATML_PLAIN
# Llama-3.1-like: every system turn gets the template's own line first, none can be cut out
ALWAYS_SYSTEM = (
    "{{ '<|im_start|>system\\nDate: today\\n' }}{% if messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] }}{% endif %}{{ '<|im_end|>\\n' }}"
    "{% for m in messages %}{% if m['role'] != 'system' %}{{ '<|im_start|>' + m['role'] + "
    "'\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Mistral-like: a system message is folded into the user turn
FOLDED = (
    "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] + '\\n\\n' %}"
    "{% else %}{% set sys = '' %}{% endif %}"
    "{{ '[INST] ' + sys + messages[-1]['content'] + ' [/INST]' }}"
)
# Gemma-like: a system message is an error
REFUSING = (
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{{ '<u>' + messages[0]['content'] + '</u><a>' }}"
)


@pytest.mark.parametrize(
    "system,expected",
    [
        ("default", "<|im_start|>system\nYou are a bot.<|im_end|>\n" + USER_TURN),
        ("none", USER_TURN),
        ("Be brief.", "<|im_start|>system\nBe brief.<|im_end|>\n" + USER_TURN),
    ],
)
def test_system_prompt_with_a_template_that_inserts_a_default(system, expected):
    assert chat_text(chat_tokenizer(CHATML_DEFAULT_SYSTEM), Q, system) == expected


def test_none_is_the_plain_turn_when_the_template_adds_no_system():
    tok = chat_tokenizer(CHATML_PLAIN)
    assert chat_text(tok, Q, "none") == chat_text(tok, Q, "default") == USER_TURN


@pytest.mark.parametrize("template", [FOLDED, REFUSING])
def test_none_is_the_plain_turn_for_templates_without_system_turns(template):
    tok = chat_tokenizer(template)
    assert chat_text(tok, Q, "none") == chat_text(tok, Q, "default")
    assert "system" not in chat_text(tok, Q, "none")


def test_a_template_that_refuses_system_messages_names_the_key():
    assert (
        chat_text(chat_tokenizer(FOLDED), Q, "Be brief.") == "[INST] Be brief.\n\n" + Q + " [/INST]"
    )
    with pytest.raises(ConfigError, match="task.system_prompt.*refuses a system message"):
        chat_text(chat_tokenizer(REFUSING), Q, "Be brief.")


def test_none_is_refused_when_the_template_always_writes_a_system_turn():
    tok = chat_tokenizer(ALWAYS_SYSTEM)
    assert chat_text(tok, Q, "Hi.").startswith("<|im_start|>system\nDate: today\nHi.")
    with pytest.raises(ConfigError, match="task.system_prompt"):
        chat_text(tok, Q, "none")


def test_one_bos_when_the_template_writes_it():
    tok = chat_tokenizer(WITH_BOS, add_bos=True)
    text = chat_text(tok, Q, "none")
    assert text == "<s>" + USER_TURN
    bos = tok.bos_token_id
    assert tok(text)["input_ids"][:2] == [bos, bos]  # what plain tokenization would give
    ids = encode_chat(tok, text)
    assert ids[0] == bos and ids.count(bos) == 1
    assert tok.decode(list(ids)) == text


def test_the_tokenizer_bos_is_kept_when_the_template_has_none():
    tok = chat_tokenizer(CHATML_PLAIN, add_bos=True)
    ids = encode_chat(tok, chat_text(tok, Q))
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1


def test_chat_task_samples_carry_ids_and_keep_the_reward():
    tok = chat_tokenizer(CHATML_DEFAULT_SYSTEM)
    inner = ArithmeticQATask(ops="+")
    task = chat_task(inner, tok, system_prompt="none")
    s, plain = task.samples("test")[0], inner.samples("test")[0]
    assert s.prompt == f"<|im_start|>user\n{plain.prompt}<|im_end|>\n<|im_start|>assistant\n"
    assert list(s.prompt_ids) == tok(s.prompt, add_special_tokens=False)["input_ids"]
    assert (s.answer, s.question, task.name, task.config) == (
        plain.answer,
        plain.question,
        "arithmetic_qa",
        inner.config,
    )
    assert task.reward(f"It is {s.answer}.<|im_end|>", s).score == 1.0
    assert task.tokenizer is None  # the model's own tokenizer stays


def test_ids_reach_the_rollout_unchanged():
    from fp8rl.models import tiny_qwen3
    from fp8rl.rollout import RolloutEngine, SamplingParams

    tok = chat_tokenizer(WITH_BOS, add_bos=True)
    task = chat_task(ArithmeticQATask(ops="+"), tok)
    samples = task.samples("test")[:2]
    model = tiny_qwen3(vocab_size=len(tok), hidden_size=32, intermediate_size=64)
    batch = RolloutEngine(model, tok).generate(
        inputs_of(samples), SamplingParams(temperature=0, max_new_tokens=1)
    )
    for row, s in enumerate(samples):
        got = batch.prompt_ids[row][batch.prompt_mask[row]].tolist()
        assert got == list(s.prompt_ids) and got.count(tok.bos_token_id) == 1


def test_prompt_inputs_takes_ids_or_texts_never_a_mix():
    a = Sample(prompt="x", answer="1", prompt_ids=(5, 6))
    b = Sample(prompt="y", answer="2")
    assert inputs_of([a, a]) == [[5, 6], [5, 6]]
    assert inputs_of([b]) == ["y"]
    with pytest.raises(ValueError, match="prompt_ids"):
        inputs_of([a, b])


def test_chat_null_is_on_for_arithmetic_qa_with_a_template_only():
    tok = chat_tokenizer(CHATML_DEFAULT_SYSTEM)
    assert chat_task(ArithmeticQATask(), tok).samples("test")[0].prompt_ids is not None
    math = MathTask()
    assert chat_task(math, tok) is math  # plain prompts, as math runs on base models had
    assert isinstance(chat_task(math, tok, chat=True), ChatTask)
    untemplated = chat_tokenizer(None)
    qa = ArithmeticQATask()
    assert chat_task(qa, untemplated) is qa
    assert chat_task(qa, tok, chat=False) is qa
    math.close()


@pytest.mark.parametrize(
    "task,template,chat,system,match",
    [
        (ArithmeticTask, CHATML_PLAIN, True, "default", "own tokenizer"),
        (ArithmeticQATask, None, True, "default", "no chat template"),
        (ArithmeticQATask, CHATML_PLAIN, False, "Be brief.", "chat template is off"),
        (ArithmeticQATask, None, None, "none", "chat template is off"),
    ],
)
def test_chat_settings_that_cannot_apply_are_refused(task, template, chat, system, match):
    with pytest.raises(ConfigError, match=match):
        chat_task(task(), chat_tokenizer(template), chat=chat, system_prompt=system)


def test_task_section_keys_validate():
    from fp8rl.config import config_from_dict

    ok = config_from_dict({"task": {"name": "arithmetic_qa", "chat": True, "system_prompt": "x"}})
    assert (ok.task.chat, ok.task.system_prompt) == (True, "x")
    assert config_from_dict({}).task.chat is None
    for task, key in (
        ({"chat": "yes"}, "task.chat"),
        ({"system_prompt": " "}, "task.system_prompt"),
        ({"chat": False, "system_prompt": "none"}, "task.system_prompt"),
    ):
        with pytest.raises(ConfigError, match=key):
            config_from_dict({"task": task})

"""Prompts through a tokenizer's chat template: a task's prompt text becomes the user turn.

`chat_task(task, tokenizer, chat=..., system_prompt=...)` returns the task with every
sample's prompt rendered by the template (add_generation_prompt=True) and tokenized once
here, so the rollout takes the token ids as they are and never re-tokenizes the text.

System prompt: "default" sends the user turn alone (a template that inserts its own default
system turn, as ChatML templates of Qwen2.5 and SmolLM2 do, keeps it); "none" sends no system
turn at all (such a default turn is cut out, see `_without_default_system`); any other text is
sent as the system message.

No second BOS: when the rendered text already starts with the tokenizer's BOS token, it is
tokenized without the tokenizer's own special tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from fp8rl.errors import ConfigError

from .base import RewardResult, Sample, Task

SYSTEM_DEFAULT = "default"
SYSTEM_NONE = "none"
# Stand-ins no real text contains: they locate the turns in a rendered conversation.
_SYS, _USER = "\x00fp8rl-system\x00", "\x00fp8rl-user\x00"


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_enabled(chat: bool | None, task: Task, tokenizer) -> bool:
    """task.chat resolved: null is on for a task that asks for it (arithmetic_qa) when the
    tokenizer has a template and the task uses the model's tokenizer, off otherwise."""
    if chat is None:
        return bool(
            getattr(task, "chat_default", False)
            and task.tokenizer is None
            and has_chat_template(tokenizer)
        )
    if chat and task.tokenizer is not None:
        raise ConfigError(
            "task.chat", chat, f"false or null for task {task.name!r} (it has its own tokenizer)"
        )
    if chat and not has_chat_template(tokenizer):
        raise ConfigError("task.chat", chat, "false or null (the tokenizer has no chat template)")
    return bool(chat)


def _render(tokenizer, messages: list[dict], generation: bool = True) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)


def _system_refused(text: str, error: Exception) -> ConfigError:
    return ConfigError(
        "task.system_prompt",
        text,
        f"'default' or 'none': the chat template refuses a system message ({error})",
    )


def _without_default_system(tokenizer, user_text: str) -> str:
    """The conversation of one user turn with no system turn.

    A template whose rendering of a lone user turn never says "system" adds no system turn:
    that rendering is the answer. Otherwise the turn structure is read off a rendering with
    stand-in texts: the user turn's footer is what follows the user text (without the
    generation prompt); what lies between the system text and the user text is that same
    footer, then the user header; the system header is the user header with "user" replaced
    by "system". The default system turn, from its header to its footer, is then cut. A
    template whose structure does not read this way (one that adds text to every system
    turn, say) is refused.
    """
    plain = _render(tokenizer, [{"role": "user", "content": user_text}])
    bare = _render(tokenizer, [{"role": "user", "content": _USER}])
    if "system" not in bare.replace(_USER, "").lower():
        return plain
    try:
        probe = _render(
            tokenizer,
            [{"role": "system", "content": _SYS}, {"role": "user", "content": _USER}],
            generation=False,
        )
    except Exception as e:  # jinja's raise_exception, as templates without system turns use
        raise _system_refused(SYSTEM_NONE, e) from None
    i, j = probe.find(_SYS), probe.find(_USER)
    footer = probe[j + len(_USER) :]
    between = probe[i + len(_SYS) : j] if 0 <= i < j else ""
    user_header = between[len(footer) :]
    system_header = user_header.replace("user", "system")
    lead = probe[: i - len(system_header)]
    start = len(lead) + len(system_header)
    end = plain.find(footer + user_header, start) if plain.startswith(lead + system_header) else -1
    readable = footer and between.startswith(footer) and probe[:i].endswith(system_header)
    if not readable or end < 0:
        raise ConfigError(
            "task.system_prompt",
            SYSTEM_NONE,
            "'default' or a text: fp8rl cannot find the system turn of this chat template",
        )
    return lead + plain[end + len(footer) :]


def chat_text(tokenizer, user_text: str, system_prompt: str = SYSTEM_DEFAULT) -> str:
    """The rendered prompt of one user turn, ending with the generation prompt."""
    if system_prompt == SYSTEM_NONE:
        return _without_default_system(tokenizer, user_text)
    messages = [{"role": "user", "content": user_text}]
    if system_prompt == SYSTEM_DEFAULT:
        return _render(tokenizer, messages)
    try:
        return _render(tokenizer, [{"role": "system", "content": system_prompt}, *messages])
    except Exception as e:  # jinja's raise_exception, as templates without system turns use
        raise _system_refused(system_prompt, e) from None


def encode_chat(tokenizer, text: str) -> tuple[int, ...]:
    """Token ids of a rendered prompt, with no second BOS."""
    bos = getattr(tokenizer, "bos_token", None)
    special = not (bos and text.startswith(bos))
    return tuple(int(t) for t in tokenizer(text, add_special_tokens=special)["input_ids"])


class ChatTask(Task):
    """`task` with its prompts rendered by a chat template; rewards are the task's own."""

    def __init__(self, task: Task, tokenizer, system_prompt: str = SYSTEM_DEFAULT):
        self.inner = task
        self.name = task.name
        self.template = task.template
        # Task's class attribute would hide the inner task's from __getattr__
        self.garble_kinds = task.garble_kinds
        self.system_prompt = system_prompt
        self._tokenizer = tokenizer
        self._samples: dict[str, list[Sample]] = {}

    def samples(self, split: str) -> list[Sample]:
        if split not in self._samples:
            self._samples[split] = [self._chat(s) for s in self.inner.samples(split)]
        return list(self._samples[split])

    def _chat(self, sample: Sample) -> Sample:
        text = chat_text(self._tokenizer, sample.prompt, self.system_prompt)
        return replace(sample, prompt=text, prompt_ids=encode_chat(self._tokenizer, text))

    def reward(self, response_text: str, sample: Sample) -> RewardResult:
        return self.inner.reward(response_text, sample)

    def rewards(self, responses: Sequence[str], samples: Sequence[Sample]) -> list[RewardResult]:
        return self.inner.rewards(responses, samples)

    def __getattr__(self, name: str):
        # what a caller reads of a task beyond the interface (config, close, max_new_tokens)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def chat_task(
    task: Task, tokenizer, *, chat: bool | None = None, system_prompt: str = SYSTEM_DEFAULT
) -> Task:
    """`task` as the run prompts it: through the chat template when `chat` resolves on."""
    if not chat_enabled(chat, task, tokenizer):
        if system_prompt != SYSTEM_DEFAULT:
            raise ConfigError(
                "task.system_prompt", system_prompt, "'default' when the chat template is off"
            )
        return task
    return ChatTask(task, tokenizer, system_prompt)

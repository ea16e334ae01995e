"""Chat tokenizers built in memory: ChatML's special tokens with a template of choice.

A test file imports helpers from the tests/helpers_*.py modules, never from another test
file (tests/test_test_hygiene.py checks it). Imports at the top stay within the standard
library, pytest, torch, numpy and hypothesis: the helpers are imported in the vLLM venv too
(scripts/check-vllm.sh); fp8rl and the optional peers are imported inside the helpers."""

from __future__ import annotations

CHATML_DEFAULT_SYSTEM = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a bot.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def chat_tokenizer(template: str | None, *, add_bos: bool = False):
    """A character-level fast tokenizer with ChatML's special tokens and `template` as its
    chat template; `add_bos`: it prepends <s> to every encoding, as Llama's do."""
    import string

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    chars = sorted(set(string.printable))
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
        )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        additional_special_tokens=specials[2:],
    )
    hf.chat_template = template
    return hf

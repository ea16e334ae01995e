"""A character-level tokenizer built locally with `tokenizers` (one id per character)."""

from __future__ import annotations

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
# One fixed alphabet for every arithmetic config, so a model trained on "+" can move on to
# "+-*" without a new embedding table.
ARITHMETIC_ALPHABET = "0123456789+-*=() "


def char_tokenizer(alphabet: str = ARITHMETIC_ALPHABET):
    """A `PreTrainedTokenizerFast`: ids 0-3 are <pad> <bos> <eos> <unk>, then one per character.

    Encoding prepends <bos> (as Llama does, so the first real token has a context) and adds
    no <eos>; write "<eos>" in the text where one belongs. Decoding concatenates characters.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"char_tokenizer: alphabet {alphabet!r} repeats a character")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    # [\s\S] so that a newline is a character like any other (mapped to <unk> unless in the
    # alphabet).
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
    )

"""The quality check of a converted model: it still answers a plain question, and its mean
negative log-likelihood on a fixed text equals that of the GGUF file it came from (the
conversion dequantizes once and writes float32, so the two agree to rounding)."""

from __future__ import annotations

import functools
import json
from contextlib import contextmanager
from pathlib import Path

import torch

from fp8rl.errors import CheckpointError
from fp8rl.utils import sha256_file

from .pretrained import load_pretrained

PROVENANCE = "fp8rl-provenance.json"
QUESTION = "What is the capital of France?"
EXPECTED = "Paris"
NLL_TOLERANCE = 1e-4
ANSWER_TOKENS = 24
# plain prose (about 200 tokens of a 49k-token BPE vocabulary); any fixed text would do, a
# natural one keeps the NLL in a range where a broken weight shows as a jump
FIXED_TEXT = (
    "The river starts high in the mountains, where snow melts in the spring and runs down "
    "through narrow valleys. By the time it reaches the plain it is wide and slow, and towns "
    "have grown along both of its banks. For centuries the river carried boats loaded with "
    "grain, wood and stone to the markets by the sea. Bridges were built of timber at first, "
    "then of stone, and the oldest of them still stands in the centre of the largest town. "
    "Today most goods travel by road and by rail, but the river is still used by small ships "
    "and by people who come to walk along the water in the evening. In the summer, children "
    "swim near the sandy shallows, and fishermen sit on the old stone steps from early in the "
    "morning. Scientists measure the water every week to check that it stays clean, because "
    "the farms and factories upstream can change its quality within a few days. The people "
    "who live here say that the river is the reason their towns exist at all."
)


@contextmanager
def no_progress_bars():
    """transformers' loading and saving bars off (fp8rl's progress lines name each step): a
    bar redrawn with carriage returns makes a saved log unreadable. Its GGUF loader draws
    its own tqdm bar, outside transformers' switch."""
    import transformers.modeling_gguf_pytorch_utils as gguf_loader
    from transformers.utils import logging as hf_logging

    was, bar = hf_logging.is_progress_bar_enabled(), gguf_loader.tqdm
    hf_logging.disable_progress_bar()
    gguf_loader.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_loader.tqdm = bar
        if was:
            hf_logging.enable_progress_bar()


def mean_nll(model, tokenizer, text: str = FIXED_TEXT) -> tuple[float, int]:
    """(mean next-token NLL in nats, number of tokens) of `text`, computed in float64 from
    the model's logits."""
    ids = tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits.double()
    nll = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
    return float(nll), int(ids.shape[1])


def greedy_answer(model, tokenizer, question: str = QUESTION) -> str:
    """The model's greedy reply to `question`, asked through its own chat template (which
    writes any BOS itself: no second one)."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    enc = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=ANSWER_TOKENS, do_sample=False, pad_token_id=pad)
    return tokenizer.decode(out[0, enc.input_ids.shape[1] :], skip_special_tokens=True).strip()


def quality_of_folder(folder, gguf_nll: float, *, paris_required: bool) -> dict:
    """The check on a converted folder, loaded as `model.source` loads it (float32), against
    the GGUF-loaded model's NLL on the same text."""
    model, tokenizer = load_pretrained(folder, dtype=torch.float32)
    model.eval()
    nll, n_tokens = mean_nll(model, tokenizer)
    answer = greedy_answer(model, tokenizer)
    return {
        "question": QUESTION,
        "answer": answer,
        "answer_has_paris": EXPECTED in answer,
        "paris_required": paris_required,
        "text_tokens": n_tokens,
        "nll_gguf": round(gguf_nll, 6),
        "nll_converted": round(nll, 6),
        "nll_abs_diff": abs(nll - gguf_nll),
        "nll_tolerance": NLL_TOLERANCE,
        "nll_equal": abs(nll - gguf_nll) <= NLL_TOLERANCE,
    }


def failed_checks(quality: dict) -> list[str]:
    """The required checks that failed, each as a short phrase (empty: all passed)."""
    failed = []
    if not quality["nll_equal"]:
        failed.append(
            f"mean NLL {quality['nll_converted']} of the folder != {quality['nll_gguf']} of "
            f"the GGUF (|diff| {quality['nll_abs_diff']:.2e} > {quality['nll_tolerance']})"
        )
    if quality["paris_required"] and not quality["answer_has_paris"]:
        failed.append(f"the answer to {quality['question']!r} lacks {EXPECTED!r}")
    if quality.get("files_mismatched"):
        failed.append(f"sha256 differs for {', '.join(quality['files_mismatched'])}")
    return failed


def result_table(quality: dict) -> str:
    """The check as a short table for stdout."""

    def mark(ok: bool, required: bool = True) -> str:
        return "pass" if ok else ("FAIL" if required else "no (not required)")

    paris = mark(quality["answer_has_paris"], quality["paris_required"])
    diff = f"|diff| {quality['nll_abs_diff']:.1e} over {quality['text_tokens']} tokens"
    rows = [
        ("check", "result", "value"),
        ("greedy answer contains Paris", paris, repr(quality["answer"])),
        ("mean NLL, converted folder", "", f"{quality['nll_converted']:.6f} nats/token"),
        ("mean NLL, GGUF-loaded model", "", f"{quality['nll_gguf']:.6f} nats/token"),
        ("NLL equal (tolerance 1e-4)", mark(quality["nll_equal"]), diff),
    ]
    if "files_checked" in quality:
        n, bad = quality["files_checked"], quality["files_mismatched"]
        rows.append(("files sha256 as recorded", mark(not bad), f"{n - len(bad)}/{n}"))
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"{r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2]}" for r in rows)


def read_provenance(folder) -> dict:
    path = Path(folder) / PROVENANCE
    if not path.is_file():
        raise CheckpointError(
            f"{path}: missing; `fp8rl model check` checks folders `fp8rl model fetch/convert` wrote"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) and "quality" in data and "files" in data else {}
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot be read ({e})") from e


def mismatched_files(folder, files: dict) -> list[str]:
    """The recorded files that are missing or whose sha256 differs from the recorded one."""
    return [
        name
        for name, digest in sorted(files.items())
        if not (Path(folder) / name).is_file() or sha256_file(Path(folder) / name) != digest
    ]


def already_fetched(folder, gguf_sha256: str) -> bool:
    """True where `folder` is a finished conversion of this very GGUF with every file intact:
    a second `fetch` then has nothing to do (README's commands may be run again)."""
    if not (Path(folder) / PROVENANCE).is_file():
        return False
    provenance = read_provenance(folder)
    source = provenance.get("source") or {}
    if not provenance or source.get("gguf_sha256") != gguf_sha256:
        return False
    return not mismatched_files(folder, provenance["files"])


def check_folder(folder) -> dict:
    """`fp8rl model check`: the files against their recorded sha256, then the quality check
    again, against the GGUF NLL recorded at conversion."""
    provenance = read_provenance(folder)
    if not provenance:
        raise CheckpointError(f"{Path(folder) / PROVENANCE}: lacks 'files' or 'quality'")
    files = provenance["files"]
    mismatched = mismatched_files(folder, files)
    recorded = provenance["quality"]
    with no_progress_bars():
        quality = quality_of_folder(
            folder, recorded["nll_gguf"], paris_required=recorded["paris_required"]
        )
    return {**quality, "files_checked": len(files), "files_mismatched": mismatched}

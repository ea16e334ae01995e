"""Cost of the Calibrated Clipping math next to one forward pass of a small model.

For each token count: calibrate_bounds on pooled FP8/BF16 ratios, and one `calibrated`
policy loss forward + backward, against a no-grad forward of a small Qwen3 over the same
number of tokens. The forward is timed on a sub-batch (--forward-tokens) and scaled
linearly to the full count; the table says when it was. Not a test:

    python bench/rl_core.py            # 1M and 10M tokens
    python bench/rl_core.py --smoke    # small sizes, seconds
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)
from fp8rl.models import tiny_qwen3
from fp8rl.rl import calibrate_bounds, policy_loss


def timed(fn, repeats: int) -> float:
    """Median wall time of `repeats` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def synthetic_step(n_tokens: int, seq_len: int, gen: torch.Generator):
    """Pooled tokens of a step: ratios near 1 with FP8-like noise, one advantage per row."""
    rows = n_tokens // seq_len
    old = torch.log(torch.rand(rows, seq_len, generator=gen).clamp_min(0.02))
    new_shadow = old + 0.05 * torch.randn(rows, seq_len, generator=gen)
    new_fp8 = new_shadow * (1 + 0.03 * torch.randn(rows, seq_len, generator=gen))
    adv = torch.randn(rows, generator=gen)
    mask = torch.rand(rows, seq_len, generator=gen) < 0.9
    return old, new_shadow, new_fp8, adv, mask


def rl_times(n_tokens: int, seq_len: int, repeats: int) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(0)
    old, new_shadow, new_fp8, adv, mask = synthetic_step(n_tokens, seq_len, gen)
    r, r_shadow = torch.exp(new_fp8 - old), torch.exp(new_shadow - old)

    def calibrate():
        calibrate_bounds(r, r_shadow, adv, mask, nominal=(0.8, 1.28), previous=(0.8, 1.28))

    def loss_fwd_bwd():
        lp = new_fp8.clone().requires_grad_()
        loss, _ = policy_loss("ppo_clip", lp, old, adv, mask, lower=0.8, upper=1.28)
        loss.backward()

    return timed(calibrate, repeats), timed(loss_fwd_bwd, repeats)


@torch.inference_mode()
def forward_time(model, n_tokens: int, seq_len: int, batch_rows: int) -> float:
    """Seconds for a no-grad forward over n_tokens, in batches of batch_rows sequences."""
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch_rows, seq_len), generator=gen)
    model(ids[:1, :seq_len])  # warm-up
    rows = n_tokens // seq_len
    t0 = time.perf_counter()
    done = 0
    while done < rows:
        take = min(batch_rows, rows - done)
        model(ids[:take]).logits.sum()
        done += take
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="small sizes (10K, 50K tokens)")
    ap.add_argument("--sizes", type=float, nargs="*", help="token counts (default 1e6 1e7)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument(
        "--forward-tokens",
        type=float,
        default=2**16,
        help="tokens the model forward is actually timed on (then scaled)",
    )
    ap.add_argument("--hidden", type=int, default=256, help="Qwen3 hidden size (tiny default 128)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads; on busy shared cores more threads thrash",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    sizes = [int(s) for s in (args.sizes or ([1e4, 5e4] if args.smoke else [1e6, 1e7]))]
    seq_len = min(args.seq_len, 256) if args.smoke else args.seq_len
    fwd_tokens = int(min(args.forward_tokens, 8 * seq_len if args.smoke else args.forward_tokens))
    model = tiny_qwen3(
        hidden_size=args.hidden,
        intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 32,
        num_key_value_heads=max(1, args.hidden // 64),
        vocab_size=1024,
        tie_word_embeddings=True,
        max_position_embeddings=max(512, seq_len),
    ).eval()
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; model: Qwen3 hidden "
        f"{args.hidden}, {args.layers} layers, vocab 1024, {n_params / 1e6:.2f}M params, "
        f"sequences of {seq_len} tokens"
    )

    measured = min(fwd_tokens, max(sizes))
    measured -= measured % seq_len
    fwd_per_token = (
        forward_time(model, measured, seq_len, batch_rows=max(1, 8192 // seq_len)) / measured
    )
    print(
        f"model forward timed on {measured} tokens ({fwd_per_token * 1e6:.1f} us/token), "
        f"scaled linearly to each size below"
    )

    header = (
        f"{'tokens':>10} | {'calibrate_bounds':>16} | {'loss fwd+bwd':>12} | "
        f"{'model forward':>13} | {'calib/fwd':>9} | {'(calib+loss)/fwd':>16}"
    )
    print(header)
    print("-" * len(header))
    for n in sizes:
        n -= n % seq_len
        calib, loss = rl_times(n, seq_len, repeats=1 if n >= 5e6 else args.repeats)
        fwd = fwd_per_token * n
        print(
            f"{n:>10} | {calib:>15.3f}s | {loss:>11.3f}s | {fwd:>12.1f}s | "
            f"{100 * calib / fwd:>8.3f}% | {100 * (calib + loss) / fwd:>15.3f}%"
        )


if __name__ == "__main__":
    main()

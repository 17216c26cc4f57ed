"""Peak memory (max RSS) of one GRPO update, `sparring.train.train`, on a real-size model.

    .venv/bin/python bench/train_memory.py --model smollm2-135m-instruct   # 8 x 512 tokens
    /usr/bin/time -v .venv/bin/python bench/train_memory.py --model smollm2-135m-instruct \\
        --naive-logprobs              # the pre-#17 path: full fp32 (B, T, V) log-softmax

One mini-batch, one epoch (on-policy: the old log-probs come from the step's own forward), so
the figure is one forward+backward of `--micro` rows plus the AdamW step and the checkpoint
save. Rows are rollout-shaped: 40-token scaffolding and 60-token replies alternating, two
rewards per group. `--naive-logprobs` swaps in a copy of the old `token_log_probs`, which
materialised log_softmax over the whole (B, T, V) logits in fp32 and its exp for the entropy.
The last line is `RESULT train_peak_rss_mb <max RSS of this process in MiB>`. On CUDA
(`--device cuda`) it is `RESULT train_peak_gpu_mb <torch.cuda.max_memory_allocated in MiB>`, the
figure sparring.gpu_memory's model predicts.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch


def naive_token_log_probs(model, batch, with_entropy=False, entropy_grad=False):
    """The trainer's log-probs before issue #17 (kept here only to measure against)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, V)
    log_prob = logp.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    if not with_entropy:
        return log_prob, None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(logp.exp() * logp).sum(-1)  # (B, T-1)
    return log_prob, entropy


def samples(n: int, seq_len: int, vocab: int, seed: int = 0) -> pd.DataFrame:
    """`n` rows of `seq_len` tokens: replies (mask 1) at 40-100 of every 100, varied rewards."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        mask = [int(j % 100 >= 40) for j in range(seq_len)]
        end = max(j for j, m in enumerate(mask) if m)
        rewards = [0.0] * seq_len
        rewards[end] = float(i % 2)
        rows.append(
            {
                "init": f"i{i // 4}",
                "input_ids": rng.integers(3, vocab, seq_len).tolist(),
                "assistant_mask": mask[: end + 1] + [0] * (seq_len - end - 1),
                "token_rewards": rewards,
            }
        )
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", required=True, help="Model ref (a path or a named model).")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--micro", type=int, default=8, help="micro_batch_size")
    ap.add_argument("--naive-logprobs", action="store_true", help="the pre-#17 log-prob path")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--lora-rank", type=int, default=0, help="0 = full fine-tuning")
    ap.add_argument("--param-dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")

    from transformers import AutoConfig

    import sparring.train as train_mod
    from sparring.models import resolve_model

    path = resolve_model(args.model)
    if args.naive_logprobs:
        train_mod.token_log_probs = naive_token_log_probs
    extra = {}
    if args.gradient_checkpointing:
        extra["gradient_checkpointing"] = True
    if args.lora_rank:
        extra["lora_rank"] = args.lora_rank
    if args.param_dtype != "float32":
        extra["param_dtype"] = args.param_dtype
    Config = getattr(train_mod, "GRPOConfig", None) or train_mod.TrainConfig  # before the split
    cfg = Config(
        group_key="init",
        mini_batch_size=args.rows,
        micro_batch_size=args.micro,
        policy=None,
        **extra,
    )
    vocab = AutoConfig.from_pretrained(path).vocab_size
    with tempfile.TemporaryDirectory() as tmp:
        parquet = Path(tmp) / "samples.parquet"
        samples(args.rows, args.seq_len, vocab).to_parquet(parquet)
        t0 = time.perf_counter()
        stats = train_mod.train(path, [parquet], Path(tmp) / "out", cfg, device=args.device)
        seconds = time.perf_counter() - t0
    print(f"train step {seconds:.1f} s, loss {stats.metrics['train/loss']:.4f}")
    if cuda:
        print(f"RESULT train_peak_gpu_mb {torch.cuda.max_memory_allocated() / 2**20:.0f}")
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"RESULT train_peak_rss_mb {peak_mb:.0f}")


if __name__ == "__main__":
    main()

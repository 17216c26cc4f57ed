"""Cost of one GRPO update relative to a bare forward+backward over the same tokens.

    .venv/bin/python bench/train.py                     # ~7M-param Qwen2, 8 x ~512 tokens, CPU
    .venv/bin/python bench/train.py --model smollm2-135m-instruct --threads 2 --repeats 1
    .venv/bin/python bench/train.py --model runs/tiny --batch 2 --seq-len 64 --repeats 1
    .venv/bin/python bench/train.py --model smollm2-135m-instruct --batch 8 --mini-batch 2 \\
        --seq-len 256 --threads 2 --repeats 1              # and what bypass_mode saves
    .venv/bin/python bench/train.py --model smollm2-135m-instruct --threads 2 --repeats 1 \\
        --cpu-bf16 [--lora-rank 16]                        # and bf16 autocast on CPU

Both sides run the same model over the same micro-batches in one process, interleaved, and the
median of `--repeats` rounds is compared. Time is the process's CPU time on `--threads` torch
threads (default 1): on a shared machine wall time mostly measures the neighbours, so it is
printed too but not used for the RESULT. The bare step is HF's next-token loss, forward and
backward, nothing else. The GRPO step is `sparring.train.grpo_update` on the same rows: old
log-probs, verl advantages (computed once, as in `train`), verl's clipped loss over the masked
tokens, grad clipping and the AdamW step. With one mini-batch and one epoch (on-policy) the old
log-probs come from the step's own forward. KL on is timed twice: reference = the start
weights (no extra pass, `train`'s default) and a separate reference model (one no-grad
forward). The bare step is also timed with the rollout engine's attention (`sdpa_gqa`,
sparring/generation/attention.py: key/value heads shared, not copied) on a second copy of the
weights, to show whether the trainer would gain from it. The last line is
`RESULT grpo_step_ratio <GRPO time / bare time>` with KL off.

With `--mini-batch` below `--batch` the update takes several optimizer steps, and the old
log-probs of the rows outside the first mini-batch come from a separate no-grad pass; the step
is then also timed in `bypass_mode`, which takes the rollout engine's log-probs instead (here
the start weights' own, as an exact engine's would be), and
`RESULT bypass_saving <share of the GRPO step's time bypass_mode saves>` comes before the last.

With `--cpu-bf16` the GRPO step (KL off) is also timed under CPU bf16 autocast (`train.cpu_bf16`,
the LM head kept fp32), the log-probs of both at the start weights are compared, and
`RESULT cpu_bf16_step_speedup <fp32 CPU time / bf16 CPU time>` comes before the last. With
`--mini-batch` as well, `bypass_mode` is timed in bf16 too: `RESULT bf16_bypass_saving`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
import pandas as pd
import torch
from transformers import AutoModelForCausalLM

from sparring import heap
from sparring.generation import attention
from sparring.models import resolve_model
from sparring.tiny_model import TinyModelConfig, init_tiny
from sparring.train import advantages_for, batched_log_probs, collate, grpo_update, load_model
from sparring.train_config import GRPOConfig

CPU_MODEL = TinyModelConfig(
    hidden_size=256, num_layers=6, num_heads=4, num_kv_heads=4, intermediate_size=1024
)


def samples(n: int, seq_len: int, vocab: int, seed: int = 0) -> pd.DataFrame:
    """Rollout-shaped rows: lengths 75-100% of seq_len, alternating 40-token scaffolding and
    60-token replies (mask 1), the reward on the last reply token, games of two seats."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        t = int(rng.integers(int(0.75 * seq_len), seq_len + 1))
        mask = [int(j % 100 >= 40) for j in range(t)]
        end = max(j for j, m in enumerate(mask) if m)
        rewards = [0.0] * t
        rewards[end] = float(rng.random())
        rows.append(
            {
                "game": f"g{i // 2}",
                "input_ids": rng.integers(3, vocab, t).tolist(),
                "assistant_mask": mask[: end + 1] + [0] * (t - end - 1),
                "token_rewards": rewards,
            }
        )
    return pd.DataFrame(rows)


def bare_step(model, batch, micro: int) -> None:
    """Forward + backward of HF's causal-LM loss over the same micro-batches, the activations
    reusing the heap's pages as the trainer's do (`sparring.heap.reusing_model`)."""
    model.zero_grad(set_to_none=True)
    with heap.reusing_model(model):
        for i in range(0, len(batch), micro):
            mb = batch.select(list(range(i, min(i + micro, len(batch)))))
            model(
                input_ids=mb.input_ids, attention_mask=mb.attention_mask, labels=mb.input_ids
            ).loss.backward()


def timed(fn) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds) spent in `fn()`."""
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--model",
        help="Model ref: a checkpoint or a named model (default: build the CPU bench model).",
    )
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--mini-batch", type=int, help="rows per optimizer step (default: --batch)")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument(
        "--cpu-bf16", action="store_true", help="also the GRPO step under CPU bf16 autocast"
    )
    ap.add_argument("--lora-rank", type=int, default=0, help="train LoRA adapters of this rank")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        path = resolve_model(args.model) if args.model else init_tiny(tmp, CPU_MODEL)
        lora = GRPOConfig(lora_rank=args.lora_rank)
        model, ref = load_model(path, device, cfg=lora), load_model(path, device, trainable=False)
        gqa = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attention.register())
        gqa.to(device).eval()
        vocab = model.config.vocab_size
        params = sum(p.numel() for p in model.parameters())
    df = samples(args.batch, args.seq_len, vocab)
    batch = collate(df, pad_id=0)
    cfg = GRPOConfig(
        group_key="game",
        lr=1e-6,
        mini_batch_size=args.mini_batch or args.batch,
        micro_batch_size=min(args.micro_batch, args.mini_batch or args.batch),
    )
    kl_cfg = cfg.model_copy(update={"kl_coef": 0.05})
    advantages, _ = advantages_for(df, batch, cfg)
    steps = {
        "bare fwd+bwd": lambda: bare_step(model, batch.to(device), cfg.micro_batch_size),
        "bare fwd+bwd, sdpa_gqa attention": lambda: bare_step(
            gqa, batch.to(device), cfg.micro_batch_size
        ),
        "grpo, KL off": lambda: grpo_update(model, batch, advantages, cfg, device),
        "grpo, KL on (ref = start weights)": lambda: grpo_update(
            model, batch, advantages, kl_cfg, device
        ),
        "grpo, KL on (separate ref model)": lambda: grpo_update(
            model, batch, advantages, kl_cfg, device, ref
        ),
    }
    if cfg.mini_batch_size < len(batch):  # the engine's log-probs: an exact engine's
        batch.rollout_log_prob = batched_log_probs(model, batch, range(len(batch)), cfg, device)
        bypass_cfg = cfg.model_copy(update={"bypass_mode": True})
        steps["grpo, KL off, bypass_mode"] = lambda: grpo_update(
            model, batch, advantages, bypass_cfg, device
        )
    if args.cpu_bf16 and device.type == "cpu":
        bf16_cfg = cfg.model_copy(update={"cpu_bf16": True})
        steps["grpo, KL off, cpu_bf16"] = lambda: grpo_update(
            model, batch, advantages, bf16_cfg, device
        )
        if "grpo, KL off, bypass_mode" in steps:
            bf16_bypass = bf16_cfg.model_copy(update={"bypass_mode": True})
            steps["grpo, KL off, cpu_bf16, bypass_mode"] = lambda: grpo_update(
                model, batch, advantages, bf16_bypass, device
            )
        rows = range(len(batch))
        gap = (
            batched_log_probs(model, batch, rows, bf16_cfg, device)
            - batched_log_probs(model, batch, rows, cfg, device)
        )[batch.response_mask.bool()].abs()  # (N,) at the start weights
    for fn in steps.values():  # warm-up
        fn()
    times = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, fn in steps.items():
            times[name].append(timed(fn))
    cpu = {name: statistics.median(t[0] for t in ts) for name, ts in times.items()}
    wall = {name: statistics.median(t[1] for t in ts) for name, ts in times.items()}
    tokens = int(batch.attention_mask.sum())
    print(
        f"model {params / 1e6:.1f}M params on {device}, {args.threads} thread(s); batch "
        f"{args.batch} x <= {args.seq_len} tokens ({tokens} tokens, "
        f"{int(batch.response_mask.sum())} trained), mini-batch {cfg.mini_batch_size}, "
        f"micro-batch {cfg.micro_batch_size}, median of {args.repeats}"
    )
    bare = "bare fwd+bwd"
    for name in steps:
        print(
            f"  {name:<34} cpu {cpu[name]:7.3f} s  ratio {cpu[name] / cpu[bare]:.3f}   "
            f"wall {wall[name]:7.3f} s  ratio {wall[name] / wall[bare]:.3f}"
        )
    if "grpo, KL off, cpu_bf16" in steps:
        print(
            f"cpu_bf16 log-probs against fp32's at the start weights: mean |d| "
            f"{gap.mean():.4f}, max {gap.max():.4f} nats"
        )
        speedup = cpu["grpo, KL off"] / cpu["grpo, KL off, cpu_bf16"]
        print(f"RESULT cpu_bf16_step_speedup {speedup:.3f}")
    if "grpo, KL off, cpu_bf16, bypass_mode" in steps:
        saved = 1 - cpu["grpo, KL off, cpu_bf16, bypass_mode"] / cpu["grpo, KL off, cpu_bf16"]
        print(f"RESULT bf16_bypass_saving {saved:.3f}")
    if "grpo, KL off, bypass_mode" in steps:
        saved = 1 - cpu["grpo, KL off, bypass_mode"] / cpu["grpo, KL off"]
        print(f"RESULT bypass_saving {saved:.3f}")
    print(f"RESULT grpo_step_ratio {cpu['grpo, KL off'] / cpu[bare]:.3f}")


if __name__ == "__main__":
    main()

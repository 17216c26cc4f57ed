"""What sorting a mini-batch's rows by length saves in a GRPO update, on a run's own samples.

    .venv/bin/python bench/micro_batches.py --model runs/<run>/work/warm \\
        --samples runs/<run>/work/0/rollout/samples.parquet      # after `make run`
    .venv/bin/python bench/micro_batches.py --model runs/<run>/work/warm \\
        --samples runs/<run>/work/0/rollout/samples.parquet --config configs/pipeline.yaml

The trainer splits each mini-batch into micro-batches longest rows first
(`sparring.train.Batch.micro_batches`), so a micro-batch pads to rows of similar length. The
baseline is the split it replaced: the mini-batch's rows in the shuffled order the schedule
drew them in. Both run `sparring.train.grpo_update` with the config's `train` section on the
same samples from the same weights, alternating, `--repeats` times each; the bench prints
both CPU times (median), the tokens each pushes through the model (padding included) against
the real ones, and the largest difference of the updated weights (the split does not change a
mini-batch's gradient, so only float rounding may). Last line:
`RESULT length_sorted_speedup <time in row order / time sorted>`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from unittest import mock

import pandas as pd
import torch
from transformers import AutoTokenizer

from sparring.cli.options import load_config, parse_params
from sparring.loop.config import DEFAULT_CONFIG, PipelineConfig
from sparring.train import Batch, advantages_for, collate, grpo_update, load_model, schedule

SORTED = Batch.micro_batches


def in_row_order(self: Batch, rows: list[int], size: int, by_length: bool = True) -> Iterator:
    """The split before sorting: consecutive rows of the mini-batch as drawn."""
    return SORTED(self, rows, size, by_length=False)


def padded_tokens(batch: Batch, plan: list[list[int]], size: int, split) -> int:
    """Tokens the model reads over every micro-batch of `plan` (each padded to its longest)."""
    lengths = batch.attention_mask.sum(1)  # (B,)
    return sum(
        int(lengths[rows].max()) * len(rows) for mini in plan for rows in split(batch, mini, size)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", required=True, help="the checkpoint the samples were played by")
    ap.add_argument("--samples", required=True, help="a rollout's samples.parquet")
    ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="its `train` section is used")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field (dotted path, YAML value); repeatable")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    cfg = load_config(PipelineConfig, args.config, parse_params(tuple(args.set))).train
    cpu = torch.device("cpu")
    df = pd.read_parquet(args.samples)
    pad_id = AutoTokenizer.from_pretrained(args.model).pad_token_id
    batch = collate(df, pad_id, cfg.max_seq_len)
    advantages, _ = advantages_for(df, batch, cfg)
    plan = schedule(len(batch), cfg)
    real = int(batch.attention_mask.sum()) * cfg.epochs
    sorted_tokens = padded_tokens(batch, plan, cfg.micro_batch_size, SORTED)
    order_tokens = padded_tokens(batch, plan, cfg.micro_batch_size, in_row_order)

    def update(split) -> tuple[float, torch.Tensor]:
        model = load_model(args.model, cpu)
        with mock.patch.object(Batch, "micro_batches", split):
            start = time.process_time()
            grpo_update(model, batch, advantages, cfg, cpu)
            seconds = time.process_time() - start
        return seconds, torch.cat([p.detach().flatten() for p in model.parameters()])

    times: dict[str, list[float]] = {"sorted": [], "row order": []}
    for _ in range(args.repeats):
        (t_sorted, w_sorted), (t_order, w_order) = update(SORTED), update(in_row_order)
        times["sorted"].append(t_sorted)
        times["row order"].append(t_order)
    median = {name: statistics.median(ts) for name, ts in times.items()}
    print(
        f"{len(batch)} rows, {len(plan)} optimizer steps, micro-batch {cfg.micro_batch_size}, "
        f"{torch.get_num_threads()} thread(s), median of {args.repeats}"
    )
    for name, tokens in (("sorted", sorted_tokens), ("row order", order_tokens)):
        print(
            f"  {name:<9}  cpu {median[name]:7.2f} s  tokens {tokens} "
            f"({tokens / real - 1:+.0%} over the {real} real)"
        )
    print(f"  largest weight difference {float((w_sorted - w_order).abs().max()):.2e}")
    print(f"RESULT length_sorted_speedup {median['row order'] / median['sorted']:.3f}")


if __name__ == "__main__":
    main()

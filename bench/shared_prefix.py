"""What running each shared prompt once saves in a GRPO update, on a run's own samples.

    .venv/bin/python bench/shared_prefix.py --config configs/pipeline-smollm2.yaml \\
        --model <run>/warm --samples <run>/0/rollout/samples.parquet --inits 4

A seat's rows played from one game state open with the same prompt (in
`configs/pipeline-smollm2.yaml` about half of each row, shared by 8 rows). Three updates of
the config's `train` section from the same weights on the same samples, one after another:
  - plain: the config with `share_prefix` off;
  - share_prefix: each micro-batch's rows packed behind the prompts they share
    (`train.share_prefix`, sparring.shared_prefix): the same gradients, up to rounding;
  - prompt mini-batches: `share_prefix` with `mini_batches: prompts` and micro-batches of
    `--prompt-micro-batch` rows, each one prompt's chunk (at a group's size, verl's whole
    groups: each prompt runs once per step): a different draw of rows per step, so its
    weights differ from the others by more than rounding.
Each prints its CPU and wall time, its forward tokens (padding included) against the rows'
real tokens, and how far its update lands from plain's: the norm of the difference of the
updated weights over the norm of plain's update (the elementwise largest difference says
little: AdamW's first steps move a weight by about lr whatever its gradient's size).
`--inits` keeps the rows of that many game states (all by default). `--repeats N` runs N
rounds of the three, each round starting with the next arm, and takes each arm's median CPU
time: a host whose speed drifts by 10% between runs (CPU-2e) hides a 1.2x in one round.
The RESULT lines end with
`RESULT prompt_batches_update_speedup <plain CPU time / prompt mini-batches' CPU time>`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pandas as pd
import torch
from transformers import AutoTokenizer

from sparring.cli.options import load_config, parse_params
from sparring.loop.config import PipelineConfig
from sparring.shared_prefix import pack
from sparring.train import (
    Batch,
    advantages_for,
    collate,
    grpo_update,
    load_model,
    prompt_groups,
    schedule,
)


def forward_tokens(batch: Batch, plan: list[list[int]], size: int) -> int:
    """Tokens the model reads over every micro-batch of `plan` (packed rows when the batch has
    prompt groups; each micro-batch padded to its longest row)."""
    total = 0
    for mini in plan:
        for rows in batch.micro_batches(mini, size):
            mb = batch.select(rows)
            ids = mb.input_ids
            if mb.prefix_group is not None:
                ids = pack(mb.input_ids, mb.attention_mask, mb.prefix_group).input_ids
            total += ids.numel()
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", required=True, help="the checkpoint the samples were played by")
    ap.add_argument("--samples", required=True, help="a rollout's samples.parquet")
    ap.add_argument("--config", required=True, help="its `train` section is used")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field (dotted path, YAML value); repeatable")  # fmt: skip
    ap.add_argument("--inits", type=int, help="keep the rows of this many game states")
    ap.add_argument("--prompt-micro-batch", type=int, default=8,
                    help="rows per micro-batch with prompt mini-batches (one prompt's group)")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds of all arms, each round starting one arm later; the RESULT "
                         "lines take each arm's median CPU time (a host's drift hits all arms)")  # fmt: skip
    args = ap.parse_args()
    base = load_config(PipelineConfig, args.config, parse_params(tuple(args.set))).train
    cpu = torch.device("cpu")
    df = pd.read_parquet(args.samples)
    if args.inits:
        df = df[df.init_id.isin(df.init_id.unique()[: args.inits])].reset_index(drop=True)
    pad_id = AutoTokenizer.from_pretrained(args.model).pad_token_id
    groups = torch.tensor(prompt_groups(df))
    arms = {
        "plain": base.model_copy(update={"share_prefix": False}),
        "share_prefix": base.model_copy(update={"share_prefix": True}),
        "prompt mini-batches": base.model_copy(
            update={
                "share_prefix": True,
                "mini_batches": "prompts",
                "micro_batch_size": args.prompt_micro_batch,
            }
        ),
    }
    real = None
    names = list(arms)
    rounds = [names[r % len(names) :] + names[: r % len(names)] for r in range(args.repeats)]
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}  # (cpu, wall)
    results: dict[str, tuple[int, torch.Tensor]] = {}  # forward tokens, the first update
    for name in (name for order in rounds for name in order):
        cfg = arms[name]
        batch = collate(df, pad_id, cfg.max_seq_len)
        real = int(batch.attention_mask.sum()) * cfg.epochs
        advantages, _ = advantages_for(df, batch, cfg)
        prompts = groups.tolist() if cfg.mini_batches == "prompts" else None
        if cfg.share_prefix:
            batch.prefix_group = groups
        plan = schedule(len(batch), cfg, prompts=prompts)
        tokens = forward_tokens(batch, plan, cfg.micro_batch_size)
        torch.manual_seed(cfg.seed)  # the same LoRA initialisation in every arm, as `train`
        model = load_model(args.model, cpu, cfg=cfg)
        before = torch.cat([p.detach().flatten().float() for p in model.parameters()])
        wall, start = time.perf_counter(), time.process_time()
        grpo_update(model, batch, advantages, cfg, cpu, prompts=prompts)
        times[name].append((time.process_time() - start, time.perf_counter() - wall))
        weights = torch.cat([p.detach().flatten().float() for p in model.parameters()])
        results.setdefault(name, (tokens, weights - before))
    print(
        f"{len(df)} rows of {df.init_id.nunique()} game states, {int(groups.max()) + 1} prompt "
        f"groups, {torch.get_num_threads()} thread(s); {real} real tokens per pass"
    )
    cpu_s = {name: statistics.median(c for c, _ in runs) for name, runs in times.items()}
    plain = results["plain"][1]
    for name in names:
        tokens, moved = results[name]
        gap = float((moved - plain).norm() / plain.norm())
        runs = " ".join(f"{c:.1f}" for c, _ in times[name])
        wall = statistics.median(w for _, w in times[name])
        print(
            f"  {name:<20} cpu {cpu_s[name]:8.1f} s  wall {wall:7.1f} s  forward tokens {tokens} "
            f"(one forward pass of the update; {tokens / real - 1:+.0%} against the real)  "
            f"update off plain's by {gap:.3f} of its norm  (cpu s by round: {runs})"
        )
    print(f"RESULT shared_prefix_update_speedup {cpu_s['plain'] / cpu_s['share_prefix']:.3f}")
    print(
        f"RESULT prompt_batches_update_speedup {cpu_s['plain'] / cpu_s['prompt mini-batches']:.3f}"
    )


if __name__ == "__main__":
    main()

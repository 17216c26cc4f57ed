"""Where the hf engine's rollout time goes: prefill, decode forwards, KV bookkeeping, sampling.

    .venv/bin/python bench/engine_profile.py --games 32      # CPU, SmolLM2-shaped random model
    python bench/engine_profile.py --device cuda --games 128 --batch 256
    .venv/bin/python bench/engine_profile.py --model smollm2-135m-instruct --games 32
    .venv/bin/python bench/engine_profile.py --model smollm2-135m-instruct --quantize int8

`--quantize int8` or `bf16` profiles the CPU engine that `rollout.backend.quantize` picks (the
roofline then counts an int8 layer's weights at a byte each).

Plays seeded matching games (k=3, fixed names, one retry) through `sparring.rollout.play` and
times `HFBackend`'s own methods, synchronising CUDA around each one, so each figure is the
device time of that phase, and the attention inside them (the CPU engine's `sdpa_gqa`: what
quantized linear layers leave as it was). `_prefill` runs forwards and builds caches
(`_batch_cache`) itself: those are listed under it, and the `_forward` and `_batch_cache` rows
count only the calls outside it (the decode steps and the decode batch's cache), so the
top-level rows add up to the wall time less the games' own work. The default model is SmolLM2-135M's shape (30 layers,
hidden 576, 9 heads over 3 KV heads, MLP 1536) with random weights and the tiny model's
1650-token vocabulary. It needs no download, and since no reply stops early, every row decodes
all `--max-new-tokens` steps.

Then the decode steps by batch size: rows leave a call's batch as their replies end, so a call's
last steps run few rows at nearly the cost of many. A line fitted to step time against rows
models the decode if every step ran the largest batch seen: a bound on what any scheduler
could save, since a game's turns are sequential and its longest chain of replies runs at
whatever batch is left (continuous batching, measured, saved 7% of the steps; docs/results.md).

Then the decode roofline. Before the games the bench measures the device's memory bandwidth
(`memory_bandwidth`: the best of a few copies of a 256 MiB fp32 tensor, bytes read + written
over the time). A decode step must read every weight the step multiplies by (the LM head
included, the input embedding table not, except where the LM head shares it) and the keys and
values of every token each row attends to (its attention mask, padding excluded); that many
bytes over the bandwidth is the step's floor. Summed over the steps, the floor over the
measured decode time is the fraction of the roofline the engine reaches (1 = bound only by
memory traffic; the rest is compute, padding, the static cache's unused room and overheads).

Prints `RESULT engine_decode_ms_per_step <ms>`, `RESULT memory_bandwidth_gb_s <GB/s>` and
last `RESULT decode_roofline_fraction <floor time / measured decode time>`. With `--out DIR`
it also writes DIR/engine_profile.jsonl, one JSON object per printed row, by `row`: "run"
(the totals), "phase" (a timed method, `phase`, with the timed call it ran inside, `parent`: ""
at the top level, "_prefill" for prefill's own), "decode_batch" (a bucket of decode steps by
rows), "decode_model" (the fitted line, where there is one) and "roofline".
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from sparring.device import pick_device
from sparring.game_init import GameInitConfig, generate_inits
from sparring.games import GameSpec
from sparring.games.base import LEARNER
from sparring.generation import attention, hf, int8_linear
from sparring.generation.base import SamplingParams
from sparring.models import resolve_model
from sparring.rollout import RolloutConfig, play
from sparring.tiny_model import TinyModelConfig, init_tiny

SMOLLM2_SHAPE = TinyModelConfig(
    hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, intermediate_size=1536
)
PHASES = ["_prefill", "_forward", "_batch_cache", "_store", "_lookup", "_completion"]


class PhaseTimer:
    """Synchronised wall time and call count of wrapped methods, keyed by (the outermost timed
    call they run inside, or "", their name). A method calling itself counts once."""

    def __init__(self, device: torch.device) -> None:
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.seconds: Counter = Counter()
        self.calls: Counter = Counter()
        self.stack: list[str] = []  # the timed calls in progress, outermost first
        self.sizes: list[tuple[int, float]] = []  # (size, seconds) of sized top-level calls

    def wrap(self, owner, name: str, size=None) -> None:
        """Replace `owner.name` by a timed wrapper; `size(*args, **kwargs)`, if given, records
        each top-level call's size with its time in `sizes`."""
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if name in self.stack:
                return fn(*args, **kwargs)
            key = (self.stack[0] if self.stack else "", name)
            self.sync()
            t0 = time.perf_counter()
            self.stack.append(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.stack.pop()
                self.sync()
                dt = time.perf_counter() - t0
                self.seconds[key] += dt
                self.calls[key] += 1
                if size is not None and not self.stack:
                    self.sizes.append((size(*args, **kwargs), dt))

        setattr(owner, name, wrapper)

    def row(self, label: str, parent: str, name: str) -> tuple[str, float, int]:
        return label, self.seconds[parent, name], self.calls[parent, name]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", help="a model ref (default: a SmolLM2-shaped random model)")
    ap.add_argument("--device", default="auto", help="cpu, cuda or auto")
    ap.add_argument("--games", type=int, default=32, help="initial states, each played twice")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch", type=int, default=64, help="rows per forward (max_batch_size)")
    ap.add_argument("--out", help="folder for engine_profile.jsonl, the rows as JSON")
    ap.add_argument(
        "--quantize", choices=("none", "int8", "bf16"), default="none", help="the CPU engine's"
    )
    ap.add_argument(
        "--copy-mib", type=int, default=256, help="size of the bandwidth probe's tensor"
    )
    args = ap.parse_args()

    model = (
        resolve_model(args.model)
        if args.model
        else str(init_tiny(tempfile.mkdtemp(), SMOLLM2_SHAPE))
    )
    timer = PhaseTimer(pick_device(args.device))
    timer.wrap(attention, "sdpa_gqa")  # before the model registers it
    backend = hf.HFBackend(
        model, device=args.device, max_batch_size=args.batch, quantize=args.quantize
    )
    bandwidth = memory_bandwidth(backend.device, args.copy_mib * 2**20)
    for name in PHASES:  # a top-level _forward is one decode step: its rows and keys read
        timer.wrap(hf.HFBackend, name, size=decode_size if name == "_forward" else None)
    timer.wrap(hf, "sample_tokens")

    params = {"k": 3, "max_turns": args.max_turns, "random_names": False, "max_retries": 1}
    game = GameSpec(params=params)
    df = generate_inits(GameInitConfig(game=game, num_train=args.games, num_val=0), progress=False)
    inits = [(r.init_id, json.loads(r.state)) for r in df.itertuples()]
    sampling = SamplingParams(temperature=0.7, max_new_tokens=args.max_new_tokens, seed=0)
    cfg = RolloutConfig(game=game, sampling=sampling, max_batch_size=args.batch)
    t0 = time.perf_counter()
    result = play(inits, {LEARNER: backend}, cfg, progress=False)
    wall = time.perf_counter() - t0

    print(
        f"{backend.device}: {len(result.episodes)} games ({args.games} states x "
        f"{cfg.games_per_init}) x {args.max_turns} turns x {args.max_new_tokens} "
        f"tokens, {args.batch} rows per forward: {wall:.2f} s wall, {result.generate_calls} "
        f"generate calls, {backend.generated_tokens} generated + {backend.prefilled_tokens} "
        "prefilled tokens"
    )

    phases = [  # (label, the timed call it runs inside or "", method)
        ("prefill, all of it", "", "_prefill"),
        ("  its forwards", "_prefill", "_forward"),
        ("    their attention", "_prefill", "sdpa_gqa"),
        ("  its _batch_cache", "_prefill", "_batch_cache"),
        ("_forward", "", "_forward"),  # the decode steps
        ("  its attention", "_forward", "sdpa_gqa"),
        ("_batch_cache", "", "_batch_cache"),  # the decode batch's cache
        *((name, "", name) for name in ("sample_tokens", "_store", "_lookup", "_completion")),
    ]
    records = [
        {"row": "run", "device": str(backend.device), "games": len(result.episodes)}
        | {"states": args.games, "max_turns": args.max_turns, "batch": args.batch}
        | {"max_new_tokens": args.max_new_tokens, "wall_s": wall}
        | {"generate_calls": result.generate_calls, "generated_tokens": backend.generated_tokens}
        | {"prefilled_tokens": backend.prefilled_tokens}
    ]
    print(f"{'phase':28s} {'seconds':>8s} {'share':>6s} {'calls':>6s} {'ms/call':>8s}")
    for label, parent, name in phases:
        _, s, n = timer.row(label, parent, name)
        print(f"{label:28s} {s:8.2f} {s / wall:6.2f} {n:6d} {1000 * s / max(n, 1):8.2f}")
        records.append(
            {"row": "phase", "phase": name, "parent": parent, "seconds": s, "calls": n}
            | {"share": s / wall, "ms_per_call": 1000 * s / max(n, 1)}
        )
    _, decode_s, decode_n = timer.row("", "", "_forward")
    records += decode_by_batch([(rows, s) for (rows, _), s in timer.sizes])
    roofline = decode_roofline(backend, timer.sizes, bandwidth)
    records.append(roofline)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(r) + "\n" for r in records]
        (Path(args.out) / "engine_profile.jsonl").write_text("".join(lines))
    print(f"RESULT engine_decode_ms_per_step {1000 * decode_s / max(decode_n, 1):.2f}")
    print(f"RESULT memory_bandwidth_gb_s {bandwidth / 1e9:.2f}")
    print(f"RESULT decode_roofline_fraction {roofline['fraction']:.4f}")


def decode_size(self, **kw) -> tuple[int, int]:
    """(rows, keys attended) of one `_forward` call: its batch, and the ones of its attention
    mask (each row's real cached tokens plus the new one; left padding and finished rows are
    0). The call's size for `PhaseTimer.sizes`."""
    return kw["input_ids"].shape[0], int(kw["attention_mask"].sum())


def memory_bandwidth(device: torch.device, nbytes: int, repeats: int = 5) -> float:
    """Bytes per second of the device's memory: the best of `repeats` copies of an `nbytes`
    fp32 tensor into another, counting the bytes read and the bytes written."""
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    dst.copy_(src)  # first touch: page faults and allocation are not bandwidth
    best = float("inf")
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        dst.copy_(src)
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * src.element_size() / best


def weight_bytes(backend: hf.HFBackend) -> int:
    """Bytes of the weights one decode step reads: every parameter but the input embedding
    table, which a step reads one row of per sequence, unless the LM head is that table. An int8
    layer's weights count a byte each (a decode step reads those, not their fp32 copy)."""
    model = backend.model
    cfg = model.config.get_text_config()
    embedding = model.get_input_embeddings().weight
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    params = backend.num_params - (0 if tied else embedding.numel())
    int8 = sum(
        m.int8.weight().numel() for m in model.modules() if isinstance(m, int8_linear.Int8Linear)
    )
    return params * model.dtype.itemsize - int8 * (model.dtype.itemsize - 1)


def decode_roofline(
    backend: hf.HFBackend, steps: list[tuple[tuple[int, int], float]], bandwidth: float
) -> dict:
    """Print and return (a "roofline" engine_profile.jsonl row) the decode steps against
    their floor: the bytes of weights and of the attended keys and values over `bandwidth`.
    `steps`: ((rows, keys attended), seconds) per decode step."""
    weights = weight_bytes(backend)
    kv = sum(keys for (_, keys), _ in steps) * backend.token_bytes
    moved = len(steps) * weights + kv
    measured = sum(s for _, s in steps)
    floor = moved / bandwidth
    fraction = floor / measured if measured else 0.0
    print(
        f"memory bandwidth {bandwidth / 1e9:.2f} GB/s (copy); a decode step reads "
        f"{weights / 1e6:.0f} MB of weights + {backend.token_bytes / 1e3:.1f} kB of keys and "
        f"values per attended token; {len(steps)} steps read {moved / 1e9:.2f} GB "
        f"({kv / max(moved, 1):.0%} keys and values): floor {floor:.2f} s against "
        f"{measured:.2f} s measured, {fraction:.3f} of the roofline"
    )
    return {"row": "roofline", "bandwidth_gb_s": bandwidth / 1e9, "weight_bytes": weights} | {
        "kv_bytes": kv, "steps": len(steps), "floor_s": floor, "measured_s": measured,
        "fraction": fraction,
    }  # fmt: skip


def decode_by_batch(steps: list[tuple[int, float]]) -> list[dict]:
    """Print decode steps bucketed by rows, and the decode time modelled at the largest batch;
    return them as engine_profile.jsonl rows."""
    if not steps:
        return []
    records = []
    rows, secs = np.array([r for r, _ in steps]), np.array([s for _, s in steps])
    top = int(rows.max())
    width = max(1, -(-top // 8))  # eight buckets at most
    print(f"{'decode rows':28s} {'seconds':>8s} {'steps':>6s} {'ms/step':>8s}")
    for lo in range(0, top + 1, width):
        pick = (rows >= lo) & (rows < lo + width)
        if pick.any():
            label = f"{lo}-{lo + width - 1}" if width > 1 else str(lo)
            n, s = int(pick.sum()), float(secs[pick].sum())
            print(f"{label:28s} {s:8.2f} {n:6d} {1000 * s / n:8.2f}")
            records.append(
                {"row": "decode_batch", "rows_min": lo, "rows_max": lo + width - 1}
                | {"seconds": s, "steps": n, "ms_per_step": 1000 * s / n}
            )
    if np.unique(rows).size > 1:  # a line needs two batch sizes
        full = -(-int(rows.sum()) // top)  # steps if every one ran `top` rows
        slope, fixed = np.polyfit(rows, secs, 1)
        modelled = full * (fixed + slope * top)
        print(
            f"step time ~ {1000 * fixed:.1f} ms + {1000 * slope:.2f} ms per row; "
            f"{int(rows.sum())} row-steps at {top} rows ({full} steps): ~{modelled:.2f} s "
            f"modelled against {secs.sum():.2f} s measured"
        )
        records.append(
            {"row": "decode_model", "fixed_ms": 1000 * float(fixed)}
            | {"ms_per_row": 1000 * float(slope)}
            | {"row_steps": int(rows.sum()), "rows": top, "steps": full}
            | {"modelled_s": float(modelled), "measured_s": float(secs.sum())}
        )
    return records


if __name__ == "__main__":
    main()

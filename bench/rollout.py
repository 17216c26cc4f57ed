"""Batched concurrent rollout vs a plain game-by-game loop, same seeded games, same model.

    .venv/bin/python bench/rollout.py            # 64 games, k=4 (about 3 minutes on 2 cores)
    .venv/bin/python bench/rollout.py --games 4  # smoke size
    .venv/bin/python bench/rollout.py --model smollm2-135m-instruct --games 8 --k 3
    .venv/bin/python bench/rollout.py --model runs/learn/iter-0 --games 64 --k 3 \\
        --max-new-tokens 48 --temperature 0.7 --param random_names=false --param max_retries=1
    .venv/bin/python bench/rollout.py --backend openai --base-url http://127.0.0.1:30000 \\
        --model Qwen/Qwen2.5-1.5B-Instruct      # any backend of sparring.generation.factory
    .venv/bin/python bench/rollout.py --model smollm2-135m-instruct --games 64 --k 3 \\
        --max-new-tokens 48 --temperature 0.7 --param random_names=false --param max_retries=1 \\
        --quantize int8 --vs-fp32 --no-baseline # the int8 engine against the fp32 one

The baseline is what a user of dialop's env would write: for each game, for each turn, render
the chat template, generate for that one seat, step. Prints games/s for both, tokens/s, and the
share of wall time inside the model's forward passes (hf only), then
`RESULT rollout_speedup <ratio>`. The hf backend also reports its achieved model FLOP/s,
2 x parameters x processed tokens (prefilled and decoded; a cached prefix is not processed
again) over the batched rollout's wall time, as a fraction of the best fp32 (bf16 on CUDA)
matmul rate measured in the same run: `RESULT rollout_flop_util <fraction>`, printed before
the speedup. Both figures are also given per CPU second of this process, which other jobs on a
shared machine do not dilute. The count includes the LM head for every token although prefill computes logits
for the last position only, so it slightly overstates the work actually done.

With a CUDA GPU (`torch.cuda.is_available()`) it measures the GPU throughput instead, for the
documented model config (configs/pipeline-gpu.yaml: its model, game params,
rollout.max_batch_size and max_new_tokens, 512 games unless flags say otherwise), batched only
(`--baseline` adds the game-by-game loop and its speedup line; `--no-baseline` drops it on
CPU), and ends with
`RESULT rollout_tokens_per_s <generated tokens per second>`.

With `--out DIR` it also writes DIR/rollout.jsonl, one JSON object per measured loop (`row`:
"batched", then "sequential" if it ran): its wall and CPU seconds, games, generate calls,
generated tokens and rates; the batched row adds the hf backend's FLOP figures, the sequential
row both speedups.

`--quantize int8` plays with the hf engine's int8 linear layers (sparring.generation.int8_linear),
`--quantize bf16` with the whole engine in bf16 (on a CPU with bf16 instructions).
`--vs-fp32` then plays the same batched rollout again on the fp32 engine in the same process and
prints `RESULT rollout_speedup_vs_fp32 <fp32 wall / quantized wall>`, and scores the first
`--mismatch-rows` samples of the quantized rollout with the fp32 trainer (`sparring.train`, at
the sampling temperature): `RESULT rollout_mismatch_kl <k3 KL, the trainer's train/mismatch_kl>`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import yaml
from sparring.configs import CONFIG_DIR

from sparring.game_init import GameInitConfig, generate_inits
from sparring.games import GameSpec, make_game
from sparring.games.base import LEARNER
from sparring.generation.base import GenerationBackend, SamplingParams
from sparring.generation.factory import BACKENDS, BackendConfig, make_backend
from sparring.models import resolve_model
from sparring.peak_flops import matmul_peak
from sparring.rollout import RolloutConfig, RolloutResult, play
from sparring.rollout_correction import mismatch_metrics
from sparring.tiny_model import init_tiny
from sparring.train import batched_log_probs, collate, load_model
from sparring.train_config import GRPOConfig

GPU_CONFIG = CONFIG_DIR / "pipeline-gpu.yaml"


def sequential(
    backend: GenerationBackend, inits, game_params: dict, sampling: SamplingParams
) -> int:
    """Game-by-game loop; returns the number of generate calls."""
    calls = 0
    for _, state in inits:
        game = make_game("matching", **game_params)
        game.reset(state)
        while not game.done:
            seat = game.current_seat
            prompt = backend.tokenizer.apply_chat_template(
                game.messages(seat), add_generation_prompt=True, tokenize=True
            )["input_ids"]
            sampling = sampling.model_copy(update={"seed": calls})
            game.step(seat, backend.generate([prompt], sampling)[0].text)
            calls += 1
    return calls


def processed_tokens(backend: GenerationBackend) -> int:
    """Tokens the model ran on: uncached prompt tokens plus generated ones (hf backend)."""
    return backend.prefilled_tokens + backend.generated_tokens


def vs_fp32(
    model: str,
    inits,
    cfg: RolloutConfig,
    quantized: RolloutResult,
    quantized_cpu: float,
    pad_id: int,
    rows: int,
    mode: str,
) -> dict:
    """The same batched rollout on the fp32 hf engine, and the fp32 trainer's log-probs of the
    first `rows` samples of the `quantized` rollout (which took `quantized_cpu` CPU seconds)
    against the engine's: the figures of `--vs-fp32`."""
    fp32 = make_backend(model, BackendConfig(), device="cpu", max_batch_size=cfg.max_batch_size)
    c0 = time.process_time()
    result = play(inits, {LEARNER: fp32}, cfg, progress=False)
    cpu = time.process_time() - c0
    fp32.close()
    speedup = result.seconds / quantized.seconds
    print(
        f"fp32:       {result.seconds:7.1f} s  {len(inits) / result.seconds:6.3f} games/s  "
        f"{result.generated_tokens / result.seconds:7.1f} tokens/s  ({mode} {speedup:.2f}x; by "
        f"CPU time {cpu / quantized_cpu:.2f}x, {cpu:.1f} s against {quantized_cpu:.1f} s)"
    )
    df = pd.DataFrame(quantized.samples[:rows])
    batch = collate(df, pad_id)
    trainer = load_model(model, torch.device("cpu"), trainable=False)
    old = batched_log_probs(
        trainer, batch, range(len(df)), GRPOConfig(micro_batch_size=4), torch.device("cpu")
    )
    gap = mismatch_metrics(old, batch.rollout_log_prob, batch.response_mask)
    tokens = int(batch.response_mask.sum())
    print(
        f"{mode} sampler vs fp32 trainer over {len(df)} samples ({tokens} response tokens): "
        f"mismatch_kl {gap['mismatch_kl']:.3g}, ratio outside [0.5, 2] "
        f"{gap['mismatch_frac_out']:.4f}"
    )
    return {
        "row": "fp32",
        "seconds": result.seconds,
        "generated_tokens": result.generated_tokens,
        "cpu_seconds": cpu,
        "speedup_vs_fp32": speedup,
        "cpu_speedup_vs_fp32": cpu / quantized_cpu,
        "mismatch_rows": len(df),
        "mismatch_tokens": tokens,
    } | gap


def gpu_defaults() -> dict:
    """The documented GPU config's model, table size, batch and per-turn budget."""
    cfg = yaml.safe_load(GPU_CONFIG.read_text())
    rollout = cfg.get("rollout", {})
    return {
        "model": cfg["model"],
        "k": cfg["game"]["params"]["k"],
        "games": 512,
        "max_new_tokens": rollout.get("sampling", {}).get("max_new_tokens", 256),
        "max_batch_size": rollout.get("max_batch_size", 256),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--games", type=int, help="seeded games to play each way (CPU 64, GPU 512)")
    ap.add_argument("--k", type=int, help="table size (CPU 4, GPU: the GPU config's)")
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, help="per turn (CPU 24, GPU: the config's)")
    ap.add_argument("--model", help="checkpoint (CPU: a fresh tiny model; GPU: the config's)")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    ap.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another matching-game parameter, e.g. random_names=false (value parsed as YAML)",
    )
    ap.add_argument("--backend", choices=BACKENDS, default="hf", help="generation engine")
    ap.add_argument("--base-url", help="openai backend: the server root, e.g. http://host:30000")
    ap.add_argument(
        "--baseline",
        action=argparse.BooleanOptionalAction,
        help="run the game-by-game loop too (default: on CPU yes, on a GPU no)",
    )
    ap.add_argument("--out", help="folder for rollout.jsonl, the rows as JSON (default: none)")
    ap.add_argument(
        "--quantize", choices=("none", "int8", "bf16"), default="none", help="hf on CPU"
    )
    ap.add_argument(
        "--int8-fp32-layers",
        default="",
        metavar="NAMES",
        help="with --quantize int8: layers kept fp32, comma-separated (e.g. down_proj,lm_head)",
    )
    ap.add_argument("--vs-fp32", action="store_true", help="also the fp32 engine (--quantize)")
    ap.add_argument("--mismatch-rows", type=int, default=16, help="samples scored by --vs-fp32")
    args = ap.parse_args()
    if args.vs_fp32 and args.quantize == "none":
        ap.error("--vs-fp32 compares a --quantize engine with the fp32 one")

    gpu = torch.cuda.is_available()
    d = gpu_defaults() if gpu else {"k": 4, "games": 64, "max_new_tokens": 24}
    games, k = args.games or d["games"], args.k or d["k"]
    max_new_tokens = args.max_new_tokens or d["max_new_tokens"]
    model = (
        args.model or d.get("model") or str(init_tiny(tempfile.mkdtemp(prefix="sparring-tiny-")))
    )
    if args.backend == "hf":
        model = resolve_model(model)  # named real models (smollm2-135m-instruct) are fetched
    try:  # e.g. openai without --base-url
        backend_cfg = BackendConfig(
            name=args.backend,
            base_url=args.base_url,
            quantize=args.quantize,
            int8_fp32_layers=[n for n in args.int8_fp32_layers.split(",") if n],
        )
    except ValueError as e:
        ap.error(str(e).splitlines()[1].strip())
    batch = min(games, d.get("max_batch_size", games))
    backend = make_backend(
        model, backend_cfg, device="cuda" if gpu else "cpu", max_batch_size=batch
    )

    game_params = {"k": k, "max_turns": args.max_turns}
    for pair in args.param:
        key, _, value = pair.partition("=")
        game_params[key] = yaml.safe_load(value)
    df = generate_inits(
        GameInitConfig(game=GameSpec(params=game_params), num_train=games, num_val=0),
        progress=False,
    )
    inits = [(r.init_id, json.loads(r.state)) for r in df.itertuples()]
    sampling = SamplingParams(temperature=args.temperature, max_new_tokens=max_new_tokens, seed=0)
    print(
        f"{args.backend} on {'cuda' if gpu else 'cpu'}: {model}, {games} games, {game_params}, "
        f"max_new_tokens={max_new_tokens}, temperature {args.temperature}, "
        f"linears {args.quantize}"
        + (f" except {args.int8_fp32_layers}" if args.int8_fp32_layers else "")
    )

    def reset() -> None:  # per-backend counters of generated tokens (and hf forward time)
        backend.generated_tokens = 0
        if hasattr(backend, "forward_seconds"):
            backend.forward_seconds, backend.prefilled_tokens = 0.0, 0

    def share(seconds: float) -> str:  # only the hf backend times its forward passes
        fwd = getattr(backend, "forward_seconds", None)
        return "" if fwd is None else f"  forward share {fwd / seconds:.2f}"

    def row(name: str, seconds: float, cpu: float, calls: int, tokens: int) -> dict:
        """One loop's figures, as rollout.jsonl keeps them."""
        row = {"row": name, "games": len(inits), "seconds": seconds, "cpu_seconds": cpu}
        row |= {"games_per_s": len(inits) / seconds, "generate_calls": calls}
        row |= {"generated_tokens": tokens, "tokens_per_s": tokens / seconds}
        if hasattr(backend, "forward_seconds"):
            row["forward_share"] = backend.forward_seconds / seconds
        return row

    cfg = RolloutConfig(
        game=GameSpec(params=game_params), games_per_init=1, sampling=sampling, max_batch_size=batch
    )
    reset()
    c0 = time.process_time()
    result = play(inits, {LEARNER: backend}, cfg, progress=False)
    batched_cpu = time.process_time() - c0
    batched_gps = len(inits) / result.seconds
    tokens_per_s = result.generated_tokens / result.seconds
    print(
        f"batched:    {result.seconds:7.1f} s  {batched_gps:6.3f} games/s  "
        f"{tokens_per_s:7.1f} tokens/s  {result.generate_calls} generate calls"
        f"{share(result.seconds)}"
    )
    batched = row(
        "batched", result.seconds, batched_cpu, result.generate_calls, result.generated_tokens
    )
    rows = [batched]
    if hasattr(backend, "prefilled_tokens"):  # hf: the model's own counters and parameters
        params = backend.num_params
        flop = 2 * params * processed_tokens(backend)
        peak, cpu_peak = matmul_peak(backend.device)
        print(
            f"model FLOP/s: {flop / result.seconds / 1e9:.1f} G (2 x {params / 1e6:.1f}M params x "
            f"{processed_tokens(backend)} tokens: {backend.prefilled_tokens} prefilled, "
            f"{backend.generated_tokens} generated) of a {peak / 1e9:.1f} G matmul peak; per CPU "
            f"second {flop / batched_cpu / 1e9:.1f} G of {cpu_peak / 1e9:.1f} G "
            f"(utilisation {flop / batched_cpu / cpu_peak:.3f} by CPU time)"
        )
        batched |= {"params": params, "prefilled_tokens": backend.prefilled_tokens}
        batched |= {"flop_per_s": flop / result.seconds, "matmul_peak": peak}
        batched |= {"flop_util": flop / result.seconds / peak, "cpu_matmul_peak": cpu_peak}
        batched |= {"cpu_flop_util": flop / batched_cpu / cpu_peak}
        print(f"RESULT rollout_flop_util {flop / result.seconds / peak:.3f}")

    if not gpu if args.baseline is None else args.baseline:
        reset()
        t0, c0 = time.perf_counter(), time.process_time()
        calls = sequential(backend, inits, game_params, sampling)
        seq_s, seq_cpu = time.perf_counter() - t0, time.process_time() - c0
        seq_gps = len(inits) / seq_s
        print(
            f"sequential: {seq_s:7.1f} s  {seq_gps:6.3f} games/s  "
            f"{backend.generated_tokens / seq_s:7.1f} tokens/s  {calls} generate calls"
            f"{share(seq_s)}"
        )
        print(f"speedup by CPU time: {seq_cpu / batched_cpu:.2f} (the same games either way)")
        rows.append(row("sequential", seq_s, seq_cpu, calls, backend.generated_tokens))
        rows[-1] |= {"speedup": batched_gps / seq_gps, "cpu_speedup": seq_cpu / batched_cpu}
        print(f"RESULT rollout_speedup {batched_gps / seq_gps:.2f}")
    backend.close()
    if args.vs_fp32:
        pad_id = backend.pad_id
        rows.append(
            vs_fp32(
                model, inits, cfg, result, batched_cpu, pad_id, args.mismatch_rows, args.quantize
            )
        )
        print(f"RESULT rollout_speedup_vs_fp32 {rows[-1]['speedup_vs_fp32']:.2f}")
        print(f"RESULT rollout_mismatch_kl {rows[-1]['mismatch_kl']:.3g}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(r) + "\n" for r in rows]
        (Path(args.out) / "rollout.jsonl").write_text("".join(lines))
    if gpu:
        print(f"RESULT rollout_tokens_per_s {tokens_per_s:.1f}")


if __name__ == "__main__":
    main()

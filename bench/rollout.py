"""Batched concurrent rollout vs a plain game-by-game loop, same seeded games, same model.

    .venv/bin/python bench/rollout.py            # 64 games, k=4 (about 3 minutes on 2 cores)
    .venv/bin/python bench/rollout.py --games 4  # smoke size

The baseline is what a user of dialop's env would write: for each game, for each turn, render
the chat template, generate for that one seat, step. Prints games/s for both, tokens/s, and the
share of wall time inside the model's forward passes, then `RESULT rollout_speedup <ratio>`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from sparring.game_init import GameInitConfig, generate_inits
from sparring.games import make_game
from sparring.generation.base import SamplingParams
from sparring.generation.hf import HFBackend
from sparring.rollout import RolloutConfig, play
from sparring.tiny_model import init_tiny


def sequential(backend: HFBackend, inits, game_params: dict, sampling: SamplingParams) -> int:
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


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--games", type=int, default=64, help="seeded games to play each way")
    ap.add_argument("--k", type=int, default=4, help="table size")
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--model", help="checkpoint (default: a fresh tiny model)")
    args = ap.parse_args()

    model = args.model or str(init_tiny(tempfile.mkdtemp(prefix="sparring-tiny-")))
    game_params = {"k": args.k, "max_turns": args.max_turns}
    df = generate_inits(
        GameInitConfig(game_params=game_params, num_train=args.games, num_val=0), progress=False
    )
    inits = [(r.init_id, json.loads(r.state)) for r in df.itertuples()]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    backend = HFBackend(model, device="cpu", max_batch_size=args.games)

    cfg = RolloutConfig(game_params=game_params, games_per_init=1, sampling=sampling)
    backend.forward_seconds, backend.generated_tokens = 0.0, 0
    result = play(inits, {"policy": backend}, cfg, progress=False)
    batched_gps = len(inits) / result.seconds
    fwd_share = backend.forward_seconds / result.seconds
    print(f"batched:    {result.seconds:7.1f} s  {batched_gps:6.3f} games/s  "
          f"{result.generated_tokens / result.seconds:7.1f} tokens/s  "
          f"{result.generate_calls} generate calls  forward share {fwd_share:.2f}")  # fmt: skip

    backend.forward_seconds, backend.generated_tokens = 0.0, 0
    t0 = time.perf_counter()
    calls = sequential(backend, inits, game_params, sampling)
    seq_s = time.perf_counter() - t0
    seq_gps = len(inits) / seq_s
    print(f"sequential: {seq_s:7.1f} s  {seq_gps:6.3f} games/s  "
          f"{backend.generated_tokens / seq_s:7.1f} tokens/s  {calls} generate calls  "
          f"forward share {backend.forward_seconds / seq_s:.2f}")  # fmt: skip
    print(f"RESULT rollout_speedup {batched_gps / seq_gps:.2f}")


if __name__ == "__main__":
    main()

"""Diplomacy: batched rollout of many games vs the same games played one at a time.

    .venv/bin/python bench/diplomacy_rollout.py              # 16 games, one year, with press
    .venv/bin/python bench/diplomacy_rollout.py --games 2 --horizon 1 --max-new-tokens 8  # smoke

All three ways use `sparring.rollout.play` with the same backend, seeded scenarios and
sampling; a decision is one power's reply (a press or an orders turn).
- batched: all games at once, so each step's generate call holds every pending power of every
  game (up to 7 x games prompts);
- game-by-game: `play` on one game at a time, each decision its own forward passes (the plain
  loop of bench/rollout.py's baseline: for each game, for each power, generate, step);
- per-game batch: one game at a time, but a call holds that game's up to 7 powers.
Prints decisions/s each way, the batched speedup over per-game batches, and last
`RESULT diplomacy_speedup <batched / game-by-game decisions/s>`.
"""

from __future__ import annotations

import argparse
import json
import tempfile

from sparring.game_init import GameInitConfig, generate_inits
from sparring.games import GameSpec
from sparring.games.base import LEARNER
from sparring.generation.base import SamplingParams
from sparring.generation.hf import HFBackend
from sparring.rollout import RolloutConfig, RolloutResult, play
from sparring.tiny_model import init_tiny


def report(label: str, results: list[RolloutResult], backend: HFBackend) -> float:
    """Print one way's figures; return its decisions per second."""
    seconds = sum(r.seconds for r in results)
    decisions = sum(len(e.transcript) for r in results for e in r.episodes)
    calls = sum(r.generate_calls for r in results)
    truncated = sum(e.truncated for r in results for e in r.episodes)
    print(
        f"{label:14s} {seconds:7.1f} s  {decisions} decisions  {decisions / seconds:6.2f} "
        f"decisions/s  {calls} generate calls  {truncated} truncated  forward share "
        f"{backend.forward_seconds / seconds:.2f}"
    )
    return decisions / seconds


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--games", type=int, default=16, help="seeded scenarios, played each way")
    ap.add_argument("--horizon", type=int, default=1, help="game years per game")
    ap.add_argument("--no-press", dest="press", action="store_false", help="skip press rounds")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--model", help="checkpoint (default: a fresh tiny model)")
    args = ap.parse_args()

    model = args.model or str(init_tiny(tempfile.mkdtemp(prefix="sparring-tiny-")))
    params = {"horizon": args.horizon, "press": args.press}
    df = generate_inits(
        GameInitConfig(
            game=GameSpec(name="diplomacy", params=params), num_train=args.games, num_val=0
        ),
        progress=False,
    )
    inits = [(r.init_id, json.loads(r.state)) for r in df.itertuples()]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    cfg = RolloutConfig(
        game=GameSpec(name="diplomacy", params=params), games_per_init=1, sampling=sampling
    )
    backend = HFBackend(model, device="cpu", max_batch_size=7 * args.games)
    print(
        f"{args.games} games, horizon {args.horizon}, press {args.press}, "
        f"{args.max_new_tokens} new tokens per decision"
    )

    play(inits[:1], {LEARNER: backend}, cfg, progress=False)  # warm-up (first-call costs)

    def run(label: str, batch: int, together: bool) -> float:
        backend.max_batch_size, backend.forward_seconds = batch, 0.0
        groups = [inits] if together else [[init] for init in inits]
        results = [play(group, {LEARNER: backend}, cfg, progress=False) for group in groups]
        return report(label, results, backend)

    batched = run("batched", 7 * args.games, together=True)
    per_game = run("per-game batch", 7, together=False)
    one_by_one = run("game-by-game", 1, together=False)
    print(f"batched / per-game batch: {batched / per_game:.2f}")
    print(f"RESULT diplomacy_speedup {batched / one_by_one:.2f}")


if __name__ == "__main__":
    main()

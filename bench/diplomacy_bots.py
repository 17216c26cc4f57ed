"""Diplomacy bots, no model: the `support` bot in one power's seat against six greedy bots, vs
a greedy bot in the same seat.

    .venv/bin/python bench/diplomacy_bots.py                 # 64 held-out states, 1-2 min
    .venv/bin/python bench/diplomacy_bots.py --states 2      # smoke

The states are the recipe's held-out test split (`--config`, default configs/diplomacy.yaml:
its game rules and game-init seed, `state_seed(seed, "test", i)`), played over the recipe's
horizon without press. Each state is played once by seven greedy bots (the reference, the same
for every seat) and seven times with the `support` bot in one power's seat (each power in
turn). Per (state, power): supply centers gained since the start and the game's normalized
reward, support bot minus greedy. Prints both means with standard errors over states x powers
(and, for centers, over per-state means, since one state's seven powers share a board), then
`RESULT <bot>_bot_gain_over_<opponent> <mean center gain difference>` and its `_se` last
(`support_bot_gain_over_greedy` by default).
"""

from __future__ import annotations

import argparse
import statistics
import time

from sparring.cli.options import load_config
from sparring.game_init import state_seed
from sparring.games.diplomacy import ROLES
from sparring.loop.config import CONFIG_DIR, PipelineConfig
from sparring.stats import mean_se


def play(game, state: dict, seats: list[str], seed: int) -> tuple[list[int], list[float]]:
    """One game with these bots per seat: (centers gained per power, rewards per power)."""
    bots = [game.make_agent(name, seed=seed) for name in seats]
    game.reset(state)
    while not game.done:
        for seat in list(game.pending_seats):
            game.step(seat, bots[seat].act(game, seat))
    gained = [r.centers - r.start_centers for r in game.results()]
    return gained, game.rewards


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default=str(CONFIG_DIR / "diplomacy.yaml"),
                    help="recipe whose game rules and game-init seed give the test states")  # fmt: skip
    ap.add_argument("--states", type=int, default=64, help="held-out test states")
    ap.add_argument("--horizon", type=int, help="game years (default: the recipe's)")
    ap.add_argument("--bot", default="support", help="the bot measured in one seat")
    ap.add_argument("--opponent", default="greedy", help="the other six seats, and the reference")
    args = ap.parse_args()

    cfg = load_config(PipelineConfig, args.config, {})
    params = {**cfg.game.params, "press": False}
    if args.horizon:
        params["horizon"] = args.horizon
    game = cfg.game.model_copy(update={"params": params}).make()
    print(f"{args.states} test states of {args.config}: {params}; {args.bot} vs {args.opponent}")
    start = time.perf_counter()
    centers, rewards, by_state = [], [], []
    for i in range(args.states):
        seed = state_seed(cfg.game_init.seed, "test", i)
        state = game.generate_state(seed)
        ref_gain, ref_reward = play(game, state, [args.opponent] * len(ROLES), seed)
        diffs = []
        for seat in range(len(ROLES)):
            seats = [args.opponent] * len(ROLES)
            seats[seat] = args.bot
            gain, reward = play(game, state, seats, seed)
            diffs.append(gain[seat] - ref_gain[seat])
            rewards.append(reward[seat] - ref_reward[seat])
        print(f"state {i:3d} {state['phase']}: centers gained over {args.opponent} per power "
              + " ".join(f"{d:+d}" for d in diffs))  # fmt: skip
        centers += diffs
        by_state.append(statistics.fmean(diffs))
    gain, se = mean_se(centers)
    reward, reward_se = mean_se(rewards)
    print(f"{time.perf_counter() - start:.0f} s; {len(centers)} (state, power) pairs")
    print(f"normalized reward gain {reward:+.4f} ± {reward_se:.4f}")
    print(f"center gain over per-state means {gain:+.3f} ± {mean_se(by_state)[1]:.3f}")
    name = f"{args.bot}_bot_gain_over_{args.opponent}".replace("-", "_")
    print(f"RESULT {name} {gain:.4f}")
    print(f"RESULT {name}_se {se:.4f}")


if __name__ == "__main__":
    main()

"""verl dataset rows for online self-play: one row per (initial state, focal seat).

verl gives every dataset row a fresh `uid` and generates it `rollout.n` times. The
`sparring_group` estimator (`sparring.verl_backend.estimator`) groups the rows by their
`extra_info.group_key` label: under `init_seat` a group is one row's `rollout.n` plays ("same
initial state, same seat", verl's own uid groups); under `role` or a game's own key it pools
the rows of every state that share the label. Columns (what verl's RLHFDataset and agent-loop
worker read):
    data_source   "sparring/<game>"
    prompt        the focal seat's opening chat messages (verl's `raw_prompt`; the loop renders
                  its own tokens, this only has to fit data.max_prompt_length)
    agent_name    "sparring_selfplay" (the registered loop)
    extra_info    {game, game_params (JSON), state (JSON), init_id, seat, role, group_key}
    reward_model  {style: "sparring", ground_truth: ""} (unused: the loop sets reward_score)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from sparring.games import GameSpec
from sparring.verl_backend.config import AGENT_NAME


def selfplay_rows(
    inits: list[tuple[str, dict[str, Any]]], game: GameSpec, group_key: str = "init_seat"
) -> pd.DataFrame:
    """One row per (initial state, seat); `extra_info.group_key` holds the row's label under
    `group_key` (`init_seat`, `role`, or one of the game's own keys)."""
    rows = []
    for init_id, state in inits:
        g = game.make()
        g.reset(state)
        for seat in range(g.num_seats):
            keys = {"init_seat": f"{init_id}/{seat}", "role": g.roles[seat]} | g.group_keys(seat)
            if group_key not in keys:
                raise ValueError(f"{game.name} has no `{group_key}` group key (has {sorted(keys)})")
            rows.append(
                {
                    "data_source": f"sparring/{game.name}",
                    "prompt": g.messages(seat),
                    "agent_name": AGENT_NAME,
                    "extra_info": {
                        "game": game.name,
                        "game_params": json.dumps(game.params),
                        "state": json.dumps(state),
                        "init_id": init_id,
                        "seat": seat,
                        "role": g.roles[seat],
                        "group_key": str(keys[group_key]),
                    },
                    "reward_model": {"style": "sparring", "ground_truth": ""},
                }
            )
    return pd.DataFrame(rows)


def write_rows(df: pd.DataFrame, path: str | Path) -> Path:
    """Write rows to parquet for `data.train_files` / `data.val_files`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path, index=False)
    return path

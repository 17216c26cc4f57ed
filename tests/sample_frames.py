"""Samples DataFrames in the rollout's schema, built with the real `TokenTrace` (for the
trainer and SFT tests, independent of the rollout)."""

from __future__ import annotations

import pandas as pd

from sparring.samples import TokenTrace, last_reply_index
from sparring.samples import reply_spans as mask_spans  # noqa: F401 - the tests' name

REPLIES = ("[message] hi", "[propose]\nAda: P1", "[accept]", "[reject]", "[message] 42 ok")


def sample_row(tokenizer, i: int, reward: float, two_turns: bool = True) -> dict:
    """One (game, seat) row: a system prompt, a user turn and one or two assistant replies."""
    trace = TokenTrace(tokenizer)
    messages = [
        {"role": "system", "content": f"You are seat {i % 2}."},
        {"role": "user", "content": "You move first."},
    ]
    for turn in range(2 if two_turns else 1):
        trace.prompt(messages)
        messages = [*messages, {"role": "assistant", "content": REPLIES[(i + turn) % 5]}]
        trace.reply(messages, None)
        messages = [*messages, {"role": "user", "content": "Partner: [reject]"}]
    end = last_reply_index(trace.assistant_mask)
    ids, mask = trace.input_ids[: end + 1], trace.assistant_mask[: end + 1]
    return {
        "sample_id": f"g{i // 2}/{i % 2}",
        "game_id": f"g{i // 2}",
        "init_id": f"s{i // 4}",
        "seat": i % 2,
        "role": ("proposer", "reviewer")[i % 2],
        "policy": "policy",
        "game": f"g{i // 2}",
        "init": f"s{i // 4}",
        "input_ids": ids,
        "assistant_mask": mask,
        "token_rewards": [0.0] * end + [reward],
        "reward": reward,
        "normalized_reward": reward,
    }


def make_samples(tokenizer, rewards: list[float], **columns: list) -> pd.DataFrame:
    """Rows i = 0.. with `rewards[i]`; game = i // 2, init = i // 4, role by seat; `columns`
    override or add columns (e.g. a custom group key)."""
    df = pd.DataFrame([sample_row(tokenizer, i, r) for i, r in enumerate(rewards)])
    for name, values in columns.items():
        df[name] = values
    return df

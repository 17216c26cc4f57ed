"""A verl agent loop that plays one whole Sparring game in self-play (seed 002, route 1).

verl runs one `run()` per dataset row, `rollout.n` times. A row names an initial state and a
focal seat (`sparring.verl_backend.data`). `run()`:
  1. resets the game to the row's state and keeps one `TokenTrace` per seat;
  2. each step, every pending seat renders its new chat-template tokens and generates through
     verl's `server_manager.generate`, one request_id per seat (its prefix cache stays warm);
     simultaneous seats (Diplomacy) generate concurrently;
  3. ends on game over, or when a seat's context would pass prompt_length + response_length;
  4. returns the FOCAL seat's trace: prompt = tokens before its first reply, response = the rest
     up to its last own token, response_mask 1 on its own generated tokens and 0 on everything
     else (scaffolding, partners' messages), `reward_score` = its game reward (verl puts it on
     the last response token, which is the focal seat's own), `num_turns` = game turns.

Every seat is the current policy, so partner turns are on-policy too; only the focal seat's
tokens are trained in this row. The row for the other seat of the same state trains that seat.

Select it with `agent_name: sparring_selfplay` in the dataset rows and point
`actor_rollout_ref.rollout.agent.agent_loop_config_path` at the YAML `write_agent_loop_config`
writes (its extra keys become constructor arguments: `max_new_tokens`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from sparring.games import Game, make_game
from sparring.generation.stops import trim_reply, turn_stop_ids
from sparring.samples import TokenTrace
from sparring.verl_backend.config import AGENT_NAME

__all__ = ["AGENT_NAME", "SeatTrace", "SparringSelfPlayLoop", "focal_output", "play_game"]


Generate = Callable[
    ..., Awaitable[Any]
]  # server_manager.generate(request_id, *, prompt_ids, sampling_params)


@dataclass
class SeatTrace:
    """One seat's token trace plus the rollout log-probs of its own tokens."""

    trace: TokenTrace
    logprobs: list[float]
    """One per token of `trace.input_ids` (0.0 where the seat did not generate)."""


async def play_game(
    game: Game,
    generate: Generate,
    tokenizer: Any,
    sampling_params: dict[str, Any],
    request_prefix: str,
    max_new_tokens: int,
    max_tokens: int,
) -> tuple[list[SeatTrace], bool]:
    """Play `game` (already reset) with every seat generated through `generate`.

    Returns the per-seat traces and whether the game was cut at `max_tokens` of context.
    """
    _, stop_ids = turn_stop_ids(tokenizer)
    params = {**sampling_params, "max_new_tokens": max_new_tokens, "stop_token_ids": stop_ids}
    seats = [SeatTrace(TokenTrace(tokenizer), []) for _ in range(game.num_seats)]

    async def turn(seat: int) -> tuple[int, Any] | None:
        prompt = seats[seat].trace.prompt(game.messages(seat))
        if len(prompt) + max_new_tokens > max_tokens:
            return None
        out = await generate(f"{request_prefix}/{seat}", prompt_ids=prompt, sampling_params=params)
        return seat, out

    while not game.done:
        results = await asyncio.gather(*(turn(s) for s in game.pending_seats))
        if any(r is None for r in results):
            return seats, True
        for seat, out in results:
            reply = trim_reply(out.token_ids, tokenizer, stop_ids)
            s = seats[seat]
            s.logprobs += [0.0] * (len(s.trace.input_ids) - len(s.logprobs))
            s.logprobs += list(out.log_probs or [0.0] * len(out.token_ids))[: len(reply.token_ids)]
            game.step(seat, reply.text)
            messages = game.messages(seat)
            last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
            s.trace.reply(messages[: last + 1], reply.token_ids)
    return seats, False


def focal_output(
    seat: SeatTrace,
    reward: float,
    num_turns: int,
    with_logprobs: bool,
    prompt_length: int,
    response_length: int,
) -> AgentLoopOutput:
    """The focal seat's AgentLoopOutput: prompt up to its first reply, response through its
    last own token (so the reward lands on it), mask 1 only on its own generated tokens.

    The prompt keeps its last `prompt_length` tokens and the response its first
    `response_length` (verl pads both to those widths); the game's context cap keeps the cut
    rare, and a cut response carries the reward on its last kept token.
    """
    ids, mask = seat.trace.input_ids, seat.trace.assistant_mask
    own = [i for i, m in enumerate(mask) if m]
    if own:
        start, end = own[0], own[-1] + 1
    else:  # never spoke: one mask-0 token carries the reward (counted in the group baseline)
        start, end = len(ids) - 1, len(ids)
    end = min(end, start + response_length)
    logprobs = (seat.logprobs + [0.0] * len(ids))[start:end] if with_logprobs else None
    return AgentLoopOutput(
        prompt_ids=ids[max(0, start - prompt_length) : start],
        response_ids=ids[start:end],
        response_mask=mask[start:end],
        response_logprobs=logprobs,
        reward_score=float(reward),
        num_turns=num_turns,
        metrics=AgentLoopMetrics(),
    )


@register(AGENT_NAME)
class SparringSelfPlayLoop(AgentLoopBase):
    """Plays the row's game with every seat on the current policy; trains the focal seat."""

    def __init__(self, *args: Any, max_new_tokens: int = 256, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_new_tokens = max_new_tokens
        self.max_tokens = self.rollout_config.prompt_length + self.rollout_config.response_length

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        info = kwargs["extra_info"]
        game = make_game(info["game"], **json.loads(info["game_params"]))
        game.reset(json.loads(info["state"]))
        seats, truncated = await play_game(
            game,
            self.server_manager.generate,
            self.tokenizer,
            sampling_params,
            request_prefix=f"{kwargs.get('uid', info['init_id'])}/{id(game)}",
            max_new_tokens=self.max_new_tokens,
            max_tokens=self.max_tokens,
        )
        focal = int(info["seat"])
        cfg = self.rollout_config
        output = focal_output(
            seats[focal],
            game.rewards[focal],
            game.num_turns,
            bool(sampling_params.get("logprobs")),
            cfg.prompt_length,
            cfg.response_length,
        )
        output.extra_fields.update({"truncated": truncated, "role": game.roles[focal]})
        return output

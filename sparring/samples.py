"""Token ids and assistant masks, built turn by turn, and the samples parquet schema.

`TokenTrace` keeps one seat's conversation as token ids while the game runs. Each turn it
appends only the new chat-template text (the scaffolding and the other side's messages, mask
0) and then the seat's reply: the ids the model actually generated (mask 1), its stop token
included, or, for a scripted seat, the tokenized text plus the EOS token. A reply that stopped at
another special token than EOS (SmolLM2's <|im_start|> or <|endoftext|>) keeps that token, and the
template's own end of turn (its EOS text) follows it with mask 0: the stop is trained, and later
prompts hold exactly the ids the model saw. Re-tokenizing a finished conversation can drift
from what was generated (a verl pitfall); this never does. For canonical tokenizations the ids
equal `apply_chat_template(whole conversation)` exactly (tested with SmolLM2's template and
templates reproducing Qwen2.5 and Llama 3 in tests/templates/). A template that trims replies
(Llama 3) is followed: the trace keeps the generated ids, which later prompts were built on.
A template that re-renders earlier turns (Qwen3 drops earlier <think> blocks) raises
TemplateError: the ids the model saw could not be extended consistently.

One samples row per (game, seat):
    sample_id, game_id, init_id, seat, role, policy   identifiers
    game, init, init_seat, role (+ game-specific keys)  GRPO group keys
    input_ids        list[int]    the whole conversation from this seat's view  (T,)
    assistant_mask   list[int]    1 on this seat's own generated tokens          (T,)
    token_rewards    list[float]  reward on the last masked token, else 0        (T,)
    reward, normalized_reward     float
    messages, prompt              list[{role, content}] (prompt = up to the first reply)
    data_source, reward_model     verl-compatible: {normalized_reward, game_state (JSON)}
    num_turns, invalid_actions    int
    rejected_mask    list[int]    1 on the tokens of replies the game rejected   (T,)
    rollout_log_probs  list[float] | None  the engine's log-prob of each generated token   (T,)
                     (0 elsewhere); None for a scripted seat or an engine that gave none
The rollout adds `temperature` and `top_p` for model seats (how their tokens were sampled).
Rows built to distill a table (`Game.average_rows`) carry only input_ids, assistant_mask,
token_rewards, temperature and `weight` (SFT trains a row of weight w as w copies of it).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sparring.games import GameSpec


class TemplateError(ValueError):
    """The tokenizer's chat template can't be extended turn by turn."""


@dataclass
class TokenTrace:
    """One seat's conversation as token ids plus an assistant mask."""

    tokenizer: Any
    input_ids: list[int] = field(default_factory=list)
    assistant_mask: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)
    """The engine's log-prob of each generated token, 0 on every other token (as `input_ids`)."""
    scored: bool = True
    """Every reply so far came with its log-probs (else `rollout_log_probs` is meaningless)."""
    replies: list[tuple[int, int]] = field(default_factory=list)
    """[start, end) of each reply's tokens in `input_ids`, in order (empty for a reply that
    generated no token)."""
    _rendered: str = ""  # template text that `input_ids` already covers

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )

    def _append_text(self, text: str, mask: int) -> None:
        ids = self.tokenizer.encode(text, add_special_tokens=False) if text else []
        self.input_ids += ids
        self.assistant_mask += [mask] * len(ids)
        self.rollout_log_probs += [0.0] * len(ids)
        self._rendered += text

    def prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """Extend with everything new in `messages` plus the generation prompt; return all ids."""
        full = self._render(messages, generation_prompt=True)
        if not full.startswith(self._rendered):
            raise TemplateError(
                "the seat's earlier turns changed, so the ids the model saw can't be extended "
                "turn by turn: either the game restarted the seat's chat (a game option that "
                "summarises earlier phases in a fresh chat supports scripted seats only), or the chat "
                "template re-renders earlier turns differently (as Qwen3-style templates do when "
                "they drop earlier <think> blocks; use a prefix-stable template such as ChatML "
                f"or Llama 3). {_divergence(self._rendered, full)}"
            )
        self._append_text(full[len(self._rendered) :], 0)
        return list(self.input_ids)

    def reply(
        self,
        messages: list[dict[str, str]],
        generated_ids: list[int] | None,
        log_probs: list[float] | None = None,
    ) -> None:
        """Add the seat's reply, which is `messages[-1]` (an assistant message).

        `generated_ids` are the model's ids (ending with the stop token it generated, EOS or
        another special token, unless cut by length); None means a scripted reply, tokenized
        here and closed with EOS, all with mask 1. `log_probs` are the engine's, one per
        generated id (None: the trace is no longer `scored`).
        """
        content = messages[-1]["content"]
        eos_id, eos_text = self.tokenizer.eos_token_id, self.tokenizer.eos_token
        closed = self._render(messages, generation_prompt=False)
        # The template's text of the reply: the content, or (Llama 3) the content trimmed. The
        # ids stay the generated ones, which the model saw in every later prompt of this trace.
        shown = next(
            (c for c in (content, content.strip()) if closed.startswith(self._rendered + c)), None
        )
        if shown is None:
            raise TemplateError(
                "the chat template renders the assistant's reply as other text than its content "
                "(e.g. it adds or drops a <think> block), so the generated ids can't be placed in "
                f"it. {_divergence(self._rendered + content, closed)}"
            )
        ids = generated_ids
        if ids is None:
            ids = self.tokenizer.encode(shown, add_special_tokens=False) + [eos_id]
        if log_probs is not None and len(log_probs) != len(ids):
            raise ValueError(f"{len(log_probs)} log-probs for a reply of {len(ids)} tokens")
        self.scored = self.scored and log_probs is not None
        self.replies.append((len(self.input_ids), len(self.input_ids) + len(ids)))
        self.input_ids += ids
        self.assistant_mask += [1] * len(ids)
        self.rollout_log_probs += list(log_probs) if log_probs is not None else [0.0] * len(ids)
        self._rendered += shown
        tail = closed[len(self._rendered) :]
        if ids and ids[-1] == eos_id and tail.startswith(eos_text):
            self._rendered += eos_text  # the EOS is already in the ids, trained on
            tail = tail[len(eos_text) :]
        # else (another stop token, or a reply cut by length) the template's EOS is context
        self._append_text(tail, 0)


def _divergence(expected: str, rendered: str) -> str:
    """Where `rendered` stops extending `expected`, for error messages."""
    same = (a == b for a, b in zip(expected, rendered, strict=False))
    i = next((i for i, s in enumerate(same) if not s), min(len(expected), len(rendered)))
    got, want = rendered[i : i + 40], expected[i : i + 40]
    return f"At character {i}, expected {want!r}, the template gave {got!r}."


def last_reply_index(assistant_mask: list[int]) -> int:
    """Index of the seat's last own token (-1 if it never spoke)."""
    for i in range(len(assistant_mask) - 1, -1, -1):
        if assistant_mask[i]:
            return i
    return -1


def reply_spans(assistant_mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s in `assistant_mask`: the seat's replies, in order."""
    spans, start = [], None
    for i, m in enumerate([*assistant_mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def rejected_mask(
    length: int, replies: list[tuple[int, int]], transcript: list[dict[str, Any]], seat: int
) -> list[int]:
    """1 on the tokens (of `length`) of `seat`'s replies the game rejected, 0 elsewhere:
    `replies` are the seat's reply spans (`TokenTrace.replies`), one per transcript entry of
    the seat, in order; an entry with `ok` false marks its span."""
    oks = [t["ok"] for t in transcript if t["seat"] == seat]
    if len(replies) != len(oks):
        raise ValueError(
            f"seat {seat} has {len(replies)} replies but {len(oks)} transcript entries"
        )
    out = [0] * length
    for (a, b), ok in zip(replies, oks, strict=True):
        out[a : min(b, length)] = [0 if ok else 1] * (min(b, length) - a)
    return out


def sample_row(episode: Any, seat: int, trace: TokenTrace) -> dict[str, Any] | None:
    """The samples-parquet row for one seat of a finished episode (None if it never spoke)."""
    end = last_reply_index(trace.assistant_mask)
    if end < 0:
        return None
    ids, mask = trace.input_ids[: end + 1], trace.assistant_mask[: end + 1]
    # Keep the closing scaffolding after the last reply (e.g. "\n") out: nothing to learn there.
    reward = float(episode.rewards[seat])
    token_rewards = [0.0] * len(ids)
    token_rewards[end] = reward
    messages = episode.messages[seat]
    last_assistant = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    first_assistant = min(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return {
        "sample_id": f"{episode.game_id}/{seat}",
        "game_id": episode.game_id,
        "init_id": episode.init_id,
        "seat": seat,
        "role": episode.roles[seat],
        "policy": episode.seat_policies[seat],
        "game": episode.game_id,
        "init": episode.init_id,
        "init_seat": f"{episode.init_id}/{seat}",
        **episode.group_keys[seat],
        "input_ids": ids,
        "assistant_mask": mask,
        "token_rewards": token_rewards,
        "reward": reward,
        "normalized_reward": reward,
        "messages": messages[: last_assistant + 1],
        "prompt": messages[:first_assistant],
        "data_source": f"sparring/{episode.game_name}",
        "reward_model": {"normalized_reward": reward, "game_state": json.dumps(episode.state)},
        "num_turns": episode.num_turns,
        "invalid_actions": episode.invalid_actions[seat],
        "rejected_mask": rejected_mask(len(ids), trace.replies, episode.transcript, seat),
        "rollout_log_probs": trace.rollout_log_probs[: end + 1] if trace.scored else None,
    }


GENERIC_GROUP_KEYS = ("game", "init", "init_seat", "role", "batch")
"""Group keys every game has: both seats of one game, every play of one initial state, one
seat of one initial state (the verl route's key: the baseline of a zero-sum seat is its own),
every episode of one seat (role), and one group for the whole batch."""


def check_group_key(game: GameSpec, key: str) -> str:
    """`key` if `game`'s samples carry it (or it is `batch`), its new name if it is a
    deprecated alias; else a ValueError naming the valid keys."""
    cls = game.cls
    key = cls.group_key_synonyms.get(key, key)
    if key in cls.group_key_aliases:
        new = cls.group_key_aliases[key]
        warnings.warn(
            f"group key {key!r} is deprecated; use {new!r}", DeprecationWarning, stacklevel=2
        )
        key = new
    valid = (*GENERIC_GROUP_KEYS, *cls.extra_group_keys)
    if key not in valid:
        raise ValueError(f"unknown group key {key!r} for {game.name}; choose from {list(valid)}")
    return key


def write_samples(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write sample rows to parquet (one row per (game, seat))."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


REQUIRED_COLUMNS = ("input_ids", "assistant_mask", "token_rewards")


def read_samples(paths: list[str | Path] | str | Path) -> pd.DataFrame:
    """Read and concatenate samples parquets, checking the training columns exist."""
    paths = [paths] if isinstance(paths, str | Path) else list(paths)
    if not paths:
        raise ValueError("no samples files given")
    frames = [pd.read_parquet(p) for p in paths]
    df = pd.concat(frames, ignore_index=True)
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"samples {paths} lack columns {missing}; were they written by `sparring rollout`?"
        )
    return df

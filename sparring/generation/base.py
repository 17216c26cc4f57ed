"""The generation backend interface.

The rollout engine hands a backend a batch of token-id prompts and gets back one completion
each: the generated ids, their text and the log-prob of each sampled token (the samples'
`rollout_log_probs`, which the trainer compares with its own). Backends own batching, padding and device placement; games and the rollout never see
them. A second backend (SGLang) only has to implement `generate`.
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    """How to sample one turn."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, ge=0.0)
    """0 means greedy decoding."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    max_new_tokens: int = Field(64, ge=1)
    """Cap on generated tokens per turn; a turn cut here is kept as-is."""
    seed: int | None = 0
    """Seed of one generate call (None = unseeded). The rollout derives one per step from
    its base seed, so a whole rollout repeats exactly."""


def row_seeds(seed: int | None, n: int, sessions: list[str] | None = None) -> list[int | None]:
    """Per-prompt seeds of one generate call of `n` prompts. With `sessions` each prompt's seed
    comes from the call's seed and its session (one per game seat), so a game's draws do not
    depend on which other games share the batch: a rollout split into shards repeats the
    single-task rollout exactly. Without sessions prompt i gets `seed + i`."""
    if seed is None:
        return [None] * n
    if sessions is None:
        return [seed + i for i in range(n)]
    return [session_seed(seed, s) for s in sessions]


def session_seed(seed: int, session: str) -> int:
    """The sampling seed of one session's prompt in a call seeded with `seed`."""
    return zlib.crc32(f"{seed}/{session}".encode())


@dataclass
class Completion:
    """One generated turn."""

    token_ids: list[int]
    """Generated ids, including the stop token if one was produced."""
    text: str
    """Decoded text without special tokens."""
    finish_reason: str
    """"stop" (hit a stop token) or "length" (hit max_new_tokens)."""
    log_probs: list[float] | None = None
    """Log-prob of each of `token_ids` under the distribution it was drawn from: the logits
    divided by the temperature (renormalized over the top-p set when top_p < 1; the raw
    logits when greedy), as the trainer scores them. None when the engine did not return
    them (then the trainer cannot measure or correct the rollout-trainer mismatch)."""


class GenerationBackend(ABC):
    """Generates completions for batches of prompts. `tokenizer` is a HF tokenizer."""

    tokenizer: object
    name: str

    @abstractmethod
    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        sessions: list[str] | None = None,
        seeds: list[int | None] | None = None,
    ) -> list[Completion]:
        """Complete every prompt (token ids) in one batched call, in order.

        `sessions` names the conversation each prompt continues (one per game seat); a backend
        may keep its KV cache per session so that the next turn prefills only the new tokens.
        `seeds` gives each prompt its own sampling seed; default `row_seeds(params.seed, ...)`.
        """

    def choose(
        self,
        prompts: list[list[int]],
        options: list[list[str]],
        params: SamplingParams,
        seeds: list[int | None] | None = None,
        by_kind: bool = False,
    ) -> list[Completion]:
        """For each prompt (token ids), one of its `options` (reply texts, each followed by
        the end-of-turn token), drawn in proportion to the probability that sampling at
        `params.temperature` writes exactly it (greedy: the likeliest), with its ids and
        log-probs as `generate` returns them. With `by_kind`, first an option's kind (its
        first word) by the probability of writing the tokens that spell it, then an option of
        that kind by the probability of the rest. Only an engine that scores replies
        teacher-forced can (`rollout.choose_legal`)."""
        raise NotImplementedError(
            f"the {self.name} engine can't choose among legal moves (rollout.choose_legal); "
            "use rollout.backend.name: hf"
        )

    def release(self, sessions: list[str]) -> None:  # noqa: B027 - optional hook
        """Forget cached state of finished sessions."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release model memory or servers."""

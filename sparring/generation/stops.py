"""Turn-ending rules shared by every generation backend.

A turn ends at EOS or at any other special token (a model opening a new chat turn mid-reply,
say). The stop token the model generated stays in the reply, whichever it is: it is the
model's choice to end the turn, so it is trained like every other generated token (an
immediately emitted stop can then be discouraged), and it keeps its log-prob. Its text is
skipped when decoding (every stop id is EOS or a special token), so a reply's text still equals
`decode(ids, skip_special_tokens=True)` and the game sees the same text as before. The token
trace follows a non-EOS stop with the template's own end of turn (`sparring.samples`).
Backends apply `trim_reply` to whatever their engine returned, so HF, SGLang and a remote
server all produce the same `Completion` shape.
"""

from __future__ import annotations

from typing import Any

from sparring.generation.base import Completion


def turn_stop_ids(tokenizer: Any, eos_ids: list[int] | None = None) -> tuple[list[int], list[int]]:
    """(eos_ids, stop_ids): the EOS ids (tokenizer's plus `eos_ids`) and every id ending a turn."""
    eos = sorted({tokenizer.eos_token_id, *(eos_ids or [])} - {None})
    return eos, sorted(set(eos) | set(tokenizer.all_special_ids))


def until_stop(row: list[int], stop_ids: list[int]) -> list[int]:
    """`row` up to and including its first stop token."""
    for i, t in enumerate(row):
        if t in stop_ids:
            return row[: i + 1]
    return row


def trim_reply(
    row: list[int],
    tokenizer: Any,
    stop_ids: list[int],
    log_probs: list[float] | None = None,
) -> Completion:
    """Cut generated ids after the first stop token (kept, EOS or not) and decode.
    `log_probs` (one per id of `row`, or fewer, or None) are cut with them; log-probs that do
    not cover every kept id are dropped (None)."""
    ids = until_stop(list(row), stop_ids)
    stopped = bool(ids) and ids[-1] in stop_ids
    text = tokenizer.decode(ids, skip_special_tokens=True)
    kept = None
    if log_probs is not None and len(log_probs) >= len(ids):
        kept = [float(x) for x in log_probs[: len(ids)]]
    return Completion(ids, text, "stop" if stopped else "length", kept)

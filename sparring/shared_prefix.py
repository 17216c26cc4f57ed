"""Forward passes that run a shared prompt once: the trainer's rows packed by prefix.

A GRPO group's rows start from one game state, so each seat's rows share their first prompt:
in `configs/pipeline-smollm2.yaml` 242 of a row's 496 tokens, shared by 8 rows. Packing runs
that prefix once per micro-batch (verl's `use_prefix_grouper`, the PrefixGrouper layout): each
packed row is one group's prefix followed by each of its rows' suffixes,

    [prefix | suffix_1 | suffix_2 | ...]   positions 0..P-1, then P.. again for every suffix,

and every attention layer splits it back: the prefix attends causally to itself, each suffix
to the whole prefix and causally to itself, never to another suffix. The linear layers, most
of a small model's work, then see each prefix token once. The math is the unpacked forward's,
up to the order of floating-point sums (tests/test_shared_prefix.py compares log-probs and
gradients on a real model).

`pack` builds the packed rows for a micro-batch, `response_hidden` runs the decoder on them
and returns the hidden states at the response positions, in the order
`hidden[:, :-1][response_mask]` would give.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "sdpa_shared_prefix"


@dataclass
class Packing:
    """A micro-batch's rows packed by shared prefix."""

    input_ids: torch.Tensor  # (G, L) one packed row per group, right-padded
    position_ids: torch.Tensor  # (G, L)
    spans: list[tuple[int, list[int]]]  # each packed row's prefix length and suffix lengths
    row_group: torch.Tensor  # (B,) the packed row of each input row
    column: torch.Tensor  # (B, T) each input position's column in its packed row


def prefix_length(rows: torch.Tensor, lengths: list[int]) -> int:
    """The longest prefix the rows (B, T) share, leaving every row at least one token of its
    own. A scored position inside the prefix is fine: its hidden state is the same in every
    row that shares the prefix (attention is causal)."""
    cap = min(lengths) - 1
    same = (rows[:, :cap] == rows[:1, :cap]).all(0)  # (cap,)
    differ = (~same).nonzero()
    return int(differ[0]) if len(differ) else cap


def pack(
    input_ids: torch.Tensor,  # (B, T) right-padded
    attention_mask: torch.Tensor,  # (B, T)
    group: torch.Tensor,  # (B,) rows with one id share their prompt
) -> Packing:
    """The rows of each `group` id packed behind the prefix they share."""
    lengths = attention_mask.sum(1).tolist()
    groups = rows_by_group(group.tolist(), range(len(lengths)))
    row_of = {r: g for g, members in enumerate(groups) for r in members}
    packed, positions, prefixes, starts = [], [], [], {}
    for members in groups:
        p = prefix_length(input_ids[members], [lengths[r] for r in members])
        parts, pos, at = [input_ids[members[0], :p]], [torch.arange(p)], p
        for r in members:
            parts.append(input_ids[r, p : lengths[r]])
            pos.append(torch.arange(p, lengths[r]))
            starts[r] = at
            at += lengths[r] - p
        packed.append(torch.cat(parts))
        positions.append(torch.cat(pos))
        prefixes.append(p)
    longest = max(len(x) for x in packed)
    t = torch.arange(input_ids.shape[1])
    column = torch.stack(
        [
            torch.where(t < prefixes[row_of[r]], t, starts[r] + t - prefixes[row_of[r]])
            for r in range(len(lengths))
        ]
    ).clamp(max=longest - 1)  # (B, T): padding positions point anywhere, never read
    return Packing(
        input_ids=_pad(packed, longest, 0),
        position_ids=_pad(positions, longest, 0),
        spans=[
            (p, [lengths[r] - p for r in members])
            for p, members in zip(prefixes, groups, strict=True)
        ],
        row_group=torch.tensor([row_of[r] for r in range(len(lengths))]),
        column=column,
    )


def rows_by_group(group: list[int], rows: Iterable[int]) -> list[list[int]]:
    """`rows` by their `group` id, the groups in order of first appearance."""
    members: dict[int, list[int]] = {}
    for r in rows:
        members.setdefault(group[r], []).append(r)
    return list(members.values())


def _pad(rows: list[torch.Tensor], width: int, value: int) -> torch.Tensor:
    return torch.stack([F.pad(r, (0, width - len(r)), value=value) for r in rows])


def response_hidden(
    decoder: torch.nn.Module,
    input_ids: torch.Tensor,  # (B, T)
    attention_mask: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T-1)
    group: torch.Tensor,  # (B,)
) -> torch.Tensor:
    """The decoder's final hidden states at the response positions (N, H), in the order of
    `hidden[:, :-1][response_mask.bool()]`, from one packed forward pass."""
    device = input_ids.device
    packing = pack(input_ids.cpu(), attention_mask.cpu(), group.cpu())
    packing = replace(
        packing,
        **{k: v.to(device) for k, v in vars(packing).items() if isinstance(v, torch.Tensor)},
    )
    use_shared_attention(decoder.config)
    hidden = decoder(
        input_ids=packing.input_ids,
        position_ids=packing.position_ids,
        use_cache=False,
        shared_prefix=packing,
    ).last_hidden_state  # (G, L, H)
    rows, t = response_mask.bool().nonzero().unbind(1)  # (N,), (N,) row-major
    return hidden[packing.row_group[rows], packing.column[rows, t]]  # (N, H)


def use_shared_attention(config) -> None:
    """Switch a model's attention to NAME for good: transformers' sdpa on unpacked rows, the
    packed attention where a packing is passed (so also when gradient checkpointing recomputes
    a layer in backward, after the forward call has returned)."""
    if config._attn_implementation == NAME:
        return
    if config._attn_implementation != "sdpa":
        raise ValueError(
            f"share_prefix runs on sdpa attention; this model uses "
            f"{config._attn_implementation!r}: load it with attn_implementation='sdpa' or set "
            "share_prefix: false"
        )
    register()
    config._attn_implementation = NAME


def shared_prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # (G, H, L, D)
    key: torch.Tensor,  # (G, H_kv, L, D)
    value: torch.Tensor,  # (G, H_kv, L, D)
    attention_mask: torch.Tensor | None,  # unused with a packing: the spans define the mask
    dropout: float = 0.0,
    scaling: float | None = None,
    shared_prefix: Packing | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention over packed rows, each part at its own length (no padding): a prefix
    causally over itself, each suffix over its prefix and causally over itself. Returns
    (G, L, H, D) as transformers' attention functions do. Without a packing, transformers'
    sdpa attention."""
    if shared_prefix is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    gqa = key.shape[1] != query.shape[1]
    rows = []
    for g, (p, suffixes) in enumerate(shared_prefix.spans):
        q, k, v = query[g : g + 1], key[g : g + 1], value[g : g + 1]  # (1, heads, L, D)
        parts = (
            [
                F.scaled_dot_product_attention(
                    q[:, :, :p],
                    k[:, :, :p],
                    v[:, :, :p],
                    is_causal=True,
                    scale=scaling,
                    enable_gqa=gqa,
                )  # fmt: skip
            ]
            if p
            else []
        )
        at = p
        for s in suffixes:
            ends = (slice(None), slice(None), slice(at, at + s))
            keys = torch.ones(s, p + s, dtype=torch.bool, device=q.device).tril(p)  # (s, p+s)
            parts.append(
                F.scaled_dot_product_attention(
                    q[ends],
                    torch.cat([k[:, :, :p], k[ends]], 2),
                    torch.cat([v[:, :, :p], v[ends]], 2),
                    attn_mask=keys,
                    scale=scaling,
                    enable_gqa=gqa,
                )
            )  # (1, heads, s, D)
            at += s
        row = torch.cat(parts, 2)  # (1, heads, at, D)
        rows.append(F.pad(row, (0, 0, 0, query.shape[2] - at)))
    return torch.cat(rows).transpose(1, 2), None  # (G, L, heads, D)


def register() -> str:
    """Make `attn_implementation=NAME` available, with sdpa's masks for unpacked rows."""
    AttentionInterface.register(NAME, shared_prefix_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME

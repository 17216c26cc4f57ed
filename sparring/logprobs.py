"""Per-token log-probs and entropy without materialising (B, T, V) fp32 log-softmax.

A real vocabulary makes the naive path expensive: log_softmax over the whole (B, T, V) logits
in fp32, plus its exp for the entropy, is ~0.8 GB per tensor for SmolLM2 (V = 49152) at
8 x 512 tokens and ~20 GB at Qwen's 152k vocabulary with a GPU micro-batch. Here:
  1. the decoder gives hidden states (B, T, H); the LM head is never applied to all of them,
  2. only the response positions (`response_mask`, the tokens the loss covers) are kept (N, H),
  3. the head + fp32 log-softmax run over chunks of those positions, each chunk under
     activation checkpointing, so at most one chunk's (n, V) logits live at a time, forward or
     backward: log p(y) = logit_y - logsumexp(logits), entropy = -sum(p * log p).
The logits are divided by the temperature the tokens were sampled at (as verl and TRL do), so
the log-probs, the entropy and the KL describe the distribution that actually played.
Positions outside the mask get 0 (every consumer multiplies by the mask). `token_scores` can
also average the final hidden states over other positions (a prompt's, for the trainer's
transfer loss: sparring.grpo.transfer_loss) from the same forward pass.

Models whose logits are not simply `lm_head(last hidden state)` (soft-capping, logit scaling)
are detected once per model by comparing both on a few tokens; they take the model's own logits,
still gathering only the response positions, chunk by chunk.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from sparring import shared_prefix
from sparring.gpu_memory import CHUNK_ELEMENTS  # logits per chunk (one chunk lives at a time)


def token_log_probs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # (B, T)
    attention_mask: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T-1): position t scores token t+1
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_elements: int = CHUNK_ELEMENTS,
    temperature: torch.Tensor | None = None,  # (B,) each row's sampling temperature; None = 1
    prefix_group: torch.Tensor | None = None,  # (B,) rows of one id share their prompt
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(token t+1 | prefix) (B, T-1) fp32 of softmax(logits / temperature) and, if asked,
    its entropy (B, T-1); 0 where `response_mask` is 0. The entropy carries gradients only
    with `entropy_grad`. With `prefix_group` the rows run packed behind the prefixes they share
    (sparring.shared_prefix)."""
    log_prob, entropy, _ = token_scores(
        model, input_ids, attention_mask, response_mask, with_entropy, entropy_grad,
        chunk_elements, temperature, prefix_group=prefix_group,
    )  # fmt: skip
    return log_prob, entropy


def token_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # (B, T)
    attention_mask: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T-1): position t scores token t+1
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_elements: int = CHUNK_ELEMENTS,
    temperature: torch.Tensor | None = None,  # (B,)
    pool_mask: torch.Tensor | None = None,  # (B, T) the positions to average, e.g. the prompt's
    prefix_group: torch.Tensor | None = None,  # (B,)
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """`token_log_probs`, and with `pool_mask` each row's mean final hidden state over its
    `pool_mask` positions (B, H) fp32, in the graph, from the same forward pass. `prefix_group`
    packs the rows by shared prefix where the model's head splits off and nothing is pooled."""
    pos = response_mask.bool()  # (B, T-1)
    labels = input_ids[:, 1:][pos]  # (N,)
    temps = None if temperature is None else temperature[:, None].expand(pos.shape)[pos]  # (N,)
    split = split_head(model, input_ids, attention_mask)
    if split is not None and prefix_group is not None and pool_mask is None:
        decoder, head = split
        rows = shared_prefix.response_hidden(
            decoder, input_ids, attention_mask, response_mask, prefix_group
        )  # (N, H)
    elif split is not None:
        decoder, head = split
        hidden = decoder(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state  # (B, T, H)
        rows = hidden[:, :-1][pos]  # (N, H)
    else:
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            use_cache=False,
            output_hidden_states=pool_mask is not None,
        )
        hidden = out.hidden_states[-1] if pool_mask is not None else None  # (B, T, H)
        rows, head = out.logits[:, :-1][pos], torch.nn.Identity()  # (N, V) in the model's dtype
    vocab = _vocab_size(model, head, rows)
    log_prob, entropy = selective_log_softmax(
        rows, head, labels, with_entropy, entropy_grad, max(1, chunk_elements // vocab), temps
    )  # (N,), (N,)
    lp = torch.zeros(pos.shape, dtype=torch.float32, device=rows.device)  # (B, T-1)
    lp[pos] = log_prob
    ent = None
    if entropy is not None:
        ent = torch.zeros(pos.shape, dtype=torch.float32, device=rows.device)  # (B, T-1)
        ent[pos] = entropy
    pooled = None
    if pool_mask is not None:
        weights = pool_mask.to(torch.float32)  # (B, T)
        pooled = torch.einsum("bth,bt->bh", hidden.float(), weights)  # (B, H)
        pooled = pooled / weights.sum(1, keepdim=True).clamp(min=1)  # (B, H)
    return lp, ent, pooled


def selective_log_softmax(
    rows: torch.Tensor,  # (N, H) hidden states, or (N, V) logits with head = Identity
    head: torch.nn.Module,  # maps rows to logits (N, V)
    labels: torch.Tensor,  # (N,)
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_tokens: int = 1024,
    temperature: torch.Tensor | None = None,  # (N,) per row; None = 1
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(head(rows) / temperature)[labels] (N,) fp32 and the entropy (N,),
    `chunk_tokens` rows at a time; with gradients on, each chunk is recomputed in backward
    instead of kept."""

    def chunk(
        h: torch.Tensor, y: torch.Tensor, t: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = _head_logits(head, h)  # (n, V)
        if t is not None:
            logits = logits / t[:, None].float()  # (n, V): the sampled distribution's logits
        lse = torch.logsumexp(logits, dim=-1)  # (n,)
        log_prob = logits.gather(-1, y[:, None]).squeeze(-1) - lse  # (n,)
        if not with_entropy:
            return log_prob, lse.new_zeros(())
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            logp = logits - lse[:, None]  # (n, V)
            entropy = -(logp.exp() * logp).sum(-1)  # (n,): non-negative terms, no cancellation
        return log_prob, entropy

    grad = torch.is_grad_enabled() and (rows.requires_grad or _has_grad_params(head))
    log_probs, entropies = [], []
    for i in range(0, rows.shape[0], chunk_tokens):
        h, y = rows[i : i + chunk_tokens], labels[i : i + chunk_tokens]
        t = None if temperature is None else temperature[i : i + chunk_tokens]
        lp, ent = checkpoint(chunk, h, y, t, use_reentrant=False) if grad else chunk(h, y, t)
        log_probs.append(lp)
        entropies.append(ent)
    if not log_probs:  # no response tokens: empty, but still in the graph (backward gives 0)
        empty = rows.sum(-1).float()  # (0,)
        return empty, (empty if with_entropy else None)
    return torch.cat(log_probs), (torch.cat(entropies) if with_entropy else None)


def _head_logits(head: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """head(h) as fp32 logits. Under CPU bf16 autocast (`train.cpu_bf16`) the head runs in its
    weights' dtype instead: bf16 logits keep 8 bits of mantissa (a logit near 20 rounds by up
    to .06), a mismatch with the engine that samples from an fp32 head (docs/training.md,
    "bf16 on CPU")."""
    if h.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        return head(h).float()
    weight = next(head.parameters(), None)
    with torch.autocast("cpu", enabled=False):
        return head(h if weight is None else h.to(weight.dtype)).float()


def split_head(model, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """(decoder, lm_head) when the model's logits are exactly lm_head(decoder output), else None.

    Checked once per model on the first 8 tokens of the first row, and remembered on the model.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    verdict = getattr(base, "_sparring_plain_head", None)
    if verdict is None:
        verdict = _plain_head(base, input_ids[:1, :8], attention_mask[:1, :8])
        base._sparring_plain_head = verdict
    return (base.get_decoder(), base.get_output_embeddings()) if verdict else None


def _plain_head(base, ids: torch.Tensor, mask: torch.Tensor) -> bool:
    decoder = getattr(base, "get_decoder", lambda: None)()
    head = getattr(base, "get_output_embeddings", lambda: None)()
    if decoder is None or head is None:  # not a HF causal LM: use whatever logits it gives
        return False
    with torch.no_grad():
        hidden = decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        ours = head(hidden).float()
        theirs = base(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
    return ours.shape == theirs.shape and torch.allclose(ours, theirs, rtol=1e-3, atol=1e-3)


def _vocab_size(model, head, rows: torch.Tensor) -> int:
    if isinstance(head, torch.nn.Identity):
        return rows.shape[-1]
    return int(getattr(head, "out_features", 0) or model.config.vocab_size)


def _has_grad_params(module: torch.nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())

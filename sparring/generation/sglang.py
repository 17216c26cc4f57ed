"""SGLang backend: the offline `sglang.Engine`, in-process, generating from token ids.

    rollout:
      backend: {name: sglang, tp_size: 2, mem_fraction: 0.8}

Prompts go in as `input_ids`, so the model sees exactly the chat-template tokens that the
`TokenTrace` records (no detokenize/retokenize drift). SGLang's radix cache keeps every game's
shared prefix, so the rollout's per-step batches across games reuse each seat's earlier turns
without the per-session bookkeeping the HF backend does (`sessions` is not needed here).

Between pipeline iterations the rollout step starts a fresh process on the new checkpoint. A
long-lived engine can instead load new weights in place with
`engine.update_weights_from_disk(model_path)` (same architecture, new safetensors; the radix
cache is flushed), which `load_weights` wraps.

Log-probs: every request asks for `return_logprob`, and `meta_info.output_token_logprobs`
(`[logprob, token_id, text]` per generated token) become the completion's `log_probs`. SGLang's
sampler returns them for the distribution it sampled from: the logits divided by the
temperature (top-p renormalized), what the trainer scores, unless the server runs with
`SGLANG_RETURN_ORIGINAL_LOGPROB=1`, which returns the raw temperature-1 log-probs instead: leave
it unset (with it, `train/mismatch_kl` shows the temperature gap, as the trainer's tests do).

Verified on CPU: the request and response mapping (`sampling_request`, `to_completions`) on
realistic payloads. Not run here (no GPU, SGLang not installable): the Engine itself.
"""

from __future__ import annotations

from typing import Any

from transformers import AutoTokenizer

from sparring.generation.base import Completion, GenerationBackend, SamplingParams, row_seeds
from sparring.generation.stops import trim_reply, turn_stop_ids


def sampling_request(
    params: SamplingParams, stop_ids: list[int], seeds: list[int | None]
) -> list[dict[str, Any]]:
    """SGLang `sampling_params` for the prompts of one generate call, one per seed.

    Every special token stops a turn, as in the HF backend; `skip_special_tokens=False` and
    `no_stop_trim=True` keep the stop token in `output_ids` so `trim_reply` sees it. A seeded
    prompt gets `sampling_seed` (honoured by SGLang's sampler when the server runs with
    `enable_deterministic_inference`), so rows differ but repeat exactly.
    """
    base = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_new_tokens": params.max_new_tokens,
        "stop_token_ids": list(stop_ids),
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    return [dict(base) if s is None else {**base, "sampling_seed": s} for s in seeds]


def to_completions(
    outputs: list[dict[str, Any]], tokenizer: Any, stop_ids: list[int]
) -> list[Completion]:
    """Map SGLang output dicts (`output_ids`, `text`, `meta_info.finish_reason`,
    `meta_info.output_token_logprobs`) to Completions.

    The ids are authoritative: the text is re-decoded from them (so text == decode(ids), as in
    every backend). If SGLang reports a token-id stop (`{"type": "stop", "matched": id}`) whose
    id was trimmed from `output_ids`, it is put back so the reply ends with its stop token like
    HF's.
    """
    completions = []
    for out in outputs:
        if "output_ids" not in out:
            raise ValueError(
                f"SGLang output without output_ids (keys {sorted(out)}); generate with input_ids"
            )
        ids = list(out["output_ids"])
        reason = (out.get("meta_info") or {}).get("finish_reason") or {}
        if reason.get("type") == "abort":
            raise RuntimeError(f"SGLang aborted a request: {reason.get('message', reason)}")
        matched = reason.get("matched") if reason.get("type") == "stop" else None
        if isinstance(matched, int) and matched in stop_ids and (not ids or ids[-1] != matched):
            ids.append(matched)
        log_probs = output_log_probs(ids, (out.get("meta_info") or {}).get("output_token_logprobs"))
        completions.append(trim_reply(ids, tokenizer, stop_ids, log_probs))
    return completions


def output_log_probs(ids: list[int], entries: list[list[Any]] | None) -> list[float] | None:
    """The log-probs SGLang's `output_token_logprobs` give for `ids` (`[logprob, token_id,
    text]` per generated token, in order): one per id, or fewer when SGLang scored no put-back
    stop token (`trim_reply` then keeps them only if the cut reply is covered). Entries naming
    other tokens than `ids` are a protocol error."""
    if not entries:
        return None
    named = [int(e[1]) for e in entries[: len(ids)]]
    if named != ids[: len(named)]:
        raise ValueError(
            f"SGLang's output_token_logprobs name tokens {named[:8]}... but output_ids are "
            f"{ids[:8]}...; the log-probs would score other tokens than the sampled ones"
        )
    if any(e[0] is None for e in entries[: len(ids)]):
        return None
    return [float(e[0]) for e in entries[: len(ids)]]


def _import_sglang() -> Any:
    try:
        import sglang
    except ImportError as e:
        raise ImportError(
            "rollout.backend.name=sglang needs SGLang (a CUDA GPU): use the GPU image, or "
            "`pip install 'sglang[all]'` on a GPU machine; on CPU use backend `hf`"
        ) from e
    return sglang


class SGLangBackend(GenerationBackend):
    """Generate with an in-process `sglang.Engine` (tensor parallel over `tp_size` GPUs)."""

    name = "sglang"

    def __init__(
        self, model_path: str, tp_size: int = 1, mem_fraction: float = 0.85, seed: int = 0
    ) -> None:
        sglang = _import_sglang()
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        _, self.stop_ids = turn_stop_ids(self.tokenizer)
        self.engine = sglang.Engine(
            model_path=model_path,
            tp_size=tp_size,
            mem_fraction_static=mem_fraction,
            random_seed=seed,
            skip_tokenizer_init=True,
        )
        self.generated_tokens = 0

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        sessions: list[str] | None = None,
        seeds: list[int | None] | None = None,
    ) -> list[Completion]:
        outputs = self.engine.generate(
            input_ids=prompts,
            sampling_params=sampling_request(
                params, self.stop_ids, seeds or row_seeds(params.seed, len(prompts), sessions)
            ),
            return_logprob=True,  # meta_info.output_token_logprobs: the rollout log-probs
        )
        completions = to_completions(outputs, self.tokenizer, self.stop_ids)
        self.generated_tokens += sum(len(c.token_ids) for c in completions)
        return completions

    def load_weights(self, model_path: str) -> None:
        """Swap in a new checkpoint of the same architecture without restarting the engine."""
        result = self.engine.update_weights_from_disk(model_path)  # (ok, message[, paused])
        ok, message = result[0], result[1]
        if not ok:
            raise RuntimeError(f"SGLang could not load weights from {model_path}: {message}")

    def close(self) -> None:
        self.engine.shutdown()

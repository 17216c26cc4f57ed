"""Hugging Face transformers backend: batched, left-padded generation with a KV cache.

Runs on CPU or one CUDA GPU. Prompts arrive as token ids; they are left-padded into one batch
(split into chunks of `max_batch_size`) and decoded with `model.generate(use_cache=True)`.
`forward_seconds` accumulates wall time inside the model's forward passes, so benchmarks can
report how much of a rollout is model compute.
"""

from __future__ import annotations

import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from sparring.generation.base import Completion, GenerationBackend, SamplingParams


def pick_device(device: str = "auto") -> torch.device:
    """`auto` -> cuda if available, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class HFBackend(GenerationBackend):
    """Generate with a local or hub checkpoint through transformers."""

    name = "hf"

    def __init__(self, model_path: str, device: str = "auto", max_batch_size: int = 64) -> None:
        self.device = pick_device(device)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        self.model.to(self.device).eval()
        self.max_batch_size = max_batch_size
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id
        eos = {self.tokenizer.eos_token_id, *_as_list(self.model.generation_config.eos_token_id)}
        self.eos_ids = sorted(eos - {None})
        # Any special token ends a turn (a model opening a new turn mid-reply, say); only EOS is
        # kept in the reply, so a reply's text always equals the decode of its ids.
        self.stop_ids = sorted(set(self.eos_ids) | set(self.tokenizer.all_special_ids))
        self.forward_seconds = 0.0
        self.generated_tokens = 0
        self._t0 = 0.0
        self.model.register_forward_pre_hook(self._start_clock)
        self.model.register_forward_hook(self._stop_clock)

    def _start_clock(self, *_: object) -> None:
        self._t0 = time.perf_counter()

    def _stop_clock(self, *_: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.forward_seconds += time.perf_counter() - self._t0

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        out: list[Completion] = []
        for start in range(0, len(prompts), self.max_batch_size):
            out += self._generate_chunk(prompts[start : start + self.max_batch_size], params)
        return out

    def _generate_chunk(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)  # (B, T)
        attention_mask = torch.zeros_like(input_ids)  # (B, T)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p)
            attention_mask[i, width - len(p) :] = 1
        if params.seed is not None:
            torch.manual_seed(params.seed)
        sample = params.temperature > 0
        tokens = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            do_sample=sample,
            temperature=params.temperature if sample else None,
            top_p=params.top_p if sample else None,
            top_k=None,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            use_cache=True,
        )[:, width:].tolist()  # (B, new)
        return [self._completion(row) for row in tokens]

    def _completion(self, row: list[int]) -> Completion:
        """Cut a generated row at its first stop token (keeping it only if it is EOS)."""
        stop = next((i for i, t in enumerate(row) if t in self.stop_ids), None)
        if stop is None:
            ids = row
        else:
            ids = row[: stop + 1] if row[stop] in self.eos_ids else row[:stop]
        self.generated_tokens += len(ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(ids, text, "stop" if stop is not None else "length")

    def close(self) -> None:
        del self.model
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _as_list(x: int | list[int] | None) -> list[int | None]:
    return list(x) if isinstance(x, list | tuple) else [x]

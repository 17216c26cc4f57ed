"""Build a tiny Qwen2-style model and a locally trained tokenizer, with no network.

    sparring model init-tiny --out runs/tiny

The tokenizer is a byte-level BPE (vocabulary 1650) trained once on game text (system
prompts, actions, names, numbers) and shipped frozen as `tokenizer.json`: every string
encodes and round-trips, and the same bytes load whatever extras are installed and however
the game prompts change later. It carries a ChatML chat template, and `<|im_end|>` is its
EOS. The model has random weights, seeded: it only exists so that tests, the benchmarks and
the embedded default run the real code paths on a CPU in seconds.
"""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import BaseModel, Field
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOKENIZER_FILE = Path(__file__).with_name("tokenizer.json")


class TinyModelConfig(BaseModel):
    """Size of the tiny model. Defaults give ~1.3M parameters, ~50 ms per CPU forward."""

    hidden_size: int = Field(128, ge=16)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(4, ge=1)
    """< num_heads: grouped-query attention (the default, = num_heads, is plain multi-head)."""
    intermediate_size: int = Field(512, ge=16)
    max_positions: int = Field(4096, ge=256)
    seed: int = 0
    """Seeds the weight init, so a build is reproducible."""


def load_tokenizer(max_positions: int = 4096) -> PreTrainedTokenizerFast:
    """The frozen tiny tokenizer (`tokenizer.json` next to this file) with the ChatML template."""
    return PreTrainedTokenizerFast(
        tokenizer_file=str(TOKENIZER_FILE),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=max_positions,
    )


def init_tiny(out: str | Path, cfg: TinyModelConfig | None = None) -> Path:
    """Write a randomly initialised tiny model + tokenizer to `out` (a HF checkpoint dir)."""
    cfg = cfg or TinyModelConfig()
    out = Path(out)
    tokenizer = load_tokenizer(cfg.max_positions)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(cfg.seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out

"""Build a tiny Qwen2-style model and a locally trained tokenizer, with no network.

    sparring model init-tiny --out runs/tiny

The tokenizer is a byte-level BPE trained on game text (system prompts, actions, names,
numbers), so every string encodes and round-trips. It carries a ChatML chat template, and
`<|im_end|>` is its EOS. The model has random weights: it only exists so that tests, the
benchmarks and the embedded default run the real code paths on a CPU in seconds.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from pydantic import BaseModel, Field
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from sparring.games import make_game
from sparring.games.matching import PAPERS, REVIEWERS

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


class TinyModelConfig(BaseModel):
    """Size of the tiny model. Defaults give ~1.3M parameters, ~50 ms per CPU forward."""

    vocab_size: int = Field(2048, ge=512)
    """BPE vocabulary size (the trained tokenizer may come out slightly smaller)."""
    hidden_size: int = Field(128, ge=16)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(4, ge=1)
    """= num_heads (plain multi-head attention): on CPU, grouped KV heads cost a copy per step."""
    intermediate_size: int = Field(512, ge=16)
    max_positions: int = Field(4096, ge=256)
    seed: int = 0
    """Seeds both the tokenizer corpus and the weight init, so a build is reproducible."""


def game_corpus(seed: int, n_games: int = 200) -> list[str]:
    """Text the tokenizer is trained on: matching-game prompts and actions of all sizes, plus
    Diplomacy episodes when its optional engine is installed."""
    rng = random.Random(seed)
    lines: list[str] = []
    for i in range(n_games):
        game = make_game("matching", k=rng.randint(2, 8), hard_ratio=None)
        state = game.generate_state(seed * 100_003 + i)
        game.reset(state)
        lines.append(game.messages(0)[0]["content"])
        pairs = "\n".join(
            f"{r}: {p}" for r, p in zip(state["reviewers"], state["papers"], strict=True)
        )
        r, p = rng.choice(state["reviewers"]), rng.choice(state["papers"])
        v = rng.randint(0, 999)
        lines += [
            f"[message] {r} on {p} is {v}. What do you see?",
            f"[message] I see {r} {p} {v}, {rng.choice(REVIEWERS)} {rng.choice(PAPERS)} ?",
            f"[propose]\n{pairs}",
            "[accept]",
            "[reject]",
            "You move first.",
            "Partner: [reject]",
            "Error: no action tag; use [message], [propose], [accept] or [reject]. Try again.",
        ]
    return lines + diplomacy_corpus(seed)


def diplomacy_corpus(seed: int, n_games: int = 6) -> list[str]:
    """Every seat's chat (prompts, observations, scripted orders) of a few short scripted
    Diplomacy episodes, plus sample press lines; empty without the `diplomacy` extra."""
    try:
        from sparring.games.diplomacy import ROLES
    except ImportError:
        return []
    from sparring.agents import make_agent

    lines: list[str] = []
    for i in range(n_games):
        game = make_game("diplomacy", horizon=2)
        game.reset(game.generate_state(seed * 100_003 + i))
        bots = [make_agent(("greedy", "random-legal")[s % 2], seed=i * 7 + s) for s in range(7)]
        while not game.done:
            for s in game.pending_seats:
                game.step(s, bots[s].act(game, s))
        lines += [m["content"] for s in range(7) for m in game.messages(s)]
        a, b = random.Random(seed + i).sample(ROLES, 2)
        lines += [f"{a}: I will support you into {b[:3]}.", f"ALL: {b} attacks {a} now."]
    return lines


def build_tokenizer(cfg: TinyModelConfig) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `game_corpus` and wrap it with the ChatML template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(game_corpus(cfg.seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=cfg.max_positions,
    )


def init_tiny(out: str | Path, cfg: TinyModelConfig | None = None) -> Path:
    """Write a randomly initialised tiny model + tokenizer to `out` (a HF checkpoint dir)."""
    cfg = cfg or TinyModelConfig()
    out = Path(out)
    tokenizer = build_tokenizer(cfg)
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

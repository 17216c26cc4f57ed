"""HFBackend against a plain reference: greedy decoding with a full forward per token.

Batching, left padding, grouped prefill, the decode `StaticCache` and the session cache are
all optimisations; none may change a greedy token.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from sparring.generation.base import SamplingParams
from sparring.generation.hf import HFBackend, _groups, sample_tokens
from sparring.generation.stops import trim_reply

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=10)


@pytest.fixture(scope="module")
def sharp_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model with sharpened attention. At its init scale attention is near uniform,
    so its greedy tokens barely depend on positions or on which tokens a row attends to;
    scaling queries and keys makes a wrong position id or mask change the tokens."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
    out = tmp_path_factory.mktemp("sharp-model")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def reference(sharp_model: str):
    """Greedy tokens for one prompt, recomputing the whole sequence every step (no cache)."""
    model = AutoModelForCausalLM.from_pretrained(sharp_model).eval()
    backend = HFBackend(sharp_model, device="cpu")  # for its stop ids and trimming

    @torch.inference_mode()
    def generate(
        prompt: list[int],
        max_new_tokens: int = GREEDY.max_new_tokens,
        stop_ids: list[int] | None = None,
    ) -> list[int]:
        stop_ids = backend.stop_ids if stop_ids is None else stop_ids
        ids = list(prompt)
        for _ in range(max_new_tokens):
            nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(nxt)
            if nxt in stop_ids:
                break
        return trim_reply(ids[len(prompt) :], backend.tokenizer, stop_ids).token_ids

    return generate


def _chat(tokenizer, *turns: str) -> list[int]:
    messages = [{"role": "system", "content": "You play FRANCE in Diplomacy."}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    """Prompts of very different lengths, so rows pad and prefill splits into groups."""
    return [
        _chat(tokenizer, "Orders?"),
        _chat(tokenizer, "Spring 1901. Your units: A PAR, A MAR, F BRE. " * 6),
        _chat(tokenizer, "Centers: AUS 3 ENG 3 FRA 3 GER 3 ITA 3 RUS 4 TUR 3"),
        _chat(tokenizer, "Press: up to 3 lines 'POWER: message' or 'ALL: message'. " * 3),
    ]


@pytest.mark.parametrize("prefill_tokens", [1, 300, 100_000])
def test_batched_greedy_matches_the_uncached_reference(
    sharp_model, prompts, reference, prefill_tokens
):
    """One row per prefill forward, a few groups, or all rows in one forward: same tokens."""
    backend = HFBackend(sharp_model, device="cpu", prefill_tokens=prefill_tokens)
    got = [c.token_ids for c in backend.generate(prompts, GREEDY)]
    assert got == [reference(p) for p in prompts]
    assert backend.prefilled_tokens == sum(map(len, prompts))


def test_prefill_groups_split_where_padding_costs_more_than_a_forward():
    """Short and long rows go to separate forwards (padding 8 short rows to 100 tokens would
    cost far more than a second forward); similar rows share one; the budget holds."""
    new = [10, 100] * 8
    groups = _groups(new, [0] * 16, budget=4096, key_cost=0.0)
    assert sorted(i for g in groups for i in g) == list(range(16))
    assert [sorted({new[i] for i in g}) for g in groups] == [[10], [100]]
    assert _groups([40, 41, 42, 43], [0] * 4, budget=4096, key_cost=0.0) == [[0, 1, 2, 3]]
    small = _groups([50] * 10, [0] * 10, budget=120, key_cost=0.0)
    assert all(len(g) * 50 <= 120 for g in small) and sum(map(len, small)) == 10
    # long cached prefixes make attention the cost: rows over a 2000-token prefix go apart
    mixed = _groups([40] * 16, [0, 2000] * 8, budget=4096, key_cost=3e-4)
    assert sorted(sorted({[0, 2000][i % 2] for i in g}) for g in mixed) == [[0], [2000]]


def test_session_cache_reuses_turns_without_changing_tokens(sharp_model, tokenizer, reference):
    """Turn 2 of each session prefills only what is new since turn 1, with the same result."""
    backend = HFBackend(sharp_model, device="cpu", prefill_tokens=200)
    firsts = ["Orders?", "Spring 1901. A PAR, A MAR, F BRE. " * 4, "Press?"]
    sessions = [f"game/{i}" for i in range(len(firsts))]
    turn1 = [_chat(tokenizer, text) for text in firsts]
    replies = [c.text for c in backend.generate(turn1, GREEDY, sessions)]
    turn2 = [
        _chat(tokenizer, text, reply, "Messages: none. Orders, one per line:")
        for text, reply in zip(firsts, replies, strict=True)
    ]
    before = backend.reused_tokens
    got = [c.token_ids for c in backend.generate(turn2, GREEDY, sessions)]
    assert got == [reference(p) for p in turn2]
    reused = backend.reused_tokens - before
    assert reused >= sum(map(len, turn1))  # every first-turn prompt came from the cache
    assert backend.prefilled_tokens == sum(map(len, turn1)) + sum(map(len, turn2)) - reused


def test_rows_that_stop_early_leave_the_batch_without_changing_tokens(
    sharp_model, tokenizer, prompts, reference
):
    """Decoding drops finished rows from the batch (storing their session cache first) once a
    quarter of it is done. Stopping on prompt 0's second greedy token makes rows finish at
    different steps; every row keeps the reference's tokens, and turn 2 reuses every session's
    whole turn 1."""
    free = [reference(p, stop_ids=[]) for p in prompts]
    stop = [free[0][1]]
    backend = HFBackend(sharp_model, device="cpu")
    backend.stop_ids = stop
    sessions = [f"g/{i}" for i in range(len(prompts))]
    got = [c.token_ids for c in backend.generate(prompts, GREEDY, sessions)]
    assert got == [reference(p, stop_ids=stop) for p in prompts]
    assert len(got[0]) < max(map(len, got)) == GREEDY.max_new_tokens  # they finished apart
    turn2 = [p + r + _chat(tokenizer, "Next?")[-6:] for p, r in zip(prompts, got, strict=True)]
    before = backend.reused_tokens
    again = [c.token_ids for c in backend.generate(turn2, GREEDY, sessions)]
    assert again == [reference(p, stop_ids=stop) for p in turn2]
    assert all(r[-1] == stop[0] for r in got if len(r) < GREEDY.max_new_tokens)  # kept
    fed = [len(p) + len(r) - 1 for p, r in zip(prompts, got, strict=True)]
    assert backend.reused_tokens - before == sum(fed)  # a last token (the stop) is never fed


def test_sessions_stay_independent_of_batch_order(sharp_model, prompts):
    """The same prompts in reverse order, as sessions, give the same tokens per prompt."""
    backend = HFBackend(sharp_model, device="cpu", prefill_tokens=300)
    forward = backend.generate(prompts, GREEDY, [f"a/{i}" for i in range(len(prompts))])
    backward = backend.generate(prompts[::-1], GREEDY, [f"b/{i}" for i in range(len(prompts))])
    assert [c.token_ids for c in forward] == [c.token_ids for c in backward[::-1]]


def test_sampled_tokens_follow_the_softmax():
    """Inverse-transform sampling draws each token with its softmax probability and never
    one that top-p filtering removed (probability 0)."""
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0, float("-inf")]]).repeat(40_000, 1)
    uniforms = torch.rand(len(logits), generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(sample_tokens(logits, uniforms), minlength=5) / len(logits)
    want = torch.softmax(logits[0], -1)
    assert counts[4] == 0
    assert torch.allclose(counts, want, atol=0.01), (counts, want)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, max_new_tokens=10, seed=3),
        SamplingParams(temperature=1.3, top_p=0.8, max_new_tokens=10, seed=4),
        GREEDY,
    ],
    ids=["T0.7", "T1.3-top_p0.8", "greedy"],
)
def test_completions_carry_the_log_probs_of_the_sampled_distribution(sharp_model, prompts, params):
    """Each generated token's log-prob is that of the distribution it was drawn from: the plain
    full forward's logits over prompt + earlier tokens, divided by the temperature and
    renormalized over the top-p set (the raw logits when greedy). Batched, cached and with
    rows leaving the batch as they stop, as a rollout generates."""
    model = AutoModelForCausalLM.from_pretrained(sharp_model).eval()
    backend = HFBackend(sharp_model, device="cpu", prefill_tokens=300)
    for prompt, out in zip(prompts, backend.generate(prompts, params), strict=True):
        assert out.log_probs is not None and len(out.log_probs) == len(out.token_ids)
        with torch.no_grad():
            ids = torch.tensor([prompt + out.token_ids])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (n, V)
        if params.temperature > 0:
            logits = TemperatureLogitsWarper(params.temperature)(None, logits)
            logits = TopPLogitsWarper(params.top_p)(None, logits)  # top_p 1 keeps every token
        want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None])
        torch.testing.assert_close(torch.tensor(out.log_probs), want[:, 0], atol=1e-4, rtol=0)


def test_a_sessions_draws_do_not_depend_on_its_batch(tiny_model_dir, tokenizer):
    """Seeded sampling with sessions: a seat's reply is the same alone or in any batch (what
    makes a sharded rollout repeat the single-task one); different sessions draw differently."""
    backend = HFBackend(str(tiny_model_dir), device="cpu")
    chat = [{"role": "user", "content": "Propose an assignment."}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True)["input_ids"]
    other = tokenizer.apply_chat_template(chat[:1] * 2, add_generation_prompt=True)["input_ids"]
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=5)
    (alone,) = backend.generate([prompt], params, ["g#0/0"])
    backend.release(["g#0/0"])
    batch = backend.generate([other, prompt, prompt], params, ["h#0/1", "g#0/0", "g#1/0"])
    assert batch[1].token_ids == alone.token_ids
    assert batch[2].token_ids != alone.token_ids  # same prompt, another game: its own draws


def test_shared_prefixes_are_prefilled_once(sharp_model, tokenizer, reference):
    """Two games x three powers: the rules (all rows) and each game's board (its rows) run
    through the model once; every token comes out as without sharing."""
    rules = "Rules: own as many supply centers as you can. Orders hold, move or support. " * 2
    boards = [
        "Spring 1901. Units: AUS A VIE, A BUD; ENG F LON; FRA A PAR, A MAR. " * 2,
        "Fall 1905. Units: GER A BER, A MUN; ITA F NAP; TUR A CON, F ANK. " * 2,
    ]
    games = [
        [
            tokenizer.apply_chat_template(
                [{"role": "system", "content": rules}, {"role": "user", "content": board + mine}],
                add_generation_prompt=True,
            )["input_ids"]
            for mine in ("7 You are AUSTRIA.", "8 You are ENGLAND.", "9 You are FRANCE.")
        ]
        for board in boards
    ]
    prompts = [p for game in games for p in game]
    everyone = len(os.path.commonprefix(prompts))
    per_game = [len(os.path.commonprefix(game)) for game in games]
    assert everyone >= 32 and min(per_game) > everyone + 32
    want = everyone + sum(n - everyone for n in per_game)  # each shared prefix once
    want += sum(len(p) - n for game, n in zip(games, per_game, strict=True) for p in game)

    backend = HFBackend(sharp_model, device="cpu")
    got = [c.token_ids for c in backend.generate(prompts, GREEDY)]
    assert got == [reference(p) for p in prompts]
    assert backend.prefilled_tokens == want < sum(map(len, prompts))

    unshared = HFBackend(sharp_model, device="cpu", min_shared_prefix=10**6)
    assert [c.token_ids for c in unshared.generate(prompts, GREEDY)] == got
    assert unshared.prefilled_tokens == sum(map(len, prompts))


def test_a_session_s_cache_is_one_allocation_of_its_size(sharp_model, tokenizer):
    """Each session's keys and values, every layer, are views of one block of exactly their
    size: one mapping, returned to the system when the session ends (`sparring.heap`)."""
    backend = HFBackend(sharp_model, device="cpu")
    backend.generate([_chat(tokenizer, "Orders?"), _chat(tokenizer, "Press?")], GREEDY, ["a", "b"])
    blocks = set()
    for ids, kv in backend._sessions.values():
        storages = {t.untyped_storage() for pair in kv for t in pair}
        assert len({s.data_ptr() for s in storages}) == 1
        assert storages.pop().nbytes() == backend.token_bytes * len(ids)
        blocks.add(kv[0][0].untyped_storage().data_ptr())
    assert len(blocks) == 2


def test_the_session_cache_is_capped_in_bytes(sharp_model, tokenizer, reference):
    """Past `max_cached_bytes` of keys and values, the sessions' and the decode batch's
    together, sessions keep the prefixes that fit: a rollout visiting every session each turn
    (a cycle, where least-recently-used eviction would miss every time) still reuses cached
    turns, and no token changes."""
    firsts = ["Orders?", "Spring 1901. A PAR, A MAR, F BRE. " * 4, "Press?", "Centers?"]
    sessions = [f"game/{i}" for i in range(len(firsts))]
    turn1 = [_chat(tokenizer, text) for text in firsts]
    full = HFBackend(sharp_model, device="cpu")
    full.generate(turn1, GREEDY, sessions)
    ids, kv = full._sessions[sessions[-1]]
    assert full.token_bytes == sum(k.nbytes + v.nbytes for k, v in kv) // len(ids)
    lengths = [len(ids) for ids, _ in full._sessions.values()]
    batch = len(turn1) * (max(map(len, turn1)) + GREEDY.max_new_tokens)  # turn 1's decode cache
    cap = batch + lengths[0] + lengths[1] + 2  # beside it, two sessions, with a little room
    small = HFBackend(sharp_model, device="cpu", max_cached_bytes=cap * full.token_bytes)
    grown = []  # after each store that grew the sessions: their tokens and the batch cache's

    def session_tokens() -> int:
        return sum(len(ids) for ids, _ in small._sessions.values())

    def store(sessions, prompts, rows, cache, lmax, alive, which, _store=small._store):
        before = session_tokens()
        _store(sessions, prompts, rows, cache, lmax, alive, which)
        if session_tokens() > before:
            grown.append(session_tokens() + len(alive) * cache.get_max_cache_shape())

    small._store = store
    replies = [c.text for c in small.generate(turn1, GREEDY, sessions)]
    assert 0 < len(small._sessions) < len(sessions)  # the cap binds
    cached = [p for p, s in zip(turn1, sessions, strict=True) if s in small._sessions]
    warm = sum(map(len, cached))  # what the cached sessions reuse, at least
    for turn in range(2, 4):  # two more turns: the cached sessions stay warm, capped
        turn1 = [
            _chat(tokenizer, text, reply, f"Turn {turn}. Orders, one per line:")
            for text, reply in zip(firsts, replies, strict=True)
        ]
        before = small.reused_tokens
        completions = small.generate(turn1, GREEDY, sessions)
        assert [c.token_ids for c in completions] == [reference(p) for p in turn1]
        assert small.reused_tokens - before >= warm
        replies = [c.text for c in completions]
    assert grown and max(grown) <= cap


def test_a_decode_batch_over_the_cap_still_runs_and_caches_nothing(
    sharp_model, tokenizer, reference
):
    prompts = [_chat(tokenizer, text) for text in ("Orders?", "Press?")]
    tight = HFBackend(sharp_model, device="cpu", max_cached_bytes=1)
    got = [c.token_ids for c in tight.generate(prompts, GREEDY, ["a", "b"])]
    assert got == [reference(p) for p in prompts]
    assert tight._sessions == {}


@pytest.mark.parametrize("prefill_tokens", [1, 100_000])
def test_scored_replies_match_a_full_forward_and_prompts_prefill_once(
    sharp_model, prompts, tokenizer, prefill_tokens
):
    """`score`, as `choose` calls it (each prompt's replies next to each other, replies of one
    token and of several): every reply token's log-prob at temperature 0.7 equals a plain
    forward over prompt + reply, and each distinct prompt is prefilled once, however many
    replies it has and however prefill is grouped."""
    model = AutoModelForCausalLM.from_pretrained(sharp_model).eval()
    texts = ["[bet]", "[check]", "A PAR - BUR\nF BRE - MAO"]
    replies = [tokenizer.encode(t, add_special_tokens=False) for t in texts] + [[7]]
    flat = [(p, r) for p in prompts for r in replies]
    backend = HFBackend(sharp_model, device="cpu", prefill_tokens=prefill_tokens)
    got = backend.score([p for p, _ in flat], [r for _, r in flat], 0.7)
    assert backend.prefilled_tokens == sum(map(len, prompts))
    with torch.inference_mode():
        for (prompt, reply), scores in zip(flat, got, strict=True):
            logits = model(input_ids=torch.tensor([prompt + reply])).logits[0].float()
            lp = torch.log_softmax(logits[len(prompt) - 1 : -1] / 0.7, -1)  # (len(reply), V)
            want = lp.gather(-1, torch.tensor(reply)[:, None])[:, 0]
            assert scores == pytest.approx(want.tolist(), abs=1e-4)

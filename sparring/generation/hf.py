"""Hugging Face transformers backend: batched, left-padded generation with a KV cache that
persists across turns.

Multi-turn self-play re-sends each seat's whole conversation every turn. Like SGLang's radix
cache, this backend keeps each session's (one per game seat) keys and values after a call;
the next call for that session prefills only the tokens that are new since then (the reply's
stop token, the partner's message, the template scaffolding).

A call runs in two phases:
- prefill: a prefix that rows of the call share (say the rules and the board of one game) is
  computed once and handed to them like a session's cached prefix. Then the rest goes in
  groups of at most `prefill_tokens` padded tokens, cut where padding would cost more than
  another forward (`_groups`). A group's row is
  `[pad..., cached prefix (L_i) | pad..., new tokens (n_i)]`, with a 2-D attention mask and
  explicit position ids, so rows with different cached lengths share one forward pass;
- decode, the whole batch at once: each row's prompt keys and values, left-padded, in one
  preallocated `StaticCache` (written in place; a growing cache re-copies every step, which
  dominated CPU decode time), one token per row per forward. Once a quarter of the rows have
  hit a stop token they leave the batch (their session cache stored first): a finished row
  would otherwise be decoded, and its cache read, until the longest reply ends.
On CPU the model attends with `attention.sdpa_gqa`: grouped-query attention that shares the
key/value heads instead of copying them per query head (transformers copies them whenever a
mask is passed, and these batches always have one). Its linear layers multiply by weights
packed once for oneDNN (`packed_linear`), not re-packed by every GEMM call; with
`quantize="int8"` decode steps run them in dynamic int8 instead (`int8_linear`: a quarter of
the weight bytes, fp32 below `int8_min_rows` rows; prefill stays fp32, see `int8_linear`), a
policy slightly apart from the fp32 trainer's. With `quantize="bf16"` the weights, activations
and keys and values are bf16 on a CPU with bf16 instructions (AVX512-BF16, AMX: the weights'
multiplies ~4x faster than fp32's); a CPU without them converts in software, slower than fp32,
so there the engine stays fp32 (`peak_flops.cpu_bf16("auto")` decides).

Prefill is compute-bound and gains nothing from huge batches; decoding is where batching
pays. Sampling applies transformers' temperature / top-p logits warpers, then draws by
inverse transform (`sample_tokens`). Each drawn token's log-prob under those warped logits
(`token_log_prob`) comes back with the completion: the rollout log-probs the trainer compares
with its own.
`forward_seconds` accumulates wall time inside the model's forward passes.
"""

from __future__ import annotations

import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, StaticCache
from transformers.cache_utils import Cache
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from sparring import heap, peak_flops
from sparring.device import pick_device
from sparring.generation import attention, int8_linear, packed_linear
from sparring.generation.base import Completion, GenerationBackend, SamplingParams, row_seeds
from sparring.generation.stops import trim_reply, turn_stop_ids, until_stop

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values, each (H, T, D)
SCORED_TOKENS = 2048  # padded reply tokens per scoring forward: their logits are kept (fp32)


class HFBackend(GenerationBackend):
    """Generate with a local or hub checkpoint through transformers."""

    name = "hf"

    def __init__(
        self,
        model_path: str,
        device: str = "auto",
        max_batch_size: int = 64,
        max_cached_bytes: int = 8 * 2**30,
        prefill_tokens: int | None = None,
        min_shared_prefix: int = 32,
        quantize: str = "none",
        int8_min_rows: int = 1,
        int8_fp32_layers: tuple[str, ...] = (),
    ) -> None:
        self.device = pick_device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path,
            dtype=torch.bfloat16 if self.device.type == "cuda" else torch.float32,
            # GQA without copies (sparring.generation.attention)
            attn_implementation=attention.register() if self.device.type == "cpu" else None,
        )
        self.model.to(self.device).eval()
        self.num_params = sum(p.numel() for p in self.model.parameters())
        self.bounded = self.device.type == "cpu" and heap.bound_for(self.num_params)
        """The C heap is bounded (`sparring.heap`), before the caches and activations; each
        decode step lifts the bound for its (B, V) logits (`heap.reusing`)."""
        if quantize == "int8":
            if self.device.type != "cpu":
                raise ValueError("quantize: int8 is for the CPU engine (fbgemm); on a GPU use bf16")
            int8_linear.quantize_linears(self.model, int8_min_rows, int8_fp32_layers)
        if quantize == "bf16" and self.device.type == "cpu":  # on a GPU the engine is bf16 already
            if peak_flops.cpu_bf16("auto"):
                self.model.to(torch.bfloat16)
            else:
                print(
                    f"rollout.backend.quantize=bf16: bf16 multiplies only "
                    f"{peak_flops.bf16_speedup():.2f}x as fast as fp32 on this CPU (no bf16 "
                    "instructions), so the engine stays fp32",
                    file=sys.stderr,
                )
        if self.device.type == "cpu":  # weights packed once, not per call (packed_linear)
            packed_linear.pack_linears(self.model)  # those left fp32 or bf16
        self.max_batch_size = max_batch_size
        self.token_bytes = _kv_bytes_per_token(self.model)
        self.key_cost = _key_cost(self.model, self.num_params)
        """One cached key's attention FLOPs over one token's projection FLOPs (`_groups`)."""
        self.max_cached_tokens = max_cached_bytes // self.token_bytes
        """Cap on the tokens whose keys and values the engine holds at once, the sessions' and
        the decode batch's cache together (`max_cached_bytes`: 186k tokens for SmolLM2-135M
        in fp32); see `_store` for what happens at the cap."""
        self.prefill_tokens = prefill_tokens or (4096 if self.device.type == "cpu" else 65536)
        """Padded tokens per prefill forward (see `_prefill`)."""
        self.min_shared_prefix = min_shared_prefix
        """Shortest prefix that rows of one call share and prefill once (`_share_prefixes`)."""
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id
        # Any special token ends a turn and stays in the reply (sparring.generation.stops).
        _, self.stop_ids = turn_stop_ids(
            self.tokenizer, _as_list(self.model.generation_config.eos_token_id)
        )
        self._sessions: dict[str, tuple[list[int], KV]] = {}
        self.forward_seconds = 0.0
        self.generated_tokens = 0
        self.prefilled_tokens = 0
        self.reused_tokens = 0

    # ---- public API ------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        sessions: list[str] | None = None,
        seeds: list[int | None] | None = None,
    ) -> list[Completion]:
        seeds = seeds or row_seeds(params.seed, len(prompts), sessions)
        out: list[Completion] = []
        for start in range(0, len(prompts), self.max_batch_size):
            chunk = slice(start, start + self.max_batch_size)
            out += self._generate_chunk(
                prompts[chunk], params, sessions[chunk] if sessions else None, seeds[chunk]
            )
        return out

    def choose(
        self,
        prompts: list[list[int]],
        options: list[list[str]],
        params: SamplingParams,
        seeds: list[int | None] | None = None,
        by_kind: bool = False,
    ) -> list[Completion]:
        seeds = seeds or row_seeds(params.seed, len(prompts))
        eos = self.tokenizer.eos_token_id
        replies = [[self.tokenizer.encode(o, add_special_tokens=False) + [eos] for o in opts]
                   for opts in options]  # fmt: skip
        flat = [(p, r) for p, rs in zip(prompts, replies, strict=True) for r in rs]
        scores = iter(self.score([p for p, _ in flat], [r for _, r in flat], params.temperature))
        uniforms = _uniforms(seeds, 2)  # (B, 2): the kind's draw, then the option's
        out = []
        for i, (texts, ids) in enumerate(zip(options, replies, strict=True)):
            log_probs = [next(scores) for _ in ids]
            kind_of = [t.split(maxsplit=1)[0] if by_kind else "" for t in texts]
            cut = [
                self._kind_tokens(t, r) if by_kind else 0 for t, r in zip(texts, ids, strict=True)
            ]
            heads: dict[str, float] = {}  # each kind: the log-prob of the tokens spelling it
            for kind, lp, c in zip(kind_of, log_probs, cut, strict=True):
                heads.setdefault(kind, sum(lp[:c]))
            kind = list(heads)[
                self._draw(torch.tensor(list(heads.values())), params, uniforms[i, 0])
            ]
            picks = [j for j, other in enumerate(kind_of) if other == kind]
            rest = torch.tensor([sum(log_probs[j][cut[j] :]) for j in picks])  # (options of kind,)
            k = picks[self._draw(rest, params, uniforms[i, 1])]
            self.generated_tokens += len(ids[k])
            out.append(Completion(ids[k], texts[k], "stop", log_probs[k]))
        return out

    @staticmethod
    def _draw(log_weights: torch.Tensor, params: SamplingParams, uniform: torch.Tensor) -> int:
        """An index drawn in proportion to exp(`log_weights`) (greedy: the largest)."""
        if params.temperature == 0 or len(log_weights) == 1:
            return int(log_weights.argmax())
        return int(sample_tokens(log_weights[None], uniform[None])[0])

    def _kind_tokens(self, text: str, ids: list[int]) -> int:
        """How many of `ids` (`text`'s tokens) it takes to spell its first word."""
        word = text.split(maxsplit=1)[0]
        for n in range(1, len(ids) + 1):
            if len(self.tokenizer.decode(ids[:n]).lstrip()) >= len(word):
                return n
        return len(ids)

    @torch.inference_mode()
    def score(
        self, prompts: list[list[int]], replies: list[list[int]], temperature: float
    ) -> list[list[float]]:
        """Each reply's per-token log-probs after its prompt (token ids), teacher-forced at
        `temperature` (1 when 0, as greedy replies are scored), as the trainer scores them.
        Each distinct prompt is prefilled once, sharing common prefixes as `generate` does;
        its replies (say the legal moves of one turn) then run over its keys and values."""
        temp = temperature or 1.0
        distinct = list(dict.fromkeys(map(tuple, prompts)))
        which = {p: i for i, p in enumerate(distinct)}
        row = [which[tuple(p)] for p in prompts]
        with int8_linear.full_precision():
            last, kvs = self._prefill([list(p) for p in distinct], [([], None)] * len(distinct))
            first = torch.log_softmax(last.float() / temp, -1)  # (P, V) at each prompt's end
            rest = self._teacher_forced(
                [(prompts[i], kvs[row[i]]) for i in range(len(prompts))],
                [r[:-1] for r in replies], [r[1:] for r in replies], temp,
            )  # fmt: skip
        return [[float(first[row[i], r[0]]), *rest[i]] for i, r in enumerate(replies)]

    def release(self, sessions: list[str]) -> None:
        for s in sessions:
            self._sessions.pop(s, None)

    def close(self) -> None:
        self._sessions.clear()
        del self.model
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ---- one batch -------------------------------------------------------------------------
    def _forward(self, every_position: bool = False, **kw) -> torch.Tensor:
        """The last position's fp32 logits (B, V), or every position's (B, T, V)."""
        t0 = time.perf_counter()
        out = self.model(**kw, use_cache=True, logits_to_keep=0 if every_position else 1).logits
        logits = out.float() if every_position else out[:, -1].float()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.forward_seconds += time.perf_counter() - t0
        return logits

    def _generate_chunk(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        sessions: list[str] | None,
        seeds: list[int | None],
    ) -> list[Completion]:
        b, dev = len(prompts), self.device
        cached = [self._lookup(s, p) for s, p in zip(sessions or [None] * b, prompts, strict=True)]
        # int8 only decodes (see int8_linear). The activations come from the heap and go back
        # after it (`heap.reusing`): each layer's reuse the last one's pages.
        with int8_linear.full_precision(), heap.reusing(self.bounded, trim=True):
            logits, kvs = self._prefill(prompts, cached)  # (B, V), each row's KV over its prompt
        lens = [len(p) for p in prompts]
        lmax = max(lens)
        cache = self._batch_cache(kvs, lens, lmax, params.max_new_tokens)
        del kvs, cached  # copied into `cache`: freed before the decode's peak, not after it
        mask = torch.zeros(b, lmax, dtype=torch.long, device=dev)  # (B, Lmax), left-padded
        for i, n in enumerate(lens):
            mask[i, lmax - n :] = 1
        position = torch.tensor(lens, device=dev) - 1  # (B,) of each row's last prompt token

        warpers = []
        if params.temperature > 0:
            warpers = [TemperatureLogitsWarper(params.temperature)]
            if params.top_p < 1.0:  # top-p 1 keeps every token; skip its vocabulary sort
                warpers.append(TopPLogitsWarper(params.top_p))
        draws = _uniforms(seeds, params.max_new_tokens).to(dev)
        stop = torch.tensor(self.stop_ids, device=dev)
        rows = torch.full((b, params.max_new_tokens), self.pad_id, device=dev)  # (B, steps)
        log_probs = torch.zeros(b, params.max_new_tokens, device=dev)  # (B, steps)
        alive = torch.arange(b, device=dev)  # the batch row of each cache row
        done = torch.zeros(b, dtype=torch.bool, device=dev)  # per cache row
        # A step's (B, V) logits, their warped copies and softmax come from the heap, not each
        # a fresh mapping to fault in (`heap.reusing`); the session stores and the cache's
        # reordering stay bounded, so what they free leaves the process.
        for step in range(params.max_new_tokens):
            with heap.reusing(self.bounded):
                if params.temperature > 0:
                    for warp in warpers:
                        logits = warp(None, logits)
                    nxt = sample_tokens(logits, draws[:, step])  # (B_alive,)
                else:
                    nxt = logits.argmax(-1)  # (B_alive,)
                nxt = torch.where(done, self.pad_id, nxt)
                rows[alive, step] = nxt
                log_probs[alive, step] = token_log_prob(logits, nxt)
                done |= torch.isin(nxt, stop)
            if bool(done.all()) or step == params.max_new_tokens - 1:
                break
            if 4 * int(done.sum()) >= len(done):  # drop finished rows from the batch
                if sessions:
                    self._store(sessions, prompts, rows, cache, lmax, alive, done)
                keep = (~done).nonzero()[:, 0]
                cache.reorder_cache(keep)
                mask, position, draws, alive = mask[keep], position[keep], draws[keep], alive[keep]
                nxt, done = nxt[keep], done[keep]
            mask = torch.cat([mask, (~done).long()[:, None]], dim=1)  # finished rows stop attending
            position = position + 1
            with heap.reusing(self.bounded):
                logits = self._forward(
                    input_ids=nxt[:, None],
                    attention_mask=mask,
                    position_ids=position[:, None],
                    past_key_values=cache,
                )
        if sessions:
            self._store(sessions, prompts, rows, cache, lmax, alive, torch.ones_like(done))
        n = step + 1
        return [
            self._completion(r, lp)
            for r, lp in zip(rows[:, :n].tolist(), log_probs[:, :n].tolist(), strict=True)
        ]

    def _prefill(
        self,
        prompts: list[list[int]],
        cached: list[tuple[list[int], KV | None]],
        share: bool = True,
    ) -> tuple[torch.Tensor, list[KV]]:
        """Run each prompt's uncached tokens through the model in groups of at most
        `prefill_tokens` padded tokens, split where padding costs more than a forward
        (`_groups`). Returns the last position's logits (B, V) and each
        row's keys and values over its whole prompt.

        Prefill is compute-bound: a huge padded batch only adds padding and cache misses (on
        CPU, 106 rows of ~400 tokens cost twice as much per token as 8 rows), so prefill goes
        in groups and only decoding runs the whole batch at once. With `share`, prefixes that
        rows share are computed once first (`_share_prefixes`)."""
        if share:
            cached = self._share_prefixes(prompts, cached)
        past = [len(ids) for ids, _ in cached]  # L_i
        new = [p[n:] for p, n in zip(prompts, past, strict=True)]  # n_i >= 1 tokens each
        self.reused_tokens += sum(past)
        self.prefilled_tokens += sum(len(n) for n in new)
        logits: list[torch.Tensor | None] = [None] * len(prompts)
        kvs: list[KV | None] = [None] * len(prompts)
        for group in _groups([len(n) for n in new], past, self.prefill_tokens, self.key_cost):
            out, cache, lmax, nmax = self._group_forward(group, cached, new)
            for row, i in enumerate(group):  # the row's cached prefix, then its new tokens
                logits[i] = out[row]
                spans = [(lmax - past[i], lmax), (lmax + nmax - len(new[i]), lmax + nmax)]
                kvs[i] = _row_kv(cache, row, spans)
        return torch.stack(logits), kvs

    def _group_forward(
        self,
        group: list[int],
        cached: list[tuple[list[int], KV | None]],
        new: list[list[int]],
        every_position: bool = False,
    ) -> tuple[torch.Tensor, Cache, int, int]:
        """One forward of rows `group`: each row's `new` tokens after its cached prefix, as
        `[pad..., cached prefix (L_i) | pad..., new tokens (n_i)]` with a 2-D mask and explicit
        position ids. Returns the last position's logits (G, V), or with `every_position` each
        new position's (G, Nmax, V), the group's cache, Lmax and Nmax."""
        past = [len(cached[i][0]) for i in group]
        lmax, nmax = max(past), max(len(new[i]) for i in group)
        mask = torch.zeros(len(group), lmax + nmax, dtype=torch.long)  # (G, Lmax + Nmax)
        input_ids = torch.full((len(group), nmax), self.pad_id, dtype=torch.long)
        position_ids = torch.zeros(len(group), nmax, dtype=torch.long)  # (G, Nmax)
        for row, (i, n) in enumerate(zip(group, past, strict=True)):
            toks = new[i]
            mask[row, lmax - n : lmax] = 1
            mask[row, lmax + nmax - len(toks) :] = 1
            input_ids[row, nmax - len(toks) :] = torch.tensor(toks)
            position_ids[row, nmax - len(toks) :] = torch.arange(n, n + len(toks))
        cache = self._batch_cache([cached[i][1] for i in group], past, lmax)
        out = self._forward(
            input_ids=input_ids.to(self.device),
            past_key_values=cache,
            attention_mask=mask.to(self.device),
            position_ids=position_ids.to(self.device),
            every_position=every_position,
        )
        return out, cache, lmax, nmax

    def _teacher_forced(
        self,
        cached: list[tuple[list[int], KV]],
        inputs: list[list[int]],
        targets: list[list[int]],
        temperature: float,
    ) -> list[list[float]]:
        """log p(targets[i][t] | cached prefix, inputs[i][: t + 1]) at `temperature`, per row:
        the rows' `inputs` fed after their cached prefixes, grouped as prefill groups."""
        out: list[list[float]] = [[] for _ in inputs]
        todo = [i for i, toks in enumerate(inputs) if toks]
        past = [len(cached[i][0]) for i in todo]
        budget = min(self.prefill_tokens, SCORED_TOKENS)  # each new position keeps its logits
        for group in _groups([len(inputs[i]) for i in todo], past, budget, self.key_cost):
            rows = [todo[g] for g in group]
            logits, _, _, nmax = self._group_forward(rows, cached, inputs, every_position=True)
            for row, i in enumerate(rows):  # its new tokens are the last len(inputs[i])
                n = len(inputs[i])
                lp = torch.log_softmax(logits[row, nmax - n :] / temperature, -1)  # (n, V)
                out[i] = lp.gather(-1, torch.tensor(targets[i], device=lp.device)[:, None])[
                    :, 0
                ].tolist()
        return out

    def _share_prefixes(
        self, prompts: list[list[int]], cached: list[tuple[list[int], KV | None]]
    ) -> list[tuple[list[int], KV | None]]:
        """Give rows without a session cache the longest prefix they share with another such
        row (at least `min_shared_prefix` tokens), prefilled once for all rows that share it.

        In lexicographic order a row's longest shared prefix is the longer of its common
        prefixes with its two neighbours. The part common to all those prefixes (say the rules,
        when each prefix is the rules plus one Diplomacy game's board) is prefilled once too."""
        fresh = sorted((i for i, (ids, _) in enumerate(cached) if not ids), key=prompts.__getitem__)
        common = [
            _common_prefix(prompts[a], prompts[b]) for a, b in zip(fresh, fresh[1:], strict=False)
        ]
        shared: dict[int, tuple[int, ...]] = {}  # row -> the prefix it takes from the cache
        for k, i in enumerate(fresh):
            n = max(common[k - 1] if k else 0, common[k] if k < len(common) else 0)
            n = min(n, len(prompts[i]) - 1)  # leave >= 1 new token
            if n >= self.min_shared_prefix:
                shared[i] = tuple(prompts[i][:n])
        if not shared:
            return cached
        prefixes = sorted(set(shared.values()))
        root = prefixes[0][
            : min(_common_prefix(prefixes[0], prefixes[-1]), min(map(len, prefixes)) - 1)
        ]
        base: list[tuple[list[int], KV | None]] = [([], None)] * len(prefixes)
        if len(prefixes) > 1 and len(root) >= self.min_shared_prefix:
            _, (root_kv,) = self._prefill([list(root)], [([], None)], share=False)
            base = [(list(root), root_kv)] * len(prefixes)
        _, kvs = self._prefill([list(p) for p in prefixes], base, share=False)
        kv_of = dict(zip(prefixes, kvs, strict=True))
        return [
            (list(shared[i]), kv_of[shared[i]]) if i in shared else c for i, c in enumerate(cached)
        ]

    # ---- the session cache -----------------------------------------------------------------
    def _lookup(self, session: str | None, prompt: list[int]) -> tuple[list[int], KV | None]:
        """The longest cached prefix of `prompt` for `session` (leaving >= 1 new token)."""
        if session is None or session not in self._sessions:
            return [], None
        ids, kv = self._sessions[session]
        n = _common_prefix(ids, prompt[: len(prompt) - 1])
        return ids[:n], [(k[:, :n], v[:, :n]) for k, v in kv]

    def _batch_cache(
        self, kvs: list[KV | None], past: list[int], lmax: int, room: int | None = None
    ) -> Cache:
        """A cache holding each row's cached prefix, left-padded to `lmax`. With `room`, a
        `StaticCache` with that many free positions, for decoding (it writes in place instead
        of concatenating every step); without, a `DynamicCache`, for one prefill forward (no
        free positions to allocate)."""
        if room is None:
            cache: Cache = DynamicCache()
        else:
            cache = StaticCache(config=self.model.config, max_cache_len=lmax + room)
        if lmax == 0:
            return cache
        ref = next(kv for kv in kvs if kv is not None)
        keys = values = None
        for layer, (k0, _) in enumerate(ref):
            # A DynamicCache keeps the tensors it is given; a StaticCache copies them, so one
            # pair serves every layer (rows fill the same span each time, the padding stays 0).
            if keys is None or room is None:
                shape = (len(kvs), k0.shape[0], lmax, k0.shape[2])  # (B, H, Lmax, D)
                keys = torch.zeros(shape, dtype=k0.dtype, device=k0.device)
                values = torch.zeros_like(keys)
            for i, kv in enumerate(kvs):
                if kv is not None and past[i]:
                    keys[i, :, lmax - past[i] :] = kv[layer][0]
                    values[i, :, lmax - past[i] :] = kv[layer][1]
            cache.update(keys, values, layer)
        return cache

    def _store(
        self,
        sessions: list[str],
        prompts: list[list[int]],
        rows: torch.Tensor,
        cache: StaticCache,
        lmax: int,
        alive: torch.Tensor,
        which: torch.Tensor,
    ) -> None:
        """Keep the real positions of the cache rows picked by `which` (bool, per cache row;
        `alive` maps cache rows to batch rows): each row's prompt (left-padded to `lmax`) plus
        its generated tokens (`rows`, per batch row) fed back, one contiguous span.

        An entry grows only while the sessions and the decode batch's cache (its live rows at
        full length) fit in `max_cached_tokens`; otherwise the session keeps its older, shorter
        prefix, and a new session goes uncached until finished sessions are released. A
        rollout visits every live session once per step, a cycle: evicting the least recently
        used entry would make every visit a miss once the sessions outgrow the cache, while
        this keeps the entries that fit warm. A batch larger than the cap alone still runs."""
        held = sum(len(ids) for ids, _ in self._sessions.values())
        held += len(alive) * _max_length(cache)  # the batch's cache, every row full
        for i in which.nonzero()[:, 0].tolist():
            j = int(alive[i])
            session, prompt = sessions[j], prompts[j]
            fed = prompt + until_stop(rows[j].tolist(), self.stop_ids)[:-1]
            old = len(self._sessions[session][0]) if session in self._sessions else 0
            if held - old + len(fed) > self.max_cached_tokens:
                continue
            start = lmax - len(prompt)
            kv = _one_block(_row_kv(cache, i, [(start, start + len(fed))]))
            self._sessions[session] = (fed, kv)
            held += len(fed) - old

    def _completion(self, row: list[int], log_probs: list[float]) -> Completion:
        """Cut a generated row and its log-probs after its first stop token."""
        out = trim_reply(row, self.tokenizer, self.stop_ids, log_probs)
        self.generated_tokens += len(out.token_ids)
        return out


def _uniforms(seeds: list[int | None], steps: int) -> torch.Tensor:
    """(B, steps) uniforms, row i from its own generator seeded with `seeds[i]` (None = fresh
    entropy): a row's draws do not depend on the other rows of the batch."""
    rows = []
    for seed in seeds:
        gen = torch.Generator()
        if seed is None:
            gen.seed()
        else:
            gen.manual_seed(seed)
        rows.append(torch.rand(steps, generator=gen))
    return torch.stack(rows)


def sample_tokens(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token id per row of `logits` (B, V), drawn from its softmax by inverse transform:
    the row's uniform (`uniforms`, (B,)) against its cumulative probabilities. Same
    distribution as `torch.multinomial`, which on CPU spends ~5 ms per step drawing B x V
    random numbers."""
    cdf = torch.softmax(logits, -1).cumsum(-1)  # (B, V)
    u = uniforms[:, None].to(cdf.dtype) * cdf[:, -1:]  # (B, 1)
    return torch.searchsorted(cdf, u, right=True)[:, 0].clamp_max(cdf.shape[1] - 1)


def token_log_prob(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(`logits`)[token] per row (B,): `logits` (B, V) as the tokens were drawn from
    them (after the temperature and top-p warpers, whose -inf entries drop out), the same fp32
    `logit - logsumexp` the trainer computes (`sparring.logprobs`)."""
    picked = logits.gather(-1, tokens[:, None]).squeeze(-1)  # (B,)
    return picked - torch.logsumexp(logits, dim=-1)


def _max_length(cache: StaticCache) -> int:
    """Positions per row of a static cache (transformers 5.17 renamed `get_max_cache_shape`,
    now deprecated, to `get_max_length`, which 5.10 lacks)."""
    if hasattr(cache, "get_max_length"):
        return cache.get_max_length()
    return cache.get_max_cache_shape()


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    return next(
        (k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def _groups(
    new: list[int], past: list[int], budget: int, key_cost: float, forward_cost: int = 64
) -> list[list[int]]:
    """Split rows into prefill forwards: sort them by new-token count (then cached length),
    then cut the order where the modelled cost is least (dynamic programming). A group of G rows costs
    `G * nmax * (1 + key_cost * (lmax + nmax)) + forward_cost` in tokens' worth of
    projections: every row is padded to the group's most new tokens (`nmax`) and attends over
    its longest cached prefix (`lmax`), `key_cost` is one key's attention over one token's
    projections, and `forward_cost` prices a forward's fixed work and small matmuls. Groups
    stay within `budget` padded tokens (a row larger than that runs alone)."""
    order = sorted(range(len(new)), key=lambda i: (new[i], past[i]))
    best = [0.0] + [float("inf")] * len(order)  # best[j]: cheapest split of order[:j]
    cut = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        nmax, lmax = new[order[j - 1]], 0
        for i in range(j - 1, -1, -1):  # the last group is order[i:j]
            lmax = max(lmax, past[order[i]])
            if i < j - 1 and (j - i) * nmax > budget:
                break
            cost = best[i] + (j - i) * nmax * (1 + key_cost * (lmax + nmax)) + forward_cost
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], len(order)
    while j:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def _row_kv(cache: Cache, row: int, spans: list[tuple[int, int]]) -> KV:
    """Row `row`'s keys and values at the cache positions of `spans` ([start, stop) ranges,
    its real tokens in order): views when they are one span."""

    def take(t: torch.Tensor) -> torch.Tensor:  # (H, T, D) -> (H, real, D)
        parts = [t[row, :, a:b] for a, b in spans if b > a]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    return [(take(layer.keys), take(layer.values)) for layer in cache.layers]


def _one_block(kv: KV) -> KV:
    """A copy of `kv` in one tensor (layers, 2, H, T, D), as per-layer views of it. A session's
    cache is then one allocation, which the C heap maps on its own and returns to the system
    when it is freed; per-layer copies (300 KB each for a SmolLM2 game seat) came from the heap
    and left it fragmented: 1.9 GiB stayed resident after 64 sessions of 4 turns were freed
    (`sparring.heap`)."""
    k0 = kv[0][0]
    block = k0.new_empty((len(kv), 2, *k0.shape))
    for layer, (k, v) in enumerate(kv):
        block[layer, 0], block[layer, 1] = k, v
    return [(block[layer, 0], block[layer, 1]) for layer in range(len(kv))]


def _kv_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of keys and values one cached token takes, over all layers."""
    cfg = model.config.get_text_config()
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * kv_heads * _head_dim(cfg) * model.dtype.itemsize


def _key_cost(model: torch.nn.Module, num_params: int) -> float:
    """Attention FLOPs of one query over one key (scores and weighted values, every layer and
    head), over the FLOPs of one token through the weights (2 x parameters, embedding aside)."""
    cfg = model.config.get_text_config()
    per_key = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * _head_dim(cfg)
    return per_key / (2 * (num_params - cfg.vocab_size * cfg.hidden_size))


def _head_dim(cfg) -> int:
    """Width of one attention head (`head_dim` where the config sets it)."""
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def _as_list(x: int | list[int] | None) -> list[int | None]:
    return list(x) if isinstance(x, list | tuple) else [x]

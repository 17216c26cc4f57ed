"""Self-play rollout: play many games at once, batching every pending model turn.

    sparring rollout --model runs/tiny --inits runs/inits/train.parquet --out runs/rollout

Each initial state is played `games_per_init` times (GRPO's group size). All games advance
together (at most `max_live_games` at once; a finished game's place goes to the next): at each
step, the pending turns of every live game are grouped by the policy that plays that seat, and
each model policy answers all of its turns in ONE batched `generate` call. Scripted seats answer
inline. A game's sampling seeds follow its own step count, so its draws do not depend on when
it started or on which games share its batches. Outputs:
    games.jsonl       one line per game: transcript, actions, errors, turns, seed, rewards
    samples.parquet   one row per (game, seat) played by a model (schema: sparring.samples)
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator
from tqdm.auto import tqdm

from sparring.games import Agent, Game, GameSpec, game_class
from sparring.games.base import LEARNER
from sparring.generation.base import GenerationBackend, SamplingParams, session_seed
from sparring.generation.factory import BackendConfig, make_backend
from sparring.metrics import PERF, ROLLOUT, metric_name, prefixed
from sparring.samples import TokenTrace, sample_row, write_samples

Policy = GenerationBackend | Agent
Learners = str | Sequence[str]  # the policy name(s) whose seats a rollout's metrics cover


class RolloutConfig(BaseModel):
    """Settings of one rollout step."""

    model_config = ConfigDict(extra="forbid")  # a misspelt key fails instead of being ignored

    game: GameSpec = Field(default_factory=GameSpec)
    """The game and its rules; must match game-init's."""
    games_per_init: int = Field(2, ge=1)
    """Plays of each initial state (GRPO group size for the `init` key)."""
    seats: list[str] | None = None
    """Policy name per seat; None = every seat is `policy` (pure self-play)."""
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    backend: BackendConfig = Field(default_factory=BackendConfig)
    """Engine for `policy` seats: hf | sglang | openai (sparring.generation.factory)."""
    max_batch_size: int = Field(64, ge=1)
    """Largest batch per generate call; bigger batches are split."""
    max_context_tokens: int = Field(4096, ge=64)
    """A game whose next prompt + max_new_tokens would exceed this ends (no deal)."""
    max_live_games: int | None = Field(None, ge=1)
    """Games in flight at once (None = all). Bounds the engine's KV cache: e.g. 64 keeps
    SmolLM2-135M's matching games (2 seats of <= ~1,200 tokens) inside HFBackend's 8 GiB."""
    choose_legal: bool | Literal["by_kind"] = False
    """Model seats answer with one of the game's legal moves (`legal_moves(seat)`), drawn in
    proportion to the probability that sampling writes exactly it (the engine's `choose`),
    instead of free text: no malformed replies. For games with a short list of moves.
    "by_kind" draws a move's kind (its first word, say `[message]` or `[propose]`) by the
    probability of writing that word, then the move of that kind by the rest of its text: a
    long move is not drawn less often only for being long."""

    @model_validator(mode="after")
    def _check(self) -> RolloutConfig:
        if self.choose_legal:
            if not hasattr(self.game.cls, "legal_moves"):
                raise ValueError(f"choose_legal: {self.game.name} does not list its legal moves")
            if why := self.game.cls.choose_legal_refused(self.game.params):
                raise ValueError(f"choose_legal: {why}")
            if self.sampling.top_p < 1:
                raise ValueError("choose_legal scores whole replies; it needs sampling.top_p: 1")
            if self.backend.name != "hf":
                raise ValueError(f"choose_legal needs the hf engine, not {self.backend.name}")
        if self.max_context_tokens <= self.sampling.max_new_tokens:
            raise ValueError(
                f"max_context_tokens ({self.max_context_tokens}) must exceed "
                f"sampling.max_new_tokens ({self.sampling.max_new_tokens})"
            )
        return self


@dataclass
class Episode:
    """One finished game, as written to games.jsonl."""

    game_id: str
    init_id: str
    game_name: str
    seed: int
    roles: list[str]
    seat_policies: list[str]
    state: dict[str, Any]
    rewards: list[float]
    num_turns: int
    invalid_actions: list[int]
    forfeits: list[int]
    words: list[int]
    transcript: list[dict[str, Any]]
    messages: list[list[dict[str, str]]]
    outcome: dict[str, Any]
    group_keys: list[dict[str, str]] = field(default_factory=list)
    truncated: bool = False
    """True if the game was cut because a prompt outgrew max_context_tokens."""


@dataclass
class RolloutResult:
    """Episodes, sample rows and throughput figures of one rollout."""

    episodes: list[Episode]
    samples: list[dict[str, Any]]
    seconds: float
    generate_calls: int
    generated_tokens: int


@dataclass
class LiveGame:
    """One game in flight: its ids, who sits where, and each seat's token trace."""

    game: Game
    game_id: str  # "<init_id>#<play>"
    init_id: str
    state: dict[str, Any]
    seats: list[str]  # policy name per seat
    traces: list[TokenTrace | None]  # per seat; None = no samples for that seat
    truncated: bool = False  # a prompt outgrew max_context_tokens: the game ends (no deal)
    steps: int = 0  # rollout steps since the game started (its sampling seeds follow them)

    @property
    def over(self) -> bool:
        return self.game.done or self.truncated

    def session(self, seat: int) -> str:
        """The backend's KV-cache key of one seat."""
        return f"{self.game_id}/{seat}"

    def episode(self) -> Episode:
        game, stats = self.game, self.game.stats
        return Episode(
            game_id=self.game_id,
            init_id=self.init_id,
            game_name=game.name,
            seed=int(self.state.get("seed", -1)),
            roles=list(game.roles),
            seat_policies=list(self.seats),
            state=self.state,
            rewards=list(game.rewards),
            num_turns=game.num_turns,
            invalid_actions=list(stats.invalid_actions),
            forfeits=list(stats.forfeits),
            words=list(stats.words),
            transcript=[asdict(t) for t in game.transcript],
            messages=[game.messages(s) for s in range(game.num_seats)],
            outcome=game.outcome(),
            group_keys=[game.group_keys(s) for s in range(game.num_seats)],
            truncated=self.truncated,
        )


def play_games(
    game: GameSpec,
    sampling: SamplingParams,
    runs: list[tuple[str, dict[str, Any]]],
    policies: dict[str, Policy],
    seat_plan: list[list[str]],
) -> list[Episode]:
    """Each of `runs` played once, seated per `seat_plan`, in one batched rollout (what
    `Game.policy_metrics` gets as `play`: the strategic evaluator's games)."""
    cfg = RolloutConfig(game=game, sampling=sampling, games_per_init=1)
    return play(runs, policies, cfg, progress=False, seat_plan=seat_plan).episodes


def play(
    inits: list[tuple[str, dict[str, Any]]],
    policies: dict[str, Policy],
    cfg: RolloutConfig,
    progress: bool = True,
    scripted_tokenizer: Any = None,
    seat_plan: list[list[str]] | None = None,
) -> RolloutResult:
    """Play every (init_id, state) `cfg.games_per_init` times with the given seat policies.

    `seat_plan[i]` overrides `cfg.seats` for the games of `inits[i]` (e.g. a learner against
    per-role opponents). Samples are built for model seats; pass `scripted_tokenizer` to
    build them for scripted seats too (warm-start data for SFT).
    """
    t0 = time.perf_counter()
    if not inits:
        raise ValueError("no initial states to play")
    if seat_plan is not None and len(seat_plan) != len(inits):
        raise ValueError(f"seat_plan has {len(seat_plan)} entries for {len(inits)} initial states")
    live = [
        _start(
            cfg,
            init_id,
            state,
            g,
            seat_plan[i] if seat_plan else cfg.seats,
            policies,
            scripted_tokenizer,
        )
        for i, (init_id, state) in enumerate(inits)
        for g in range(cfg.games_per_init)
    ]
    backends = {n for n, p in policies.items() if isinstance(p, GenerationBackend)}
    calls = 0
    bar = tqdm(total=len(live), desc="games", unit="game", disable=not progress)
    waiting, running = deque(live), []
    while waiting or running:
        while waiting and len(running) < (cfg.max_live_games or len(live)):
            running.append(waiting.popleft())
        turns: dict[str, list[tuple[LiveGame, int]]] = {}  # policy name -> its pending turns
        for lg in running:
            for seat in lg.game.pending_seats:
                turns.setdefault(lg.seats[seat], []).append((lg, seat))
        for name, todo in turns.items():
            policy = policies[name]
            if isinstance(policy, GenerationBackend):
                calls += _model_turns(policy, todo, cfg)
            else:
                for lg, seat in todo:
                    _scripted_turn(policy, lg, seat)
        for lg in running:
            lg.steps += 1
        for lg in [lg for lg in running if lg.over]:
            running.remove(lg)
            bar.update(1)
            for name in set(lg.seats) & backends:
                policies[name].release([lg.session(s) for s in range(lg.game.num_seats)])
    bar.close()
    episodes = [lg.episode() for lg in live]
    sampled = {"temperature": cfg.sampling.temperature, "top_p": cfg.sampling.top_p}
    samples = [
        row | (sampled if lg.seats[seat] in backends else {})  # what the trainer must score
        for lg, ep in zip(live, episodes, strict=True)
        for seat, trace in enumerate(lg.traces)
        if trace is not None and (row := sample_row(ep, seat, trace)) is not None
    ]
    distinct = {id(p): p for p in policies.values()}.values()  # names may share a backend
    tokens = sum(getattr(p, "generated_tokens", 0) for p in distinct)
    return RolloutResult(episodes, samples, time.perf_counter() - t0, calls, tokens)


def _start(
    cfg: RolloutConfig,
    init_id: str,
    state: dict[str, Any],
    play_index: int,
    seats: list[str] | None,
    policies: dict[str, Policy],
    scripted_tokenizer: Any,
) -> LiveGame:
    """A fresh game from `state`, seated, with a token trace per sampled seat."""
    game = cfg.game.make()
    game.reset(state)
    seats = list(seats or [LEARNER] * game.num_seats)
    if len(seats) != game.num_seats:
        raise ValueError(f"{cfg.game.name} has {game.num_seats} seats but {len(seats)} are seated")
    unknown = sorted(set(seats) - set(policies))
    if unknown:
        raise ValueError(
            f"seats name policies {unknown} that were not provided ({sorted(policies)})"
        )
    traces = [_trace(policies[p], scripted_tokenizer) for p in seats]
    return LiveGame(game, f"{init_id}#{play_index}", init_id, state, seats, traces)


def _trace(policy: Policy, scripted_tokenizer: Any) -> TokenTrace | None:
    if isinstance(policy, GenerationBackend):
        return TokenTrace(policy.tokenizer)
    return TokenTrace(scripted_tokenizer) if scripted_tokenizer is not None else None


def _scripted_turn(agent: Agent, lg: LiveGame, seat: int) -> None:
    trace = lg.traces[seat]
    if trace is not None:
        trace.prompt(lg.game.messages(seat))
    text = agent.act(lg.game, seat)
    lg.game.step(seat, text)
    if trace is not None:
        trace.reply(_through_reply(lg.game.messages(seat), text), None)


def _model_turns(
    backend: GenerationBackend, todo: list[tuple[LiveGame, int]], cfg: RolloutConfig
) -> int:
    """Answer all of one model's pending turns with a single batched generate call (or
    `choose` among each seat's legal moves)."""
    prompts, asked, sampling = [], [], cfg.sampling
    for lg, seat in todo:
        if lg.truncated:
            continue
        ids = lg.traces[seat].prompt(lg.game.messages(seat))
        if len(ids) + sampling.max_new_tokens > cfg.max_context_tokens:
            lg.truncated = True
            continue
        prompts.append(ids)
        asked.append((lg, seat))
    if not prompts:
        return 0
    sessions = [lg.session(seat) for lg, seat in asked]
    seeds = None
    if sampling.seed is not None:  # a distinct, reproducible seed for every seat and game step
        seeds = [session_seed(sampling.seed * 100_003 + lg.steps, lg.session(s)) for lg, s in asked]
    if cfg.choose_legal:
        moves = [lg.game.legal_moves(seat) for lg, seat in asked]
        replies = backend.choose(prompts, moves, sampling, seeds, cfg.choose_legal == "by_kind")
    else:
        replies = backend.generate(prompts, sampling, sessions, seeds)
    for (lg, seat), out in zip(asked, replies, strict=True):
        if lg.truncated:  # another seat of this game outgrew the context in this call
            continue
        lg.game.step(seat, out.text)
        # The game appended our text as the seat's last assistant message; record its ids
        # and the engine's log-probs of them.
        messages = _through_reply(lg.game.messages(seat), out.text)
        lg.traces[seat].reply(messages, out.token_ids, out.log_probs)
    return 1


def _through_reply(messages: list[dict[str, str]], text: str) -> list[dict[str, str]]:
    """The seat's messages up to and including the assistant message `step` just added."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    if messages[last]["content"] != text:
        raise RuntimeError("game.step must append the seat's text as its last assistant message")
    return messages[: last + 1]


def load_inits(path: str | Path, limit: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """Read (init_id, state) pairs from a game-init parquet."""
    df = pd.read_parquet(path)
    if limit is not None:
        df = df.head(limit)
    return [(r.init_id, json.loads(r.state)) for r in df.itertuples()]


def write_outputs(result: RolloutResult, out_dir: str | Path) -> dict[str, Path]:
    """Write games.jsonl, samples.parquet and a small stats.json into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "games.jsonl", "w") as f:
        for ep in result.episodes:
            f.write(json.dumps(asdict(ep)) + "\n")
    paths = {"games": out / "games.jsonl", "stats": out / "stats.json"}
    if result.samples:
        paths["samples"] = write_samples(result.samples, out / "samples.parquet")
    (out / "stats.json").write_text(json.dumps(rollout_stats(result), indent=2))
    return paths


def rollout_stats(result: RolloutResult, learner: Learners = LEARNER) -> dict[str, float]:
    """The `rollout/*` and `perf/*` metrics of one rollout. Reward, invalid rate and the
    game's own `episode_metrics` cover the seats `learner` played (all seats in self-play;
    a population's members: every seat one of them played); a game with a `role_breakdown`
    also gets every `play_metrics` per role."""
    eps, secs = result.episodes, max(result.seconds, 1e-9)
    n = max(len(eps), 1)
    plays = learner_plays(eps, learner)
    attempts = sum(1 for e, s in plays for t in e.transcript if t["seat"] == s)
    own: dict[str, float] = {}  # the game's metrics
    if plays:
        game = game_class(eps[0].game_name)
        own = game.episode_metrics([(vars(e), s) for e, s in plays])
        if game.role_breakdown:
            for role, role_plays in by_role(plays).items():
                prefix = metric_name(game.role_breakdown, role)
                own |= prefixed(prefix, play_metrics(game, role_plays))
    generic = {
        "games": len(eps),
        "normalized_reward": sum(e.rewards[s] for e, s in plays) / max(len(plays), 1),
        "turns": sum(e.num_turns for e in eps) / n,
        "invalid_rate": sum(e.invalid_actions[s] for e, s in plays) / max(attempts, 1),
        "truncated": sum(e.truncated for e in eps) / n,
    }
    perf = {
        "rollout_seconds": result.seconds,
        "games_per_second": len(eps) / secs,
        "generated_tokens": result.generated_tokens,
        "rollout_tokens_per_second": result.generated_tokens / secs,
        "generate_calls": result.generate_calls,
    }
    return prefixed(ROLLOUT, own | generic) | prefixed(PERF, perf)


SeatPlay = tuple[Episode, int]
"""One seat of one finished game: the episode and the seat index."""


def learner_plays(episodes: list[Episode], learner: Learners = LEARNER) -> list[SeatPlay]:
    """Every (episode, seat) that `learner` (a policy name, or several) played, in play order."""
    names = {learner} if isinstance(learner, str) else set(learner)
    return [(e, s) for e in episodes for s, p in enumerate(e.seat_policies) if p in names]


def by_role(plays: list[SeatPlay]) -> dict[str, list[SeatPlay]]:
    """`plays` split by the role of their seat, roles in order of first appearance."""
    roles: dict[str, list[SeatPlay]] = {}
    for e, s in plays:
        roles.setdefault(e.roles[s], []).append((e, s))
    return roles


def play_metrics(game: type[Game], plays: list[SeatPlay]) -> dict[str, float]:
    """Metrics of some plays (at least one), named without a prefix: mean normalized reward
    and its standard error, invalid rate (turns with an invalid action / turns attempted),
    mean turns and words, games; then the game's own (`Game.episode_metrics`)."""
    rewards = np.array([e.rewards[s] for e, s in plays])
    attempts = sum(1 for e, s in plays for t in e.transcript if t["seat"] == s)
    se = rewards.std(ddof=1) / np.sqrt(len(rewards)) if len(rewards) > 1 else 0.0
    return {
        "normalized_reward": float(rewards.mean()),
        "normalized_reward_se": float(se),
        "invalid_rate": sum(e.invalid_actions[s] for e, s in plays) / max(attempts, 1),
        "turns": float(np.mean([e.num_turns for e, _ in plays])),
        "words": float(np.mean([e.words[s] for e, s in plays])),
        "games": float(len(plays)),
    } | game.episode_metrics([(vars(e), s) for e, s in plays])


def build_policies(
    game: GameSpec,
    model: str | None,
    seats: list[str] | None,
    device: str = "auto",
    max_batch_size: int = 64,
    extra_models: dict[str, str] | None = None,
    backend: BackendConfig | None = None,
    temperature: float = 1.0,
) -> dict[str, Policy]:
    """Policies for a rollout: `policy` = the model on `backend` (default hf); any other seat
    name is one of the game's scripted agents (`Game.agents`; those that answer the learner,
    `Game.learner_agents`, are built from it and its sampling `temperature`), or a key of
    `extra_models` (name -> checkpoint path, always on hf: opponents from the pool are small
    side batches). Names with the same checkpoint path share one loaded model."""
    from sparring.generation.hf import HFBackend

    policies: dict[str, Policy] = {}
    loaded: dict[str, HFBackend] = {}  # checkpoint path -> its backend
    extra_models = extra_models or {}
    names = sorted(set(seats or [LEARNER]), key=lambda name: (name != LEARNER, name))
    for name in names:
        if name == LEARNER:
            if model is None:
                raise ValueError("a `policy` seat needs --model")
            policies[name] = make_backend(model, backend or BackendConfig(), device, max_batch_size)
        elif name in extra_models:
            path = extra_models[name]
            if path not in loaded:
                loaded[path] = HFBackend(path, device=device, max_batch_size=max_batch_size)
            policies[name] = loaded[path]
        elif name in game.cls.learner_agents and LEARNER in policies:  # built after the learner
            policies[name] = game.make_agent(
                name, learner=policies[LEARNER], rules=game.make(), temperature=temperature
            )
        else:
            policies[name] = game.make_agent(name)  # refuses a learner agent without one
    return policies

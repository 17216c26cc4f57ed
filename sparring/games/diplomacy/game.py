"""Diplomacy: seven powers over the `diplomacy` engine (PyPI 1.1.2, AGPL-3.0, optional extra).

    game = make_game("diplomacy", horizon=1, press=True)
    game.reset(game.generate_state(seed=0))
    while not game.done:
        for seat in game.pending_seats:          # simultaneous: every power that must act
            game.step(seat, policy(game.messages(seat)))
    game.rewards                                  # one float per power

Rules of the adapter (docs/games.md has the full text):
- Seats are the seven powers (`ROLES`). An episode starts from a **scenario** (see
  `scenarios.generate_state`): a 1901 opening or a later spring reached by scripted play,
  labelled with its stage, filtered for balance (`max_start_centers`, `allow_eliminated`).
  It lasts `horizon` game years: spring and fall moves, retreats and the winter adjustment,
  so supply centers (which change only after a fall) always have a chance to move.
- Each movement phase: `press_rounds` **press** rounds (every power writes `[to GERMANY]
  text` / `[to ALL] text` lines; messages are delivered at the end of each round, so a power
  can answer before orders are due), then **orders** (simultaneous).
- `recap: off` keeps every phase in each power's chat; `recap: years` starts it afresh
  at each movement phase (rules, a recap of earlier years and press, the board), bounded.
- Orders are read forgivingly (`orders.parse_orders`: JSON lists, full names, arrows, commas,
  markdown, comments). A candidate naming one of the power's units that is not legal is
  **invalid** (the unit holds; the power is told which and why). Free text is ignored. A
  turn whose every order was invalid returns ok=False and is retried up to `max_retries`
  times; then the power's units hold (forfeited).
- Retreats and builds: `retreats: auto` plays them by `auto_orders`; `retreats: policy`
  asks the powers, listing their legal options.
- Reward (swappable, `REWARDS`): by default a power's supply centers at the end / 18, capped
  at 1, minus `invalid_penalty` per invalid order, floored at 0; an eliminated power gets 0.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from sparring.games.base import (
    Baseline,
    Game,
    GameStats,
    Lineup,
    Play,
    PlayGames,
    StepResult,
    TurnRecord,
)
from sparring.games.diplomacy.alliances import alliance_context, conduct, moves_played
from sparring.games.diplomacy.board import ROLES, WIN_CENTERS, Engine, Message
from sparring.games.diplomacy.bots import BOTS, possible_orders
from sparring.games.diplomacy.metrics import power_metrics
from sparring.games.diplomacy.observation import (
    adjust_prompt,
    board_view,
    center_history,
    power_view,
    press_digest,
)
from sparring.games.diplomacy.orders import parse_orders, parse_press
from sparring.games.diplomacy.scenarios import generate_state, set_auto_orders
from sparring.games.diplomacy.strategic import StrategicConfig
from sparring.metrics import VS_SCRIPTED


# ---- reward ------------------------------------------------------------------------------------
@dataclass
class PowerResult:
    """What a reward function sees about one power at the end of an episode."""

    power: str
    centers: int
    """Supply centers owned at the end."""
    start_centers: int
    """Supply centers owned at the scenario start."""
    units: int
    invalid_orders: int
    """Order lines that were not legal for a unit of this power (they became holds)."""
    eliminated: bool
    """No centers and no units left."""


def centers_reward(r: PowerResult, invalid_penalty: float) -> float:
    """centers / 18 capped at 1, minus a penalty per invalid order, floored at 0;
    eliminated = 0."""
    if r.eliminated:
        return 0.0
    return max(min(r.centers / WIN_CENTERS, 1.0) - invalid_penalty * r.invalid_orders, 0.0)


def center_gain_reward(r: PowerResult, invalid_penalty: float) -> float:
    """0.5 + (centers gained since the scenario start) / 18, clipped to [0, 1], minus the
    invalid-order penalty, floored at 0; eliminated = 0. Fairer across unequal mid-game
    starts."""
    if r.eliminated:
        return 0.0
    gain = min(max(0.5 + (r.centers - r.start_centers) / WIN_CENTERS, 0.0), 1.0)
    return max(gain - invalid_penalty * r.invalid_orders, 0.0)


RewardFn = Callable[[PowerResult, float], float]
REWARDS: dict[str, RewardFn] = {"centers": centers_reward, "center_gain": center_gain_reward}


class DiplomacyConfig(BaseModel):
    """Rule parameters of a Diplomacy episode (the `game_params` of a run)."""

    horizon: int = Field(1, ge=1)
    """Game years per episode (spring and fall moves, retreats, winter adjustment)."""
    press: bool = True
    """Run press rounds before each movement phase's orders."""
    press_rounds: int = Field(2, ge=1)
    """Press rounds per movement phase (messages are delivered after each round)."""
    press_max_messages: int = Field(3, ge=0)
    """Press lines kept per power per round."""
    press_max_chars: int = Field(160, ge=1)
    """Each press message is cut to this many characters."""
    recap: Literal["off", "years"] = "off"
    """off: each power's chat keeps every phase, so it grows with the horizon; years: each
    movement phase starts a fresh chat (the rules, a recap of the earlier years and press, the
    board), so the prompt stays bounded over long horizons."""
    press_history: int = Field(10, ge=0)
    """With `recap: years`, the last messages a power sent or received that its recap
    keeps."""
    observation: Literal["compact", "full"] = "compact"
    """compact: per unit, its moves, supports and convoys grouped; full: every legal order."""
    retreats: Literal["auto", "policy"] = "auto"
    """Who plays retreats and builds: `auto_orders`, or the powers (with legal options)."""
    max_retries: int = Field(1, ge=0)
    """Retries of an orders turn whose every order was invalid, before the units hold."""
    reward: str = "centers"
    """Name of the reward function in `REWARDS`."""
    invalid_penalty: float = Field(0.01, ge=0.0)
    """Subtracted from the reward per invalid order."""
    stages: list[Literal["opening", "midgame", "endgame"]] = ["opening", "midgame", "endgame"]
    """Scenario stages `generate_state` draws from (uniformly)."""
    max_start_centers: int | None = Field(10, ge=3)
    """Scenario filter: no power starts above this many centers (None: no limit)."""
    allow_eliminated: bool = False
    """Scenario filter: allow starts where a power is already eliminated."""
    strategic: StrategicConfig = Field(default_factory=StrategicConfig)
    """The strategic evaluator that evaluation runs on the model (`policy_metrics`): off
    unless `strategic.scenarios` > 0 (`strategic.py`)."""

    def model_post_init(self, _: Any) -> None:
        if self.reward not in REWARDS:
            raise ValueError(f"unknown reward {self.reward!r}; choose one of {sorted(REWARDS)}")
        if not self.stages:
            raise ValueError("stages must name at least one of opening, midgame, endgame")


# ---- the game -----------------------------------------------------------------------------------
@dataclass
class PowerStats:
    """Per-power counters of one episode."""

    orders: int = 0
    """Legal orders given by the policy (movement phases)."""
    invalid_orders: int = 0
    """Order lines that were illegal and became holds."""
    missing_orders: int = 0
    """Units the policy gave no order (they held)."""
    press_sent: int = 0
    """Press messages sent."""


class DiplomacyGame(Game):
    """Seven powers, simultaneous orders, optional press. See the module docstring."""

    name = "diplomacy"
    roles = ROLES
    agents = {
        "hold": "sparring.games.diplomacy.bots:HoldBot",
        "random-legal": "sparring.games.diplomacy.bots:RandomLegalBot",
        "greedy": "sparring.games.diplomacy.bots:GreedyBot",
        "support": "sparring.games.diplomacy.bots:SupportBot",
        "greedy-press": "sparring.games.diplomacy.bots:GreedyPressBot",
        "support-press": "sparring.games.diplomacy.bots:SupportPressBot",
    }
    default_opponent = "greedy"
    extra_group_keys = ("country", "country_stage", "country_alliance")
    group_key_aliases = {"country_phase": "country_stage"}
    group_key_synonyms = {"init_country": "init_seat"}  # a seat is a country
    default_group_key = "init_seat"  # the seven powers' rewards differ
    # Seed 001's cross-country transfer: the vulnerable central powers, the corner powers,
    # the strong western powers (`train.transfer_weight`; docs/games.md, Diplomacy)
    transfer_pairs = (("AUSTRIA", "ITALY"), ("ENGLAND", "RUSSIA"), ("FRANCE", "GERMANY"))
    role_breakdown = "country"
    image_flavour = "diplomacy"  # the engine is AGPL-3.0: only the -diplomacy images hold it

    def __init__(self, **params: Any) -> None:
        self.cfg = DiplomacyConfig(**params)
        self.reward_fn = REWARDS[self.cfg.reward]
        self.state: dict[str, Any] | None = None

    def generate_state(self, seed: int) -> dict[str, Any]:
        c = self.cfg
        return generate_state(seed, c.stages, c.max_start_centers, c.allow_eliminated)

    def group_keys(self, seat: int) -> dict[str, str]:
        """`country` (the seat's power), `country_stage` (power / scenario stage) and
        `country_alliance` (power / its allies over the last year played, `alliances`: at the
        end of an episode, its last year; before any movement phase, `isolated`)."""
        power, phase = ROLES[seat], self.engine.get_current_phase()
        if phase not in self._alliances:  # the engine's history is slow to read: once a phase
            self._alliances[phase] = alliance_context(self.engine)
        return {
            "country": power,
            "country_stage": f"{power}/{self.state['stage']}",
            "country_alliance": self._alliances[phase][power],
        }

    # ---- lifecycle -----------------------------------------------------------------------------
    def reset(self, state: dict[str, Any]) -> None:
        self.state = state
        self.engine = Engine()
        self.engine.set_state(state["engine"])
        self.engine.remove_rule("NO_PRESS")
        self._rng = random.Random(f"{state['seed']}:auto")
        self._moves_done = 0
        self._end_phase = f"S{state['year'] + self.cfg.horizon}M"  # the episode ends here
        self._kind: Literal["press", "orders", "adjust"] = "press"
        self._press_round = 1
        self._outbox: list[tuple[str, str, str]] = []  # (sender, recipient, text) this round
        self._acted: set[int] = set()
        self._retries = [0] * 7
        self._done = False
        self._turn = 0
        self._transcript: list[TurnRecord] = []
        self._stats = GameStats([0] * 7, [0] * 7, [0] * 7)
        self.power_stats = [PowerStats() for _ in ROLES]
        self._feedback: list[list[str]] = [[] for _ in ROLES]
        self._chat = [[{"role": "system", "content": self._system_prompt()}] for _ in range(7)]
        self._alliances: dict[str, dict[str, str]] = {}  # phase -> `alliance_context`
        self._start_phase()

    @property
    def pending_seats(self) -> list[int]:
        if self._done:
            return []
        return [s for s in self._movers() if s not in self._acted]

    @property
    def done(self) -> bool:
        return self._done

    @property
    def action_kind(self) -> str:
        """What the pending seats are asked for now: "press", "orders" (movement) or "adjust"
        (retreats and builds, with `retreats: policy`)."""
        return self._kind

    @property
    def press_round(self) -> int:
        """Which press round of the phase is asked for now (1-based; meaningful in "press")."""
        return self._press_round

    @property
    def rewards(self) -> list[float]:
        return [self.reward_fn(r, self.cfg.invalid_penalty) for r in self.results()]

    def results(self) -> list[PowerResult]:
        """Each power's standing now (final once `done`)."""
        start = self.state["centers"]
        out = []
        for seat, power in enumerate(ROLES):
            centers, units = len(self.engine.get_centers(power)), len(self.engine.get_units(power))
            out.append(
                PowerResult(
                    power,
                    centers,
                    len(start[power]),
                    units,
                    self.power_stats[seat].invalid_orders,
                    eliminated=centers == 0 and units == 0,
                )
            )
        return out

    def outcome(self) -> dict[str, Any]:
        results = self.results()
        solo = [r.power for r in results if r.centers >= WIN_CENTERS]
        return {
            "stage": self.state["stage"],
            "start_phase": self.state["phase"],
            "end_phase": self.engine.get_current_phase(),
            "moves": self._moves_done,
            "centers": {r.power: r.centers for r in results},
            "start_centers": {r.power: r.start_centers for r in results},
            "eliminated": [r.power for r in results if r.eliminated],
            "solo": solo[0] if solo else None,
            "power_stats": {p: asdict(s) for p, s in zip(ROLES, self.power_stats, strict=True)},
            "conduct": conduct(moves_played(self.engine)),
        }

    # ---- the move ------------------------------------------------------------------------------
    def _act(self, seat: int, text: str) -> StepResult:
        """Press or orders. Invalid order candidates hold and are listed in `action["invalid"]`;
        a turn with only invalid orders is refused (ok=False) until its retries run out."""
        if self._kind == "press":
            action = self._press(seat, text)
        else:
            action = self._orders(seat, text)
            if action["invalid"] and not action["given"]:
                return self._refuse(seat, text, action)
            self._submit(seat, action)
        self._transcript.append(TurnRecord(self._turn, seat, text, True, action=action))
        self._acted.add(seat)
        if not self.pending_seats:
            self._advance()
        return StepResult(ok=True, action=action)

    def _refuse(self, seat: int, text: str, action: dict[str, Any]) -> StepResult:
        """Every order was invalid: tell the power why; after `max_retries` its units hold."""
        self._retries[seat] += 1
        forfeited = self._retries[seat] > self.cfg.max_retries
        error = "no valid order: " + _reasons(action["invalid"])
        self._transcript.append(TurnRecord(self._turn, seat, text, False, error, action, forfeited))
        if not forfeited:
            self._stats.invalid_actions[seat] += 1  # (`_submit` counts the forfeited try)
            self._tell(seat, f"Error: {error}. Write your orders again.")
            return StepResult(ok=False, error=error, action=action)
        self._submit(seat, action)
        self._acted.add(seat)
        if not self.pending_seats:
            self._advance()
        return StepResult(ok=False, error=error, action=action, forfeited=True)

    def _press(self, seat: int, text: str) -> dict[str, Any]:
        power = self._role(seat)
        sent = parse_press(text, power, self.cfg.press_max_messages, self.cfg.press_max_chars)
        self._outbox += [(power, recipient, body) for recipient, body in sent]
        self.power_stats[seat].press_sent += len(sent)
        return {"type": "press", "messages": [list(m) for m in sent]}

    def _orders(self, seat: int, text: str) -> dict[str, Any]:
        """Parse the power's orders (movement or, with `retreats: policy`, retreats/builds)."""
        power = self._role(seat)
        locs = self.engine.get_orderable_locations(power)
        parsed = parse_orders(text, self._possible_orders(), locs)
        stats = self.power_stats[seat]
        stats.orders += len(parsed.orders)
        stats.invalid_orders += len(parsed.invalid)
        invalid = [f"{line} ({why})" for line, why in parsed.invalid]
        if self._kind == "adjust":
            orders = [*parsed.orders.values(), *["WAIVE"] * parsed.waive]
        else:  # a movement phase: units without a legal order hold
            units = {u.split()[1].split("/")[0]: u for u in self.engine.get_units(power)}
            orders = [parsed.orders.get(loc, f"{units[loc]} H") for loc in locs]
            stats.missing_orders += len(locs) - len(parsed.orders)
        given = len(parsed.orders) + parsed.waive
        return {"type": "orders", "orders": orders, "invalid": invalid, "given": given}

    def _submit(self, seat: int, action: dict[str, Any]) -> None:
        """Hand the orders to the engine and note the invalid ones for the power's next view."""
        self.engine.set_orders(self._role(seat), action["orders"])
        self._retries[seat] = 0
        if action["invalid"]:
            self._stats.invalid_actions[seat] += 1  # turns with an invalid order
            self._feedback[seat].append(
                f"Invalid orders (those units held): {_reasons(action['invalid'])}"
            )

    def _advance(self) -> None:
        """Press round over -> next round or orders; orders in -> resolve and go on."""
        self._turn += 1
        self._acted = set()
        if self._kind == "press":
            last_round = self._press_round >= self.cfg.press_rounds
            self._kind = "orders" if last_round else "press"
            self._press_round += 1
            self._deliver_press(self._orders_prompt() if last_round else self._press_prompt())
            return
        moved = self.engine.phase_type == "M"
        self.engine.process()
        self._moves_done += moved
        while self.engine.phase_type != "M" and not self.engine.is_game_done:
            if self.cfg.retreats == "policy" and self._movers():
                self._kind = "adjust"
                for seat in self._movers():
                    self._tell(
                        seat, "\n".join([*self._take_feedback(seat), self._adjust_prompt(seat)])
                    )
                return
            set_auto_orders(self.engine, self._rng)
            self.engine.process()
        if self.engine.get_current_phase() == self._end_phase or self.engine.is_game_done:
            self._done = True
        else:
            self._start_phase()

    # ---- observations --------------------------------------------------------------------------
    def _movers(self) -> list[int]:
        """Seats that act now: powers with orderable locations."""
        return [s for s, p in enumerate(ROLES) if self.engine.get_orderable_locations(p)]

    def _start_phase(self) -> None:
        self._kind = "press" if self.cfg.press else "orders"
        self._press_round = 1
        if not self._movers():  # nobody can move (never in practice): end the episode
            self._done = True
            return
        ask = self._press_prompt() if self.cfg.press else self._orders_prompt()
        for seat in range(7):
            if self.cfg.recap == "years":  # a fresh chat: the rules, then the observation
                self._chat[seat] = self._chat[seat][:1]
            self._tell(seat, self.observation(seat) + "\n" + ask)

    def _deliver_press(self, ask: str) -> None:
        """Give every power the messages of the round just over, then the next request."""
        for seat, power in enumerate(ROLES):
            heard = [
                f"{sender}{' (to all)' if to == 'ALL' else ''}: {body}"
                for sender, to, body in self._outbox
                if to in (power, "ALL") and sender != power
            ]
            news = "Messages:\n" + "\n".join(heard) if heard else "No messages."
            self._tell(seat, news + "\n" + ask)
        phase = self.engine.get_current_phase()
        for sender, to, body in self._outbox:
            recipient = "GLOBAL" if to == "ALL" else to
            self.engine.add_message(
                Message(sender=sender, recipient=recipient, message=body, phase=phase)
            )
        self._outbox = []

    def observation(self, seat: int) -> str:
        """The text view of `seat` at the start of a movement phase: the board (the same for
        every power, so the seven prompts share it as a prefix), then the power's own part.
        With `recap: years` the earlier years' center counts come first (shared too) and
        the power's recent press before its own part."""
        year, power = int(self.engine.get_current_phase()[1:5]), self._role(seat)
        board = board_view(self.engine, year - self.state["year"] + 1, self.cfg.horizon)
        own = power_view(self.engine, power, self._possible_orders(), self.cfg.observation)
        years, press = [], []
        if self.cfg.recap == "years":
            years = center_history(self.engine, self.state["year"])
            press = press_digest(self.engine, power, self.cfg.press_history)
        return "\n".join([*years, board, *self._take_feedback(seat), *press, own])

    def _take_feedback(self, seat: int) -> list[str]:
        lines, self._feedback[seat] = self._feedback[seat], []
        return lines

    def _possible_orders(self) -> dict[str, list[str]]:
        """The engine's legal orders per location, computed once per position
        (`bots.possible_orders`: all seven powers' prompts and orders, and the bots, need them)."""
        return possible_orders(self.engine)

    def _adjust_prompt(self, seat: int) -> str:
        return adjust_prompt(self.engine, self._role(seat), self._possible_orders())

    def _press_prompt(self) -> str:
        return (
            f"Press round {self._press_round} of {self.cfg.press_rounds}: up to "
            f"{self.cfg.press_max_messages} lines '[to GERMANY] message' or '[to ALL] message' "
            "(other lines stay private), or NONE."
        )

    @staticmethod
    def _orders_prompt() -> str:
        return "Orders, one per line (e.g. A PAR - BUR, A MAR S A PAR - BUR, F BRE H):"

    def _system_prompt(self) -> str:
        """The rules, the same for every power (each observation says which power it is), so
        all prompts of a rollout share them as a prefix."""
        years = f"{self.cfg.horizon} game year" + ("s" if self.cfg.horizon > 1 else "")
        press = (
            "Before orders you may send messages: a line '[to FRANCE] text' goes to France, "
            "'[to ALL] text' to everyone; other lines are private notes. "
            if self.cfg.press
            else ""
        )
        builds = (
            "After fall you choose retreats and builds from the listed options. "
            if self.cfg.retreats == "policy"
            else "Retreats and builds are automatic. "
        )
        return (
            "You play one of the seven powers in Diplomacy (standard map, 34 supply centers). "
            f"Own as many supply centers as you can after {years}; centers change hands "
            f"after each fall. {press}Give one order per unit: hold 'A PAR H', move "
            "'A PAR - BUR', support 'A MAR S A PAR - BUR' or 'A MAR S F BRE', convoy "
            f"'F ENG C A LON - BRE'. Illegal or missing orders hold. {builds}"
        )

    @staticmethod
    def _role(seat: int) -> str:
        return ROLES[seat]

    # ---- hooks: turn budget, per-power metrics, every bot in evaluation, the country report ----
    @classmethod
    def turn_budget(cls, params: dict[str, Any]) -> int:
        """Seven powers' turns in every round of every phase: per year two movement phases
        (press rounds and orders) and, with `retreats: policy`, up to three adjustments."""
        c = DiplomacyConfig(**params)
        press = c.press_rounds if c.press else 0
        rounds = 2 * (press + 1) + (3 if c.retreats == "policy" else 0)
        return len(ROLES) * c.horizon * rounds

    @classmethod
    def episode_metrics(cls, plays: list[Play]) -> dict[str, float]:
        return power_metrics(plays)

    @classmethod
    def eval_lineups(cls, mode: str, opponent: str | None) -> list[Lineup]:
        """`vs_scripted` also plays each other bot of `BOTS` as its own mode `vs_<bot>`: the
        learner in each country in turn, that bot in the other six."""
        lineups = super().eval_lineups
        if mode != VS_SCRIPTED:
            return lineups(mode, opponent)
        others = [
            Lineup(f"vs_{b}", x.seats) for b in BOTS if b != opponent for x in lineups(mode, b)
        ]
        return lineups(mode, opponent) + others

    @classmethod
    def baselines(cls) -> tuple[Baseline, ...]:
        """Each bot of `BOTS` in the learner's country against the `vs_scripted` opponent in the
        other six, played: `hold` and `random-legal` trivial, `greedy` and `support`
        references."""
        trivial = ("hold", "random-legal")
        return tuple(Baseline(b, VS_SCRIPTED, trivial=b in trivial, agent=b) for b in BOTS)

    def policy_metrics(
        self, policy: Any, temperature: float, play: PlayGames | None = None
    ) -> dict[str, float]:
        """The strategic evaluator (`strategic.py`) when `strategic.scenarios` > 0: the policy
        on its scenario sets, at `temperature`, played by `play`,
        `strategic/<dimension>/<COUNTRY>/<metric>`."""
        from sparring.games import GameSpec
        from sparring.games.diplomacy.strategic import evaluate_strategic, scenario_sets
        from sparring.generation.base import SamplingParams

        s = self.cfg.strategic
        if not s.scenarios:
            return {}
        if play is None:
            raise ValueError("the strategic evaluator plays games: pass the engine's play_games")
        sampling = SamplingParams(temperature=temperature, max_new_tokens=s.max_new_tokens)
        game = GameSpec(name=self.name, params=self.cfg.model_dump(exclude={"strategic"}))
        return evaluate_strategic(
            policy, scenario_sets(s), play, game, sampling, s.opponent_bot, s.horizon
        )

    @classmethod
    def write_report(cls, metrics: dict[str, float], out_dir: Path) -> dict[str, Path]:
        """The country table and heatmap, and the strategic evaluator's where it ran."""
        from sparring.games.diplomacy.report import (
            country_grid,
            strategic_cells,
            write_country_report,
            write_strategic_report,
        )

        paths = write_country_report(metrics, out_dir) if country_grid(metrics) else {}
        if strategic_cells(metrics):
            paths |= write_strategic_report({"policy": metrics}, out_dir)
        return paths

    @classmethod
    def write_comparison(
        cls, by_model: dict[str, dict[str, float]], out_dir: Path
    ) -> dict[str, Path]:
        """The strategic table and heatmap, models side by side."""
        from sparring.games.diplomacy.report import write_strategic_report

        return write_strategic_report(by_model, out_dir)


def _reasons(invalid: list[str]) -> str:
    """The first few invalid candidates with their reasons, for the power's feedback."""
    return "; ".join(invalid[:5]) + (f"; and {len(invalid) - 5} more" if len(invalid) > 5 else "")

"""Diplomacy: seven powers over the `diplomacy` engine (PyPI 1.1.2, AGPL-3.0, optional extra).

    game = make_game("diplomacy", horizon=4, press=True)
    game.reset(game.generate_state(seed=0))
    while not game.done:
        for seat in game.pending_seats:          # simultaneous: every power that must act
            game.step(seat, policy(game.messages(seat)))
    game.rewards                                  # one float per power

Rules of the adapter:
- Seats are the seven powers (`ROLES`). An episode starts from a **scenario** (see
  `generate_state`): a 1901 opening or a later position reached by scripted play, labelled
  with its stage (opening 1901-03, midgame 1904-08, endgame 1909+). It runs for `horizon`
  movement phases, then the following retreat/adjustment phases, and ends at the next
  movement phase (or when the engine says the game is over).
- Each movement phase: an optional **press** round (every power with units writes lines
  `POWER: message` or `ALL: message`, sent through the engine's `Message`), then **orders**
  (every power with orderable locations writes one order per line, simultaneously).
- Order parsing is forgiving (case, bullets, `->`, `to`, `HOLD`, `SUPPORTS`, missing coast).
  A line that starts like an order (`A xxx`/`F xxx`) but is not a legal order of one of the
  power's units is **invalid**: the unit holds and the power's invalid count grows. Other
  lines are free text and ignored. Units without an order hold (counted as missing).
- Retreats and builds are not asked of the policy; `auto_orders` plays them (a random legal
  retreat else disband; builds in free home centers up to the allowance; the engine's civil
  disorder rule picks disbands).
- Reward (swappable, `REWARDS`): by default a power's supply centers at the end / 18, capped
  at 1, minus `invalid_penalty` per invalid order; an eliminated power gets exactly 0.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from sparring.games.base import Game, GameStats, StepResult, TurnRecord
from sparring.games.diplomacy.board import ROLES, WIN_CENTERS, Engine, Message
from sparring.games.diplomacy.orders import parse_orders, parse_press
from sparring.games.diplomacy.scenarios import generate_state, set_auto_orders


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
    """centers / 18 capped at 1, minus a penalty per invalid order; eliminated = 0."""
    if r.eliminated:
        return 0.0
    return min(r.centers / WIN_CENTERS, 1.0) - invalid_penalty * r.invalid_orders


def center_gain_reward(r: PowerResult, invalid_penalty: float) -> float:
    """0.5 + (centers gained since the scenario start) / 18, clipped to [0, 1], minus the
    invalid-order penalty; eliminated = 0. Fairer across unequal mid-game starts."""
    if r.eliminated:
        return 0.0
    gain = 0.5 + (r.centers - r.start_centers) / WIN_CENTERS
    return min(max(gain, 0.0), 1.0) - invalid_penalty * r.invalid_orders


RewardFn = Callable[[PowerResult, float], float]
REWARDS: dict[str, RewardFn] = {"centers": centers_reward, "center_gain": center_gain_reward}


class DiplomacyConfig(BaseModel):
    """Rule parameters of a Diplomacy episode (the `game_params` of a run)."""

    horizon: int = Field(2, ge=1)
    """Movement phases per episode (2 = one game year)."""
    press: bool = True
    """Run a press round before each movement phase's orders."""
    press_max_messages: int = Field(3, ge=0)
    """Press lines kept per power per round."""
    press_max_chars: int = Field(160, ge=1)
    """Each press message is cut to this many characters."""
    observation: Literal["compact", "full"] = "compact"
    """compact: per unit, its move destinations; full: every legal order of every unit."""
    reward: str = "centers"
    """Name of the reward function in `REWARDS`."""
    invalid_penalty: float = Field(0.01, ge=0.0)
    """Subtracted from the reward per invalid order."""
    stages: list[Literal["opening", "midgame", "endgame"]] = ["opening", "midgame", "endgame"]
    """Scenario stages `generate_state` draws from (uniformly)."""

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
    }
    default_opponent = "greedy"
    extra_group_keys = ("country", "country_stage")
    group_key_aliases = {"country_phase": "country_stage"}

    def __init__(self, **params: Any) -> None:
        self.cfg = DiplomacyConfig(**params)
        self.reward_fn = REWARDS[self.cfg.reward]
        self.state: dict[str, Any] | None = None

    def generate_state(self, seed: int) -> dict[str, Any]:
        return generate_state(seed, self.cfg.stages)

    def group_keys(self, seat: int) -> dict[str, str]:
        """`country` (the seat's power) and `country_stage` (power / scenario stage)."""
        return {"country": ROLES[seat], "country_stage": f"{ROLES[seat]}/{self.state['stage']}"}

    # ---- lifecycle -----------------------------------------------------------------------------
    def reset(self, state: dict[str, Any]) -> None:
        self.state = state
        self.engine = Engine()
        self.engine.set_state(state["engine"])
        self.engine.remove_rule("NO_PRESS")
        self._rng = random.Random(f"{state['seed']}:auto")
        self._moves_done = 0
        self._kind: Literal["press", "orders"] = "press"
        self._acted: set[int] = set()
        self._done = False
        self._turn = 0
        self._transcript: list[TurnRecord] = []
        self._stats = GameStats([0] * 7, [0] * 7, [0] * 7)
        self.power_stats = [PowerStats() for _ in ROLES]
        self._feedback: list[list[str]] = [[] for _ in ROLES]
        self._chat = [[{"role": "system", "content": self._system_prompt()}] for _ in range(7)]
        self._possible: tuple[str, dict[str, list[str]]] = ("", {})  # (phase, legal orders)
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
        """What the pending seats are asked for now: "press" or "orders"."""
        return self._kind

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
        }

    # ---- the move ------------------------------------------------------------------------------
    def _act(self, seat: int, text: str) -> StepResult:
        """Press or orders; invalid order lines hold and are listed in `action["invalid"]`."""
        action = self._press(seat, text) if self._kind == "press" else self._orders(seat, text)
        self._transcript.append(TurnRecord(self._turn, seat, text, True, action=action))
        self._acted.add(seat)
        if not self.pending_seats:
            self._advance()
        return StepResult(ok=True, action=action)

    def _press(self, seat: int, text: str) -> dict[str, Any]:
        power, phase = self._role(seat), self.engine.get_current_phase()
        sent = parse_press(text, power, self.cfg.press_max_messages, self.cfg.press_max_chars)
        for recipient, body in sent:
            to = "GLOBAL" if recipient == "ALL" else recipient
            self.engine.add_message(Message(sender=power, recipient=to, message=body, phase=phase))
        self.power_stats[seat].press_sent += len(sent)
        return {"type": "press", "messages": [list(m) for m in sent]}

    def _orders(self, seat: int, text: str) -> dict[str, Any]:
        """Parse and hand the power's orders to the engine; a unit without a legal order holds
        (the action's `orders` are exactly what the engine gets, holds included)."""
        power = self._role(seat)
        locs = self.engine.get_orderable_locations(power)
        orders, invalid = parse_orders(text, self._possible_orders(), locs)
        stats = self.power_stats[seat]
        stats.orders += len(orders)
        stats.invalid_orders += len(invalid)
        stats.missing_orders += len(locs) - len(orders)
        units = {u.split()[1].split("/")[0]: u for u in self.engine.get_units(power)}
        orders = [orders.get(loc, f"{units[loc]} H") for loc in locs]  # unordered units hold
        self.engine.set_orders(power, orders)
        self._stats.invalid_actions[seat] += bool(invalid)  # turns with an invalid order
        if invalid:
            self._feedback[seat].append(f"Invalid orders ignored: {'; '.join(invalid[:5])}")
        return {"type": "orders", "orders": orders, "invalid": invalid}

    def _advance(self) -> None:
        """Press round over -> ask for orders; orders in -> resolve the phase and go on."""
        self._turn += 1
        self._acted = set()
        if self._kind == "press":
            self._kind = "orders"
            self._deliver_press()
            return
        self.engine.process()
        self._moves_done += 1
        while self.engine.phase_type != "M" and not self.engine.is_game_done:
            set_auto_orders(self.engine, self._rng)
            self.engine.process()
        if self._moves_done >= self.cfg.horizon or self.engine.is_game_done:
            self._done = True
        else:
            self._start_phase()

    # ---- observations --------------------------------------------------------------------------
    def _movers(self) -> list[int]:
        """Seats that act now: powers with orderable locations."""
        return [s for s, p in enumerate(ROLES) if self.engine.get_orderable_locations(p)]

    def _start_phase(self) -> None:
        self._kind = "press" if self.cfg.press else "orders"
        if not self._movers():  # nobody can move (never in practice): end the episode
            self._done = True
            return
        for seat in range(7):
            ask = self._press_prompt() if self.cfg.press else self._orders_prompt()
            self._tell(seat, self.observation(seat) + "\n" + ask)

    def _deliver_press(self) -> None:
        phase = self.engine.get_current_phase()
        for seat, power in enumerate(ROLES):
            heard = [
                f"{m.sender}{' (to all)' if m.recipient == 'GLOBAL' else ''}: {m.message}"
                for m in self.engine.messages.values()
                if m.phase == phase and m.recipient in (power, "GLOBAL") and m.sender != power
            ]
            news = "Messages:\n" + "\n".join(heard) if heard else "No messages."
            self._tell(seat, news + "\n" + self._orders_prompt())

    def observation(self, seat: int) -> str:
        """The compact text view of `seat` at the start of a movement phase."""
        e, power = self.engine, self._role(seat)
        phase = e.get_current_phase()
        head = (
            f"{'Spring' if phase[0] == 'S' else 'Fall'} {phase[1:5]}, move {self._moves_done + 1} of "
            f"{self.cfg.horizon}."
        )
        counts = " ".join(f"{p[:3]} {len(e.get_centers(p))}" for p in ROLES)
        units = "; ".join(f"{p[:3]} {', '.join(e.get_units(p))}" for p in ROLES if e.get_units(p))
        lines = [  # the board first: the same for all seven powers, a prefix their prompts share
            head,
            f"Centers: {counts}",
            f"Units: {units}",
            f"You are {power}. Your centers: {' '.join(sorted(e.get_centers(power))) or 'none'}",
            *self._feedback[seat],
        ]
        self._feedback[seat] = []
        locs = e.get_orderable_locations(power)
        if not locs:
            return "\n".join([*lines, "You have no units to order."])
        possible = self._possible_orders()
        lines.append(
            "Your units and legal moves:"
            if self.cfg.observation == "compact"
            else "Your units and legal orders:"
        )
        for unit in e.get_units(power):
            legal = possible.get(unit.split()[1].split("/")[0], [])
            if self.cfg.observation == "full":
                lines.append(f"{unit}: " + " | ".join(sorted(legal)))
            else:
                dests = sorted(
                    {
                        o.split(" - ")[1]
                        for o in legal
                        if " - " in o
                        and " S " not in o
                        and " C " not in o
                        and not o.endswith("VIA")
                    }
                )
                lines.append(f"{unit} -> {' '.join(dests) or '(hold only)'}")
        return "\n".join(lines)

    def _possible_orders(self) -> dict[str, list[str]]:
        """The engine's legal orders per location, computed once per phase (the engine
        recomputes them on every call, and all seven powers' prompts and orders need them)."""
        phase = self.engine.get_current_phase()
        if self._possible[0] != phase:
            self._possible = (phase, self.engine.get_all_possible_orders())
        return self._possible[1]

    def _press_prompt(self) -> str:
        return (
            f"Press: up to {self.cfg.press_max_messages} lines 'POWER: message' or "
            "'ALL: message', or NONE."
        )

    @staticmethod
    def _orders_prompt() -> str:
        return "Orders, one per line (e.g. A PAR - BUR, A MAR S A PAR - BUR, F BRE H):"

    def _system_prompt(self) -> str:
        """The rules, the same for every power (each observation says which power it is), so
        all prompts of a rollout share them as a prefix."""
        press = "send short messages, then " if self.cfg.press else ""
        return (
            "You play one of the seven powers in Diplomacy (standard map, 34 supply centers). "
            f"Own as many supply centers as you can after {self.cfg.horizon} movement "
            f"phases. Each phase you {press}give one order per unit: hold 'A PAR H', move "
            "'A PAR - BUR', support 'A MAR S A PAR - BUR', convoy 'F ENG C A LON - BRE'. "
            "Illegal or missing orders hold. Retreats and builds are automatic."
        )

    @staticmethod
    def _role(seat: int) -> str:
        return ROLES[seat]

    # ---- hooks: per-country metrics, the vs-every-bot evaluation and its report ----------------
    @classmethod
    def episode_metrics(cls, episodes: list[dict[str, Any]], policy: str) -> dict[str, float]:
        from sparring.games.diplomacy.metrics import country_metrics

        return country_metrics(episodes, policy)

    @classmethod
    def scripted_eval(cls, policy: Any, inits: list, cfg: Any, progress: bool) -> Any:
        from sparring.games.diplomacy.report import vs_bots

        return vs_bots(policy, inits, cfg, progress)

    @classmethod
    def write_report(cls, metrics: dict[str, float], out_dir: Path) -> dict[str, Path]:
        from sparring.games.diplomacy.report import write_country_report

        if not any(k.endswith("/all/reward_mean") for k in metrics):  # no vs-bots eval ran
            return {}
        return write_country_report(metrics, out_dir)

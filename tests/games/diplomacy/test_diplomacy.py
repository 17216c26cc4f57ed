"""The Diplomacy adapter against the real `diplomacy` engine, the scripted bots, and a fuzz."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("diplomacy")

from sparring.games import make_game  # noqa: E402
from sparring.games.diplomacy import ROLES, DiplomacyGame  # noqa: E402
from sparring.games.diplomacy.bots import greedy_orders, random_orders  # noqa: E402
from sparring.games.diplomacy.orders import normalize_order, parse_orders  # noqa: E402
from sparring.games.diplomacy.scenarios import stage_of  # noqa: E402

make_agent = DiplomacyGame.make_agent

FRANCE, ENGLAND = ROLES.index("FRANCE"), ROLES.index("ENGLAND")


def opening(**params) -> DiplomacyGame:
    """A game reset to the 1901 opening (seed 2 draws S1901M)."""
    game = make_game("diplomacy", **params)
    state = game.generate_state(2)
    assert state["phase"] == "S1901M"
    game.reset(state)
    return game


def hold_everyone_but(game: DiplomacyGame, texts: dict[int, str]) -> dict[int, dict]:
    """Play one stage: seats in `texts` send that text, every other pending seat holds."""
    hold = make_agent("hold")
    actions = {}
    for seat in list(game.pending_seats):
        actions[seat] = game.step(seat, texts.get(seat, hold.act(game, seat))).action
    return actions


def test_generate_state_is_seeded_json_and_staged():
    game = make_game("diplomacy")
    states = [game.generate_state(s) for s in range(8)]
    assert [game.generate_state(s) for s in range(8)] == states
    for state in states:
        assert json.loads(json.dumps(state)) == state
        assert state["phase"] == f"S{state['year']}M"
        assert state["stage"] == stage_of(state["year"])
    assert {s["stage"] for s in states} == {"opening", "midgame", "endgame"}
    only = make_game("diplomacy", stages=["midgame"]).generate_state(0)
    assert only["stage"] == "midgame"


def test_orders_given_are_the_orders_processed_and_illegal_ones_hold():
    game = opening(press=False)
    phase = game.engine.get_current_phase()
    rng = random.Random(0)
    texts = {s: "\n".join(random_orders(game.engine, p, rng)) for s, p in enumerate(ROLES)}
    texts[FRANCE] = "A PAR - MOS\nF BRE - PAR\nI think we should attack.\nA MUN - BUR\nA MAR H"
    actions = hold_everyone_but(game, texts)
    processed = game.engine.order_history[phase]
    for seat, power in enumerate(ROLES):
        assert sorted(processed[power]) == sorted(actions[seat]["orders"])
    assert actions[FRANCE]["invalid"] == ["A PAR - MOS", "F BRE - PAR", "A MUN - BUR"]
    assert sorted(actions[FRANCE]["orders"]) == ["A MAR H", "A PAR H", "F BRE H"]
    assert game.stats.invalid_actions[FRANCE] == 1  # one turn with invalid orders
    assert game.power_stats[FRANCE].invalid_orders == 3
    assert game.power_stats[FRANCE].invalid_orders == 3
    assert "Invalid orders ignored: A PAR - MOS" in game.messages(FRANCE)[-1]["content"]


def test_center_counts_and_reward_match_the_engine():
    game = make_game("diplomacy", horizon=2, press=False, invalid_penalty=0.05)
    game.reset(game.generate_state(0))
    bots = [make_agent("greedy") for _ in ROLES]
    first = True
    while not game.done:
        texts = {s: bots[s].act(game, s) for s in game.pending_seats}
        if first:
            texts[ENGLAND] += "\nF LON - MOS"  # one invalid order for England
            first = False
        hold_everyone_but(game, texts)
    outcome = game.outcome()
    for seat, power in enumerate(ROLES):
        centers = len(game.engine.get_centers(power))
        assert outcome["centers"][power] == centers
        expected = (
            0.0
            if centers == 0 and not game.engine.get_units(power)
            else min(centers / 18, 1.0) - 0.05 * (seat == ENGLAND)
        )
        assert game.rewards[seat] == pytest.approx(expected)
    gain = make_game("diplomacy", reward="center_gain")
    assert gain.reward_fn is not game.reward_fn


def test_full_episode_with_scripted_bots_and_press():
    game = make_game("diplomacy", horizon=4)
    game.reset(game.generate_state(1))
    names = ["greedy", "random-legal", "hold", "greedy", "random-legal", "greedy", "hold"]
    bots = [make_agent(n) for n in names]
    steps = 0
    while not game.done:
        assert game.pending_seats
        for seat in game.pending_seats:
            text = bots[seat].act(game, seat)
            if seat == FRANCE and game.action_kind == "press":
                text = "ENGLAND: let us split the channel\nALL: peace\nfrance: self"
            assert game.step(seat, text).ok
            steps += 1
        chat = game.messages(FRANCE)
        assert chat[0]["role"] == "system"
        assert all(a["role"] != b["role"] for a, b in zip(chat[1:], chat[2:], strict=False))
    assert game.pending_seats == []
    assert steps > 0 and game.num_turns == steps
    assert sum(game.outcome()["centers"].values()) <= 34
    heard = "\n".join(m["content"] for m in game.messages(ENGLAND))
    assert "FRANCE: let us split the channel" in heard
    assert "FRANCE (to all): peace" in heard
    assert game.power_stats[FRANCE].press_sent == 2 * 4
    assert not game.step(FRANCE, "A PAR H").ok  # the game is over


def test_observation_is_compact_and_messages_alternate():
    game = opening()
    obs = game.messages(FRANCE)[-1]["content"]
    assert "You are FRANCE" in obs and "A PAR -> BRE BUR GAS PIC" in obs
    assert len(obs) < 800
    assert not game.step(FRANCE, "A PAR H").action["type"] == "orders"  # press comes first
    assert FRANCE not in game.pending_seats
    assert not game.step(FRANCE, "again").ok


def test_all_powers_prompts_share_the_rules_and_the_board():
    """The prefix the hf backend prefills once per game: system prompt, then the board."""
    game = opening()
    chats = [game.messages(seat) for seat in range(7)]
    assert len({chat[0]["content"] for chat in chats}) == 1  # the rules name no power
    boards = {tuple(chat[1]["content"].splitlines()[:3]) for chat in chats}
    assert len(boards) == 1
    (board,) = boards
    assert board[1].startswith("Centers: AUS 3") and board[2].startswith("Units: AUS A BUD")
    assert all(
        f"You are {p}." in chat[1]["content"].splitlines()[3]
        for p, chat in zip(ROLES, chats, strict=True)
    )


def test_parser_normalizes_common_spellings():
    game = opening(press=False)
    possible = game.engine.get_all_possible_orders()
    russia = game.engine.get_orderable_locations("RUSSIA")
    text = "1. a war to gal\n- F STP - BOT.\n* army mos -> ukr\nF SEV HOLD\nA WAR - SIL"
    orders, invalid = parse_orders(text, possible, russia)
    assert orders == {
        "WAR": "A WAR - GAL",
        "STP": "F STP/SC - BOT",
        "MOS": "A MOS - UKR",
        "SEV": "F SEV H",
    }
    assert invalid == ["A WAR - SIL"]  # a second order for the same unit
    assert normalize_order("A PAR supports A MAR hold") == "A PAR S A MAR"


def test_scripted_bots_give_legal_orders_and_greedy_heads_for_centers():
    game = opening(press=False)
    possible = game.engine.get_all_possible_orders()
    for power in ROLES:
        for order in greedy_orders(game.engine, power):
            assert order in possible[order.split()[1].split("/")[0]]
    assert "A MAR - SPA" in greedy_orders(game.engine, "FRANCE")
    assert make_agent("hold").act(game, FRANCE) == "F BRE H\nA MAR H\nA PAR H"


def test_group_keys():
    game = opening()
    assert game.group_keys(FRANCE) == {"country": "FRANCE", "country_stage": "FRANCE/opening"}
    assert game.group_keys(0)["country"] == "AUSTRIA"


PIECES = st.sampled_from(
    [
        "A ",
        "F ",
        "PAR",
        "BUR",
        "STP/SC",
        " - ",
        " S ",
        " C ",
        " H",
        "\n",
        "VIA",
        "->",
        "ALL:",
        "ENGLAND:",
        "é",
        "\x00",
        "1.",
        "army",
        "hold",
        "  ",
    ]
)
TEXTS = st.one_of(st.text(max_size=200), st.lists(PIECES, max_size=40).map("".join))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(TEXTS, min_size=1, max_size=30))
def test_fuzzed_text_never_crashes(texts):
    game = opening(horizon=1)
    i = 0
    while not game.done:
        for seat in game.pending_seats:
            legal = sum(game.engine.get_all_possible_orders().values(), [])
            result = game.step(seat, texts[i % len(texts)])
            i += 1
            assert result.ok
            if result.action["type"] == "orders":
                assert all(o in legal for o in result.action["orders"])
    assert len(game.rewards) == 7


def test_country_metrics_from_played_episodes():
    from dataclasses import asdict

    from sparring.games.diplomacy.metrics import country_metrics
    from sparring.rollout import RolloutConfig, play

    names = ["greedy", "random-legal", "hold", "greedy", "random-legal", "greedy", "hold"]
    cfg = RolloutConfig(
        game={"name": "diplomacy", "params": {"horizon": 2}}, games_per_init=2, seats=names
    )
    game = make_game("diplomacy")
    inits = [(f"i{s}", game.generate_state(s)) for s in range(2)]
    result = play(inits, {n: make_agent(n) for n in set(names)}, cfg, progress=False)
    episodes = [json.loads(json.dumps(asdict(ep))) for ep in result.episodes]
    metrics = country_metrics(episodes, policy="greedy")
    assert {k.split("/")[1] for k in metrics} == {"AUSTRIA", "GERMANY", "RUSSIA"}
    rewards = [ep["rewards"][0] for ep in episodes]
    assert metrics["country/AUSTRIA/episodes"] == 4
    assert metrics["country/AUSTRIA/reward_mean"] == pytest.approx(sum(rewards) / 4)
    assert metrics["country/AUSTRIA/centers"] == pytest.approx(18 * sum(rewards) / 4)
    assert metrics["country/AUSTRIA/moves"] == 2
    assert metrics["country/AUSTRIA/invalid_order_rate"] == 0
    assert len(country_metrics(episodes)) == 7 * 9

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
from sparring.games.diplomacy.game import PowerResult, centers_reward  # noqa: E402
from sparring.games.diplomacy.orders import normalize_order, parse_orders, parse_press  # noqa: E402
from sparring.games.diplomacy.scenarios import generate_state, stage_of, start_center_table  # noqa: E402

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


def test_scenario_filters_drop_lopsided_starts_by_default():
    stages = ["midgame", "endgame"]
    raw = [generate_state(s, stages) for s in range(12)]  # no filter
    lopsided = [
        s for s in raw if max(len(c) for c in s["centers"].values()) > 10 or s["eliminated"]
    ]
    assert lopsided, "bot play should produce some lopsided starts"
    game = make_game("diplomacy", stages=stages)  # default filters: <= 10 centers, no one out
    for s in lopsided:
        state = game.generate_state(s["seed"])
        assert state["attempts"] > 1 and not state["eliminated"]
        assert max(len(c) for c in state["centers"].values()) <= 10
    table = start_center_table(raw)
    assert table.splitlines()[0] == "| power | mean | min | max | eliminated |"
    assert len(table.splitlines()) == 2 + len(ROLES)


def test_orders_given_are_the_orders_processed_and_illegal_ones_hold():
    game = opening(press=False)
    phase = game.engine.get_current_phase()
    rng = random.Random(0)
    texts = {s: "\n".join(random_orders(game.engine, p, rng)) for s, p in enumerate(ROLES)}
    # another power's unit (A MUN) is free text, not an invalid order of France's
    texts[FRANCE] = "A PAR - MOS\nF BRE - PAR\nI think we should attack.\nA MUN - BUR\nA MAR H"
    actions = hold_everyone_but(game, texts)
    processed = game.engine.order_history[phase]
    for seat, power in enumerate(ROLES):
        assert sorted(processed[power]) == sorted(actions[seat]["orders"])
    why = "not a legal order for your unit in"
    assert actions[FRANCE]["invalid"] == [f"A PAR - MOS ({why} PAR)", f"F BRE - PAR ({why} BRE)"]
    assert sorted(actions[FRANCE]["orders"]) == ["A MAR H", "A PAR H", "F BRE H"]
    assert game.stats.invalid_actions[FRANCE] == 1  # one turn with invalid orders
    assert game.power_stats[FRANCE].invalid_orders == 2
    told = game.messages(FRANCE)[-1]["content"]
    assert f"Invalid orders (those units held): A PAR - MOS ({why} PAR)" in told


def test_center_counts_and_reward_match_the_engine():
    game = make_game("diplomacy", horizon=1, press=False, invalid_penalty=0.05)
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


def test_one_year_of_greedy_play_changes_centers_so_the_reward_has_signal():
    game = opening(press=False)  # horizon=1: one game year
    bots = [make_agent("greedy") for _ in ROLES]
    while not game.done:
        hold_everyone_but(game, {s: bots[s].act(game, s) for s in game.pending_seats})
    out = game.outcome()
    assert out["end_phase"] == "S1902M" and out["moves"] == 2
    assert out["centers"] != out["start_centers"]  # fall captured neutral centers
    assert sum(out["centers"].values()) > 22
    assert len(set(game.rewards)) > 1


def test_reward_has_a_floor_at_zero():
    r = PowerResult("FRANCE", 3, 3, 3, invalid_orders=500, eliminated=False)
    assert centers_reward(r, 0.01) == 0.0
    game = opening(press=False, invalid_penalty=0.5)
    hold_everyone_but(game, {FRANCE: "A PAR - MOS\nA MAR H"})
    assert game.rewards[FRANCE] == 0.0 and min(game.rewards) >= 0.0


def test_a_turn_whose_every_order_is_invalid_is_refused_then_retried_then_forfeited():
    game = opening(press=False, max_retries=1)
    first = game.step(FRANCE, "A PAR - MOS\nF BRE - MUN")
    assert not first.ok and not first.forfeited and "no valid order" in first.error
    assert (
        FRANCE in game.pending_seats
        and "Error: no valid order" in game.messages(FRANCE)[-1]["content"]
    )
    second = game.step(FRANCE, "A PAR - MOS")
    assert not second.ok and second.forfeited and FRANCE not in game.pending_seats
    assert sorted(second.action["orders"]) == ["A MAR H", "A PAR H", "F BRE H"]
    assert game.stats.invalid_actions[FRANCE] == 2
    assert game.step(ENGLAND, "Let me think about this.").ok  # free text only: all units hold


def test_retreats_and_builds_by_the_policy_list_the_legal_options():
    game = opening(press=False, retreats="policy")
    bots = [make_agent("greedy") for _ in ROLES]
    asked = []
    while not game.done:
        for seat in list(game.pending_seats):
            if game.action_kind == "adjust":
                asked.append((seat, game.messages(seat)[-1]["content"]))
            assert game.step(seat, bots[seat].act(game, seat)).ok
    assert asked and all("Legal orders" in text for _, text in asked)
    seat, text = next((s, t) for s, t in asked if "build" in t)
    assert " B" in text and "WAIVE" in text
    power = ROLES[seat]
    assert len(game.engine.get_units(power)) == len(game.engine.get_centers(power))
    with pytest.raises(ValueError):
        make_game("diplomacy", retreats="random")


def test_full_episode_with_scripted_bots_and_press():
    game = make_game("diplomacy", horizon=2)
    game.reset(game.generate_state(1))
    names = ["greedy", "random-legal", "hold", "greedy", "random-legal", "greedy", "hold"]
    bots = [make_agent(n) for n in names]
    steps = 0
    while not game.done:
        assert game.pending_seats
        for seat in game.pending_seats:
            text = bots[seat].act(game, seat)
            if seat == FRANCE and game.action_kind == "press":
                text = (
                    "Germany: is a reasoning line, never sent\n[to ENGLAND] let us split the "
                    "channel\n**[to ALL]** peace\n[to france] self"
                )
            assert game.step(seat, text).ok
            steps += 1
        chat = game.messages(FRANCE)
        assert chat[0]["role"] == "system"
        assert all(a["role"] != b["role"] for a, b in zip(chat[1:], chat[2:], strict=False))
    assert game.pending_seats == []
    assert steps > 0 and game.num_turns == steps
    assert steps == DiplomacyGame.turn_budget({"horizon": 2})  # 7 powers x 2 years x 2 x 3 rounds
    assert sum(game.outcome()["centers"].values()) <= 34
    heard = "\n".join(m["content"] for m in game.messages(ENGLAND))
    assert "FRANCE: let us split the channel" in heard
    assert "FRANCE (to all): peace" in heard
    assert "reasoning line" not in "".join(
        m["content"] for s in range(7) for m in game.messages(s)[1:] if s != FRANCE
    )
    assert game.power_stats[FRANCE].press_sent == 2 * 4 * 2  # 2 messages, 4 moves, 2 rounds
    assert not game.step(FRANCE, "A PAR H").ok  # the game is over


def test_press_rounds_let_a_power_answer_before_orders():
    game = opening(press_rounds=2)
    hold_everyone_but(game, {FRANCE: "[to ENGLAND] DMZ in the Channel?"})
    assert game.action_kind == "press"  # round 2
    assert "FRANCE: DMZ in the Channel?" in game.messages(ENGLAND)[-1]["content"]
    hold_everyone_but(game, {ENGLAND: "[to FRANCE] Agreed."})
    assert game.action_kind == "orders"
    last = game.messages(FRANCE)[-1]["content"]
    assert "ENGLAND: Agreed." in last and last.rstrip().endswith(":")
    assert parse_press("Germany: hi\n[to GERMANY]\n[to Prussia] x", "FRANCE", 3, 99) == []


def test_observation_shows_owners_supports_and_last_orders_with_results():
    game = opening()
    obs = game.messages(FRANCE)[-1]["content"]
    assert "You are FRANCE" in obs and "A PAR -> BRE BUR GAS PIC" in obs
    assert "FRA BRE MAR PAR" in obs and "unowned: BEL BUL DEN" in obs
    assert "A MAR -> BUR GAS PIE SPA | S into BUR GAS PIE\n" in obs  # nobody else reaches SPA
    assert "A PAR -> BRE BUR GAS PIC | S into BUR GAS PIC | S hold BRE\n" in obs
    assert len(obs) < 1200
    game = opening(press=False)
    hold_everyone_but(game, {FRANCE: "A PAR - BUR\nA MAR - BUR", ENGLAND: "F LON - ENG"})
    obs = game.messages(FRANCE)[-1]["content"]
    assert "Last orders (S1901M):" in obs
    assert "A PAR - BUR (bounce)" in obs and "ENG F EDI H, F LON - ENG, A LVP H" in obs
    game = opening()
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
    assert board[1].startswith("Centers: AUS BUD TRI VIE") and board[2].startswith("Units: AUS")
    assert all(
        f"You are {p}:" in chat[1]["content"].splitlines()[3]
        for p, chat in zip(ROLES, chats, strict=True)
    )


def test_parser_normalizes_common_spellings():
    game = opening(press=False)
    possible = game.engine.get_all_possible_orders()
    russia = game.engine.get_orderable_locations("RUSSIA")
    text = "1. a war to gal\n- F STP - BOT.\n* army mos -> ukr\nF SEV HOLD\nA WAR - SIL"
    orders, invalid, _ = parse_orders(text, possible, russia)
    assert orders == {
        "WAR": "A WAR - GAL",
        "STP": "F STP/SC - BOT",
        "MOS": "A MOS - UKR",
        "SEV": "F SEV H",
    }
    assert invalid == [("A WAR - SIL", "WAR already has an order")]
    assert normalize_order("A PAR supports A MAR hold") == "A PAR S A MAR"


@pytest.mark.parametrize(
    "text",
    [
        '```json\n["A PAR - BUR", "A MAR S A PAR - BUR", "F BRE - MAO"]\n```',  # AI_Diplomacy
        '{"orders": ["A PAR - BUR", "A MAR S A PAR - BUR", "F BRE - MAO"]}',
        "Army Paris -> Burgundy\nA Marseilles supports A Paris – Burgundy\nF Brest → Mid-Atlantic Ocean",
        "A PAR - BUR, A MAR S A PAR - BUR, F BRE - MAO",
        "**Orders:**\n1. **A PAR - BUR** (take Burgundy)\n- A MAR S A PAR — BUR # back it up\n* F BRE - MAO // west",
    ],
)
def test_parser_reads_what_models_write(text):
    game = opening(press=False)
    parsed = parse_orders(text, game.engine.get_all_possible_orders(), ["BRE", "MAR", "PAR"])
    assert parsed.orders == {
        "PAR": "A PAR - BUR",
        "MAR": "A MAR S A PAR - BUR",
        "BRE": "F BRE - MAO",
    }
    assert parsed.invalid == []


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
    assert game.group_keys(FRANCE) == {
        "country": "FRANCE",
        "country_stage": "FRANCE/opening",
        "country_alliance": "FRANCE/isolated",  # nothing played yet
    }
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
        "[to ",
        "]",
        "**",
        "—",
        "→",
        "Paris",
        "Burgundy",
        '["',
        '", "',
        '"]',
        '{"orders": ',
        ", ",
        " # ",
        "(",
        "WAIVE",
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
    game = opening(horizon=1, retreats="policy")
    i = 0
    while not game.done:
        for seat in game.pending_seats:
            legal = sum(game.engine.get_all_possible_orders().values(), ["WAIVE"])
            result = game.step(seat, texts[i % len(texts)])
            i += 1
            assert result.ok or (result.error and result.action["invalid"])
            if result.action["type"] == "orders":
                assert all(o in legal for o in result.action["orders"])
    assert len(game.rewards) == 7


def test_vs_scripted_plays_every_bot_in_every_country():
    from sparring.games.base import LEARNER

    lineups = DiplomacyGame.eval_lineups("vs_scripted", "greedy")
    modes = {"vs_scripted": "greedy", "vs_hold": "hold", "vs_random-legal": "random-legal"}
    modes["vs_support"] = "support"
    assert sorted(x.mode for x in lineups) == sorted(list(modes) * 7)
    for x in lineups:
        assert sorted(x.seats) == sorted([LEARNER] + [modes[x.mode]] * 6)
    assert {x.seats.index(LEARNER) for x in lineups if x.mode == "vs_hold"} == set(range(7))
    assert len(DiplomacyGame.eval_lineups("selfplay", "greedy")) == 1


def test_power_metrics_per_country_in_the_rollout_stats():
    from dataclasses import asdict

    from sparring.games.diplomacy.metrics import power_metrics
    from sparring.rollout import RolloutConfig, play, rollout_stats

    names = ["greedy", "random-legal", "hold", "greedy", "random-legal", "greedy", "hold"]
    cfg = RolloutConfig(
        game={"name": "diplomacy", "params": {"horizon": 1}}, games_per_init=2, seats=names
    )
    game = make_game("diplomacy")
    inits = [(f"i{s}", game.generate_state(s)) for s in range(2)]
    result = play(inits, {n: make_agent(n) for n in set(names)}, cfg, progress=False)
    episodes = [json.loads(json.dumps(asdict(ep))) for ep in result.episodes]
    rewards = [ep["rewards"][0] for ep in episodes]  # AUSTRIA, played by greedy
    metrics = power_metrics([(ep, 0) for ep in episodes])
    assert metrics["centers"] == pytest.approx(18 * sum(rewards) / 4)  # reward = centers / 18
    assert metrics["moves"] == 2 and metrics["invalid_order_rate"] == 0
    assert metrics["survival_rate"] + metrics["elimination_rate"] == 1
    # the rollout splits the learner's plays by country (`role_breakdown`)
    stats = rollout_stats(result, learner="greedy")
    assert {k.split("/")[2] for k in stats if k.startswith("rollout/country/")} == {
        "AUSTRIA",
        "GERMANY",
        "RUSSIA",
    }
    assert stats["rollout/country/AUSTRIA/games"] == 4
    assert stats["rollout/country/AUSTRIA/normalized_reward"] == pytest.approx(sum(rewards) / 4)
    assert stats["rollout/country/AUSTRIA/centers"] == metrics["centers"]


def test_summary_history_keeps_the_prompt_bounded_over_three_years():
    """`recap: years` starts each power's chat afresh every movement phase (the rules, the
    earlier years' center counts, the last `press_history` messages, the board), so its
    longest prompt barely grows by year, while the full transcript grows with every phase."""
    greedy = make_agent("greedy")
    longest = {}
    for recap in ("off", "years"):
        game = opening(horizon=3, recap=recap, press_rounds=1, press_history=2)
        longest[recap] = [0, 0, 0]
        while not game.done:
            phase = game.engine.get_current_phase()
            for seat in game.pending_seats:
                chat = game.messages(seat)
                year = int(phase[1:5]) - 1901
                size = sum(len(m["content"]) for m in chat)
                longest[recap][year] = max(longest[recap][year], size)
                if recap == "years" and game.action_kind == "press":
                    assert [m["role"] for m in chat] == ["system", "user"]
                if recap == "years" and phase == "S1903M" and seat == FRANCE:
                    now = game.messages(FRANCE)[1]["content"].splitlines()
                    counts = {p[:3]: len(game.engine.get_centers(p)) for p in ROLES}
                    assert now[0].startswith("Centers after 1901: AUS ")
                    assert now[1].startswith("Centers after 1902: ")
                    assert all(f"{p} {n}" in now[1] for p, n in counts.items())
                    at = now.index("Earlier press (the last 2):")
                    assert now[at + 1 : at + 3] == [
                        "F1902M RUSSIA to all: RUSSIA in F1902M",
                        "F1902M TURKEY to all: TURKEY in F1902M",
                    ]
                press = f"[to ALL] {ROLES[seat]} in {phase}"
                game.step(seat, press if game.action_kind == "press" else greedy.act(game, seat))
    full, summary = longest["off"], longest["years"]
    assert full[2] > 2.5 * full[0]
    assert summary[2] < 1.3 * summary[0]  # more units on the board, the recap's lines

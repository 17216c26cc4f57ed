"""Alliance contexts (`sparring.games.diplomacy.alliances`) on hand-built order histories, and
the `country_alliance` group key of a game played through the engine."""

from __future__ import annotations

import pytest

pytest.importorskip("diplomacy")

from start_position import CENTERS, UNITS  # noqa: E402  the 1901 board, by power

from sparring.games import GameSpec, make_game  # noqa: E402
from sparring.games.diplomacy import ROLES, DiplomacyGame  # noqa: E402
from sparring.games.diplomacy.alliances import (  # noqa: E402
    PhaseOrders,
    alliance_label,
    allies,
    relations,
)
from sparring.loop.config import PipelineConfig  # noqa: E402
from sparring.samples import check_group_key  # noqa: E402


def phase(**orders: list[str]) -> PhaseOrders:
    """A movement phase on the 1901 board: the given powers' orders, the others none."""
    return PhaseOrders({p: orders.get(p, []) for p in ROLES}, UNITS, CENTERS)


def pair(a: str, b: str) -> frozenset[str]:
    return frozenset((a, b))


def test_a_support_to_another_powers_unit_is_help_and_makes_allies():
    # France supports Germany's army into Burgundy (held by no one): help, no attack
    helped, attacked = relations([phase(FRANCE=["A PAR S A MUN - BUR"], GERMANY=["A MUN - BUR"])])
    assert helped == {pair("FRANCE", "GERMANY")} and attacked == set()
    found = allies([phase(FRANCE=["A PAR S A MUN - BUR"], GERMANY=["A MUN - BUR"])])
    assert found["FRANCE"] == ["GERMANY"] and found["GERMANY"] == ["FRANCE"]
    assert found["ITALY"] == []


def test_support_to_hold_and_convoy_are_help_too():
    helped, _ = relations(
        [phase(AUSTRIA=["A VIE S A WAR"], ENGLAND=["F LON C A PAR - PIC"])]  # (not legal: shape)
    )
    assert helped == {pair("AUSTRIA", "RUSSIA"), pair("ENGLAND", "FRANCE")}


def test_a_move_into_a_held_province_or_owned_center_is_an_attack():
    # Germany moves into Warsaw (a Russian army stands there); Italy into Vienna's center
    # while Austria's army is away (its center still counts); Turkey into an empty sea
    ph = PhaseOrders(
        {
            **{p: [] for p in ROLES},
            "GERMANY": ["A BER - WAR"],
            "ITALY": ["A VEN - VIE"],
            "TURKEY": ["F ANK - BLA"],
        },
        {**UNITS, "AUSTRIA": ["A GAL", "A BUD", "F TRI"]},
        CENTERS,
    )
    _, attacked = relations([ph])
    assert attacked == {pair("GERMANY", "RUSSIA"), pair("ITALY", "AUSTRIA")}


def test_a_support_of_a_move_against_a_power_is_an_attack_on_it():
    # Austria supports Russia's Warsaw army into Munich (German): help to Russia, attack on
    # Germany; Russia and Austria stay allies
    orders = {"AUSTRIA": ["A VIE S A WAR - MUN"], "RUSSIA": ["A WAR - MUN"]}
    helped, attacked = relations([phase(**orders)])
    assert helped == {pair("AUSTRIA", "RUSSIA")}
    assert attacked == {pair("AUSTRIA", "GERMANY"), pair("RUSSIA", "GERMANY")}
    assert allies([phase(**orders)])["AUSTRIA"] == ["RUSSIA"]


def test_an_attack_anywhere_in_the_year_cancels_the_alliance():
    spring = phase(FRANCE=["A PAR S A MUN - BUR"], GERMANY=["A MUN - BUR"])
    fall = phase(GERMANY=["A MUN - MAR"])  # Germany then moves on Marseilles (French)
    assert allies([spring])["FRANCE"] == ["GERMANY"]
    assert allies([spring, fall])["FRANCE"] == []
    assert allies([])["FRANCE"] == []  # nothing played: nobody is allied


def test_labels_name_the_seeds_blocs_where_they_apply():
    assert alliance_label("AUSTRIA", []) == "AUSTRIA/isolated"
    assert alliance_label("AUSTRIA", ["RUSSIA"]) == "AUSTRIA/with:RUSSIA"
    assert alliance_label("AUSTRIA", ["TURKEY", "RUSSIA"]) == "AUSTRIA/eastern_alliance"
    assert alliance_label("RUSSIA", ["AUSTRIA", "TURKEY"]) == "RUSSIA/eastern_alliance"
    assert alliance_label("FRANCE", ["ENGLAND", "GERMANY"]) == "FRANCE/western_triple"
    # a power outside a bloc allied with exactly its members joins it (the seed's "Austria
    # in a western triple")
    assert alliance_label("AUSTRIA", ["ENGLAND", "FRANCE", "GERMANY"]) == "AUSTRIA/western_triple"
    # more or fewer than the bloc: the allies by name, in ROLES order
    assert (
        alliance_label("AUSTRIA", ["TURKEY", "RUSSIA", "ITALY"])
        == "AUSTRIA/with:ITALY,RUSSIA,TURKEY"
    )


def test_an_eastern_alliance_from_supports_over_a_year():
    spring = phase(
        AUSTRIA=["A BUD S A WAR - GAL"],  # Austria helps Russia into Galicia
        RUSSIA=["A WAR - GAL", "F SEV S F ANK - BLA"],  # Russia helps Turkey into the Black Sea
        TURKEY=["F ANK - BLA"],
    )
    fall = phase(TURKEY=["A CON S A BUD"])  # Turkey supports Austria's Budapest army to hold
    found = allies([spring, fall])
    assert found["AUSTRIA"] == ["RUSSIA", "TURKEY"] and found["RUSSIA"] == ["AUSTRIA", "TURKEY"]
    assert alliance_label("RUSSIA", found["RUSSIA"]) == "RUSSIA/eastern_alliance"


def test_the_group_key_reads_the_last_year_the_engine_played():
    game = make_game("diplomacy", press=False, horizon=1)
    state = game.generate_state(2)  # S1901M
    game.reset(state)
    hold = DiplomacyGame.make_agent("hold")
    france, germany = ROLES.index("FRANCE"), ROLES.index("GERMANY")
    spring = {
        france: "A PAR S A MUN - BUR\nA MAR H\nF BRE H",
        germany: "A MUN - BUR\nA BER H\nF KIE H",
    }
    for seat in list(game.pending_seats):
        assert game.step(seat, spring.get(seat, hold.act(game, seat))).ok
    while not game.done:  # the fall: everyone holds
        for seat in list(game.pending_seats):
            game.step(seat, hold.act(game, seat))
    keys = [game.group_keys(s)["country_alliance"] for s in range(7)]
    assert keys[france] == "FRANCE/with:GERMANY" and keys[germany] == "GERMANY/with:FRANCE"
    assert keys[ROLES.index("ITALY")] == "ITALY/isolated"


def test_country_alliance_is_a_valid_train_group_key():
    assert check_group_key(GameSpec(name="diplomacy"), "country_alliance") == "country_alliance"
    cfg = PipelineConfig.model_validate(
        {"game": "diplomacy", "train": {"group_key": "country_alliance"}}
    )
    assert cfg.train.group_key == "country_alliance"
    cfg = PipelineConfig.model_validate({"game": "diplomacy", "train": {"balance_by": "country"}})
    assert cfg.train.balance_by == "country"  # the country-balanced sampler

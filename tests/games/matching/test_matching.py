"""The matching game's rules, parsing and scoring."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparring.games import make_game
from sparring.games.matching import MatchingGame
from sparring.games.matching.table import best_assignment, generate_state, own_view_values


def new_game(k: int = 4, seed: int = 0, **params):
    game = make_game("matching", k=k, **params)
    game.reset(game.generate_state(seed))
    return game


def proposal_text(game, cols) -> str:
    s = game.state
    return "[propose]\n" + "\n".join(
        f"{s['reviewers'][r]}: {s['papers'][c]}" for r, c in enumerate(cols)
    )


@pytest.mark.parametrize("k", [2, 3, 4, 8])
def test_hungarian_optimum_scores_exactly_one(k):
    for seed in range(5):
        game = new_game(k, seed)
        assert game.step(0, proposal_text(game, game.state["best_assignment"])).ok
        assert game.step(1, "[accept]").ok
        assert game.done and game.rewards == [1.0, 1.0]


def test_best_value_is_the_true_optimum():
    # brute force over all 4! assignments agrees with the stored Hungarian best
    from itertools import permutations

    state = generate_state(7, k=4)
    table = np.array(state["table"])
    brute = max(sum(table[r, c] for r, c in enumerate(p)) for p in permutations(range(4)))
    assert state["best_value"] == brute
    assert best_assignment(table.astype(float))[1] == brute


def test_suboptimal_proposal_scores_its_true_value():
    game = new_game(4, 1)
    cols = list(range(4))
    value = sum(game.state["table"][r][c] for r, c in enumerate(cols))
    game.step(0, proposal_text(game, cols))
    game.step(1, "[accept]")
    assert game.rewards[0] == pytest.approx(value / game.state["best_value"])


def test_same_seed_same_state_and_different_seed_differs():
    assert generate_state(3, k=5) == generate_state(3, k=5)
    assert generate_state(3, k=5)["table"] != generate_state(4, k=5)["table"]


def test_hidden_cells_are_fifty_and_visibility_is_about_point_four():
    seen, cells = 0, 0
    for seed in range(300):
        s = generate_state(seed, k=6, hard_ratio=None)
        table, views = np.array(s["table"]), s["views"]
        vis = np.array([[[v is not None for v in row] for row in view] for view in views])
        assert (table[~vis[0] & ~vis[1]] == 50).all()
        for seat in range(2):  # visible numbers are the true value times the private scale
            for r in range(6):
                for c in range(6):
                    if vis[seat, r, c]:
                        assert views[seat][r][c] == int(table[r, c] * s["scales"][seat])
        assert all(1 <= x <= 10 for x in s["scales"])
        seen += vis.sum()
        cells += vis.size
    assert 0.38 < seen / cells < 0.42


def test_hard_filter_holds():
    """Each seat's own value is the true value of an assignment that is best on its own view
    (an unseen cell counting 50), and below the best value / 1.25."""
    perms = [list(p) for p in itertools.permutations(range(5))]
    for seed in range(40):
        s = generate_state(seed, k=5)
        assert s["hard"]
        table = np.array(s["table"], dtype=float)
        for seat, own in enumerate(s["own_best_values"]):
            vis = np.array([[v is not None for v in row] for row in s["views"][seat]])
            guess = np.where(vis, table, 50.0)
            top = max(guess[range(5), p].sum() for p in perms)
            optima = {table[range(5), p].sum() for p in perms if guess[range(5), p].sum() == top}
            assert own in optima and own * 1.25 < s["best_value"]


@pytest.mark.parametrize(
    ("k", "p_visible", "hard_ratio", "max_tries"),
    [(2, 0.4, 1.25, 20000), (3, 0.4, 1.25, 20000), (3, 0.2, 1.1, 20000), (4, 0.2, 1.25, 300),
     (2, 0.4, 1.25, 300), (6, 0.4, 1.25, 20000)],
)  # fmt: skip
def test_the_chunked_filter_keeps_what_a_plain_loop_keeps(k, p_visible, hard_ratio, max_tries):
    """The filter judges draws a chunk at a time, bounding ties over all k! assignments, and
    calls the solver only where the bounds leave a draw open. It keeps the attempt a plain loop
    of attempts keeps (dialop's), and leaves the generator where that loop does, so every state
    is the one the plain loop made (few-visible tables are full of ties; 300 tries run out)."""
    for seed in range(25 if k < 6 else 4):
        rng = np.random.default_rng(seed)
        for attempt in range(1, max_tries + 1):  # noqa: B007 - the attempt kept
            table = rng.integers(0, 100, size=(k, k))
            visible = rng.random((2, k, k)) < p_visible
            table[~visible[0] & ~visible[1]] = 50
            scales = rng.uniform(1.0, 10.0, size=2)
            best = best_assignment(table.astype(float))[1]
            hard = max(own_view_values(table, visible)) < best / hard_ratio
            if hard:
                break
        state = generate_state(seed, k, p_visible, hard_ratio, max_tries)
        assert (state["attempts"], state["hard"]) == (attempt, hard)
        assert state["scales"] == scales.tolist()
        shuffle = rng.permutation(k), rng.permutation(k)  # the generator continues from here
        assert state["table"] == table[np.ix_(*shuffle)].tolist()


def test_no_position_is_informative():
    """Over many hard tables every fixed positional deal is worth what a random deal is (before
    the shuffle the identity deal scored .66 against .72 for a random one on k=3)."""
    states = [generate_state(seed, k=3) for seed in range(300)]
    rand = np.mean([np.sum(s["table"]) / 3 / s["best_value"] for s in states])
    for p in itertools.permutations(range(3)):
        fixed = [np.array(s["table"])[range(3), p].sum() / s["best_value"] for s in states]
        assert abs(np.mean(fixed) - rand) < 3 * np.std(fixed) / np.sqrt(len(states))


def test_turns_alternate_and_wrong_seat_is_rejected():
    game = new_game()
    assert game.current_seat == 0
    bad = game.step(1, "[message] hi")
    assert not bad.ok and "turn" in bad.error
    assert game.step(0, "[message] hello").ok
    assert game.current_seat == 1
    assert (
        "Partner: [message] hello\nYour turn: write one line that starts with"
        in game.messages(1)[-1]["content"]
    )


def test_reject_clears_the_proposal_and_the_rejecting_seat_keeps_the_turn():
    game = new_game()
    game.step(0, proposal_text(game, [0, 1, 2, 3]))
    res = game.step(1, "[message] wait")
    assert not res.ok and "accept" in res.error
    assert game.step(1, "[reject]").ok
    assert game.current_seat == 1 and game.num_turns == 2  # dialop: the rejecter moves again
    assert game.messages(0)[-1]["content"].endswith("Partner: [reject]")
    assert "still your turn" in game.messages(1)[-1]["content"]
    res = game.step(1, "[accept]")
    assert not res.ok and "no proposal" in res.error
    assert game.step(1, "[message] Cole is strong on BLEU").ok and game.current_seat == 0


def test_accept_without_proposal_is_an_error_shown_only_to_the_actor():
    game = new_game()
    res = game.step(0, "[accept]")
    assert not res.ok and res.error
    assert "Error" in game.messages(0)[-1]["content"]
    assert all("Error" not in m["content"] for m in game.messages(1))
    assert game.current_seat == 0  # retry


def test_retry_bound_forfeits_the_turn_and_counts_it():
    game = new_game(max_retries=2)
    results = [game.step(0, "no tag here") for _ in range(3)]
    assert [r.forfeited for r in results] == [False, False, True]
    assert game.stats.invalid_actions == [3, 0] and game.stats.forfeits == [1, 0]
    assert game.current_seat == 1 and game.num_turns == 1
    assert "lost their turn" in game.messages(1)[-1]["content"]


def test_turn_cap_ends_with_zero_reward():
    game = new_game(max_turns=6)
    for t in range(6):
        assert not game.done
        game.step(t % 2, f"[message] turn {t}")
    assert game.done and game.rewards == [0.0, 0.0] and game.num_turns == 6
    assert MatchingGame.turn_budget({"max_turns": 6}) == 6  # the time estimate's budget
    assert MatchingGame.turn_budget({}) == MatchingGame.turn_budget({"preset": "dialop"}) == 30


def test_the_last_line_opening_with_a_tag_is_the_action_and_reasoning_is_allowed():
    game = new_game()
    action, err = game.parse("Let me think. [propose] no wait.\n[message] I see Ava 30")
    assert err is None and action == {"type": "message", "text": "I see Ava 30"}
    action, err = game.parse("Thinking...\n- **[accept]**")  # list marker and bold
    assert err is None and action == {"type": "accept"}


def test_a_tag_inside_prose_is_never_the_action():
    game = new_game(k=3, seed=4)
    r, p = game.state["reviewers"], game.state["papers"]
    # Reproduced bug: the last tag anywhere used to turn this reject into an accept.
    assert game.parse(f"[reject] No. I'd only [accept] if you move {r[2]}.") == (
        {"type": "reject"},
        None,
    )
    plan = "\n".join(f"{r[i]}: {p[i]}" for i in range(3))
    action, err = game.parse(f"[propose]\n{plan}\nor else I just [reject]")
    assert err is None and action["type"] == "propose"
    assert game.parse("I would [accept] that")[1].startswith("no action line")
    # In play: the reject stands and the game goes on.
    game.step(0, f"[propose]\n{plan}")
    assert game.step(1, f"[reject] No. I'd only [accept] if you move {r[2]}.").ok
    assert not game.done and game.current_seat == 1


def test_pathological_input_parses_in_linear_time_and_long_turns_are_refused():
    import time

    game = new_game(k=8, max_chars=None)
    r = game.state["reviewers"]
    for text in ["[propose]\n" + " " * 8000 + "x", "[propose]\n" + f"{r[0]}" + " " * 20000 + ":"]:
        start = time.perf_counter()
        assert game.parse(text)[1]
        assert time.perf_counter() - start < 0.2
    capped = new_game(k=3, max_chars=50)
    res = capped.step(0, "[message] " + "x" * 60)
    assert not res.ok and "70 characters long; the limit is 50" in res.error
    assert capped.step(0, "[message] short").ok


def test_values_run_from_0_to_99():
    values = np.concatenate(
        [np.ravel(generate_state(s, k=8, hard_ratio=None)["table"]) for s in range(200)]
    )
    assert values.min() == 0 and values.max() == 99


def test_dialop_preset_plays_dialops_setting():
    game = make_game("matching", preset="dialop")
    state = game.generate_state(3)
    assert state["k"] == 8 and state["hard"]
    # dialop's published names, the same in every game
    r, p = state["reviewers"], state["papers"]
    assert (r[0], r[3], r[-1], len(set(r))) == ("Ava Li", "Andrei Petrov", "Noah Wilson", 8)
    assert (p[0], p[1], p[-1], len(set(p))) == ("BLEU", "Electra", "SWAG", 8)
    assert game.generate_state(4)["reviewers"] == state["reviewers"]
    game.reset(state)
    prompt = game.messages(0)[0]["content"]
    assert "scale" not in prompt and "Ava Li" in prompt and "SWAG" in prompt
    assert "scaled by a private factor" in new_game(k=3).messages(0)[0]["content"]
    # every try, a bad one included, counts toward the 30-turn cap; none forfeits the turn
    for _ in range(30):
        res = game.step(0, "no action here")
        assert not res.forfeited
    assert game.done and game.num_turns == 0 and game.rewards == [0.0, 0.0]
    # multi-word names parse; explicit parameters override the preset
    cols = state["best_assignment"]
    game.reset(state)
    plan = "\n".join(
        f"- {state['reviewers'][i]} -> {state['papers'][c]}" for i, c in enumerate(cols)
    )
    assert game.step(0, f"[propose]\n{plan}").ok and game.step(1, "[accept]").ok
    assert game.rewards == [1.0, 1.0]
    assert make_game("matching", preset="dialop", max_turns=12).max_turns == 12
    with pytest.raises(ValueError, match="preset"):
        make_game("matching", preset="human")


def test_proposal_parsing_is_fuzzy_but_strict_on_count_and_duplicates():
    game = new_game(k=4, seed=2)
    r, p = game.state["reviewers"], game.state["papers"]
    sloppy = "[propose]\n" + "\n".join(f"- {r[i].lower()} -> {p[i].upper()}." for i in range(4))
    action, err = game.parse(sloppy)
    assert err is None and action["assignment"] == dict(zip(r, p, strict=True))
    typo = f"[propose] {r[0][:-1]}x: {p[0]}, {r[1]}: {p[1]}, {r[2]}: {p[2]}, {r[3]}: {p[3]}"
    if len(r[0]) >= 4:  # a one-letter slip in a 4+ letter name still matches
        assert game.parse(typo)[1] is None
    assert "exactly 4" in game.parse(f"[propose]\n{r[0]}: {p[0]}")[1]
    dup_paper = "[propose]\n" + "\n".join(f"{r[i]}: {p[0]}" for i in range(4))
    assert "two reviewers" in game.parse(dup_paper)[1]
    dup_reviewer = f"[propose]\n{r[0]}: {p[0]}\n{r[0]}: {p[1]}\n{r[2]}: {p[2]}\n{r[3]}: {p[3]}"
    assert "twice" in game.parse(dup_reviewer)[1]
    assert "unknown" in game.parse(f"[propose]\nZorro: {p[0]}")[1]


@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(
        st.text(max_size=200)
        | st.sampled_from(
            [
                "[accept]",
                "[reject]",
                "[propose]",
                "[message]",
                "[propose]\nAva: BLEU",
                "[MESSAGE] x",
                "I'd [accept] if you [reject] it",
                "- **[reject]** no\n[message] but [propose] later",
                "[propose]\nAva -> BLEU, Ben = GloVe; Cole - ELMo",
                " " * 3000,
            ]
        ),
        min_size=1,
        max_size=40,
    )
)
def test_fuzz_any_text_never_crashes(texts):
    game = new_game(k=3, max_turns=10)
    for text in texts:
        if game.done:
            break
        res = game.step(game.current_seat, text)
        assert res.ok or res.error
    assert len(game.rewards) == 2 and all(0.0 <= x <= 1.0 for x in game.rewards)


def test_fixed_names_keep_the_table():
    randomized = make_game("matching", k=3).generate_state(7)
    fixed = make_game("matching", k=3, random_names=False).generate_state(7)
    assert fixed["reviewers"] == ["Ava", "Ben", "Cole"] and fixed["papers"] == [
        "BLEU",
        "GloVe",
        "ELMo",
    ]
    assert fixed["table"] == randomized["table"] and fixed["views"] == randomized["views"]


def test_invalid_penalty_charges_only_the_seat_that_erred():
    plain, shaped = new_game(k=3), new_game(k=3, invalid_penalty=0.1)
    for game in (plain, shaped):
        assert not game.step(0, "[accept]").ok  # nothing to accept: seat 0 errs once
        assert game.step(0, proposal_text(game, game.state["best_assignment"])).ok
        assert game.step(1, "[accept]").ok and game.done
    assert plain.rewards == [1.0, 1.0]
    assert shaped.rewards == pytest.approx([0.9, 1.0])
    with pytest.raises(ValueError, match="invalid_penalty"):
        make_game("matching", invalid_penalty=-1)


def test_the_prompt_holds_a_worked_example_the_parser_accepts():
    game = new_game(k=3, seed=5)
    prompt = game.messages(0)[0]["content"]
    example = prompt.split("Examples:\n", 1)[1]
    propose = example[example.index("[propose]") : example.index("[accept]")]
    action, err = game.parse(propose)
    assert err is None and list(action["assignment"]) == game.state["reviewers"]
    assert game.parse(example.splitlines()[0])[0]["type"] == "message"
    assert game.step(0, propose).ok
    assert game.messages(1)[-1]["content"].endswith("Reply with [accept] or [reject].")


def test_agreement_and_the_deals_quality_are_reported_apart():
    plays = [
        ({"outcome": {"agreed": True}, "rewards": [0.9, 0.9]}, 0),
        ({"outcome": {"agreed": True}, "rewards": [0.5, 0.5]}, 1),
        ({"outcome": {"agreed": False}, "rewards": [0.0, 0.0]}, 0),
        ({"outcome": {"agreed": False}, "rewards": [0.0, 0.0]}, 1),
    ]
    metrics = MatchingGame.episode_metrics(plays)
    assert metrics == {"agreement_rate": 0.5, "reward_given_agreement": pytest.approx(0.7)}
    assert MatchingGame.episode_metrics(plays[2:])["reward_given_agreement"] == 0.0

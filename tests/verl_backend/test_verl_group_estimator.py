"""The verl route's `sparring_group` estimator on CPU: registered in verl's registry, fed its
labels by the agent-loop manager, equal to verl's own `grpo` on `init_seat` labels, pooling a
power's rows across states on `country` labels (hand-computed), ties exactly 0; the recipe's
`verl.group_key` check and the launch arguments that select both.

Advantages go through verl's own V1 path (`compute_advantage_for_multi_trajectories`, which
calls a registered estimator with the kwargs verl's trainer passes), on batches whose uids and
`extra_info` are collated the way verl's trainer collates dataset rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.rl_dataset import collate_fn
from verl.utils.import_utils import load_class_from_fqn

from sparring.games import GameSpec
from sparring.recipe import Recipe
from sparring.verl_backend import estimator
from sparring.verl_backend.config import ESTIMATOR_NAME, LOOP_MANAGER, VerlConfig
from sparring.verl_backend.data import selfplay_rows
from sparring.verl_backend.launch import verl_overrides

VERL_CONFIG_DIR = Path(__import__("verl").__file__).parent / "trainer" / "config"


@pytest.fixture(autouse=True)
def no_labels():
    estimator.LABELS.clear()
    yield
    estimator.LABELS.clear()


def dispatch(labels: list[str], validate: bool = False) -> list[str]:
    """Collate one train batch of prompts with these group labels as verl's trainer does
    (a fresh uid each), hand it to the manager's recorder, and return the uids."""
    rows = [{"raw_prompt": [], "extra_info": {"group_key": g}} for g in labels]
    batch = collate_fn(rows)
    batch["uid"] = np.array([f"uid{i}" for i in range(len(rows))], dtype=object)
    prompts = tu.get_tensordict(batch)
    if validate:
        tu.assign_non_tensor_data(prompts, "validate", True)
    estimator.record_labels(prompts)
    return list(batch["uid"])


def played(uids: list[str], rewards: list[list[float]], norm: bool = True, name=ESTIMATOR_NAME):
    """Advantages (B, T=3) of `rollout.n` plays per uid with these final rewards, computed by
    verl's V1 trainer function; the reward sits on each row's last own token."""
    n = len(rewards[0])
    index = np.array([u for u in uids for _ in range(n)], dtype=object)  # (B,)
    keys = [f"{u}_{s}_0" for u in uids for s in range(n)]  # verl's {uid}_{session}_{output}
    mask = torch.tensor([[1.0, 1.0, 0.0]] * len(index))  # (B, T): last token is not own
    scores = torch.zeros_like(mask)
    scores[:, 1] = torch.tensor([r for group in rewards for r in group])
    data = DataProto.from_dict(
        tensors={"token_level_rewards": scores, "response_mask": mask},
        non_tensors={"uid": index},
    )
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": norm})
    out = compute_advantage_for_multi_trajectories(
        data, keys, adv_estimator=name, norm_adv_by_std_in_grpo=norm, config=config
    )
    assert torch.equal(out.batch["advantages"][:, 2], torch.zeros(len(index)))  # masked out
    return out.batch["advantages"][:, 0]  # (B,): one advantage per row


def test_the_estimator_and_the_manager_are_what_verl_looks_up():
    assert get_adv_estimator_fn(ESTIMATOR_NAME) is estimator.sparring_group_advantage
    manager = load_class_from_fqn(LOOP_MANAGER, "AgentLoopManager")  # as verl's TaskRunner
    assert manager is estimator.GroupLabelManager and issubclass(manager, AgentLoopManagerTQ)


def test_the_manager_records_train_labels_before_dispatching(monkeypatch):
    dispatched = []
    monkeypatch.setattr(
        AgentLoopManagerTQ, "generate_sequences", lambda self, p: dispatched.append(p)
    )
    rows = [{"raw_prompt": [], "extra_info": {"group_key": "FRANCE"}}]
    prompts = tu.get_tensordict({**collate_fn(rows), "uid": np.array(["u"], dtype=object)})
    estimator.GroupLabelManager.generate_sequences(
        object.__new__(estimator.GroupLabelManager), prompts
    )
    assert estimator.LABELS == {"u": "FRANCE"} and dispatched == [prompts]
    dispatch(["a", "b"], validate=True)  # validation computes no advantages: not recorded
    assert estimator.LABELS == {"u": "FRANCE"}


@pytest.mark.parametrize("norm", [True, False])
def test_init_seat_labels_give_verls_own_grpo(norm):
    """One row per (state, seat), so init_seat labels group exactly as verl's uids do."""
    rewards = [[0.9, 0.1, 0.4, 0.3], [0.0, 1.0, 1.0, 0.5], [0.2, 0.25, 0.7, 0.6]]
    uids = dispatch(["s0/0", "s0/1", "s1/0"])
    ours = played(uids, rewards, norm)
    verls = played(uids, rewards, norm, name="grpo")  # verl's own GRPO branch, by uid
    torch.testing.assert_close(ours, verls)
    assert estimator.LABELS == {}  # the trained uids are forgotten


def test_country_labels_pool_one_power_across_states():
    """Two states x two powers, rollout.n = 2. Under `country` FRANCE's rows of both states
    form one group, and so do ENGLAND's."""
    uids = dispatch(["FRANCE", "ENGLAND", "FRANCE", "ENGLAND"])  # state A, A, B, B
    rewards = [[1.0, 0.0], [0.2, 0.6], [1.0, 1.0], [0.4, 0.4]]
    # FRANCE [1, 0, 1, 1]: mean .75, deviations [.25, -.75, .25, .25], unbiased variance
    #   (3 * .0625 + .5625) / 3 = .25, std .5: advantages [.5, -1.5, .5, .5] (state B's tied
    #   pair, 0 on its own, is above its power's mean).
    # ENGLAND [.2, .6, .4, .4]: mean .4, deviations [-.2, .2, 0, 0], variance .08 / 3,
    #   std .163299: advantages [-1.224745, 1.224745, 0, 0].
    expected = [0.5, -1.5, -1.224745, 1.224745, 0.5, 0.5, 0.0, 0.0]
    torch.testing.assert_close(played(uids, rewards), torch.tensor(expected), atol=1e-5, rtol=0)
    uids = dispatch(["FRANCE", "ENGLAND", "FRANCE", "ENGLAND"])
    # Dr. GRPO (no std): the deviations themselves.
    expected = [0.25, -0.75, -0.2, 0.2, 0.25, 0.25, 0.0, 0.0]
    torch.testing.assert_close(
        played(uids, rewards, norm=False), torch.tensor(expected), atol=1e-6, rtol=0
    )


def test_diplomacy_rows_share_a_country_label_across_states():
    game = GameSpec(name="diplomacy")
    states = [(f"s{i}", game.make().generate_state(i)) for i in range(2)]
    labels = [e["group_key"] for e in selfplay_rows(states, game, "country").extra_info]
    assert len(labels) == 14 and labels[:7] == labels[7:] and len(set(labels)) == 7


def test_tied_groups_and_singletons_get_exactly_zero():
    uids = dispatch(["tie", "near", "live"])
    rewards = [[0.7] * 16, [0.7] * 15 + [0.7 + 5e-7], [0.0] * 15 + [1.0]]
    verls = played(uids, rewards, name="grpo")
    assert verls[:16].abs().max() > 0.01  # verl's float32 statistics leave rounding noise
    ours = played(uids, rewards)
    assert torch.equal(ours[:32], torch.zeros(32))  # spans below 1e-6: exactly 0
    torch.testing.assert_close(ours[32:], verls[32:])
    (uid,) = dispatch(["alone"])
    assert torch.equal(played([uid], [[1.0]]), torch.zeros(1))  # nothing to compare with


def test_a_uid_without_a_label_names_the_manager():
    with pytest.raises(KeyError, match=LOOP_MANAGER):
        played(["never-dispatched"], [[0.0, 1.0]])


def test_the_recipe_checks_verl_group_key_against_the_game():
    def key(game: str, group_key: str) -> str:
        return Recipe.model_validate(
            {"game": {"name": game}, "verl": {"group_key": group_key}}
        ).verl.group_key

    assert key("diplomacy", "country") == "country"
    assert key("diplomacy", "country_stage") == "country_stage"
    assert key("diplomacy", "init_country") == "init_seat"  # Diplomacy's word for a seat
    assert key("matching", "role") == "role"
    assert Recipe.model_validate({"game": {"name": "diplomacy"}}).verl.group_key == "init_seat"
    for game, bad in (("diplomacy", "power"), ("diplomacy", "init"), ("matching", "country")):
        with pytest.raises(ValueError, match=rf"verl.group_key='{bad}'.*one of \['init_seat'"):
            key(game, bad)


def test_the_launch_selects_the_estimator_and_the_manager():
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    args = verl_overrides(VerlConfig(group_key="country"), "/m", "/t", "/v", "/o", "/l.yaml")
    assert f"algorithm.adv_estimator={ESTIMATOR_NAME}" in args
    with initialize_config_dir(config_dir=str(VERL_CONFIG_DIR), version_base=None):
        composed = compose(config_name="ppo_trainer", overrides=args)
    assert composed.algorithm.adv_estimator == ESTIMATOR_NAME and composed.trainer.use_v1
    agent = omega_conf_to_dataclass(composed.actor_rollout_ref.rollout.agent)  # verl's schema
    assert agent.agent_loop_manager_class == LOOP_MANAGER

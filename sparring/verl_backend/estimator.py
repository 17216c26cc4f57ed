"""verl's GRPO grouped by each row's `group_key` label: the `sparring_group` advantage estimator.

verl groups GRPO by `uid`, a fresh uuid4 its trainer gives every dataset row when it loads a
batch (the data cannot set it), and passes a registered estimator only the rewards, the
response mask, the algorithm config and `index` = the rows' uids. The label a row carries in
`extra_info.group_key` (`sparring.verl_backend.data`) reaches the estimator through verl's
driver process (the TaskRunner), where both of these run:
  1. `GroupLabelManager`, verl's agent-loop manager (`rollout.agent.agent_loop_manager_class`),
     records uid -> label for every train prompt it dispatches;
  2. `sparring_group_advantage` (`algorithm.adv_estimator=sparring_group`) maps each row's uid
     to its label and computes GRPO over the labels with verl's `compute_grpo_outcome_advantage`
     and Sparring's tie rule (`sparring.grpo.grpo_advantages`: a group whose rewards span less
     than `TIE_TOLERANCE` gets exactly 0; a group of one row gets 0).
verl imports the manager class by name in the driver, which imports this module and registers
the estimator there (`launch.verl_overrides` sets both). On `init_seat` labels the groups are
verl's own uid groups, so the advantages are verl's `grpo` ones, ties aside.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import register_adv_est
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ

from sparring.grpo import grpo_advantages
from sparring.verl_backend.config import ESTIMATOR_NAME, LOOP_MANAGER

__all__ = ["LABELS", "GroupLabelManager", "record_labels", "sparring_group_advantage"]

LABELS: dict[str, str] = {}
"""uid -> group label of the train prompts dispatched and not yet through the estimator."""


def record_labels(prompts: TensorDict) -> None:
    """Remember each train prompt's `extra_info.group_key` under its uid (validation batches
    compute no advantages and are skipped)."""
    if "validate" in prompts.keys() and prompts["validate"]:
        return
    labels = (info["group_key"] for info in prompts["extra_info"])
    LABELS.update(zip(prompts["uid"], labels, strict=True))


def take_labels(index: np.ndarray) -> np.ndarray:
    """The group label of each row (B,) from its uid `index` (B,); the uids are forgotten."""
    missing = set(index) - LABELS.keys()
    if missing:
        raise KeyError(
            f"{len(missing)} uids have no group label (e.g. {sorted(missing)[0]}): the "
            f"{ESTIMATOR_NAME} estimator needs verl's agent-loop manager to be {LOOP_MANAGER} "
            "(sparring.verl_backend.launch sets both)"
        )
    labels = np.array([LABELS[uid] for uid in index], dtype=object)  # (B,)
    for uid in set(index):
        del LABELS[uid]
    return labels


@register_adv_est(ESTIMATOR_NAME)
def sparring_group_advantage(
    token_level_rewards: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    index: np.ndarray,  # (B,) uids
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both (B, T) as in verl's `grpo`, grouped by each row's label;
    `config` is verl's `algorithm` section (`norm_adv_by_std_in_grpo`)."""
    norm = config.get("norm_adv_by_std_in_grpo", True) if config is not None else True
    advantages = grpo_advantages(
        token_level_rewards, response_mask, take_labels(index), norm_by_std=norm
    )  # (B, T)
    return advantages, advantages


class GroupLabelManager(AgentLoopManagerTQ):
    """verl's agent-loop manager, recording each train prompt's group label (`LABELS`) in the
    driver before it dispatches the prompts to the agent-loop workers."""

    def generate_sequences(self, prompts: TensorDict) -> None:
        record_labels(prompts)
        super().generate_sequences(prompts)

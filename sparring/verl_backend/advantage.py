"""`sparring_grpo`: verl's GRPO outcome advantage under a Sparring group key.

verl hands a registered estimator only `uid` as the per-row label (a fresh uuid4 per dataset
row). A uid of the form "<group>|<uuid>" groups by <group> (e.g. a country across initial
states, seed 001); a plain uid groups by itself, which is stock GRPO. Advantages come from
`core_algos.compute_grpo_outcome_advantage` itself, so the math is verl's. A group of size 1
gets advantage 0 here (verl's function would give it the raw score, see DESIGN.md).

Select with `algorithm.adv_estimator=sparring_grpo`; this module must be imported in the
trainer process (see `sparring.verl_backend.launch`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, register_adv_est

from sparring.verl_backend.config import ESTIMATOR

SEP = "|"


def tag_uid(group: str, uid: str) -> str:
    """A uid that `sparring_grpo` groups by `group` (no "|" allowed in `group`)."""
    if SEP in group:
        raise ValueError(f"group label {group!r} must not contain {SEP!r}")
    return f"{group}{SEP}{uid}"


def group_of(uid: str) -> str:
    """The group label of a (possibly tagged) uid."""
    return uid.split(SEP, 1)[0] if SEP in uid else uid


@register_adv_est(ESTIMATOR)
def compute_sparring_grpo_advantage(
    token_level_rewards: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    index: np.ndarray,  # (B,) uids
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO advantages grouped by `group_of(uid)`; singleton groups get 0."""
    groups = np.array([group_of(str(u)) for u in index], dtype=object)
    norm = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    advantages, returns = compute_grpo_outcome_advantage(
        token_level_rewards, response_mask, groups, norm_adv_by_std_in_grpo=norm
    )
    sizes = Counter(groups.tolist())
    single = torch.tensor([sizes[g] == 1 for g in groups.tolist()])  # (B,)
    advantages = advantages.masked_fill(single[:, None], 0.0)  # (B, T)
    return advantages, advantages


def setup_worker() -> None:
    """Ray `worker_process_setup_hook`: importing this module registered the estimator in the
    worker (verl computes advantages inside its TaskRunner actor, not in the launching shell)."""

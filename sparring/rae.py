"""Role-conditioned advantages (SPIRAL's RAE): an EMA baseline of the reward per role.

    baseline = RoleBaseline.load(model_dir, decay=0.95)    # the previous update's, if stored
    advantages = baseline.advantages(df["role"], scores)   # (B,) reward - the role's baseline
    baseline.save(out_dir)                                  # beside the new checkpoint

In two-player zero-sum self-play one policy plays both seats, and a seat can be worth more than
the other (the first mover's edge): a group baseline over one state's plays (`init`) is 0.5 by
construction, and a baseline per state and seat needs several plays of every state. RAE keeps
one running mean per role across updates instead (SPIRAL, arXiv 2506.24119, §3.3). Per batch
and role: b ← decay · b + (1 - decay) · mean(rewards of the role), then A = reward - b, the
same advantage on every response token (no std normalisation). A role seen for the first time
starts at its batch mean, not at 0 (a baseline of 0 would call every positive reward good).

Restart-safe: the baselines are a small JSON file saved with each checkpoint and read from the
checkpoint the update starts from. So a resumed run continues where it was, and a retried
train task, which starts again from the same input checkpoint, applies its batch once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BASELINE_FILE = "rae_baseline.json"


@dataclass
class RoleBaseline:
    """The EMA reward baseline of each role (any samples column's values), and its updates."""

    decay: float = 0.95
    values: dict[str, float] = field(default_factory=dict)
    updates: dict[str, int] = field(default_factory=dict)

    def advantages(self, roles: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """Update each role's baseline with this batch, then return reward - baseline (B,)."""
        roles = np.asarray(roles).astype(str)
        scores = np.asarray(scores, dtype=np.float64)
        for role in np.unique(roles):
            mean = float(scores[roles == role].mean())
            old = self.values.get(role, mean)  # a new role starts at its batch mean
            self.values[role] = self.decay * old + (1 - self.decay) * mean
            self.updates[role] = self.updates.get(role, 0) + 1
        return scores - np.array([self.values[r] for r in roles])

    def save(self, checkpoint: str | Path) -> Path:
        """Write the baselines beside the checkpoint in `checkpoint`."""
        path = Path(checkpoint) / BASELINE_FILE
        state = {"decay": self.decay, "values": self.values, "updates": self.updates}
        path.write_text(json.dumps(state, indent=2, sort_keys=True))
        return path

    @classmethod
    def load(cls, checkpoint: str | Path, decay: float) -> RoleBaseline:
        """The baselines stored with `checkpoint` (fresh ones if it has none), at `decay`."""
        path = Path(checkpoint) / BASELINE_FILE
        if not path.is_file():
            return cls(decay)
        try:
            state = json.loads(path.read_text())
            return cls(decay, dict(state["values"]), dict(state["updates"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(
                f"{path} is not a RAE baseline file ({e}); delete it to start fresh"
            ) from e

    def metrics(self) -> dict[str, float]:
        """`train/rae/<role>/baseline` for every role."""
        return {f"train/rae/{role}/baseline": v for role, v in sorted(self.values.items())}

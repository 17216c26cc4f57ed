"""Where the model runs: one rule for the engines and the trainers."""

from __future__ import annotations

import torch

from sparring import heap


def pick_device(device: str = "auto") -> torch.device:
    """`auto` -> cuda if available, else cpu. On CPU, the C heap is bounded first
    (`sparring.heap`): every engine and trainer picks its device before its first tensor."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        heap.bound()
    return torch.device(device)

"""Where the model runs: one rule for the engines and the trainers."""

from __future__ import annotations

import torch


def pick_device(device: str = "auto") -> torch.device:
    """`auto` -> cuda if available, else cpu."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)

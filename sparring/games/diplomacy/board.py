"""The Diplomacy engine (PyPI `diplomacy` 1.1.2, AGPL-3.0, the optional `diplomacy` extra) and
the standard board's constants."""

from __future__ import annotations

try:
    from diplomacy import Game as Engine
    from diplomacy import Message
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the Diplomacy game needs the optional `diplomacy` engine (AGPL-3.0): "
        "pip install 'sparring[diplomacy]'"
    ) from err

ROLES = ("AUSTRIA", "ENGLAND", "FRANCE", "GERMANY", "ITALY", "RUSSIA", "TURKEY")
ABBREV = {p[:3]: p for p in ROLES}
WIN_CENTERS = 18


__all__ = ["ABBREV", "ROLES", "WIN_CENTERS", "Engine", "Message"]

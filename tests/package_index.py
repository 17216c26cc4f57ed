"""Whether the package index (PyPI) answers: tests that install from it skip without it."""

from __future__ import annotations

import socket


def index_reachable() -> bool:
    """True if pypi.org accepts a TCP connection within 5 s."""
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        return False
    return True

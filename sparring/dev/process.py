"""What the local servers share: a context manager around `start`/`stop`, and stopping a
process politely (SIGTERM, then SIGKILL after a grace period)."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any, Self


def terminate(proc: subprocess.Popen, grace: float, group: bool = False) -> None:
    """SIGTERM `proc` (its whole process group if `group`), SIGKILL it after `grace` s."""
    if proc.poll() is not None:
        return
    kill = (lambda sig: os.killpg(proc.pid, sig)) if group else proc.send_signal
    kill(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        kill(signal.SIGKILL)
        proc.wait()


class LocalServer:
    """`with Server(...) as server:` starts it and always stops it."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

"""Stopping `sparring run` cleanly on SIGTERM or SIGINT (CI runners, supervisors, Kubernetes
and Ctrl-C): the running task's process is terminated, and `Stopped` unwinds the run so that
the local services stop, the MLflow parent run is marked KILLED and the CLI exits non-zero.

    with stop_on_signals():
        build_pipeline(cfg)()          # raises Stopped on a signal
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(BaseException):
    """The run was stopped by a signal (a BaseException, so that no `except Exception` in
    kfp.local swallows it). `exit_code` is the shell's 128 + signal number."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum).name
        self.exit_code = 128 + signum
        self.partial: str | None = None  # where the run's partial artifacts are, once it started
        super().__init__(f"stopped by {self.signal}")


def terminate_children(keep: set[int], grace: float = 10.0) -> None:
    """SIGTERM the processes this one started, except `keep` (the local services, stopped
    later) and theirs, then SIGKILL those still alive after `grace` seconds."""
    import psutil

    me = psutil.Process()
    kept = {p.pid for p in me.children() if p.pid in keep}
    kept |= {c.pid for p in me.children() if p.pid in keep for c in p.children(recursive=True)}
    children = [c for c in me.children(recursive=True) if c.pid not in kept]
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=grace)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT terminate the child processes started in it (the
    running task, or services still starting) and raise Stopped, once: after a signal both stay
    ignored, in the block and after it, while the caller unwinds to exit. Processes started
    before the block (the local services) are left to their owners."""
    import psutil

    services = {p.pid for p in psutil.Process().children()}
    received = False

    def handler(signum: int, frame: object) -> None:
        nonlocal received
        received = True
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        terminate_children(services)
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        if not received:
            for sig, old in previous.items():
                signal.signal(sig, old)

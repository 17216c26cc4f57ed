"""A zygote for the tests' Python processes: one Python that imported the heavy third-party
libraries once (torch, transformers' model classes, MLflow, verl's GRPO functions) and forks a
child for each process a test starts, instead of a fresh interpreter.

A task process spends ~10 of its ~13 s importing those libraries (py-spy over the tiny
pipeline under kfp.local: 73% of the samples in imports), and the suite starts ~60 of them;
a benchmark's start-up is the same 12 s of imports. Two command shapes fork:
- a KFP lightweight component's container command, `sh -ec 'program_path=$(mktemp -d); printf
  "%s" "$0" > .../ephemeral_component.py; python3 -m kfp.dsl.executor_main
  --component_module_path ... "$@"'`: the child runs exactly that, with the same arguments
  (the executor input), environment (a `sitecustomize.py` on its PYTHONPATH included) and
  working directory;
- `python <script>.py <args...>` with this interpreter (a benchmark): the child runs the script
  as `__main__`, its folder first on `sys.path`, as `python` would.
Sparring's own modules are not preloaded: each child imports them fresh, under its own
environment. A command of any other shape runs as a real subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

PRELOAD = (
    "torch",
    "transformers:AutoModelForCausalLM",
    "transformers:AutoTokenizer",
    "safetensors.torch",
    "peft",
    "mlflow",
    "mlflow.tracking",
    "boto3",
    "pandas",
    "pyarrow.parquet",
    "scipy.optimize",
    "matplotlib.pyplot",
    "verl.trainer.ppo.core_algos",
    "kfp.dsl.executor_main",
)
SCRIPT_START = "program_path=$(mktemp -d)"


def is_component_command(command: list[str]) -> bool:
    """A lightweight component's `sh -ec <script> <source> <args...>`."""
    return (
        len(command) >= 4
        and command[:2] == ["sh", "-ec"]
        and command[2].startswith(SCRIPT_START)
        and "kfp.dsl.executor_main" in command[2]
    )


def is_script_command(command: list[str]) -> bool:
    """`<this interpreter> <script>.py <args...>`."""
    return len(command) >= 2 and command[0] == sys.executable and command[1].endswith(".py")


class Zygote:
    """The preloaded Python, started on first use; one child at a time: kfp.local runs a
    ParallelFor's iterations in threads, and each request must read its own reply."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD) -> None:
        self.preload = preload
        self._proc: subprocess.Popen | None = None
        self._turn = threading.Lock()

    def run(
        self, command: list[str], env: dict[str, str], cwd: str | None = None
    ) -> tuple[int, str]:
        """Run `command` with `env` (the whole environment) in `cwd`: a forked child for a
        component or script command, else a subprocess. Returns (exit code, stdout and
        stderr together)."""
        if not (is_component_command(command) or is_script_command(command)):
            proc = subprocess.run(
                command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            return proc.returncode, proc.stdout.decode(errors="replace")
        with tempfile.NamedTemporaryFile(suffix=".log") as log:
            code = self._fork(command, env, cwd, log.name, log.name)
            return code, Path(log.name).read_text(errors="replace")

    def run_script(self, script: str, args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
        """`python <script> <args>` in a forked child: (exit code, stdout, stderr)."""
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            out.touch(), err.touch()
            code = self._fork([sys.executable, script, *args], env, None, str(out), str(err))
            return code, out.read_text(errors="replace"), err.read_text(errors="replace")

    def _fork(
        self, command: list[str], env: dict[str, str], cwd: str | None, stdout: str, stderr: str
    ) -> int:
        """One request to the zygote and its reply: the child's exit code."""
        with self._turn:
            if self._proc is None:
                self._proc = subprocess.Popen(
                    [sys.executable, __file__, *self.preload],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST")},
                )
            request = {"command": command, "env": env, "cwd": cwd or os.getcwd()}
            request |= {"stdout": stdout, "stderr": stderr}
            self._proc.stdin.write(json.dumps(request).encode() + b"\n")
            self._proc.stdin.flush()
            reply = self._proc.stdout.readline()
            if not reply:
                raise RuntimeError(f"the zygote died (exit code {self._proc.poll()})")
            return json.loads(reply)["returncode"]

    def run_local_subprocess(self, full_command: list[str], env_vars: dict | None = None) -> int:
        """kfp.local's `subprocess_task_handler.run_local_subprocess`, through the zygote:
        the task's log printed as kfp.local prints it."""
        code, log = self.run(full_command, {**os.environ, **(env_vars or {})})
        print(log, end="")
        print("\n")
        return code

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stdin.close()
            self._proc.wait(timeout=30)
            self._proc = None


def _serve(preload: list[str]) -> None:
    """The zygote's loop: import `preload` (`module` or `module:attribute`), then fork one
    child per request line on stdin and answer its exit code on stdout."""
    import importlib

    for name in preload:
        module, _, attribute = name.partition(":")
        imported = importlib.import_module(module)
        if attribute:
            getattr(imported, attribute)  # transformers' lazy names import on access
    replies = os.fdopen(os.dup(1), "w")  # the answers' channel; stray prints go to stderr
    os.dup2(2, 1)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(**request)
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        replies.flush()


def _child(command: list[str], env: dict[str, str], cwd: str, stdout: str, stderr: str) -> None:
    """In the forked child: what the command would run in a fresh process, then exit."""
    import runpy
    import traceback

    code = 1
    try:
        for fd, path in ((1, stdout), (2, stderr)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_TRUNC), fd)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if is_script_command(command):  # `python script.py`: the script's folder first
            script, args = command[1], command[2:]
            sys.path[0] = str(Path(script).resolve().parent)
            sys.path[1:1] = paths
            sys.argv = [script, *args]
            runpy.run_path(script, run_name="__main__")
            sys.exit(0)
        sys.path[:0] = [cwd, *paths]  # `python -m`'s working directory, then PYTHONPATH
        for folder in paths:  # what the interpreter's `site` would have run at start-up
            if (Path(folder) / "sitecustomize.py").exists():
                runpy.run_path(str(Path(folder) / "sitecustomize.py"), run_name="sitecustomize")
        source, args = command[3], command[4:]
        module = Path(tempfile.mkdtemp()) / "ephemeral_component.py"
        module.write_text(source)
        os.environ["_KFP_RUNTIME"] = "true"
        sys.argv = ["executor_main", "--component_module_path", str(module), *args]
        runpy.run_module("kfp.dsl.executor_main", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):  # what the interpreter prints: the message
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    _serve(sys.argv[1:])

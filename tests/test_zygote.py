"""tests/zygote.py runs a lightweight component's command, or a Python script, as a fresh
process would: the same outputs, exit code, log, environment, `sys.path` and start-up
`sitecustomize`."""

import json
import os
import subprocess
import sys

import yaml
from kfp import compiler, dsl
from zygote import Zygote, is_component_command, is_script_command


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def greet(name: str) -> str:
    import os

    if name == "fail":
        raise ValueError("asked to fail")
    print(f"hello {name} from {os.environ['GREETING_FROM']}")
    return f"{name}:{os.environ.get('SITE_RAN', 'no site')}"


def command_for(tmp_path, name: str) -> list[str]:
    """`greet`'s container command with an executor input, as a launcher would build it."""
    compiler.Compiler().compile(greet, str(tmp_path / "greet.yaml"))
    spec = yaml.safe_load((tmp_path / "greet.yaml").read_text())
    container = spec["deploymentSpec"]["executors"]["exec-greet"]["container"]
    executor_input = {
        "inputs": {"parameterValues": {"name": name}},
        "outputs": {
            "parameters": {"Output": {"outputFile": str(tmp_path / "Output")}},
            "outputFile": str(tmp_path / "executor_output.json"),
        },
    }
    text = json.dumps(executor_input)
    command = [*container["command"], *(a.replace("{{$}}", text) for a in container["args"])]
    assert is_component_command(command)
    return command


def test_a_forked_task_runs_as_a_fresh_process_would(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['SITE_RAN'] = 'site ran'\n")
    path = f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"
    env = dict(os.environ, GREETING_FROM="the pod", PYTHONPATH=str(site), PATH=path)
    command = command_for(tmp_path, "ada")
    forks = Zygote(preload=("kfp.dsl.executor_main",))
    try:
        code, log = forks.run(command, env)
        forked = json.loads((tmp_path / "executor_output.json").read_text())
        (tmp_path / "executor_output.json").unlink()
        assert code == 0 and "hello ada from the pod" in log, log
        assert forked["parameterValues"]["Output"] == "ada:site ran"

        other = forks.run(["sh", "-c", 'echo "$GREETING_FROM"; exit 3'], env)
        assert other == (3, "the pod\n")  # a command of another shape: a subprocess

        failed, failed_log = forks.run(command_for(tmp_path, "fail"), env)
        assert failed == 1 and "ValueError: asked to fail" in failed_log
    finally:
        forks.close()


SCRIPT = """import json, os, sys
print(json.dumps([__name__, sys.argv, sys.path[0], os.environ["GREETING_FROM"], os.getcwd()]))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def test_a_forked_script_runs_as_python_would(tmp_path):
    script = tmp_path / "bench" / "probe.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    env = dict(os.environ, GREETING_FROM="the test")
    command = [sys.executable, str(script), "0", "--flag"]
    assert is_script_command(command) and not is_component_command(command)
    fresh = subprocess.run(command, env=env, capture_output=True, text=True)
    forks = Zygote(preload=("json",))
    try:
        assert forks.run_script(str(script), command[2:], env) == (0, fresh.stdout, fresh.stderr)
        code, out, _ = forks.run_script(str(script), ["4"], env)  # its own exit code
        assert code == 4 and json.loads(out)[1] == [str(script), "4"]
    finally:
        forks.close()

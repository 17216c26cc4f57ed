"""bench/train.py end to end at a tiny size: it prints its RESULT line last."""


def test_train_bench_smoke(bench, tiny_model_dir):
    args = ["--model", str(tiny_model_dir), "--batch", "2", "--seq-len", "48", "--repeats", "1"]
    lines = bench.output("train.py", *args)
    assert any("KL on (separate ref model)" in line for line in lines)
    assert any("sdpa_gqa attention" in line for line in lines)
    name, value = lines[-1].split()[1:]
    assert lines[-1].startswith("RESULT") and name == "grpo_step_ratio" and float(value) > 0


def test_train_bench_times_bypass_in_bf16(bench, tiny_model_dir):
    args = ["--model", str(tiny_model_dir), "--batch", "2", "--mini-batch", "1"]
    args += ["--seq-len", "48", "--repeats", "1", "--cpu-bf16"]
    lines = bench.output("train.py", *args)
    results = {
        line.split()[1]: float(line.split()[2]) for line in lines if line.startswith("RESULT")
    }
    assert set(results) == {
        "cpu_bf16_step_speedup",
        "bf16_bypass_saving",
        "bypass_saving",
        "grpo_step_ratio",
    }
    assert 0 < results["cpu_bf16_step_speedup"] and results["bf16_bypass_saving"] < 1
    assert lines[-1].startswith("RESULT grpo_step_ratio")

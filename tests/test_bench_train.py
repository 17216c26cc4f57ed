"""bench/train.py end to end at a tiny size: it prints its RESULT line last."""


def test_train_bench_smoke(bench, tiny_model_dir):
    args = ["--model", str(tiny_model_dir), "--batch", "2", "--seq-len", "48", "--repeats", "1"]
    lines = bench.output("train.py", *args)
    assert any("KL on (separate ref model)" in line for line in lines)
    assert any("sdpa_gqa attention" in line for line in lines)
    name, value = lines[-1].split()[1:]
    assert lines[-1].startswith("RESULT") and name == "grpo_step_ratio" and float(value) > 0

"""sparring.gpu_memory: the parameter formula against published counts, the estimate's response to
each setting (none of which it was fitted on), and every shipped GPU config against its card.

The activation terms were calibrated on five H100 peaks of SmolLM2-135M (docs/results.md); those
figures are not re-checked here, since the estimate was fitted to them.
"""

from __future__ import annotations

import copy
import sys

import pytest
import yaml

from sparring.gpu_memory import (
    GPU_LABEL,
    MODEL_SHAPES,
    TRAIN_DEFAULTS,
    USABLE,
    fit_warnings,
    gpu_memory,
    train_memory,
)
from sparring.loop.config import CONFIG_DIR, PipelineConfig

# The oversized configs below warn when they validate; these tests read fit_warnings instead.
pytestmark = pytest.mark.filterwarnings("ignore::sparring.loop.config.GPUMemoryWarning")

H100 = "NVIDIA-H100-80GB-HBM3"
BASE = {"micro_batch_size": 2, "max_seq_len": 4096}  # the GPU example's micro-batch shape

# Parameter counts the model cards publish (Qwen2.5: "Number of Parameters"), and the count
# sparring.model_zoo checks its SmolLM2 conversion against.
PUBLISHED = {
    "Qwen/Qwen2.5-0.5B-Instruct": 0.49e9,
    "Qwen/Qwen2.5-1.5B-Instruct": 1.54e9,
    "Qwen/Qwen2.5-3B-Instruct": 3.09e9,
    "Qwen/Qwen2.5-7B-Instruct": 7.61e9,
    "Qwen/Qwen2.5-14B-Instruct": 14.7e9,
    "Qwen/Qwen2.5-32B-Instruct": 32.5e9,
    "smollm2-135m-instruct": 134_515_008,
}


@pytest.mark.parametrize("model", list(PUBLISHED))
def test_parameter_formula_matches_published_counts(model):
    assert MODEL_SHAPES[model].params == pytest.approx(PUBLISHED[model], rel=0.01)


def test_every_shipped_model_name_has_a_shape():
    """Qwen and SmolLM2 models named by the shipped configs and the model zoo are all known."""
    from sparring.model_zoo import MODELS, TINY

    assert set(MODELS) - {TINY} <= set(MODEL_SHAPES)  # the tiny model never gets a GPU
    for data in shipped().values():
        if data["model"].startswith(("Qwen/Qwen2.5", "smollm2")):
            assert data["model"] in MODEL_SHAPES


def test_train_defaults_are_grpo_configs():
    from sparring.train import GRPOConfig

    defaults = GRPOConfig()
    assert {name: getattr(defaults, name) for name in TRAIN_DEFAULTS} == TRAIN_DEFAULTS


def test_a_grpo_config_object_reads_like_its_dict():
    from sparring.train import GRPOConfig

    settings = {**BASE, "lora_rank": 8, "kl_coef": 0.01, "gradient_checkpointing": True}
    assert train_memory("smollm2-135m-instruct", GRPOConfig(**settings)) == train_memory(
        "smollm2-135m-instruct", settings
    )


# How each setting moves the estimate: properties of the mechanism, not of the fitted figures.
def parts(**settings) -> dict[str, float]:
    return train_memory("Qwen/Qwen2.5-1.5B-Instruct", {**BASE, **settings})


def changed(a: dict[str, float], b: dict[str, float]) -> set[str]:
    return {k for k in a if a[k] != b[k]}


def test_doubling_the_micro_batch_doubles_only_the_activations():
    one, two = parts(), parts(micro_batch_size=4)
    assert changed(one, two) == {"activations"}
    assert two["activations"] == 2 * one["activations"]


def test_activations_grow_linearly_with_sequence_length():
    """SDPA keeps no T x T attention matrix, so no quadratic term."""
    assert parts(max_seq_len=8192)["activations"] == 2 * parts()["activations"]


def test_gradient_checkpointing_lowers_only_the_activations_by_most_of_them():
    full, ckpt = parts(), parts(gradient_checkpointing=True)
    assert changed(full, ckpt) == {"activations"}
    layers = MODEL_SHAPES["Qwen/Qwen2.5-1.5B-Instruct"].layers
    # one layer's activations are recomputed, and every layer's input (one hidden vector) kept
    assert full["activations"] / layers < ckpt["activations"] < full["activations"] / 8


def test_bf16_params_halve_weights_and_optimizer_state_and_drop_autocast_copies():
    fp32, bf16 = parts(), parts(param_dtype="bfloat16")
    assert bf16["weights"] == fp32["weights"] / 2
    assert bf16["grads+adam"] == fp32["grads+adam"] / 2
    assert fp32["autocast copies"] > 0 and bf16["autocast copies"] == 0
    assert bf16["activations"] < fp32["activations"]  # the residual stream is bf16 too


def test_lora_removes_most_optimizer_state_and_keeps_the_weights():
    full, lora = parts(), parts(lora_rank=16)
    assert changed(full, lora) == {"grads+adam"}
    assert lora["grads+adam"] < 0.05 * full["grads+adam"]


def test_a_kl_penalty_adds_one_reference_copy_of_the_weights():
    without, with_kl = parts(), parts(kl_coef=0.001)
    assert without["reference"] == 0 and with_kl["reference"] == with_kl["weights"]
    assert changed(without, with_kl) == {"reference"}


def test_bigger_models_need_more_at_the_same_settings():
    sizes = ["0.5B", "1.5B", "3B", "7B", "14B"]
    totals = [sum(train_memory(f"Qwen/Qwen2.5-{s}-Instruct", BASE).values()) for s in sizes]
    assert totals == sorted(totals)


def test_the_estimate_needs_a_sequence_length():
    with pytest.raises(ValueError, match="max_seq_len"):
        train_memory("smollm2-135m-instruct", {"micro_batch_size": 2})


def test_card_memory_from_the_table_or_the_label():
    assert gpu_memory(H100) == 80e9
    assert gpu_memory("NVIDIA-A100-SXM4-40GB") == 40e9  # its label names the size
    assert gpu_memory("NVIDIA-Unknown") is None


# fit_warnings on the shipped configs and on ones made to fail.
def shipped() -> dict[str, dict]:
    """Every shipped pipeline config's YAML data, by its path under configs/."""
    paths = sorted(CONFIG_DIR.rglob("*.yaml"))
    skip = ("train.yaml", "sft.yaml", "sft-average.yaml")  # trainer settings, not pipelines
    return {
        str(p.relative_to(CONFIG_DIR)): yaml.safe_load(p.read_text())
        for p in paths
        if p.name not in skip
    }


def on_card(
    data: dict, product: str | None = H100, train_gpus: int = 1, train: dict | None = None, **top
) -> PipelineConfig:
    """The config `data` with its train task on `train_gpus` `product` cards, `train` merged into
    its train section and `top` over its top-level keys."""
    data = copy.deepcopy(data)
    k8s = data.setdefault("kubernetes", {})
    k8s |= {"train_gpus": train_gpus, "node_selector": {GPU_LABEL: product} if product else {}}
    data["train"] = {**data.get("train", {}), **(train or {})}
    return PipelineConfig.model_validate({**data, "device": "cuda", **top})


def test_every_shipped_config_fits_its_card():
    """As shipped (only pipeline-gpu.yaml names a card), and every torch GPU one on an H100."""
    configs = shipped()
    assert "pipeline-gpu.yaml" in configs
    for name, data in configs.items():
        cfg = PipelineConfig.model_validate(data)
        assert fit_warnings(cfg) == [], name
        if cfg.device == "cuda" and cfg.train_backend == "torch":
            assert cfg.model in MODEL_SHAPES, name
            assert fit_warnings(on_card(data)) == [], name


GPU = shipped()["pipeline-gpu.yaml"]


def test_an_oversized_config_warns_naming_the_card_and_the_estimate():
    """7B in fp32 with full AdamW needs ~122 GB before any activation, on an 80 GB card."""
    cfg = on_card(GPU, model="Qwen/Qwen2.5-7B-Instruct")
    (warning,) = fit_warnings(cfg)
    part = train_memory(cfg.model, cfg.train)
    assert warning.startswith("train: Qwen/Qwen2.5-7B-Instruct needs ")
    assert H100 in warning and f"~{sum(part.values()) / 1e9:.1f} GB" in warning
    assert "with train.gradient_checkpointing: true, " in warning  # it names the fixes
    assert (part["weights"] + part["grads+adam"]) / 1e9 == pytest.approx(121.8, rel=0.01)


def test_a_smaller_card_or_a_bigger_micro_batch_warns():
    cfg = PipelineConfig.model_validate(GPU)
    assert sum(train_memory(cfg.model, cfg.train).values()) < USABLE * 80e9  # as shipped
    assert "NVIDIA-L4" in fit_warnings(on_card(GPU, "NVIDIA-L4"))[0]
    assert fit_warnings(on_card(GPU, train={"micro_batch_size": 8}))  # 4x the activations
    checkpointed = {"micro_batch_size": 8, "gradient_checkpointing": True}
    assert fit_warnings(on_card(GPU, train=checkpointed)) == []


def test_the_warm_start_section_is_checked_too():
    big = {"micro_batch_size": 16, "max_seq_len": 4096}
    (warning,) = fit_warnings(on_card(GPU, warm_start={"num_states": 8, "train": big}))
    assert warning.startswith("warm_start.train: ")


def test_no_warning_without_a_gpu_a_known_card_or_a_known_model():
    big = {"micro_batch_size": 64}
    assert fit_warnings(on_card(GPU, train=big))  # the control: it does not fit
    assert fit_warnings(on_card(GPU, train=big, device="auto"))  # auto takes the GPU
    assert fit_warnings(on_card(GPU, train=big, device="cpu")) == []
    assert fit_warnings(on_card(GPU, train_gpus=0, train=big)) == []
    assert fit_warnings(on_card(GPU, None, train=big)) == []
    assert fit_warnings(on_card(GPU, "NVIDIA-Unknown", train=big)) == []
    assert fit_warnings(on_card(GPU, train=big, model="models:/sparring@champion")) == []


def test_a_train_section_without_max_seq_len_takes_the_rollouts_context_limit():
    data = copy.deepcopy(GPU)
    del data["train"]["max_seq_len"]
    assert fit_warnings(on_card(data)) == []  # 4096, the rollout's default limit: as shipped
    data["rollout"]["max_context_tokens"] = 4 * 4096
    assert fit_warnings(on_card(data))


def test_importing_the_module_does_not_import_torch():
    import subprocess

    code = "import sys, sparring.gpu_memory; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

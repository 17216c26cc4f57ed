"""Pick a generation backend from config: `rollout.backend.name` = hf | sglang | openai.

rollout:
  backend: {name: hf}                                         # default, CPU or one GPU
  backend: {name: hf, quantize: int8}                         # CPU: int8 linear layers
  backend: {name: hf, quantize: bf16}                         # CPU with bf16 instructions
  backend: {name: sglang, tp_size: 2, mem_fraction: 0.8}      # in-process SGLang engine
  backend: {name: openai, base_url: http://sglang:30000}      # external SGLang/vLLM server
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sparring.generation.base import GenerationBackend

BACKENDS = ("hf", "sglang", "openai")


class BackendConfig(BaseModel):
    """Which engine generates the model's turns, and its settings."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["hf", "sglang", "openai"] = "hf"
    """hf = transformers (CPU or GPU), sglang = offline SGLang Engine, openai = remote server."""
    quantize: Literal["none", "int8", "bf16"] = "none"
    """hf on CPU: int8 = the linear layers (LM head included) in dynamic int8 for decoding
    (sparring.generation.int8_linear; prefill stays fp32); bf16 = the whole model in bf16
    where the CPU has bf16 instructions (fp32 where it has not). Either is a policy apart
    from the fp32 trainer's (docs/training.md), so a recipe then turns on the rollout
    correction (train.rollout_is). On a GPU the hf engine is bf16 already."""
    int8_min_rows: int = Field(1, ge=1)
    """hf with quantize: int8: inputs of fewer rows run the fp32 layer (1 = never; measured
    faster in int8 from one row on the 2-core AVX2 machine)."""
    int8_fp32_layers: list[str] = []
    """hf with quantize: int8: linear layers (by attribute name, e.g. down_proj, lm_head) kept
    in fp32: less mismatch, less speed (docs/training.md, "Quantized rollout")."""
    tp_size: int = Field(1, ge=1)
    """sglang: tensor-parallel GPUs per engine."""
    mem_fraction: float = Field(0.85, gt=0.0, lt=1.0)
    """sglang: share of GPU memory for weights + KV cache (`mem_fraction_static`)."""
    base_url: str | None = None
    """openai: server root, e.g. http://sglang:30000 (the backend appends /v1/completions)."""
    served_model: str | None = None
    """openai: the server's model name; None = the checkpoint path handed to the rollout."""
    api_key_env: str | None = None
    """openai: name of the environment variable holding the API key (None = no auth)."""
    concurrency: int = Field(32, ge=1)
    """openai: requests in flight at once."""
    retries: int = Field(3, ge=0)
    """openai: retries of a request after a connection error, timeout, 429 or 5xx."""
    timeout_s: float = Field(120.0, gt=0)
    """openai: per-request timeout in seconds."""

    @model_validator(mode="after")
    def _check(self) -> BackendConfig:
        if self.name == "openai" and not self.base_url:
            raise ValueError(
                "rollout.backend.name=openai needs rollout.backend.base_url "
                "(e.g. http://sglang-server:30000)"
            )
        if self.quantize != "none" and self.name != "hf":
            raise ValueError(
                f"rollout.backend.quantize={self.quantize!r} is the hf engine's (CPU); "
                f"{self.name} quantizes through its own server settings"
            )
        if self.int8_fp32_layers and self.quantize != "int8":
            raise ValueError("rollout.backend.int8_fp32_layers is for quantize: int8")
        if self.name != "openai" and self.base_url:
            raise ValueError(
                f"rollout.backend.base_url is set but backend is {self.name!r}; "
                "set name: openai to use the server, or drop base_url"
            )
        return self


def make_backend(
    model_path: str, cfg: BackendConfig, device: str = "auto", max_batch_size: int = 64
) -> GenerationBackend:
    """Build the backend `cfg` names for `model_path` (engines are imported lazily)."""
    if cfg.name == "hf":
        from sparring.generation.hf import HFBackend

        return HFBackend(
            model_path,
            device=device,
            max_batch_size=max_batch_size,
            quantize=cfg.quantize,
            int8_min_rows=cfg.int8_min_rows,
            int8_fp32_layers=tuple(cfg.int8_fp32_layers),
        )
    if cfg.name == "sglang":
        from sparring.generation.sglang import SGLangBackend

        return SGLangBackend(model_path, tp_size=cfg.tp_size, mem_fraction=cfg.mem_fraction)
    if cfg.name == "openai":
        from sparring.generation.openai import OpenAIBackend

        return OpenAIBackend(
            model_path,
            cfg.base_url,
            served_model=cfg.served_model,
            api_key_env=cfg.api_key_env,
            concurrency=cfg.concurrency,
            retries=cfg.retries,
            timeout_s=cfg.timeout_s,
        )
    raise ValueError(f"unknown rollout backend {cfg.name!r}; choose one of {BACKENDS}")

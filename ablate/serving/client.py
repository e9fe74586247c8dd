"""A client of an inference server's OpenAI-compatible completions API (vLLM, SGLang, llama-cpp-python's server),
for the prompt's own log-probs: ``/v1/completions`` with ``echo`` and ``logprobs``, one new token (dropped).

Every request has a timeout and bounded retries (a refused connection, a timeout, a 5xx answer or a body that is
not the JSON the API defines); then :class:`ServerError`, one line naming the server and what went wrong. A partial
or malformed answer is never used: each is checked whole before any value is read. What crossed the wire and how
long the server took are counted for the regime's cost (:attr:`Client.stats`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ablate.errors import AblateError


class ServerError(AblateError):
    """The inference server is down, too slow, or answers what the API does not define (after the retries)."""


@dataclass
class Stats:
    requests: int = 0
    retries: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    request_s: float = 0.0  # wall time of the successful requests, round trip


@dataclass
class EchoLogprobs:
    """One echoed prompt's answer: a value per token the server lists (``None`` where the API gives none)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)


class Client:
    def __init__(self, url: str, model: str | None = None, timeout_s: float = 60.0, retries: int = 3):
        import requests

        self.url = url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self.retries = retries
        self.stats = Stats()
        self._session = requests.Session()

    def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        import requests

        data = None if body is None else json.dumps(body).encode()
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats.retries += 1
                time.sleep(min(0.25 * 2**attempt, 4.0))
            t0 = time.perf_counter()
            try:
                r = self._session.request(
                    method, self.url + path, data=data, timeout=self.timeout_s,
                    headers={"Content-Type": "application/json"} if data else None,
                )  # fmt: skip
            except requests.Timeout:
                last = f"no answer within {self.timeout_s:g} s (ref.timeout_s)"
                continue
            except requests.ConnectionError as e:
                last = f"cannot connect ({type(e).__name__})"
                continue
            if r.status_code >= 500:
                last = f"HTTP {r.status_code}"
                continue
            if r.status_code >= 400:  # the request itself is wrong: retrying cannot help
                raise ServerError(f"server {self.url}{path}: HTTP {r.status_code}: {r.text[:200].strip()}")
            try:
                answer = r.json()
            except ValueError:
                last = "an answer that is not JSON"
                continue
            self.stats.requests += 1
            self.stats.bytes_sent += len(data or b"")
            self.stats.bytes_received += len(r.content)
            self.stats.request_s += time.perf_counter() - t0
            return answer
        raise ServerError(f"server {self.url}{path}: {last}, {self.retries + 1} tries (ref.retries={self.retries})")

    def models(self) -> list[str]:
        """The model ids the server serves (``/v1/models``)."""
        answer = self._request("GET", "/v1/models")
        try:
            return [m["id"] for m in answer["data"]]
        except (KeyError, TypeError):
            raise ServerError(f"server {self.url}/v1/models: not an OpenAI-compatible model list") from None

    def tokenize(self, text: str, api: str = "llama_cpp") -> list[int]:
        """The server's own tokenization of ``text``, special tokens parsed, none added: llama-cpp-python's
        ``/extras/tokenize``, or vLLM's (and SGLang's) ``/tokenize``."""
        if api == "llama_cpp":
            path, body = "/extras/tokenize", {"input": text}
        else:
            path, body = "/tokenize", {"prompt": text, "add_special_tokens": False}
            if self.model:
                body["model"] = self.model
        answer = self._request("POST", path, body)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise ServerError(f"server {self.url}{path}: no token list in the answer")
        return tokens

    def echo(self, prompt: str | list[int], top: int = 1, ids_as_keys: bool = False) -> EchoLogprobs:
        """The log-prob of every prompt token given the ones before it (``echo`` with ``logprobs=top``): the
        server's completions API, one new token asked for (and dropped by the caller). ``ids_as_keys``: vLLM's
        ``return_tokens_as_token_ids``, the top log-probs keyed ``token_id:<id>`` instead of by text."""
        body = {"prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": top, "temperature": 0.0}
        if ids_as_keys:
            body["return_tokens_as_token_ids"] = True
        if self.model:
            body["model"] = self.model
        answer = self._request("POST", "/v1/completions", body)
        try:
            lp = answer["choices"][0]["logprobs"]
            out = EchoLogprobs(list(lp["tokens"]), list(lp["token_logprobs"]), list(lp.get("top_logprobs") or []))
        except (KeyError, IndexError, TypeError):
            raise ServerError(
                f"server {self.url}/v1/completions: no echoed log-probs in the answer (does it support echo with logprobs?)"
            ) from None
        if len(out.tokens) != len(out.token_logprobs) or not all(
            v is None or isinstance(v, (int, float)) for v in out.token_logprobs
        ):
            raise ServerError(f"server {self.url}/v1/completions: malformed log-probs (lengths or values)")
        return out

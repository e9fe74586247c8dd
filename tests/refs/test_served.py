"""``ref=served`` against a real llama.cpp server (llama-cpp-python's, started by the regime on loopback): its
log-probs are the full reference's to the engine's float tolerance, a row the server tokenizes otherwise is
refused or skipped as configured, and a server that is down, killed or answering garbage is one line."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
import torch

from ablate.models.logprobs import next_token_logits
from ablate.refs.base import AUDIT, MissingReference, RefContext, TokenBatch, uncovered_rows
from ablate.refs.full import FullRefConfig, FullReference
from tests.conftest import free_port

pytest.importorskip("llama_cpp")

from ablate.refs.served import ServedRefConfig, ServedReference  # noqa: E402
from ablate.serving.client import ServerError  # noqa: E402

CHATS = [("Review the film in one line.", "It was a wonderful, moving story."), ("Describe the plot.", "Dull.")]


def chat_batch(tokenizer, chats=CHATS, left=False) -> TokenBatch:
    """Chat-formatted prompt + response rows (each starts with the template's BOS), padded right (or left)."""
    rows, masks = [], []
    for prompt, response in chats:
        p = list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                               tokenize=True, return_dict=True)["input_ids"])  # fmt: skip
        r = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p + r)
        masks.append([0] * len(p) + [1] * len(r))
    return pad(tokenizer, rows, masks, left)


def pad(tokenizer, rows, masks, left=False) -> TokenBatch:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    att, comp = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (row, m) in enumerate(zip(rows, masks)):
        cut = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, cut], att[i, cut], comp[i, cut] = torch.tensor(row), 1, torch.tensor(m)
    return TokenBatch(ids, att, comp)


@pytest.fixture(scope="module")
def ctx(tiny_source, tokenizer, cache_root):
    from ablate.models.loading import load_model

    cpu = torch.device("cpu")
    return RefContext(
        model_dir=str(tiny_source.path), model_fingerprint=tiny_source.fingerprint, tokenizer=tokenizer, device=cpu,
        load_model=lambda **kw: load_model(tiny_source, cpu, **kw), cache_root=str(cache_root),
    )  # fmt: skip


@pytest.fixture(scope="module")
def served(ctx):
    ref = ServedReference(ServedRefConfig(mismatch="skip", threads=1), ctx)
    yield ref
    ref.close()


@pytest.mark.slow  # a llama.cpp server, whose echo sorts the vocabulary in Python for every token
@pytest.mark.parametrize("left", [False, True])
def test_logprobs_are_the_full_references_to_float_tolerance(served, ctx, tokenizer, left):
    batch = chat_batch(tokenizer, left=left)
    full = FullReference(FullRefConfig(), ctx).logprobs(batch)
    got = served.logprobs(batch)
    mask = batch.target_mask
    assert (got[~mask] == 0).all() and (got[mask] < 0).all()
    assert (got[mask] - full[mask]).abs().max() < 1e-3  # the engine's float32 kernels


@pytest.mark.slow  # a llama.cpp server, whose echo sorts the vocabulary in Python for every token
def test_training_calls_are_counted_audits_are_not(served, tokenizer):
    batch = chat_batch(tokenizer)
    before = served.cost().extra["requests"]
    served.logprobs(batch, purpose=AUDIT)
    assert served.cost().extra["requests"] == before
    served.logprobs(batch)
    extra = served.cost().extra
    assert extra["requests"] == before + 2 * 2  # a tokenization and an echo per row
    assert extra["wire_bytes"] > 0 and extra["server_rss_bytes"] > 0 and served.cost().bytes_held == 0
    assert served.provenance["engine"].startswith("llama-cpp-python")


def _assert_top_k_and_tail(dist, full_logits, batch, k):
    """At every response position: the scored token and the top entries the server named at full's values, the
    whole a distribution (sums to 1), the rest of the mass spread evenly."""
    full = torch.log_softmax(full_logits.double(), -1)
    mask = batch.target_mask
    d, f, tokens = dist.double()[mask], full[mask], batch.input_ids[:, 1:][mask]
    assert d.logsumexp(-1).sub(0).abs().max() < 1e-5
    rows = torch.arange(len(tokens))
    assert (d[rows, tokens] - f[rows, tokens]).abs().max() < 1e-3
    tail = d.median(-1).values  # most tokens are the tail's, at one value
    named = (d - tail.unsqueeze(-1)).abs() > 1e-6
    assert (named.sum(-1) >= k // 2).all()  # most of the top k are named by a text one token has
    assert (d[named] - f[named]).abs().max() < 1e-3
    assert (d.exp() * (d - f)).sum(-1).abs().max() < 0.5  # KL(stand-in || full): the tail alone, small


@pytest.mark.slow  # a llama.cpp server, whose echo sorts the vocabulary in Python for every token
def test_the_audits_distribution_is_the_servers_top_k_and_a_tail_from_the_same_echo(served, ctx, tokenizer):
    batch = chat_batch(tokenizer)
    before = served.client.stats.requests
    dist = served.distribution(batch)
    _assert_top_k_and_tail(dist, next_token_logits(ctx.load_model(), batch), batch, served.cfg.top)
    asked = served.client.stats.requests - before
    # the audit's per-token log-probs of the same rows come from those answers: no request of their own
    got = served.logprobs(batch, purpose=AUDIT)
    assert served.client.stats.requests - before == asked
    at_tokens = dist.gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    assert (got[batch.target_mask] == at_tokens[batch.target_mask]).all()
    # the reference is frozen: a later audit of the same rows (the pairs, at every evaluation) asks nothing again
    pairs = chat_batch(tokenizer, left=True)
    first = served.logprobs(pairs, purpose=AUDIT)
    asked = served.client.stats.requests
    assert (served.logprobs(pairs, purpose=AUDIT) == first).all() and served.client.stats.requests == asked


def non_canonical_batch(tokenizer) -> TokenBatch:
    """A row whose response is split into tokens its text never tokenizes to (a sampled response can be)."""
    batch = chat_batch(tokenizer, CHATS[:1])
    ids, comp = batch.input_ids[0].tolist(), batch.completion_mask[0].tolist()
    start = comp.index(1)
    word = tokenizer(" wonderful", add_special_tokens=False)["input_ids"]
    split = [tokenizer.convert_tokens_to_ids(t) for t in ("Ġwon", "der", "ful")]
    assert len(word) == 1 and all(t != tokenizer.unk_token_id for t in split), (word, split)
    row = ids[:start] + split + ids[start:]
    return pad(tokenizer, [row, ids], [comp[:start] + [1, 1, 1] + comp[start:], comp])


@pytest.mark.slow  # a llama.cpp server, whose echo sorts the vocabulary in Python for every token
def test_the_audits_stand_in_kl_leaves_out_a_response_tokenized_otherwise_and_says_so(served, ctx, tokenizer):
    """``python -m ablate.audit``'s KL(SFT || served): over the responses the server could score, with a note; the
    evaluator's whole-batch distribution still refuses (its kl/approx is over every response or NaN)."""
    from types import SimpleNamespace

    from ablate.audit.measure import stand_in_kl

    batch = non_canonical_batch(tokenizer)
    judge = ctx.load_model()
    bench = SimpleNamespace(
        inputs=SimpleNamespace(device=torch.device("cpu")), fresh=[SimpleNamespace(batch=batch)],
        eval_precision="fp32", judge=judge,
    )  # fmt: skip
    with pytest.raises(NotImplementedError, match="tokenizes 1 sampled responses otherwise"):
        served.distribution(batch)
    asked = served.client.stats.requests
    value, why, note = stand_in_kl(served, bench)
    assert served.client.stats.requests == asked  # every row's answer, top log-probs too, was kept from the first ask
    assert why is None and note.startswith("over 1 of 2 fresh responses; ") and "otherwise" in note
    canonical = SimpleNamespace(**{**vars(bench), "fresh": [SimpleNamespace(batch=TokenBatch(
        *(t[1:] for t in (batch.input_ids, batch.attention_mask, batch.completion_mask))))]})  # fmt: skip
    assert stand_in_kl(served, canonical) == (value, None, None)
    assert 0 <= value < 0.5  # the F32 export's top-k + tail against full: the tail's share alone


@pytest.mark.slow  # a llama.cpp server, whose echo sorts the vocabulary in Python for every token
def test_a_row_the_server_tokenizes_otherwise_is_skipped_or_refused(served, ctx, tokenizer):
    batch = non_canonical_batch(tokenizer)
    before = served.mismatch_rows
    got = served.logprobs(batch)
    assert uncovered_rows(got).tolist() == [True, False] and served.mismatch_rows == before + 1
    strict = ServedReference(ServedRefConfig(url=served.server.url, mismatch="error"), ctx)
    with pytest.raises(MissingReference, match="tokenizes row 0 otherwise"):
        strict.logprobs(batch)
    assert uncovered_rows(strict.logprobs(batch, purpose=AUDIT)).tolist() == [True, False]  # an audit reports it


def test_a_server_that_is_down_is_one_line(ctx):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServerError, match=rf"server {url}/v1/models: cannot connect .*2 tries \(ref.retries=1\)"):
        ServedReference(ServedRefConfig(url=url, retries=1, timeout_s=2), ctx)


class Garbage(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"data": [{"id": "m"}]}' if self.path == "/v1/models" else b"{not json")

    do_POST = do_GET

    def log_message(self, *args):
        pass


class EndsGeneration(http.server.BaseHTTPRequestHandler):
    """The real server's answers passed through, each echo without its one new token: what llama-cpp-python answers
    when that token ends the generation (SmolLM2 after a row that ends with its end-of-turn token)."""

    upstream = ""

    def _relay(self, body: bytes | None) -> None:
        import requests

        headers = {"Content-Type": "application/json"} if body else None
        r = requests.request(self.command, self.upstream + self.path, data=body, headers=headers, timeout=60)
        answer = r.json()
        if self.path == "/v1/completions":
            lp = answer["choices"][0]["logprobs"]
            for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                lp[key] = lp[key][:-1]
        out = json.dumps(answer).encode()
        self.send_response(r.status_code)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self):
        self._relay(None)

    def do_POST(self):
        self._relay(self.rfile.read(int(self.headers["Content-Length"])))

    def log_message(self, *args):
        pass


@pytest.mark.slow  # a llama.cpp server, whose echo sorts the vocabulary in Python for every token
def test_an_echo_without_its_new_token_is_read_the_same(served, ctx, tokenizer):
    EndsGeneration.upstream = served.client.url
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EndsGeneration)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        ref = ServedReference(ServedRefConfig(url=f"http://127.0.0.1:{proxy.server_address[1]}", prefetch=0), ctx)
        batch = chat_batch(tokenizer)
        assert torch.equal(ref.logprobs(batch), served.logprobs(batch, purpose=AUDIT))
        assert torch.equal(ref.distribution(batch), served.distribution(batch))
    finally:
        proxy.shutdown()


def test_a_server_answering_garbage_is_one_line_and_no_value_is_used(ctx):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(ServerError, match="/extras/tokenize: an answer that is not JSON, 2 tries"):
            ServedReference(ServedRefConfig(url=url, retries=1, timeout_s=2), ctx)
    finally:
        server.shutdown()


@pytest.mark.slow  # a llama.cpp server, whose echo sorts the vocabulary in Python for every token
def test_a_killed_server_is_one_line(ctx, tokenizer):
    ref = ServedReference(ServedRefConfig(threads=1, retries=1, timeout_s=5), ctx)
    ref.server.process.kill()
    ref.server.process.wait()
    with pytest.raises(ServerError, match="cannot connect"):
        ref.logprobs(chat_batch(tokenizer))


class IdsApi(http.server.BaseHTTPRequestHandler):
    """vLLM's side of the API ``ref.api=vllm`` speaks (token-id prompts to ``/v1/completions`` with echo and
    logprobs; ``/tokenize``), answered by a real model on loopback: this machine has no GPU to run vLLM itself."""

    model = tokenizer = None

    def _send(self, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._send({"data": [{"id": "tiny"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            self._send({"tokens": self.tokenizer(body["prompt"], add_special_tokens=False)["input_ids"]})
            return
        ids = body["prompt"]
        assert isinstance(ids, list) and body["echo"] and body["max_tokens"] == 1, body
        with torch.no_grad():
            lp = torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), -1)
        new = int(lp[-1].argmax())
        values = [None] + [float(lp[j - 1, ids[j]]) for j in range(1, len(ids))] + [float(lp[-1, new])]
        tokens = self.tokenizer.convert_ids_to_tokens([*ids, new])
        logprobs = {"tokens": tokens, "token_logprobs": values}
        if body.get("return_tokens_as_token_ids"):  # vLLM's top log-probs keyed by id, the scored token's among them
            scored = [*ids[1:], new]
            top = [lp[j].topk(body["logprobs"]) for j in range(len(ids))]
            logprobs["top_logprobs"] = [None] + [
                {f"token_id:{i}": float(v) for v, i in zip(*t)} | {f"token_id:{s}": float(lp[j, s])}
                for j, (t, s) in enumerate(zip(top, scored))
            ]
        self._send({"choices": [{"text": "", "logprobs": logprobs}]})

    def log_message(self, *args):
        pass


def test_a_token_id_api_scores_the_policys_tokens_exactly_as_sent(ctx, tokenizer, tiny_model):
    IdsApi.model, IdsApi.tokenizer = tiny_model.eval(), tokenizer
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), IdsApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ref = ServedReference(ServedRefConfig(url=f"http://127.0.0.1:{server.server_address[1]}", api="vllm"), ctx)
        for batch in (chat_batch(tokenizer, left=True), non_canonical_batch(tokenizer)):  # ids need no round trip
            full, got = FullReference(FullRefConfig(), ctx).logprobs(batch), ref.logprobs(batch)
            mask = batch.target_mask
            assert not uncovered_rows(got).any() and (got[~mask] == 0).all()
            assert (got[mask] - full[mask]).abs().max() < 1e-4
        assert ref.cost().extra["requests"] == 2 + 2  # an echo a row; the probe's /tokenize is not training's
        batch = chat_batch(tokenizer, left=True)
        _assert_top_k_and_tail(ref.distribution(batch), next_token_logits(tiny_model, batch), batch, ref.cfg.top)
    finally:
        server.shutdown()


@pytest.mark.slow  # a llama.cpp server, whose echo sorts the vocabulary in Python for every token
def test_prefetched_rows_are_the_same_values_and_training_waits_on_no_request_of_its_own(served, ctx, tokenizer):
    first, second = chat_batch(tokenizer), chat_batch(tokenizer, [("Name a colour.", "Blue."), ("Say hi.", "Hi!")])
    plain = [served.logprobs(b, purpose=AUDIT) for b in (first, second)]
    ahead = ServedReference(ServedRefConfig(url=served.server.url, prefetch=1), ctx)
    assert ahead.prefetches
    ahead.prefetch([first, second])
    own = ahead.client.stats.requests
    got = [ahead.logprobs(first), ahead.logprobs(second)]
    assert ahead.client.stats.requests == own  # every row came from the background requests
    assert all(torch.equal(a, b) for a, b in zip(got, plain))
    assert ahead.cost().extra["requests"] == 2 * 2 * 2  # 2 batches x 2 rows x (tokenize, echo), all for training
    ahead.logprobs(chat_batch(tokenizer, [("Count to two.", "One, two.")]))  # not asked ahead: asked now
    assert ahead.client.stats.requests == own + 2
    ahead.close()


@pytest.mark.slow  # a second llama.cpp server
def test_a_copy_quantised_by_llama_cpp_is_served_close_to_full_but_not_equal(ctx, tokenizer):
    ref = ServedReference(ServedRefConfig(quant="q8_0", threads=1), ctx)
    try:
        assert ref.provenance["model"].endswith("model.gguf") and "quantized" in ref.provenance["model"]
        batch = chat_batch(tokenizer)
        full, got = FullReference(FullRefConfig(), ctx).logprobs(batch), ref.logprobs(batch)
        err = (got - full)[batch.target_mask].abs()
        assert 1e-4 < err.max() < 0.2, err.max()  # 8-bit weights: an error the F32 export does not have
    finally:
        ref.close()


def test_a_server_dies_with_the_process_that_started_it_even_on_sigkill(served, tmp_path):
    """A job killed with SIGKILL (or an xdist worker ending in os._exit) runs no atexit handler: the kernel's
    parent-death signal stops the server all the same (Linux)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    code = (
        "import sys, time; from pathlib import Path; from ablate.serving.engine import LlamaCppServer; "
        "s = LlamaCppServer(Path(sys.argv[1]), n_ctx=256, threads=1, log=Path(sys.argv[2])); "
        "print(s.process.pid, flush=True); time.sleep(600)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code, served.provenance["model"], str(tmp_path / "server.log")],
        stdout=subprocess.PIPE,
        text=True,
    )
    server = psutil.Process(int(parent.stdout.readline()))
    assert server.is_running() and server.status() != psutil.STATUS_ZOMBIE
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline and server.is_running() and server.status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.2)
        assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
    finally:
        if server.is_running():  # the failure above leaves no server behind either
            server.kill()

"""How a prompt string becomes the messages a chat template renders, and back: shared by the tasks that write
prompts, the models that sample them and the algorithms that hand them to TRL."""

from __future__ import annotations

import json

# A prompt is a string everywhere in the harness (caches, fingerprints, samples.jsonl). A conversational prompt of
# several messages (a system turn, earlier turns) is kept as this marker and its messages in JSON, so that it
# renders through the chat template exactly as written; a single user turn is kept as its text.
_CHAT = "\ue000chat:"


def as_chat(prompt: str) -> list[dict]:
    """``prompt`` as the messages a chat template renders: one user turn, or the conversation
    :func:`from_chat` kept."""
    if prompt.startswith(_CHAT):
        return json.loads(prompt[len(_CHAT) :])
    return [{"role": "user", "content": prompt}]


def from_chat(messages: list[dict]) -> str:
    """The prompt string of a conversation (the inverse of :func:`as_chat`): a single user turn's text, else the
    messages kept whole."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["content"]
    return _CHAT + json.dumps([{"role": m["role"], "content": m["content"]} for m in messages], ensure_ascii=False)

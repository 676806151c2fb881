"""The ``logprobs`` of emulated answers, in vLLM's two shapes.

The values come from the answer's generator (:meth:`AnswerGenerator.logprob`): how each
token was made (copied from the prompt, or sampled in its place, or a new word) sets its
probability, so copied spans read as confident and new words as not, as a real model's do.

- chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}``,
  ``top_logprobs`` the sampled token first, then the likeliest others (``top_logprobs``
  entries in all);
- completions: ``{"text_offset", "token_logprobs", "tokens", "top_logprobs"}``, each
  ``top_logprobs`` entry a map of ``logprobs + 1`` tokens (the sampled one first); with
  ``echo`` the prompt's tokens come first, the very first without a value (the emulator
  names no alternatives to a prompt's tokens: their maps hold the token alone).

vLLM floors a value at -9999.0; the emulator's are far above it. ``prompt_logprobs`` is
checked as vLLM checks it, and answered ``null``.
"""

from __future__ import annotations

from typing import Any

from gateway.emulator.engine_types import EngineRequest
from gateway.emulator.textgen import prompt_logprobs


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def chat_logprobs(req: EngineRequest, start: int, tokens: list[str], top: int) -> dict[str, Any]:
    """The chat shape for answer tokens ``start ...`` of ``req`` (``tokens`` as sent)."""
    gen, content = req.gen, []
    for j, tok in enumerate(tokens):
        i = req.skip + start + j
        alts = gen.top(i, top) if top else []
        item = _entry(tok, gen.logprob(i))
        item["top_logprobs"] = [_entry(tok if n == 0 else t, lp) for n, (t, lp) in enumerate(alts)]
        content.append(item)
    return {"content": content}


class CompletionLogprobs:
    """The completions shape for one choice, built chunk by chunk (``text_offset`` runs on
    from the text already sent)."""

    def __init__(self, req: EngineRequest, top: int) -> None:
        self.req, self.top = req, top
        self.offset = 0  # characters of the choice's text so far
        self.done = 0  # answer tokens so far

    def prompt(self) -> dict[str, Any]:
        """The prompt's tokens (``echo``)."""
        toks = self.req.prompt_tokens
        values = prompt_logprobs(toks)
        tops: list[dict[str, float] | None] = [
            None if v is None else {t: v} for t, v in zip(toks, values, strict=True)
        ]
        return self._shape(toks, values, tops)

    def answer(self, tokens: list[str]) -> dict[str, Any]:
        """The next answer tokens, as sent."""
        gen, base = self.req.gen, self.req.skip + self.done
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        for j, tok in enumerate(tokens):
            lp = gen.logprob(base + j)
            values.append(lp)
            alts = gen.top(base + j, self.top + 1)
            tops.append({tok: lp, **{t: v for t, v in alts[1:] if t != tok}})
        self.done += len(tokens)
        return self._shape(tokens, values, tops)

    def _shape(
        self, tokens: list[str], values: list[float | None], tops: list[dict[str, float] | None]
    ) -> dict[str, Any]:
        offsets = []
        for tok in tokens:
            offsets.append(self.offset)
            self.offset += len(tok)
        return {"text_offset": offsets, "token_logprobs": values, "tokens": tokens, "top_logprobs": tops}


def joined(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """Two completions-shape parts as one (the prompt's, then the answer's)."""
    if a is None:
        return b
    return {k: a[k] + b[k] for k in ("text_offset", "token_logprobs", "tokens", "top_logprobs")}

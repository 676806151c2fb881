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

from specgate_lab.emulator.engine_types import EngineRequest
from specgate_lab.emulator.textgen import prompt_logprobs


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


class ChoiceLogprobs:
    """One choice's logprobs, chunk by chunk: :meth:`next` gives those of the answer tokens
    sent in a chunk (``text_offset`` running on from the text already sent; with ``echo`` the
    first call puts the prompt's tokens first)."""

    def __init__(self, req: EngineRequest, top: int, *, chat: bool, echo: bool) -> None:
        self.req, self.top, self.chat = req, top, chat
        self.echo = echo and not chat  # chat's echo is not emulated
        self.done = 0  # answer tokens so far
        self.offset = 0  # characters of the choice's text so far (completions)

    def next(self, tokens: list[str]) -> dict[str, Any]:
        """The shape for the next answer ``tokens``, as sent."""
        start = self.done
        self.done += len(tokens)
        if self.chat:
            return {"content": [self._chat_entry(start + j, tok) for j, tok in enumerate(tokens)]}
        toks: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        if self.echo:  # the prompt's tokens come first
            self.echo = False
            toks = list(self.req.prompt_tokens)
            values = prompt_logprobs(toks)
            tops = [None if v is None else {t: v} for t, v in zip(toks, values, strict=True)]
        gen = self.req.gen
        for j, tok in enumerate(tokens):
            lp = gen.logprob(start + j)
            alts = gen.top(start + j, self.top + 1)
            toks.append(tok)
            values.append(lp)
            tops.append({tok: lp, **{t: v for t, v in alts[1:] if t != tok}})
        offsets = []
        for tok in toks:
            offsets.append(self.offset)
            self.offset += len(tok)
        return {"text_offset": offsets, "token_logprobs": values, "tokens": toks, "top_logprobs": tops}

    def _chat_entry(self, i: int, tok: str) -> dict[str, Any]:
        gen = self.req.gen
        alts = gen.top(i, self.top) if self.top else []
        item = _entry(tok, gen.logprob(i))
        item["top_logprobs"] = [_entry(tok if n == 0 else t, lp) for n, (t, lp) in enumerate(alts)]
        return item

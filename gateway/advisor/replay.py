"""One logged request and its answer → what an n-gram (and a suffix) proposer would have
done on it.

The answer is replayed against its prompt with vLLM's prompt-lookup rules
(:func:`gateway.text.lookup.realised_lookup`): at each step the longest suffix of
``prompt_lookup_min`` … ``prompt_lookup_max`` tokens that occurred earlier proposes the
``k`` tokens that followed it; a draft token is accepted while it equals the answer's.
For a sampled answer this is acceptance in expectation: vLLM accepts an n-gram draft
token with the target's probability of it, which is the chance the sampled answer holds
it. Tokens are the gateway's cheap word pieces, not the model's (no tokenizer is
loaded): counts per step are close, not exact. Work is bounded per record (the last
64 000 characters of the prompt, the first 16 000 of the answer). The suffix proposer
(:mod:`gateway.text.suffix`) drafts from the prompt, the answer so far and the earlier
answers, and is verified the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.pipeline.outcome import LookupSettings
from gateway.pipeline.request import CHAT, COMPLETIONS, BadRequest, parse_request
from gateway.routing.acceptance import temp_bucket
from gateway.text.lookup import LookupStats, realised_lookup
from gateway.text.suffix import AnswerCache, SuffixSettings, realised_suffix
from gateway.text.tokens import tokenize

MAX_PROMPT_CHARS = 64_000
MAX_ANSWER_CHARS = 16_000
MIN_ANSWER_TOKENS = 2


@dataclass(frozen=True, slots=True)
class Replay:
    """One answer replayed: its class (the gateway's kind and temperature bucket) and what
    the proposer would have done over it."""

    kind: str
    temperature: float
    bucket: int
    prompt_tokens: int  # word pieces of the prompt replayed against
    stats: LookupStats  # the n-gram proposer's
    suffix: LookupStats | None = None  # the suffix proposer's, where it was replayed too


def answer_of(response: Any) -> tuple[str, bool] | None:
    """(text, whether it ended on a stop: ``finish_reason`` "stop") of the first choice of
    an OpenAI chat or completions response object."""
    if not isinstance(response, dict):
        return None
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    c = choices[0]
    msg = c.get("message")
    text = msg.get("content") if isinstance(msg, dict) else c.get("text")
    return (text, c.get("finish_reason") == "stop") if isinstance(text, str) else None


def replay(
    request: Any,
    answer: str,
    settings: LookupSettings,
    *,
    stopped: bool = False,
    suffix: tuple[SuffixSettings, AnswerCache] | None = None,
) -> Replay | None:
    """Replay one request (an OpenAI chat or completions body) and its answer text
    (``stopped``: it ended on a stop, not at ``max_tokens``); None when the body is not a
    valid request or the answer is too short to say anything. With ``suffix``, also
    through a suffix-decoding proposer drafting from the earlier answers in its cache,
    which then takes this answer (the caller serialises calls that share a cache)."""
    if not isinstance(request, dict):
        return None
    endpoint = CHAT if "messages" in request else COMPLETIONS
    try:
        parsed = parse_request(request, endpoint, None, allow_override=False)
    except BadRequest:
        return None
    tokens = tokenize(answer[:MAX_ANSWER_CHARS])
    if len(tokens) < MIN_ANSWER_TOKENS:
        return None
    prompt = tokenize(parsed.prompt_text[-MAX_PROMPT_CHARS:])
    stats = realised_lookup(
        prompt, tokens, k=settings.k, n_min=settings.n_min, n_max=settings.n_max, stopped=stopped
    )
    f = parsed.features
    sx = None if suffix is None else realised_suffix(prompt, tokens, suffix[0], suffix[1], stopped=stopped)
    return Replay(f.kind, f.temperature, temp_bucket(f.temperature), len(prompt), stats, sx)

"""Token-level helpers of the engine's speculative step: n-gram drafting and verification.

:func:`indexed_proposer` builds a request's prompt-lookup proposer when its prefill
completes, :func:`verify_text_drafts` verifies text drafts against the request's
answer, :func:`apply_stop` cuts emitted tokens at a stop string, and
:func:`draft_cost_ms` prices a step's drafting.
"""

from __future__ import annotations

from gateway.physics import StepTimeProfile
from gateway.text import PromptLookupProposer
from specgate_lab.emulator.engine_types import EngineRequest
from specgate_lab.emulator.spec import SpecConfig


def draft_cost_ms(prof: StepTimeProfile, spec: SpecConfig, drafted_k: int, n_dec: int, ctx: float) -> float:
    """Drafting time of a step with ``n_dec`` decoding sequences (longest text draft ``drafted_k``)."""
    draft_ms = 0.0
    # Model drafters run k passes for the batch; n-gram lookup is host work per step.
    k_eff = drafted_k if spec.text_based else spec.k
    if k_eff or spec.text_based:
        draft_ms = prof.draft_ms(spec.method, max(1, k_eff), n_dec, ctx, spec.draft_model)
    return draft_ms + prof.spec_host_overhead_ms


def verify_text_drafts(req: EngineRequest, drafts: list[str]) -> int:
    """How many of ``drafts`` the target accepts: the leading run equal to the answer.

    As in vLLM's rejection sampler with a one-hot n-gram draft, a draft token is accepted
    exactly when the token the target samples there equals it, at any temperature: the
    answer text already holds what sampling chose (:mod:`specgate_lab.emulator.textgen`), so
    acceptance follows the text and nothing else.
    """
    gen = req.gen
    pos = len(req.output)
    a = 0
    for tok in drafts:
        if tok != gen.token(pos + a):
            break
        a += 1
    return a


def indexed_proposer(prompt: list[str], *, k: int, n_min: int, n_max: int) -> PromptLookupProposer:
    """A :class:`PromptLookupProposer` over ``prompt``, indexed in bulk.

    Same state as ``PromptLookupProposer(prompt, ...)`` (every n-gram that has a
    follower maps to the end of its latest occurrence) but built with C-level zips:
    long prompts are indexed once per request, so this is the emulator's hot path.
    """
    prop = PromptLookupProposer((), k=k, n_min=n_min, n_max=n_max)
    size = len(prompt)
    for n in range(n_min, n_max + 1):
        if size > n:
            grams = zip(*(prompt[j : size - n + j] for j in range(n)), strict=True)
            prop._index[n] = dict(zip(grams, range(n, size), strict=True))
    prop.tokens = list(prompt)
    return prop


def apply_stop(req: EngineRequest, toks: list[str]) -> tuple[list[str], bool]:
    """Cut ``toks`` at the first stop string (the stop string itself is not returned)."""
    tail = "".join(req.output[-8:])
    new = "".join(toks)
    text = tail + new
    best = -1
    for s in req.stop:
        if not s:
            continue
        i = text.find(s, max(0, len(tail) - len(s) + 1))
        if i != -1 and (best == -1 or i < best):
            best = i
    if best == -1:
        return toks, False
    keep = best - len(tail)
    if keep < 0:
        # The stop string began in text already produced: trim it (a stream has sent it).
        trim = -keep
        while trim > 0 and req.output:
            last = req.output.pop()
            if len(last) > trim:
                req.output.append(last[: len(last) - trim])
            trim -= len(last)
        return [], True
    out: list[str] = []
    acc = 0
    for t in toks:
        if acc + len(t) > keep:
            if keep - acc > 0:
                out.append(t[: keep - acc])
            break
        out.append(t)
        acc += len(t)
    return out, True

"""A request as an emulated engine takes it in: its answer's generator, seeded as vLLM's
sampling would be (fixed at T=0, the request's ``seed`` where given, fresh otherwise), where
a continued answer starts, and its acceptance on the engine's drafter.

:meth:`gateway.emulator.engine.Engine.make_request` calls these; the engine's stepping
never needs them again.
"""

from __future__ import annotations

import random

from gateway.emulator.acceptance import curve_for, synthetic_curve
from gateway.emulator.engine_types import EngineConfig, EngineRequest
from gateway.emulator.spec import SpecConfig
from gateway.emulator.textgen import AnswerGenerator, PromptKind, answer_seed
from gateway.text import tokenize


def new_request(
    config: EngineConfig,
    counter: int,
    prompt: str,
    *,
    max_tokens: int,
    temperature: float = 0.0,
    seed: int | None = None,
    ignore_eos: bool = False,
    stop: tuple[str, ...] = (),
    request_id: str | None = None,
    kind: PromptKind | None = None,
    prompt_tokens: list[str] | None = None,
    n_param: int = 1,
    continues: tuple[str, str] | None = None,
) -> EngineRequest:
    """The engine's ``counter``-th request. ``continues``: (the prompt the answer was begun
    for, the part of it already given) when this request continues an answer (chat's
    ``continue_final_message``): the answer is that prompt's, from where the given part ends."""
    toks = prompt_tokens if prompt_tokens is not None else tokenize(prompt)
    s = answer_seed(seed, config.seed, counter, temperature)
    skip = 0
    if continues is not None:
        begun, given = continues
        gen = AnswerGenerator(begun, tokenize(begun), temperature=temperature, seed=s, kind=kind)
        skip = answered(gen, given)
    else:
        gen = AnswerGenerator(prompt, toks, temperature=temperature, seed=s, kind=kind)
    return EngineRequest(
        request_id=request_id or f"req-{counter}",
        prompt=prompt,
        prompt_tokens=toks,
        max_tokens=max(1, max_tokens),
        temperature=max(0.0, temperature),
        gen=gen,
        ignore_eos=ignore_eos,
        stop=stop,
        n_param=n_param,
        rng=random.Random(hash((s, counter, config.seed, 0x5EED))),
        skip=skip,
    )


def speculate(spec: SpecConfig | None, req: EngineRequest) -> None:
    """Set up ``req``'s acceptance on a drafter (none for a plain engine): per-position
    counters, and the acceptance curve of a drafter that is not text-based (a text-based
    one gets its proposer when the prompt is prefilled)."""
    if spec is None:
        return
    if not req.accepted_per_pos:
        req.accepted_per_pos = [0] * spec.k
    if spec.synthetic:
        req.cond = synthetic_curve(spec.synthetic_rates, spec.synthetic_length, spec.k)
    elif not spec.text_based:
        req.cond = curve_for(spec.method, req.gen.kind, req.temperature, spec.k)


def answered(gen: AnswerGenerator, given: str) -> int:
    """How many of ``gen``'s tokens the given text covers: the first count whose text is at
    least as long (aligned on text, not on a second tokenization of it, which need not
    split where the answer's tokens did)."""
    n = chars = 0
    while chars < len(given) and n < 1 << 20:
        chars += len(gen.token(n))
        n += 1
    return n

"""Turn a seed into chat requests of a chosen mix of kinds and temperatures."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator, Mapping
from typing import Any

from gateway.text import tokenize
from specgate_lab.workload.chat import chat_question
from specgate_lab.workload.code import generate_module, rename, rename_target
from specgate_lab.workload.documents import Document, generate_document
from specgate_lab.workload.types import SUBKINDS, TemperatureDist, WorkloadRequest, kind_of, parse_mix

DEFAULT_MAX_TOKENS_CAP = 2048

_FENCES = ("```python\n{code}```", "```\n{code}```", "{code}")


def _budget(reference: str, cap: int, slack: float = 1.25, extra: int = 32) -> int:
    return max(16, min(cap, math.ceil(len(tokenize(reference)) * slack) + extra))


def _fence(code: str) -> str:
    return f"```python\n{code}```"


def _edit(rng: random.Random, subkind: str | None, cap: int) -> tuple[str, list[dict[str, str]], str, int]:
    module = generate_module(rng)
    if subkind is None:
        subkind = rng.choice(SUBKINDS["edit"])
    if subkind == "constant" and not module.constants:
        subkind = "rename"
    src = module.plain
    if subkind == "rename":
        old, new = rename_target(rng, module)
        target = rename(src, old, new)
        instr = rng.choice(
            (
                f"Rename the function `{old}` to `{new}` everywhere in this file. "
                "Return the complete file, otherwise unchanged.",
                f"Please rename {old} -> {new} in the code below and give me back the whole file.",
                f"Refactor: `{old}` should be called `{new}`. Output the full updated module only, "
                "no explanation.",
            )
        )
    elif subkind == "typehints":
        target = module.render(typed=True)
        instr = rng.choice(
            (
                "Add type hints to every function in this module. Keep everything else exactly as it is.",
                "Annotate this Python file with precise type hints (PEP 484, builtin generics). "
                "Return the whole file.",
                "Can you add types to the parameters and return values below? Don't change any logic.",
            )
        )
    elif subkind == "docstrings":
        target = module.render(documented=True)
        instr = rng.choice(
            (
                "Add a one-line docstring to each function and class. Do not change anything else.",
                "Document this module: give every function a short docstring. Return the full file.",
            )
        )
    else:
        slot, name, value = rng.choice(module.constants)
        target = module.render(const_slot=slot)
        instr = rng.choice(
            (
                f"Extract the magic number {value} into a module-level constant named {name}. "
                "Return the full file.",
                f"Replace the hard-coded {value} with a constant `{name}` defined at the top of the module. "
                "Keep the rest of the file unchanged.",
            )
        )
    pasted = rng.choice(_FENCES).format(code=src)
    user = f"{instr}\n\n{pasted}" if rng.random() < 0.7 else f"{pasted}\n\n{instr}"
    messages = [{"role": "user", "content": user}]
    if rng.random() < 0.3:
        messages.insert(0, {"role": "system", "content": "You are an expert Python programmer."})
    ref = _fence(target)
    return subkind, messages, ref, _budget(ref, cap)


def _paste(rng: random.Random, doc: Document) -> str:
    style = rng.randrange(3)
    if style == 0:
        return f'"""\n{doc.text}"""'
    if style == 1:
        return f"<document>\n{doc.text}</document>"
    return f"---\n{doc.text}---"


def _summary(
    rng: random.Random, subkind: str | None, cap: int
) -> tuple[str, list[dict[str, str]], str | None, int]:
    doc = generate_document(rng)
    if subkind is None:
        subkind = rng.choices(SUBKINDS["summary"], weights=(0.4, 0.35, 0.25), k=1)[0]
    reference: str | None
    quotable = [kw for kw in doc.keywords if any(kw in s for s in doc.sentences)]
    if subkind == "quote" and not quotable:
        subkind = "extract"
    if subkind == "extract" and not doc.records:
        subkind = "summarize"
    if subkind == "summarize":
        n = rng.randint(3, 5)
        instr = rng.choice(
            (
                f"Summarize the {doc.doctype} below in {n} bullet points.",
                f"Write a two-sentence TL;DR of this {doc.doctype}.",
                f"Summarize this {doc.doctype} for an executive who has one minute.",
                f"What are the key takeaways of the following {doc.doctype}?",
            )
        )
        reference, max_tokens = None, min(cap, rng.choice((128, 256, 384)))
    elif subkind == "extract":
        keys = ", ".join(doc.records[0])
        instr = (
            f"Extract all {doc.record_name} from the {doc.doctype} below as a JSON array of objects with "
            f"the keys {keys}. Copy the values exactly as written. Output only the JSON."
        )
        reference = json.dumps(doc.records, indent=2, ensure_ascii=False)
        max_tokens = _budget(reference, cap)
    else:
        kw = rng.choice(quotable)
        instr = rng.choice(
            (
                f"Quote verbatim every sentence of the {doc.doctype} below that mentions {kw}, "
                "one per line, without commentary.",
                f"Copy out, word for word, the lines that refer to {kw}.",
            )
        )
        reference = "\n".join(s for s in doc.sentences if kw in s)
        max_tokens = _budget(reference, cap)
    user = f"{instr}\n\n{_paste(rng, doc)}"
    return subkind, [{"role": "user", "content": user}], reference, max_tokens


def _rag(rng: random.Random, cap: int) -> tuple[str, list[dict[str, str]], str, int]:
    docs = [generate_document(rng, short=True) for _ in range(rng.randint(3, 6))]
    target = rng.randrange(len(docs))
    facts = [f for f in docs[target].facts if f[1] in docs[target].text]
    question, answer = rng.choice(facts)
    context = "\n\n".join(f"[{i + 1}] {d.text}" for i, d in enumerate(docs))
    system = (
        "Answer the question using only the context passages. Quote the sentence that answers it "
        "and cite the passage number like [2]. If the context does not contain the answer, say so."
    )
    user = f"Context:\n\n{context}\nQuestion: {question}"
    reference = f"{answer} [{target + 1}]"
    return (
        "rag",
        [{"role": "system", "content": system}, {"role": "user", "content": user}],
        reference,
        min(cap, rng.choice((96, 128, 192))),
    )


def _chat(rng: random.Random, cap: int) -> tuple[str, list[dict[str, str]], None, int]:
    system, question = chat_question(rng)
    messages = [{"role": "user", "content": question}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    return "chat", messages, None, min(cap, rng.choice((256, 384, 512, 768)))


def sample(
    rng: random.Random,
    mix: str | Mapping[str, float] | None = None,
    temperature: str | float | TemperatureDist = "default",
    *,
    max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP,
) -> WorkloadRequest:
    """Draw one request. Deterministic for a given ``rng`` state, mix and temperature spec.

    ``mix`` weights kinds (``edit``, ``summary``, ``rag``, ``chat``) or sub-kinds
    (``rename``, ``quote``, …); see :func:`specgate_lab.workload.types.parse_mix`.
    """
    weights = parse_mix(mix)
    dist = TemperatureDist.parse(temperature)
    names = sorted(weights)
    name = rng.choices(names, weights=[weights[n] for n in names], k=1)[0]
    kind = kind_of(name)
    sub = None if name == kind else name
    seed = rng.getrandbits(63)
    task_rng = random.Random(seed)
    reference: str | None
    if kind == "edit":
        subkind, messages, reference, max_tokens = _edit(task_rng, sub, max_tokens_cap)
    elif kind == "summary":
        subkind, messages, reference, max_tokens = _summary(task_rng, sub, max_tokens_cap)
    elif kind == "rag":
        subkind, messages, reference, max_tokens = _rag(task_rng, max_tokens_cap)
    else:
        subkind, messages, reference, max_tokens = _chat(task_rng, max_tokens_cap)
    return WorkloadRequest(
        kind=kind,
        subkind=subkind,
        messages=tuple(messages),
        temperature=dist.sample(rng),
        max_tokens=max_tokens,
        reference=reference,
        seed=seed,
    )


def iter_requests(
    seed: int,
    n: int | None = None,
    mix: str | Mapping[str, float] | None = None,
    temperature: str | float | TemperatureDist = "default",
    *,
    max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP,
) -> Iterator[WorkloadRequest]:
    """``n`` requests (endless when ``None``) from one seed."""
    rng = random.Random(seed)
    weights = parse_mix(mix)
    dist = TemperatureDist.parse(temperature)
    i = 0
    while n is None or i < n:
        yield sample(rng, weights, dist, max_tokens_cap=max_tokens_cap)
        i += 1


def to_openai_body(
    req: WorkloadRequest,
    model: str,
    *,
    stream: bool = True,
    include_usage: bool = True,
    seeded: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``/v1/chat/completions`` JSON body of a request (``seeded``: with its seed, so a
    sampled answer is one reproducible draw)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [dict(m) for m in req.messages],
        "temperature": req.temperature,
        "max_tokens": req.max_tokens,
        "stream": stream,
    }
    if stream and include_usage:
        body["stream_options"] = {"include_usage": True}
    if seeded and req.seed is not None:
        body["seed"] = req.seed
    if extra:
        body.update(extra)
    return body

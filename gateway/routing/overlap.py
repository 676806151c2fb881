"""Prompt→answer overlap prediction (how much of the answer will copy the prompt).

:func:`predict_overlap` is a prior from cheap text features, computed on every request
before routing. It must be fast: it never tokenizes, it lower-cases only a bounded
head and tail of the texts, and its work is a handful of substring searches, so its cost
is flat in the prompt length (``scripts/bench_overlap.py`` measures it).

Features: code fences and code-looking lines, edit verbs ("rewrite", "refactor", "fix",
"return unchanged", "rename", "add type hints"), extraction verbs ("extract", "quote",
"list all", "verbatim"), summary verbs, retrieval markers ("context:", "[1]", "sources"),
the length of pasted context relative to the instruction, and question forms.

The request *kind* is a small bounded vocabulary (:data:`KINDS`), safe as a metric
label, and is the key under which the adaptive policy learns, online, what acceptance
requests of that kind really get (:mod:`gateway.routing.acceptance`).

:func:`realised_lookup_acceptance` is the learning signal: after a response, what an
n-gram proposer would have had accepted on this answer.
"""

from __future__ import annotations

from gateway.text import LookupStats, realised_lookup, tokenize

KINDS: tuple[str, ...] = ("edit", "extract", "summary", "rag", "code", "chat")

# Prior fraction of answer tokens that copy the prompt, per kind (before the length factor).
KIND_PRIOR: dict[str, float] = {
    "edit": 0.85,
    "extract": 0.65,
    "summary": 0.3,
    "rag": 0.45,
    "code": 0.35,
    "chat": 0.05,
}

_HEAD = 2048  # chars of the instruction we inspect at its start...
_TAIL = 1024  # ...and at its end (instructions often come after a pasted document)
_CTX_PROBE = 4096  # chars of the prompt probed for retrieval markers and code

_EDIT = (
    "rewrite",
    "refactor",
    "rename",
    "return unchanged",
    "unchanged",
    "return the full",
    "return the whole",
    "return the complete",
    "full file",
    "whole file",
    "fix the",
    "fix this",
    "fix bug",
    "type hint",
    "docstring",
    "add comments",
    "modify",
    "edit the",
    "change the",
    "replace",
    "reformat",
    "convert this",
    "translate this code",
    "apply the",
    "update the code",
    "update this",
)
_EXTRACT = ("extract", "quote", "verbatim", "list all", "list every", "copy the", "find all", "exact words")
_SUMMARY = ("summar", "tl;dr", "tldr", "key points", "main points", "in brief", "overview of", "condense")
_RAG = (
    "context:",
    "sources:",
    "source:",
    "passage",
    "document [",
    "[1]",
    "<doc",
    "<context",
    "retrieved",
    "based on the following",
    "using the following",
    "according to the",
)
_QUESTION = ("what ", "why ", "how ", "who ", "when ", "which ", "explain", "tell me", "write a", "write me")
_CODE_MARKERS = ("def ", "class ", "import ", "return ", "function ", "{\n", "};", "#include", "fn ", "=> ")


def _window(text: str) -> str:
    if len(text) <= _HEAD + _TAIL:
        return text.lower()
    return (text[:_HEAD] + "\n" + text[-_TAIL:]).lower()


def _any(text: str, needles: tuple[str, ...]) -> bool:
    for n in needles:  # noqa: SIM110 - a plain loop: half the cost of any(<generator>) per request
        if n in text:
            return True
    return False


def predict_overlap(prompt_text: str, instruction_text: str) -> tuple[float, str]:
    """Return (predicted overlap 0..1, request kind). ``instruction_text`` is the last user turn.

    ``prompt_text`` is the whole prompt (all messages); the overlap is the predicted
    fraction of the answer that copies spans of it.
    """
    instr = _window(instruction_text)
    n_prompt = len(prompt_text)
    probe = prompt_text[:_CTX_PROBE]
    tail = prompt_text[-_CTX_PROBE:]
    # Bounded windows only: the cost must not grow with the prompt.
    fences = probe.count("```") + (tail.count("```") if n_prompt > _CTX_PROBE else 0)
    has_code = fences >= 2 or _any(probe, _CODE_MARKERS) or _any(tail, _CODE_MARKERS)
    # Context pasted beyond the instruction itself (or a long instruction carrying a doc).
    pasted = max(n_prompt - min(len(instruction_text), 400), 0)

    if _any(instr, _EDIT) and (has_code or pasted > 400):
        kind = "edit"
    elif _any(instr, _EXTRACT) and pasted > 200:
        kind = "extract"
    elif _any(instr, _SUMMARY) and pasted > 200:
        kind = "summary"
    elif _any(instr, _RAG) or _any(probe.lower(), _RAG):
        kind = "rag" if pasted > 200 else "chat"
    elif has_code and pasted > 200:
        kind = "code"
    else:
        kind = "chat"

    overlap = KIND_PRIOR[kind]
    # Copying needs something to copy: scale down when there is little pasted text.
    if kind != "chat":
        overlap *= min(1.0, 0.35 + pasted / 2000.0)
    elif _any(instr, _QUESTION):
        overlap *= 0.6
    return round(min(max(overlap, 0.0), 1.0), 4), kind


# Bounds on the learning computation (it runs after each response).
_MAX_PROMPT_CHARS = 64_000
_MAX_COMPLETION_CHARS = 16_000


def realised_lookup_stats(
    prompt_text: str, completion_text: str, *, k: int = 5, n_min: int = 5, n_max: int = 5
) -> tuple[LookupStats, int] | None:
    """What an n-gram proposer would have done over this answer, and the prompt's length in
    word pieces; None when there is nothing to replay. Bounded work: at most the last
    64 000 characters of the prompt and the first 16 000 of the answer are replayed."""
    if not completion_text or k < 1 or not 1 <= n_min <= n_max:
        return None
    prompt = tokenize(prompt_text[-_MAX_PROMPT_CHARS:])
    answer = tokenize(completion_text[:_MAX_COMPLETION_CHARS])
    if len(answer) < 2:
        return None
    st = realised_lookup(prompt, answer, k=k, n_min=n_min, n_max=n_max)
    return (st, len(prompt)) if st.steps else None


def lookup_rates(st: LookupStats, k: int) -> tuple[float, float]:
    """(accepted drafts per step ÷ k, draft tokens per step) over every step of ``st``."""
    return st.accepted / (st.steps * k), st.draft_tokens / st.steps


def realised_lookup_rates(
    prompt_text: str, completion_text: str, *, k: int = 5, n_min: int = 5, n_max: int = 5
) -> tuple[float, float] | None:
    """(accepted drafts per step ÷ k, draft tokens per step) an n-gram proposer would have
    realised on this answer, over *all* steps (a step with no match drafts nothing), or None.

    ``1 + k * first`` is the expected tokens per speculative step over the whole answer,
    ``1 + second`` the tokens a step verifies per sequence (what it costs). ``n_min`` /
    ``n_max`` are the engine's ``prompt_lookup_min``/``max`` (vLLM's default is 5 for
    both when unset). Bounded as :func:`realised_lookup_stats`.
    """
    got = realised_lookup_stats(prompt_text, completion_text, k=k, n_min=n_min, n_max=n_max)
    return None if got is None else lookup_rates(got[0], k)


def realised_lookup_acceptance(
    prompt_text: str, completion_text: str, *, k: int = 5, n_min: int = 5, n_max: int = 5
) -> float | None:
    """Per-step acceptance an n-gram proposer would have realised on this answer, or None.

    Counts a step with no draft as ``k`` rejected drafts, so ``1 + k * rate`` is the
    expected number of tokens per speculative step over the *whole* answer (what the
    routing model needs), not only over drafted steps. See :func:`realised_lookup_rates`.
    """
    r = realised_lookup_rates(prompt_text, completion_text, k=k, n_min=n_min, n_max=n_max)
    return None if r is None else r[0]

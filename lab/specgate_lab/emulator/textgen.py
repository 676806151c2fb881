"""Answer text for emulated requests: deterministic per seed, shaped by the prompt.

:func:`classify` sorts a prompt into one of three kinds by what it asks:

``edit``     rewrite / refactor / fix code or text that is pasted in the prompt: the
             answer copies the pasted source in order, with small edits (high copy);
``summary``  summarise / extract / quote from a pasted document: the answer
             alternates quoted spans of the document with new words (medium copy);
``chat``     an open question: the answer is new words (near-zero copy).

:class:`AnswerGenerator` produces the answer as a lazily extended token stream
(tokens of :func:`gateway.text.tokenize`): a sequence of *copy* segments (spans of
the prompt's source region) and *novel* segments (filler words). Temperature lowers
the copy probability and makes copies break off sooner. Nothing here knows about
speculation: the engine runs a real prompt-lookup proposer over the tokens, so the
acceptance of n-gram drafts emerges from this text.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import re
from dataclasses import dataclass
from enum import StrEnum

from gateway.text import tokenize


class PromptKind(StrEnum):
    EDIT = "edit"
    SUMMARY = "summary"
    CHAT = "chat"


_EDIT_WORDS = re.compile(
    r"\b(rewrite|refactor|rename|edit|fix|modify|update|change|convert|port|translate|reformat|annotate|"
    r"add (?:type hints|types|docstrings|comments|logging)|unchanged|as it is|"
    r"return the (?:full|whole|complete)|give me back|apply|patch|replace)\b",
    re.IGNORECASE,
)
_SUMMARY_WORDS = re.compile(
    r"\b(summari[sz]e|summary|extract|quote|verbatim|word for word|copy out|tl;?dr|key points|"
    r"takeaways|main points|according to|based on the (?:document|text|article|context|passage)|"
    r"list (?:the|all|every)|what does the (?:document|text|article))\b",
    re.IGNORECASE,
)
_CODE = re.compile(
    r"```|^\s*(?:def|class|function|func|fn|public|import|#include)\b|;\s*$|\{\s*$", re.MULTILINE
)
_FENCE = re.compile(r"```[^\n]*\n(.*?)(?:```|$)", re.DOTALL)
# Pasted material, where instruction words do not count: fenced blocks, quoted blocks, tags.
_PASTED = re.compile(r'```.*?(?:```|$)|""".*?(?:"""|$)|<document>.*?(?:</document>|$)', re.DOTALL)
# The chat template's markup (ChatML, as the emulator renders messages, and think tags).
_MARKUP = re.compile(r"<\|im_(?:start|end)\|>(?:[a-z]+\n)?|</?think>")
_RAG = re.compile(r"(?:^|\n)\s*(?:context|sources|documents)\s*:", re.IGNORECASE)

LONG_DOCUMENT_TOKENS = 300
# Per-token substitution in copies at temperature T: 1 - exp(-SUBSTITUTION_RATE * T).
SUBSTITUTION_RATE = 0.3


def classify(prompt: str) -> PromptKind:
    """What the prompt asks for, judged from its instruction and what is pasted into it."""
    if len(prompt) > 400_000:
        prompt = prompt[:200_000] + prompt[-200_000:]
    instruction = _PASTED.sub(" ", prompt)
    n_tokens = len(tokenize(prompt))
    has_code = bool(_CODE.search(prompt))
    asks_edit = bool(_EDIT_WORDS.search(instruction))
    asks_summary = bool(_SUMMARY_WORDS.search(instruction))
    if _RAG.search(prompt) and n_tokens > 60:
        return PromptKind.SUMMARY  # answer from retrieved context: quotes some of it
    if asks_edit and has_code:
        return PromptKind.EDIT
    if asks_summary and n_tokens > 60:
        return PromptKind.SUMMARY
    if asks_edit and (has_code or n_tokens > 80):
        return PromptKind.EDIT  # rewrite pasted code or prose
    if n_tokens >= LONG_DOCUMENT_TOKENS:
        return PromptKind.SUMMARY  # a long pasted document: answers lean on it
    return PromptKind.CHAT


@dataclass(frozen=True, slots=True)
class KindParams:
    copy_prob: float  # probability that a segment is a copy of the source (at T=0)
    copy_len: float  # mean copy segment length (tokens)
    novel_len: float  # mean novel segment length (tokens)
    skip_len: float  # mean source tokens skipped (replaced) after an edit (edit kind)
    sequential: bool  # copies walk through the source in order (edits) or jump (quotes)


PARAMS: dict[PromptKind, KindParams] = {
    PromptKind.EDIT: KindParams(copy_prob=0.93, copy_len=14.0, novel_len=2.0, skip_len=1.5, sequential=True),
    PromptKind.SUMMARY: KindParams(copy_prob=0.6, copy_len=12.0, novel_len=8.0, skip_len=0, sequential=False),
    PromptKind.CHAT: KindParams(copy_prob=0.03, copy_len=3.0, novel_len=60.0, skip_len=0, sequential=False),
}

_FILLER_TEXT = """
    the a of to and in is that it for as with on this be are by an can which from we will or more
    each when also these its one their other has have not but then so used into them some time may
    model value system data first new two over only way such result results use both between well
    through where after most our make like just many those any while because very good could should
    would might must need needs given set number part process approach case cases point example
    important different following however therefore thus often usually simply clearly step steps
    question answer idea reason reasons change changes design simple small large better best work
    works working users user people team project code function method call calls return returns
    state level note notes check rather since without within across about around under above below
    because still again already perhaps likely consider keep keeps making made take takes taking
    give gives show shows help helps run runs start starts end ends open close long short fast slow
"""
_FILLER = tuple(_FILLER_TEXT.split())
_PUNCT = (".", ",", ".", ",", ";", ":")

# How each answer token was made (AnswerGenerator._kind), which sets its log-probability.
_NOVEL, _COPIED, _SAMPLED_IN_COPY = 0, 1, 2


def _filler_logq() -> dict[str, float]:
    """log q(token) of :meth:`AnswerGenerator._filler_token`'s choice: 8 % punctuation,
    2 % a word on a new line, 90 % a word after a space (repeated entries count double)."""
    q: dict[str, float] = {}
    for p in _PUNCT:
        q[p] = q.get(p, 0.0) + 0.08 / len(_PUNCT)
    for w in _FILLER:
        q[" " + w] = q.get(" " + w, 0.0) + 0.90 / len(_FILLER)
        q["\n" + w] = q.get("\n" + w, 0.0) + 0.02 / len(_FILLER)
    return {t: math.log(v) for t, v in q.items()}


_FILLER_LOGQ = _filler_logq()
_FILLER_RANKED = sorted(_FILLER_LOGQ.items(), key=lambda c: -c[1])[:32]
# A copy goes on at the reference temperature 1 with (1 - deviation)(1 - substitution).
_P_KEEP = (1.0 - 0.05) * math.exp(-SUBSTITUTION_RATE)
_LOG_KEEP = math.log(_P_KEEP)
_LOG_LEAVE = math.log(1.0 - _P_KEEP)
_LOG_UNSEEN = math.log(1e-6)  # a token the generator never samples (a prompt's own words)


def _seed_int(*parts: object) -> int:
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little")


def _source_region(prompt_tokens: list[str], prompt: str, kind: PromptKind) -> list[str]:
    """The part of the prompt an answer copies from (code blocks for edits, else the
    prompt's text without the chat template's markup, which no answer copies)."""
    if kind is PromptKind.EDIT:
        blocks = _FENCE.findall(prompt)
        if blocks:
            toks = tokenize("\n".join(blocks))
            if len(toks) >= 8:
                return toks
    if _MARKUP.search(prompt):
        return tokenize(_MARKUP.sub("\n", prompt).strip())
    return prompt_tokens


def _word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def _source_tokens(tokens: list[str]) -> list[str]:
    """``tokens`` without the whitespace a text may end in (a token only at the very end:
    anything after it would join it)."""
    while tokens and tokens[-1].isspace():
        tokens = tokens[:-1]
    return tokens


class AnswerGenerator:
    """A lazily generated, deterministic answer token stream for one request.

    ``token(i)`` is the i-th answer token; ``natural_length`` is where the answer
    would end (finish_reason ``stop``) unless the request ignores EOS.
    """

    __slots__ = (
        "_alt",
        "_copy_run",
        "_cursor",
        "_kind",
        "_out",
        "_p",
        "_rng",
        "_src",
        "kind",
        "natural_length",
        "temperature",
    )

    def __init__(
        self,
        prompt: str,
        prompt_tokens: list[str],
        *,
        temperature: float = 0.0,
        seed: int = 0,
        kind: PromptKind | None = None,
        params: KindParams | None = None,
        length: int | None = None,
    ) -> None:
        """``params`` and ``length`` (a thinking model's reasoning, see
        :mod:`specgate_lab.emulator.thinking`): other segment statistics than the kind's, and a
        fixed natural length."""
        self.kind = kind or classify(prompt)
        self.temperature = max(0.0, temperature)
        self._p = params or PARAMS[self.kind]
        self._rng = random.Random(_seed_int(prompt, seed, round(self.temperature, 4)))
        self._src = _source_tokens(_source_region(prompt_tokens, prompt, self.kind)) or ["."]
        self._cursor = 0
        self._copy_run = 0
        self._out: list[str] = []
        self._kind = bytearray()  # per token: _NOVEL, _COPIED or _SAMPLED_IN_COPY
        self._alt: dict[int, str] = {}  # the source token a _SAMPLED_IN_COPY one replaced
        rng = self._rng
        if length is not None:
            self.natural_length = max(1, length)
        elif self.kind is PromptKind.EDIT:
            # The edited source ends where the walk through it ends.
            while self._cursor < len(self._src) and len(self._out) < 100_000:
                self._segment()
            self.natural_length = max(1, len(self._out))
        elif self.kind is PromptKind.SUMMARY:
            self.natural_length = min(800, 40 + int(0.3 * len(self._src)) + rng.randrange(0, 60))
        else:
            self.natural_length = 120 + rng.randrange(0, 380)

    # --- knobs that depend on temperature -------------------------------------------
    def _copy_prob(self) -> float:
        t = self.temperature
        return self._p.copy_prob * max(0.05, 1.0 - 0.35 * t)

    def _deviation(self) -> float:
        """Per-token probability that sampling leaves a copied span (0 at T=0)."""
        return 0.05 * self.temperature

    def _substitution(self) -> float:
        """Per-token probability that sampling puts another token in place of the copied
        one while the copy goes on (0 at T=0): the target model's probability of the
        source token falls as temperature rises (``1 - exp(-SUBSTITUTION_RATE * T)``)."""
        return 1.0 - math.exp(-SUBSTITUTION_RATE * min(self.temperature, 2.0))

    # --- generation -----------------------------------------------------------------
    def token(self, i: int) -> str:
        out = self._out
        while len(out) <= i:
            self._segment()
        return out[i]

    def tokens(self, start: int, end: int) -> list[str]:
        if end > len(self._out):
            self.token(end - 1)
        return self._out[start:end]

    def _geometric(self, mean: float) -> int:
        # Geometric on {1, 2, ...} with the given mean.
        if mean <= 1.0:
            return 1
        p = 1.0 / mean
        n = 1
        rng = self._rng
        while rng.random() > p and n < 10_000:
            n += 1
        return n

    def _segment(self) -> None:
        rng = self._rng
        p = self._p
        # Copies and novel segments alternate; after a novel segment the answer copies
        # again with the kind's (temperature-lowered) copy probability.
        if not self._copy_run and rng.random() < self._copy_prob():
            self._copy(self._geometric(p.copy_len))
            self._copy_run = 1
        else:
            self._novel(self._geometric(p.novel_len * (1.0 + self.temperature)))
            self._copy_run = 0

    def _copy(self, length: int) -> None:
        src = self._src
        n = len(src)
        if self._p.sequential:
            if self._cursor >= n:
                self._cursor = 0  # the edit is done; a model ignoring EOS starts over
            start = self._cursor
        else:
            start = self._rng.randrange(0, n)
        dev = self._deviation()
        sub = self._substitution()
        rng = self._rng
        put = self._put
        i = start
        end = min(n, start + length)
        alt = self._alt
        while i < end:
            if dev and rng.random() < dev:
                alt[len(self._out)] = src[i]
                put(self._filler_token(), _SAMPLED_IN_COPY)
                i += 1  # a sampled token replaced the source one, and the copy ends
                break
            if sub and rng.random() < sub:
                alt[len(self._out)] = src[i]
                put(self._filler_token(), _SAMPLED_IN_COPY)  # sampled in place of the source token
            else:
                put(src[i], _COPIED)
            i += 1
        self._cursor = i
        if self._p.sequential and self._p.skip_len:
            skip = self._geometric(self._p.skip_len) - 1
            self._cursor = min(n, self._cursor + skip)

    def _novel(self, length: int) -> None:
        for _ in range(length):
            self._put(self._filler_token(), _NOVEL)

    def _put(self, tok: str, kind: int) -> None:
        """Append ``tok`` so that the answer's text tokenizes back into the same tokens (what
        a client or the advisor sees is the text): a word that would join the word before
        it gets a space of its own."""
        out = self._out
        if out and _word_char(tok[:1]) and _word_char(out[-1][-1:]):
            tok = " " + tok
        out.append(tok)
        self._kind.append(kind)

    # --- the model's probabilities (what logprobs report) -----------------------------
    def logprob(self, i: int) -> float:
        """The log-probability of answer token ``i`` under the model's own distribution
        (:func:`token_logprob`)."""
        self.token(i)
        return token_logprob(self._out[i], self._kind[i])

    def top(self, i: int, k: int) -> list[tuple[str, float]]:
        """Answer token ``i`` and the ``k - 1`` likeliest tokens in its place, with their
        log-probabilities: the sampled one first (as vLLM lists them), then by rank."""
        tok, kind = self.token(i), self._kind[i]
        first = (tok, token_logprob(tok, kind))
        if k <= 1:
            return [first][:k]
        rest: list[tuple[str, float]] = []
        if kind == _SAMPLED_IN_COPY:
            rest.append((self._alt[i], _LOG_KEEP))
        scale = 0.0 if kind == _NOVEL else _LOG_LEAVE
        for cand, lq in _FILLER_RANKED:
            if len(rest) >= k - 1:
                break
            if cand != tok:
                rest.append((cand, scale + lq))
        rest.sort(key=lambda c: -c[1])
        return [first, *rest[: k - 1]]

    def _filler_token(self) -> str:
        rng = self._rng
        r = rng.random()
        if r < 0.08:
            return rng.choice(_PUNCT)
        if r < 0.10:
            return "\n" + rng.choice(_FILLER)  # a new line starts with a word
        return " " + rng.choice(_FILLER)


def token_logprob(tok: str, kind: int) -> float:
    """The model's log-probability of a token, from how the generator made it (at its
    reference temperature 1: vLLM reports the model's raw distribution, before sampling's
    temperature): a copied source token is as likely as a copy going on (``_P_KEEP``); a
    sampled word has its share of the filler vocabulary, times the chance of leaving the
    copy where it replaced a source token."""
    if kind == _COPIED:
        return _LOG_KEEP
    lq = _FILLER_LOGQ.get(tok, _LOG_UNSEEN)
    return lq + _LOG_LEAVE if kind == _SAMPLED_IN_COPY else lq


def prompt_logprobs(tokens: list[str]) -> list[float | None]:
    """Log-probabilities of a prompt's tokens (vLLM's ``echo`` with logprobs): none for the
    first; a token that continues a pair seen earlier in the prompt as a copy; a filler
    word its share; any other token as unseen."""
    out: list[float | None] = [None] if tokens else []
    seen: set[tuple[str, str]] = set()
    for prev, tok in itertools.pairwise(tokens):
        pair = (prev, tok)
        out.append(_LOG_KEEP if pair in seen else _FILLER_LOGQ.get(tok, _LOG_UNSEEN))
        seen.add(pair)
    return out


def answer_seed(request_seed: int | None, engine_seed: int, counter: int, temperature: float) -> int:
    """The seed of one answer: the request's seed if given; at T=0 a fixed one (greedy
    decoding is deterministic); otherwise a fresh one per request."""
    if request_seed is not None:
        return request_seed
    if temperature <= 0.0:
        return engine_seed
    return _seed_int(engine_seed, counter)

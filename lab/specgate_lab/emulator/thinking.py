"""What an emulated engine answers a prompt with: a thinking model's answer, and where a
continued answer starts.

A thinking model (an engine started with a reasoning parser, as Qwen3 under vLLM's
``--reasoning-parser qwen3``) answers ``<think>`` ``\\n`` reasoning ``\\n`` ``</think>``
``\\n\\n`` content, every piece a token the engine generates, counts and drafts over.
The reasoning is made as the rest of the emulator's text is (:mod:`specgate_lab.emulator.textgen`),
with its own segment statistics: it quotes the prompt less than the answer does, so the
acceptance of n-gram drafts over it emerges from its text as the content's does. The
content is conditioned on the reasoning before it: its seed mixes in the reasoning's text,
so an answer told it thought nothing (an empty think block) goes on differently.

Where an answer starts is read from the prompt's text, as a real engine reads it: the
text after the last opened assistant turn (``<|im_start|>assistant\\n`` with no end of
turn after it, what ``continue_final_message`` renders) is the answer given so far; a
server's engines also remember the raw prompts (no chat turns) they answered, so a raw
prompt that is an earlier one plus the start of its answer continues that answer.
Given the start of its own answer (at temperature 0), an engine generates the rest of
that same answer, from any point: inside the think block, after it, in the middle of a
token.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Protocol

from gateway.text import tokenize
from specgate_lab.emulator.template import (
    ASSISTANT_TURN,
    END_OF_TURN,
    THINK_CLOSE,
    THINK_OPEN,
    model_tokenize,
)
from specgate_lab.emulator.textgen import (
    _FILLER_RANKED,
    _NOVEL,
    AnswerGenerator,
    KindParams,
    PromptKind,
    _seed_int,
    classify,
    token_logprob,
)

# Reasoning quotes the prompt less, and in shorter spans, than an answer of the same kind.
_R = KindParams
REASONING_PARAMS: dict[PromptKind, KindParams] = {
    PromptKind.EDIT: _R(copy_prob=0.45, copy_len=7.0, novel_len=14.0, skip_len=0, sequential=False),
    PromptKind.SUMMARY: _R(copy_prob=0.35, copy_len=6.0, novel_len=16.0, skip_len=0, sequential=False),
    PromptKind.CHAT: _R(copy_prob=0.03, copy_len=3.0, novel_len=60.0, skip_len=0, sequential=False),
}
REASONING_TOKENS = (60, 360)  # the range of a reasoning's natural length
_LOG_MARKER = math.log(0.999)  # the think markers and their newlines: the model is sure of them


class AnswerStream(Protocol):
    """An answer as the engine reads it: token by token, with its natural end."""

    kind: PromptKind
    temperature: float
    natural_length: int

    def token(self, i: int) -> str: ...

    def tokens(self, start: int, end: int) -> list[str]: ...

    def logprob(self, i: int) -> float: ...

    def top(self, i: int, k: int) -> list[tuple[str, float]]: ...


def _stripped_top(top: list[tuple[str, float]], tok: str) -> list[tuple[str, float]]:
    return [(tok, top[0][1]), *top[1:]] if top else top


def _marker_top(tok: str, lp: float, k: int) -> list[tuple[str, float]]:
    rest = [(c, lq + math.log(0.001)) for c, lq in _FILLER_RANKED if c != tok]
    return [(tok, lp), *rest[: max(0, k - 1)]][:k]


class ThinkingAnswer:
    """``<think>``, ``\\n``, reasoning, ``\\n``, ``</think>``, ``\\n\\n``, content: the model's
    own reasoning, or the one given (``reasoning``, what a prompt's closed think block holds),
    and the content that follows it."""

    __slots__ = ("_content", "_head", "_reasoning", "_strip", "kind", "natural_length", "temperature")

    def __init__(
        self,
        prompt: str,
        prompt_tokens: list[str],
        *,
        seed: int,
        temperature: float,
        kind: PromptKind | None,
        reasoning: str | None = None,
        strip: bool = True,
    ) -> None:
        """``strip``: the content's first token loses its leading whitespace (a thinking
        model starts its content at a word)."""
        self.kind = kind or classify(prompt)
        self.temperature = max(0.0, temperature)
        self._reasoning: AnswerGenerator | None = None
        if reasoning is None:
            lo, hi = REASONING_TOKENS
            length = lo + _seed_int(prompt, seed, "reasoning length") % (hi - lo)
            gen = AnswerGenerator(
                prompt,
                prompt_tokens,
                temperature=temperature,
                seed=_seed_int(seed, "reasoning"),
                kind=self.kind,
                params=REASONING_PARAMS[self.kind],
                length=length,
            )
            toks = gen.tokens(0, length)
            toks[0] = toks[0].lstrip()
            reasoning = "".join(toks)
            self._reasoning = gen
        else:
            toks = tokenize(reasoning)
        content = AnswerGenerator(  # conditioned on the reasoning's text
            prompt,
            prompt_tokens,
            temperature=temperature,
            seed=_seed_int(seed, reasoning) if reasoning else seed,
            kind=self.kind,
        )
        self._content, self._strip = content, strip
        self._head = [THINK_OPEN, "\n", *toks, "\n", THINK_CLOSE, "\n\n"]
        self.natural_length = len(self._head) + content.natural_length

    @property
    def content_start(self) -> int:
        """The index of the first content token (after ``</think>`` and ``\\n\\n``)."""
        return len(self._head)

    def token(self, i: int) -> str:
        head = self._head
        if i < len(head):
            return head[i]
        j = i - len(head)
        tok = self._content.token(j)
        return tok.lstrip() if j == 0 and self._strip else tok

    def tokens(self, start: int, end: int) -> list[str]:
        return [self.token(i) for i in range(start, end)]

    def logprob(self, i: int) -> float:
        h = len(self._head)
        if i >= h:
            return self._content.logprob(i - h)
        if 2 <= i < h - 3:  # the reasoning: the model's own, or given (then as new words)
            r = self._reasoning
            return r.logprob(i - 2) if r is not None else token_logprob(self._head[i], _NOVEL)
        return _LOG_MARKER  # the markers and the newlines around them

    def top(self, i: int, k: int) -> list[tuple[str, float]]:
        h = len(self._head)
        tok = self.token(i)
        if i >= h:
            return _stripped_top(self._content.top(i - h, k), tok)
        if self._reasoning is not None and 2 <= i < h - 3:
            return _stripped_top(self._reasoning.top(i - 2, k), tok)
        return _marker_top(tok, self.logprob(i), k)


class _Lstripped:
    """An answer whose first token loses its leading whitespace (content after a think
    block starts at a word)."""

    __slots__ = ("_gen", "kind", "natural_length", "temperature")

    def __init__(self, gen: AnswerGenerator) -> None:
        self._gen = gen
        self.kind, self.temperature, self.natural_length = gen.kind, gen.temperature, gen.natural_length

    def token(self, i: int) -> str:
        tok = self._gen.token(i)
        return tok.lstrip() if i == 0 else tok

    def tokens(self, start: int, end: int) -> list[str]:
        return [self.token(i) for i in range(start, end)]

    def logprob(self, i: int) -> float:
        return self._gen.logprob(i)

    def top(self, i: int, k: int) -> list[tuple[str, float]]:
        return _stripped_top(self._gen.top(i, k), self.token(i))


class Continued:
    """An answer from where a given text ends: ``chars`` characters after token ``start``
    (the rest of a token cut in its middle comes first). An answer given whole goes on with
    one empty end-of-sequence token, as an engine samples EOS at once."""

    __slots__ = ("_base", "_cut", "_n", "kind", "natural_length", "temperature")

    def __init__(self, base: AnswerStream, start: int, chars: int) -> None:
        n = start
        while chars > 0 and n < 1 << 20:
            size = len(base.token(n))
            if size > chars:
                break
            chars -= size
            n += 1
        self._base, self._n, self._cut = base, n, chars
        self.kind, self.temperature = base.kind, base.temperature
        self.natural_length = max(1, base.natural_length - n)

    def _done(self) -> bool:
        return self._base.natural_length <= self._n

    def token(self, i: int) -> str:
        if i == 0 and self._done():
            return ""
        tok = self._base.token(self._n + i)
        return tok[self._cut :] if i == 0 else tok

    def tokens(self, start: int, end: int) -> list[str]:
        return [self.token(i) for i in range(start, end)]

    def logprob(self, i: int) -> float:
        return 0.0 if i == 0 and self._done() else self._base.logprob(self._n + i)

    def top(self, i: int, k: int) -> list[tuple[str, float]]:
        if i == 0 and self._done():
            return [("", 0.0)][:k]
        return _stripped_top(self._base.top(self._n + i, k), self.token(i))


def split_turn(prompt: str) -> tuple[str, str] | None:
    """(the prompt up to the open assistant turn, the answer given in it), when the text
    ends in an assistant turn it has not ended."""
    i = prompt.rfind(ASSISTANT_TURN)
    if i < 0:
        return None
    j = i + len(ASSISTANT_TURN)
    if prompt.find(END_OF_TURN, j) >= 0:
        return None
    return prompt[:j], prompt[j:]


def answer_stream(
    prompt: str,
    prompt_tokens: list[str],
    given: str,
    *,
    seed: int,
    temperature: float,
    kind: PromptKind | None,
    thinking: bool,
) -> AnswerStream:
    """The rest of the answer to ``prompt`` after ``given`` (its start, read from the text:
    an open think block goes on thinking; a closed one holds the reasoning the content is
    conditioned on). ``thinking``: the model thinks when nothing is given."""

    def think(reasoning: str | None = None, strip: bool = True) -> ThinkingAnswer:
        return ThinkingAnswer(
            prompt,
            prompt_tokens,
            seed=seed,
            temperature=temperature,
            kind=kind,
            reasoning=reasoning,
            strip=strip,
        )

    if given.startswith(THINK_OPEN) or (thinking and given and THINK_OPEN.startswith(given)):
        close = given.find(THINK_CLOSE)
        if close < 0:  # inside the think block: the reasoning goes on
            return Continued(think(), 0, len(given))
        reasoning = given[len(THINK_OPEN) : close].strip("\n")
        after = given[close + len(THINK_CLOSE) :]
        if thinking:
            full = think()
            own = "".join(full.tokens(2, full.content_start - 3))
            if reasoning != own:
                full = think(reasoning)
        else:  # a model that does not think: its own content, conditioned on what it is given
            full = think(reasoning, strip=False)
        start = full.content_start - (0 if after else 1)
        return Continued(full, start, len(after.lstrip("\n")))
    if thinking and not given:
        return think()
    gen = AnswerGenerator(prompt, prompt_tokens, seed=seed, temperature=temperature, kind=kind)
    plain: AnswerStream = _Lstripped(gen) if thinking else gen
    return Continued(plain, 0, len(given)) if given else plain


def _text_starts(stream: AnswerStream, text: str) -> bool:
    """Whether ``stream``'s answer text begins with ``text``."""
    got, i = 0, 0
    while got < len(text) and i < stream.natural_length:
        tok = stream.token(i)
        if text[got : got + len(tok)] != tok[: len(text) - got]:
            return False
        got += len(tok)
        i += 1
    return got >= len(text)


class AnswerMemory:
    """Raw prompts (no chat turns) a server's engines answered, the last ``size``, with each
    answer's seed and temperature: the answers one model's weights would give again."""

    def __init__(self, size: int = 512, key_chars: int = 32) -> None:
        self.size, self.key_chars = size, key_chars
        self._entries: OrderedDict[tuple[str, int, float], None] = OrderedDict()
        self._by_head: dict[str, set[tuple[str, int, float]]] = {}

    def remember(self, prompt: str, seed: int, temperature: float) -> None:
        key = (prompt, seed, temperature)
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        self._entries[key] = None
        self._by_head.setdefault(prompt[: self.key_chars], set()).add(key)
        while len(self._entries) > self.size:
            old, _ = self._entries.popitem(last=False)
            head = old[0][: self.key_chars]
            self._by_head[head].discard(old)
            if not self._by_head[head]:
                del self._by_head[head]

    def find(
        self, prompt: str, temperature: float, *, kind: PromptKind | None, thinking: bool
    ) -> tuple[str, str, int] | None:
        """(an earlier prompt, the start of its answer, that answer's seed) that ``prompt``
        is made of, the longest such earlier prompt first; None if there is none."""
        heads = [prompt[:n] for n in range(1, min(self.key_chars, len(prompt)) + 1)]
        found = [
            key
            for h in heads
            for key in self._by_head.get(h, ())
            if key[2] == temperature and len(key[0]) < len(prompt) and prompt.startswith(key[0])
        ]
        for begun, seed, temp in sorted(found, key=lambda k: -len(k[0])):
            given = prompt[len(begun) :]
            whole = answer_stream(
                begun, model_tokenize(begun), "", seed=seed, temperature=temp, kind=kind, thinking=thinking
            )
            if _text_starts(whole, given):
                return begun, given, seed
        return None


def answer_for(
    prompt: str,
    toks: list[str],
    seed: int,
    temperature: float,
    kind: PromptKind | None,
    *,
    thinking: bool,
    memory: AnswerMemory | None,
) -> AnswerStream:
    """The answer an engine gives ``prompt`` (``toks``, its tokens): the rest of the one
    begun in its open assistant turn, or of a remembered prompt's answer that it extends,
    else a new one; a ``thinking`` engine (one with a reasoning parser) thinks first."""
    begun, given = split_turn(prompt) or (prompt, "")
    if memory is not None and ASSISTANT_TURN not in prompt:  # raw text: no turn to read it from
        found = memory.find(prompt, temperature, kind=kind, thinking=thinking)
        if found is not None:
            begun, given, seed = found
        memory.remember(begun, seed, temperature)
    begun_toks = toks if begun == prompt else model_tokenize(begun)
    return answer_stream(
        begun, begun_toks, given, seed=seed, temperature=temperature, kind=kind, thinking=thinking
    )


#: The memory of the engines a server process runs (the emulated model's, shared by all).
ANSWERS = AnswerMemory()

"""Prompt-lookup (n-gram) drafting, as vLLM's ``ngram`` speculative method does it.

At each step the proposer takes the longest suffix of the sequence so far (between
``n_min`` and ``n_max`` tokens) that occurred earlier in the sequence, and proposes
the ``k`` tokens that followed its most recent earlier occurrence. With no match it
proposes nothing (and vLLM counts no draft for that step).

:class:`PromptLookupProposer` is incremental: appending a token costs O(n_max) and a
proposal O(n_max), so the emulator can run it at every step of every sequence.
:func:`realised_lookup` replays an answer against its prompt and reports what such a
proposer would have had accepted, which the gateway learns from after each response.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol


class PromptLookupProposer:
    """Incremental n-gram index over one growing token sequence."""

    __slots__ = ("_index", "k", "n_max", "n_min", "tokens")

    def __init__(
        self, tokens: Sequence[Hashable] = (), *, k: int = 5, n_min: int = 2, n_max: int = 5
    ) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError("need 1 <= n_min <= n_max")
        if k < 1:
            raise ValueError("need k >= 1")
        self.k, self.n_min, self.n_max = k, n_min, n_max
        self.tokens: list[Hashable] = []
        # For each n, maps an n-gram to the end position (exclusive) of its latest occurrence
        # that is NOT the current suffix; an occurrence is indexed only once a token follows it.
        self._index: dict[int, dict[tuple[Hashable, ...], int]] = {n: {} for n in range(n_min, n_max + 1)}
        self.extend(tokens)

    def append(self, token: Hashable) -> None:
        toks = self.tokens
        end = len(toks)  # the n-grams ending here now get a follower: index them
        for n in range(self.n_min, min(self.n_max, end) + 1):
            self._index[n][tuple(toks[end - n : end])] = end
        toks.append(token)

    def extend(self, tokens: Sequence[Hashable]) -> None:
        for t in tokens:
            self.append(t)

    def propose(self) -> list[Hashable]:
        """Draft tokens for the next step (possibly empty)."""
        toks = self.tokens
        size = len(toks)
        for n in range(min(self.n_max, size), self.n_min - 1, -1):
            pos = self._index[n].get(tuple(toks[size - n :]))
            if pos is not None:
                return toks[pos : pos + self.k]
        return []


@dataclass(frozen=True, slots=True)
class LookupStats:
    """Speculative counters an n-gram proposer would have produced over an answer."""

    steps: int  # engine steps needed to emit the answer
    drafts: int  # steps that carried at least one draft token
    draft_tokens: int
    accepted: int
    output_tokens: int

    def __add__(self, other: LookupStats) -> LookupStats:
        """The counters of two replays together (a class of answers, a whole log)."""
        return LookupStats(
            self.steps + other.steps,
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            self.accepted + other.accepted,
            self.output_tokens + other.output_tokens,
        )

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted/drafts, over drafted steps only (as vLLM reports it)."""
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def tokens_per_step(self) -> float:
        """Output tokens per engine step over the whole answer (drafted or not)."""
        return self.output_tokens / self.steps if self.steps else 1.0


def realised_lookup(
    prompt: Sequence[Hashable],
    answer: Sequence[Hashable],
    *,
    k: int = 5,
    n_min: int = 2,
    n_max: int = 5,
    stopped: bool = False,
) -> LookupStats:
    """Replay ``answer`` after ``prompt`` with greedy verification (T=0 semantics).

    ``stopped``: the answer ended on a stop token the text does not show (its end of
    sequence), which is then the last step's sampled token, so the answer's own last token
    can be accepted as a draft; otherwise (cut at ``max_tokens``) the last token is always
    sampled, as vLLM drafts at most the tokens left less one."""
    return replay_answer(PromptLookupProposer(prompt, k=k, n_min=n_min, n_max=n_max), answer, stopped=stopped)


class Proposer(Protocol):
    def propose(self) -> list[Hashable]: ...
    def extend(self, tokens: Sequence[Hashable]) -> None: ...


def replay_answer(proposer: Proposer, answer: Sequence[Hashable], *, stopped: bool = False) -> LookupStats:
    """Replay ``answer`` through ``proposer`` (which holds the prompt) with greedy
    verification, as vLLM runs it: the prefill step samples the first token with no draft;
    then each step drafts, the answer's matching prefix of the draft is accepted, and the
    target's own token follows. An answer cut at ``max_tokens`` (not ``stopped``) had its
    drafts cut to the tokens left less one, as vLLM cuts them; a stopped one did not know
    its end (see :func:`realised_lookup`)."""
    n = len(answer)
    if n == 0:
        return LookupStats(0, 0, 0, 0, 0)
    proposer.extend(answer[:1])  # the prefill step's token
    i = steps = 1
    drafts = draft_tokens = accepted = 0
    room = n if stopped else n - 1  # answer tokens a draft may cover
    while i < n:
        draft = proposer.propose()
        if not stopped:
            draft = draft[: max(0, room - i)]
        steps += 1
        ok = 0
        if draft:
            drafts += 1
            draft_tokens += len(draft)
            limit = min(len(draft), room - i)  # the token sampled after the drafts needs a place
            while ok < limit and draft[ok] == answer[i + ok]:
                ok += 1
            accepted += ok
        emitted = ok + 1  # accepted drafts plus the token the target model samples
        proposer.extend(answer[i : i + emitted])
        i += emitted
    return LookupStats(steps, drafts, draft_tokens, accepted, n)

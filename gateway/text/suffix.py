"""Suffix-decoding drafts, in the style of vLLM's ``suffix`` method (Arctic Inference).

Suffix decoding keeps two suffix trees: one over the request's own tokens (prompt and
answer so far) and one over the answers of earlier requests. At each step it matches the
end of the sequence in both, walks down from the matched node along the most frequent
continuation while the path's probability (count of the child ÷ count of the node, multiplied
along the path) stays at or above ``min_token_prob``, and drafts at most
``max_spec_factor`` × the match length tokens (and ``k``). Of every match length and of
both trees it keeps the draft with the highest score (the sum of its tokens'
probabilities). A long match drafts far; a short one drafts a token or two.

This is that method on the gateway's word pieces, with bounded work: an occurrence is
found through the one or two tokens it ends with (the most recent ``MAX_CANDIDATES`` of
them), and matched backwards at most ``depth`` tokens. The counts of a node are those
occurrences', so on very common endings the frequencies are of the recent ones only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from gateway.text.lookup import LookupStats, replay_answer

MAX_CANDIDATES = 64  # occurrences of an ending looked at, most recent first

Token = Hashable
Site = tuple[Sequence[Token], int]  # a sequence and the position right after a match


@dataclass(frozen=True, slots=True)
class SuffixSettings:
    """vLLM's ``--speculative-config`` for ``method: suffix`` (its defaults)."""

    k: int = 24  # num_speculative_tokens: the most tokens one step drafts
    depth: int = 24  # suffix_decoding_max_tree_depth
    max_spec_factor: float = 1.0  # suffix_decoding_max_spec_factor
    min_token_prob: float = 0.1  # suffix_decoding_min_token_prob
    max_cached_requests: int = 1000  # suffix_decoding_max_cached_requests (vLLM: 10000)

    def __post_init__(self) -> None:
        if self.k < 1 or self.depth < 1 or self.max_spec_factor <= 0 or self.max_cached_requests < 0:
            raise ValueError("need k, depth >= 1, max_spec_factor > 0, max_cached_requests >= 0")
        if not 0.0 <= self.min_token_prob <= 1.0:
            raise ValueError("min_token_prob must be in [0, 1]")


class _Index:
    """Positions of every token and token pair of some sequences, by what they end with.

    Each ending keeps a plain list, oldest first, cut back to the newest
    :data:`MAX_CANDIDATES` once it holds twice that (a list of one site costs a tenth of a
    bounded deque, and most pairs occur once)."""

    __slots__ = ("one", "two")

    def __init__(self) -> None:
        self.one: dict[Token, list[Site]] = {}
        self.two: dict[tuple[Token, Token], list[Site]] = {}

    def add(self, seq: Sequence[Token], end: int) -> None:
        """Index the occurrence ending at ``end`` (exclusive) of ``seq``: ``seq[end]`` follows it."""
        _push(self.one.setdefault(seq[end - 1], []), (seq, end))
        if end >= 2:
            _push(self.two.setdefault((seq[end - 2], seq[end - 1]), []), (seq, end))

    def sites(self, tail: Sequence[Token]) -> list[Site] | None:
        """The newest occurrences (at most :data:`MAX_CANDIDATES`, newest first) of what the
        tail ends with: its last two tokens where they occurred, else its last one."""
        found = self.two.get((tail[-2], tail[-1])) if len(tail) >= 2 else None
        if not found:
            found = self.one.get(tail[-1]) if tail else None
        return found[: -MAX_CANDIDATES - 1 : -1] if found else None


def _push(sites: list[Site], site: Site) -> None:
    sites.append(site)
    if len(sites) >= 2 * MAX_CANDIDATES:
        del sites[:-MAX_CANDIDATES]


class AnswerCache:
    """The earlier answers a suffix proposer also drafts from (its global tree), the last
    ``size`` of them."""

    __slots__ = ("_answers", "_evicted", "index", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._answers: deque[Sequence[Token]] = deque()
        self._evicted = 0
        self.index = _Index()

    def __len__(self) -> int:
        return len(self._answers)

    def add(self, answer: Sequence[Token]) -> None:
        if self.size <= 0 or len(answer) < 2:
            return
        seq = tuple(answer)
        self._answers.append(seq)
        for end in range(1, len(seq)):
            self.index.add(seq, end)
        if len(self._answers) > self.size:
            self._answers.popleft()
            self._evicted += 1
            # An evicted answer stays in the index until newer occurrences push it out of
            # the bounded candidate lists; once every `size` evictions the index is rebuilt
            # from the cached answers alone (amortised: one answer's tokens per answer).
            if self._evicted >= self.size:
                self._evicted = 0
                self.index = _Index()
                for kept in self._answers:
                    for end in range(1, len(kept)):
                        self.index.add(kept, end)


class SuffixProposer:
    """Suffix-decoding drafts over one growing sequence and, optionally, earlier answers."""

    __slots__ = ("_index", "cache", "settings", "tokens")

    def __init__(
        self,
        tokens: Sequence[Token] = (),
        settings: SuffixSettings | None = None,
        cache: AnswerCache | None = None,
    ) -> None:
        self.settings = settings or SuffixSettings()
        self.cache = cache
        self.tokens: list[Token] = []
        self._index = _Index()
        self.extend(tokens)

    def append(self, token: Token) -> None:
        if self.tokens:
            self._index.add(self.tokens, len(self.tokens))
        self.tokens.append(token)

    def extend(self, tokens: Sequence[Token]) -> None:
        for t in tokens:
            self.append(t)

    def propose(self) -> list[Token]:
        """The best-scoring draft of the request's own tree and the earlier answers' (or [])."""
        best: tuple[float, list[Token]] = (0.0, [])
        for index in (self._index, self.cache.index if self.cache else None):
            if index is None:
                continue
            sites = index.sites(self.tokens)
            if sites:
                got = self._best_draft(sites)
                if got[0] > best[0]:
                    best = got
        return best[1]

    def _best_draft(self, sites: list[Site]) -> tuple[float, list[Token]]:
        tail = self.tokens
        depth = min(self.settings.depth, len(tail))
        matched: list[tuple[int, Site]] = []
        for seq, end in sites:
            n = 0
            while n < depth and n < end and seq[end - 1 - n] == tail[-1 - n]:
                n += 1
            if n:
                matched.append((n, (seq, end)))
        best: tuple[float, list[Token]] = (0.0, [])
        for m in sorted({n for n, _ in matched}, reverse=True):
            node = [site for n, site in matched if n >= m]  # the occurrences under the match of m
            got = self._walk(node, m)
            if got[0] > best[0]:
                best = got
        return best

    def _walk(self, node: list[Site], m: int) -> tuple[float, list[Token]]:
        """Greedy path down from a node matched ``m`` deep: the most frequent continuation."""
        s = self.settings
        room = min(s.k, int(s.max_spec_factor * m), s.depth - m)
        draft: list[Token] = []
        prob, score = 1.0, 0.0
        while len(draft) < room:
            counts: dict[Token, int] = {}
            for seq, end in node:
                if end < len(seq):
                    counts[seq[end]] = counts.get(seq[end], 0) + 1
            if not counts:
                break
            total = sum(counts.values())
            tok = max(counts, key=counts.__getitem__)  # ties: the most recent (first counted)
            prob *= counts[tok] / total
            if prob < s.min_token_prob:
                break
            draft.append(tok)
            score += prob
            node = [(seq, end + 1) for seq, end in node if end < len(seq) and seq[end] == tok]
        return score, draft


def realised_suffix(
    prompt: Sequence[Token],
    answer: Sequence[Token],
    settings: SuffixSettings | None = None,
    cache: AnswerCache | None = None,
    *,
    stopped: bool = False,
) -> LookupStats:
    """Replay ``answer`` after ``prompt`` through a :class:`SuffixProposer` (drafting from
    ``cache`` too), as :func:`~gateway.text.lookup.realised_lookup` does for n-grams; the
    answer then joins ``cache``."""
    stats = replay_answer(SuffixProposer(prompt, settings, cache), answer, stopped=stopped)
    if cache is not None:
        cache.add(answer)
    return stats

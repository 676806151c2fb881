"""The suffix-decoding proposer on handmade sequences whose drafts are known exactly."""

from __future__ import annotations

import pytest

from gateway.text import tokenize
from gateway.text.suffix import MAX_CANDIDATES, AnswerCache, SuffixProposer, SuffixSettings, realised_suffix

WORDS = " ".join(f"w{i}" for i in range(1, 13))
PROMPT = tokenize(f"Copy this: {WORDS} end")
ANSWER = tokenize(" " + WORDS)


def test_a_copied_answer_drafts_as_far_as_its_match_is_long() -> None:
    """By hand (depth 24, factor 1, k 24): step 1 is the prefill's (" w1", no draft); step
    2 matches " w1" (1 deep: one draft, " w2", accepted; " w3" sampled); step 3 matches
    " w1 w2 w3" (3 deep: w4-w6 accepted, w7 sampled); step 4 matches w1-w7 (7 deep: would
    draft w8-w12, " end", " w1", but the answer, cut at max_tokens, has 4 tokens left less
    one: w8-w11, accepted, and w12 sampled): 4 steps, 3 drafted, 8 drafted tokens, 8
    accepted. Stopped instead, the whole 7 are drafted and w8-w12 accepted."""
    st = realised_suffix(PROMPT, ANSWER)
    assert (st.steps, st.drafts, st.draft_tokens, st.accepted, st.output_tokens) == (4, 3, 8, 8, 12)
    stopped = realised_suffix(PROMPT, ANSWER, stopped=True)  # the last token can be accepted too
    assert (stopped.steps, stopped.draft_tokens, stopped.accepted) == (4, 11, 9)


def test_the_factor_and_k_bound_the_draft_and_depth_bounds_the_match() -> None:
    p = SuffixProposer([*PROMPT, *ANSWER[:7]], SuffixSettings(k=3))
    assert p.propose() == [" w8", " w9", " w10"]  # 7 deep, k 3
    p = SuffixProposer([*PROMPT, *ANSWER[:7]], SuffixSettings(max_spec_factor=0.5))
    assert p.propose() == [" w8", " w9", " w10"]  # 7 deep × 0.5
    p = SuffixProposer([*PROMPT, *ANSWER[:7]], SuffixSettings(depth=4))
    # a match 4 deep at most, and the tree below it holds depth − 4 = 0 tokens: no draft
    assert p.propose() == []
    with pytest.raises(ValueError):
        SuffixSettings(min_token_prob=1.5)


def test_the_most_frequent_continuation_wins_and_rare_paths_stop() -> None:
    """ " a b" (each time after another token, so no match is deeper than 2) is followed
    by " x" three times and by " y" once: the draft is " x" (3/4), then what followed
    " a b x" (always " c": still 3/4). With min_token_prob 0.8 the path stops before its
    first token."""
    seq = tokenize(" a b x c p a b x c r a b y d s a b x c t a b")
    assert SuffixProposer(seq, SuffixSettings(max_spec_factor=4.0)).propose()[:2] == [" x", " c"]
    assert SuffixProposer(seq, SuffixSettings(min_token_prob=0.8)).propose() == []


def test_earlier_answers_draft_for_a_new_request_and_the_cache_is_bounded() -> None:
    """A second request with another prompt and the same answer: step 2 matches " a1" in the
    cached answer (1 deep: " a2" accepted), step 3 " a1 a2 a3" (3 deep, cut to the 2
    tokens left less one: a4, a5 accepted, a6 sampled): 3 steps, 2 drafted, 3 drafted
    tokens, 3 accepted."""
    answer = tokenize(" a1 a2 a3 a4 a5 a6")
    cache = AnswerCache(2)
    first = realised_suffix(tokenize("hello"), answer, cache=cache)
    assert (first.steps, first.drafts) == (6, 0)  # nothing earlier to draft from
    again = realised_suffix(tokenize("hi"), answer, cache=cache)
    assert (again.steps, again.drafts, again.draft_tokens, again.accepted) == (3, 2, 3, 3)
    for i in range(5):
        cache.add(tokenize(f" z{i} q{i} r{i}"))
    assert len(cache) == 2  # the last two answers only
    gone = realised_suffix(tokenize("hi"), answer, cache=cache)
    assert gone.drafts == 0  # the a-answers were evicted and the index rebuilt without them
    many = AnswerCache(1000)
    for _ in range(3 * MAX_CANDIDATES):
        many.add(answer)
    # candidate lists stay bounded, and a lookup sees the newest of them
    assert MAX_CANDIDATES <= len(many.index.one[" a1"]) < 2 * MAX_CANDIDATES
    sites = many.index.sites(tokenize(" a1"))
    assert sites is not None and len(sites) == MAX_CANDIDATES
    assert sites[0][0] is many.index.one[" a1"][-1][0]  # newest first

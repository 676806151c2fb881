from __future__ import annotations

import random

from gateway.text import PromptLookupProposer, detokenize, realised_lookup, tokenize


def test_tokenize_roundtrip() -> None:
    s = "def f(x):\n    return x + 1  # add one, keep 'x'!"
    assert detokenize(tokenize(s)) == s
    assert tokenize("a b")[1] == " b"


def test_proposer_uses_longest_latest_match() -> None:
    p = PromptLookupProposer(list("abcdxyzabcde"), k=3, n_min=2, n_max=4)
    # suffix "cde" occurred? no; "de" occurs only as the suffix itself -> no earlier match
    assert p.propose() == []
    p.extend(list("ab"))  # suffix "...e a b": "ab" last seen at 7..9 -> followed by "cde"
    assert p.propose() == list("cde")


def test_proposer_no_match_below_n_min() -> None:
    p = PromptLookupProposer(list("abcab"), k=2, n_min=3, n_max=3)
    assert p.propose() == []  # "cab" never occurred before


def test_realised_lookup_pure_copy_accepts_nearly_everything() -> None:
    rng = random.Random(1)
    prompt = [rng.randrange(10_000) for _ in range(400)]
    answer = prompt[100:300]  # the answer copies a span of the prompt
    stats = realised_lookup(prompt, answer, k=5, n_min=2, n_max=5)
    assert stats.mean_acceptance_length is not None and stats.mean_acceptance_length > 5.0
    assert stats.tokens_per_step > 4.5
    assert stats.output_tokens == 200


def test_realised_lookup_novel_answer_drafts_little() -> None:
    rng = random.Random(2)
    prompt = [rng.randrange(10_000) for _ in range(400)]
    answer = [rng.randrange(10_000, 20_000) for _ in range(200)]
    stats = realised_lookup(prompt, answer)
    assert stats.accepted == 0
    assert stats.tokens_per_step == 1.0

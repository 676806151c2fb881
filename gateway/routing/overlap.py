"""Prompt→answer overlap prediction (how much of the answer will copy the prompt).

Placeholder interface: the adaptive-routing work replaces the body of ``predict_overlap``
with the real, learning predictor. Signatures are the contract the API layer uses.
"""

from __future__ import annotations

from gateway.text import realised_lookup, tokenize


def predict_overlap(prompt_text: str, instruction_text: str) -> tuple[float, str]:
    """Return (predicted overlap 0..1, request kind). ``instruction_text`` is the last user turn."""
    return 0.0, "unknown"


def realised_lookup_acceptance(prompt_text: str, completion_text: str, *, k: int = 5) -> float | None:
    """Acceptance rate an n-gram proposer would have realised on this answer, or None."""
    if not completion_text:
        return None
    return realised_lookup(tokenize(prompt_text), tokenize(completion_text), k=k).acceptance_rate

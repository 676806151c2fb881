"""vLLM's ``qwen3`` reasoning parser, over the tokens one chat choice generates.

The parser splits what the engine generates into reasoning (before ``</think>``, the
markers themselves not shown) and content (after it), chunk by chunk as a stream sends
them, or at once for a whole answer. Whether it starts in the reasoning is its mode
(:attr:`specgate_lab.emulator.engine.EngineConfig.reasoning_parser_mode`):

- ``prompt-aware`` (newer vLLM): a prompt whose last think block has ended (a continued
  answer, or ``enable_thinking: false``) makes everything generated content;
- ``generated-only`` (older vLLM): it looks at its own output only, so everything before a
  ``</think>`` it generates is reasoning, even the continuation of an answer whose think
  block the prompt already closed.
"""

from __future__ import annotations

from specgate_lab.emulator.template import THINK_CLOSE, THINK_OPEN


def reasoning_ended(prompt: str) -> bool:
    """The prompt's last think block is closed."""
    return prompt.rfind(THINK_CLOSE) > prompt.rfind(THINK_OPEN)


class ReasoningParser:
    """One choice's parser: :meth:`feed` the tokens as generated; ``reasoning_tokens``
    counts those it read as thinking (the markers included)."""

    def __init__(self, prompt: str, mode: str) -> None:
        self.thinking = not (mode == "prompt-aware" and reasoning_ended(prompt))
        self.reasoning_tokens = 0

    def feed(self, tokens: list[str]) -> tuple[str, str]:
        """The (reasoning, content) text of the next ``tokens``."""
        reasoning: list[str] = []
        content: list[str] = []
        for tok in tokens:
            if not self.thinking:
                content.append(tok)
                continue
            self.reasoning_tokens += 1
            head, close, tail = tok.partition(THINK_CLOSE)
            reasoning.append(head.replace(THINK_OPEN, ""))
            if close:
                self.thinking = False
                content.append(tail)
        return "".join(reasoning), "".join(content)

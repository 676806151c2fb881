"""Qwen3's chat template, as the emulator renders messages into the text its engine sees.

Rendered as Qwen3's own Jinja template renders them (without tools):

- user and system messages: ``<|im_start|>{role}\\n{content}<|im_end|>\\n``; tool results
  go in a user turn as ``<tool_response>`` blocks; other roles as the generic ChatML turn;
- an assistant message takes its reasoning from ``reasoning_content`` (or ``reasoning``,
  the newer name) or else splits it out of ``content`` at ``</think>``. After the last user
  query it is rendered ``<think>\\n{reasoning}\\n</think>\\n\\n{content}`` when it is the
  last message or has reasoning (so a continued message given back without its reasoning
  carries an *empty* think block); earlier assistant turns render their content only;
- ``add_generation_prompt`` opens the assistant's turn, and with
  ``chat_template_kwargs: {"enable_thinking": false}`` also closes an empty think block,
  which turns thinking off; ``continue_final_message`` leaves the last message open (no
  end of turn), so the answer continues it.

Token counts (usage, ``/tokenize``) are those of this text (:func:`model_tokenize`).
"""

from __future__ import annotations

import re
from typing import Any

from gateway.text import tokenize
from specgate_lab.emulator.errors import ApiError

CHAT_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
ASSISTANT_TURN = "<|im_start|>assistant\n"
END_OF_TURN = "<|im_end|>"
NO_THINKING = f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"


_MARKER = re.compile(r"(\n*)(</?think>)(\n*)")


def model_tokenize(text: str) -> list[str]:
    """The emulated model's tokens of ``text``: :func:`gateway.text.tokenize`'s, with each
    think marker one token and the newlines around it tokens of their own, as a thinking
    engine generates them (so a thinking answer's text counts as many tokens as were
    generated; text without markers tokenizes as ever)."""
    if "think>" not in text:
        return tokenize(text)
    out: list[str] = []
    pos = 0
    for m in _MARKER.finditer(text):
        out += tokenize(text[pos : m.start()])
        out += [t for t in m.groups() if t]
        pos = m.end()
    return out + tokenize(text[pos:])


def content_text(content: Any, i: int) -> str:
    """A message's text: a string, or its text parts joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text", "output_text"):
                raise ApiError(f"messages[{i}].content: only text parts are supported", param="messages")
            text = part.get("text")
            if not isinstance(text, str):
                raise ApiError(f"messages[{i}].content[].text must be a string", param="messages")
            parts.append(text)
        return "\n".join(parts)
    raise ApiError(f"messages[{i}].content must be a string or a list of parts", param="messages")


def _reasoning(m: dict[str, Any], content: str, i: int) -> tuple[str, str]:
    """An assistant message's (reasoning, content), as Qwen3's template takes them apart."""
    for key in ("reasoning_content", "reasoning"):
        r = m.get(key)
        if r is not None:
            if not isinstance(r, str):
                raise ApiError(f"messages[{i}].{key} must be a string", param="messages")
            return r, content
    if THINK_CLOSE in content:
        head, _, _ = content.partition(THINK_CLOSE)
        reasoning = head.rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
        return reasoning, content.split(THINK_CLOSE)[-1].lstrip("\n")
    return "", content


def _last_query(messages: list[dict[str, Any]]) -> int:
    """The index of the last user message that is not a tool response (Qwen3's
    ``last_query_index``)."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        c = m.get("content")
        if m.get("role") == "user" and not (
            isinstance(c, str) and c.startswith("<tool_response>") and c.endswith("</tool_response>")
        ):
            return i
    return len(messages) - 1


def _check(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages must be a non-empty list", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ApiError(f"messages[{i}] must be an object", param="messages")
        if m.get("role") not in CHAT_ROLES:
            raise ApiError(f"messages[{i}].role must be one of {sorted(CHAT_ROLES)}", param="messages")
    return messages


def chat_template(
    messages: Any,
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    enable_thinking: bool = True,
) -> str:
    """Render ``messages`` as Qwen3's template does (see the module docstring)."""
    msgs = _check(messages)
    if continue_final_message and add_generation_prompt:
        raise ApiError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    last_query = _last_query(msgs)
    out: list[str] = []
    last = len(msgs) - 1
    for i, m in enumerate(msgs):
        role = m["role"]
        content = content_text(m.get("content"), i)
        end = "" if continue_final_message and i == last else END_OF_TURN + "\n"
        if role == "assistant":
            reasoning, content = _reasoning(m, content, i)
            if i > last_query and (i == last or reasoning):
                think = f"{THINK_OPEN}\n{reasoning.strip(chr(10))}\n{THINK_CLOSE}\n\n"
                out.append(f"{ASSISTANT_TURN}{think}{content.lstrip(chr(10))}{end}")
            else:
                out.append(f"{ASSISTANT_TURN}{content}{end}")
        elif role == "tool":
            first = i == 0 or msgs[i - 1]["role"] != "tool"
            final = i == last or msgs[i + 1]["role"] != "tool"
            opening = "<|im_start|>user" if first else ""
            closing = end if final else ""
            out.append(f"{opening}\n<tool_response>\n{content}\n</tool_response>{closing}")
        else:
            out.append(f"<|im_start|>{role}\n{content}{end}")
    if add_generation_prompt:
        out.append(ASSISTANT_TURN if enable_thinking else ASSISTANT_TURN + NO_THINKING)
    return "".join(out)


def _flag(body: dict[str, Any], key: str, default: bool, where: str = "") -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(f"{where}{key} must be a boolean", param=key)
    return v


def chat_prompt(body: dict[str, Any]) -> str:
    """The text a chat request renders to (its ``messages``, ``add_generation_prompt``,
    ``continue_final_message`` and ``chat_template_kwargs.enable_thinking``)."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ApiError("chat_template_kwargs must be an object", param="chat_template_kwargs")
    return chat_template(
        body.get("messages"),
        add_generation_prompt=_flag(body, "add_generation_prompt", True),
        continue_final_message=_flag(body, "continue_final_message", False),
        enable_thinking=_flag(kwargs or {}, "enable_thinking", True, "chat_template_kwargs."),
    )

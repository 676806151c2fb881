"""The answer generator: what prompts ask for, and how much of the prompt answers copy."""

from __future__ import annotations

from gateway.text import realised_lookup, tokenize
from specgate_lab.emulator.template import chat_template
from specgate_lab.emulator.textgen import AnswerGenerator, PromptKind, classify
from specgate_lab.workload.sampler import iter_requests

EXPECTED = {"edit": PromptKind.EDIT, "summary": PromptKind.SUMMARY, "rag": PromptKind.SUMMARY}


def test_classifier_agrees_with_the_workload_corpus() -> None:
    reqs = list(iter_requests(11, 300))
    agree = sum(
        classify(chat_template(list(r.messages))) is EXPECTED.get(r.kind, PromptKind.CHAT) for r in reqs
    )
    assert agree / len(reqs) >= 0.95


def test_instruction_words_inside_pasted_documents_do_not_count() -> None:
    doc = "Release notes. " + "We fixed and updated and refactored many things this month. " * 20
    assert classify(f'What are the key takeaways?\n"""\n{doc}\n"""') is PromptKind.SUMMARY
    assert classify("Why do cats purr?") is PromptKind.CHAT
    code = "```python\ndef f(x):\n    return x + 1\n```"
    assert classify("Rename f to g and return the whole file.\n" + code) is PromptKind.EDIT


def test_answers_copy_as_much_as_the_kind_asks() -> None:
    code = (
        "```python\n"
        + "".join(f"def f{i}(x):\n    return helper(x, {i}) * {i}\n\n" for i in range(20))
        + "```"
    )
    prompts = {
        PromptKind.EDIT: "Add type hints and return the full file.\n" + code,
        PromptKind.SUMMARY: "Summarize this report.\n"
        + " ".join(f"Team {i} shipped feature {i * 7} on day {i} after review." for i in range(40)),
        PromptKind.CHAT: "What is a good name for a cat?",
    }
    copied = {}
    for kind, prompt in prompts.items():
        toks = tokenize(prompt)
        gen = AnswerGenerator(prompt, toks, temperature=0.0, seed=3)
        assert gen.kind is kind
        answer = gen.tokens(0, min(400, gen.natural_length))
        st = realised_lookup(toks, answer)
        copied[kind] = (st.accepted + st.drafts) / len(answer)
    assert copied[PromptKind.EDIT] > 0.6 > copied[PromptKind.SUMMARY] > 0.1 > copied[PromptKind.CHAT]

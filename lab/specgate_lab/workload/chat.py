"""Open chat questions: answers that share little text with the prompt."""

from __future__ import annotations

import random

from specgate_lab.workload.vocab import (
    AUDIENCES,
    CONCEPTS,
    EVENTS,
    PRODUCTS,
    SKILLS,
    THINGS,
    TOPICS_TECH,
    USE_CASES,
)

_QUESTIONS: tuple[str, ...] = (
    "What are the pros and cons of {tech} for {use}?",
    "Explain {concept} to {aud}.",
    "Write a short poem about {thing}.",
    "How should I prepare for {event}?",
    "I want to {skill}. Give me a four-week plan.",
    "Compare {tech} and {tech2}. When would you pick each?",
    "Why does {concept} matter in everyday life?",
    "Tell me a short story about {thing}, in under 200 words.",
    "What questions should I ask before adopting {tech} at {use}?",
    "Give me three surprising facts about {concept}.",
    "Suggest five names for a product about {thing}, and explain each briefly.",
    "What is a common misconception about {concept}?",
    "Draft a friendly message inviting my team to a talk on {tech}.",
    "What would a historian find interesting about {thing}?",
    "How do I explain to my manager that we should stop using {tech}?",
    "Brainstorm ideas for a weekend project involving {tech}.",
    "What mistakes do beginners make when they try to {skill}?",
    "Write a haiku about {concept}.",
    "If {product} were a person, what would their personality be like?",
    "Is it worth learning {tech} in {year}? Be honest.",
)

_SYSTEMS: tuple[str, ...] = (
    "You are a helpful assistant.",
    "You are a concise assistant. Keep answers short.",
    "You are a friendly tutor who uses simple examples.",
    "",
)


def chat_question(rng: random.Random) -> tuple[str, str]:
    """(system prompt or "", user question)."""
    tech, tech2 = rng.sample(TOPICS_TECH, 2)
    q = rng.choice(_QUESTIONS).format(
        tech=tech,
        tech2=tech2,
        use=rng.choice(USE_CASES),
        concept=rng.choice(CONCEPTS),
        aud=rng.choice(AUDIENCES),
        thing=rng.choice(THINGS),
        event=rng.choice(EVENTS),
        skill=rng.choice(SKILLS),
        product=rng.choice(PRODUCTS),
        year=rng.randint(2025, 2028),
    )
    return rng.choice(_SYSTEMS), q

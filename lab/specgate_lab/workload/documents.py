"""Pasted documents generated from a seed: incident reports, meeting notes, release notes,
support threads and policy memos. Each document records its sentences, the structured
records it states (action items, fixes, limits, …) and question/answer facts, so that
quoting, extraction and RAG prompts come with an exact reference answer."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from specgate_lab.workload.vocab import (
    CAUSES,
    FIRST_NAMES,
    LAST_NAMES,
    MONTHS,
    PRODUCTS,
    SYMPTOMS,
    SYSTEMS,
    TEAMS,
)


@dataclass
class Document:
    doctype: str
    title: str
    text: str = ""
    sentences: list[str] = field(default_factory=list)
    record_name: str = "items"
    records: list[dict[str, str]] = field(default_factory=list)
    facts: list[tuple[str, str]] = field(default_factory=list)  # (question, sentence that answers it)
    keywords: list[str] = field(default_factory=list)  # words worth quoting sentences about


class _Builder:
    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.blocks: list[str] = [doc.title, ""]

    def heading(self, text: str) -> None:
        self.blocks += [text, ""]

    def para(self, sentences: list[str]) -> None:
        self.doc.sentences += sentences
        self.blocks += [" ".join(sentences), ""]

    def bullets(self, sentences: list[str], prefix: str = "- ") -> None:
        self.doc.sentences += sentences
        self.blocks += [f"{prefix}{s}" for s in sentences] + [""]

    def done(self) -> Document:
        self.doc.text = "\n".join(self.blocks).strip() + "\n"
        return self.doc


def _person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"


def _people(rng: random.Random, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        p = _person(rng)
        if p not in out:
            out.append(p)
    return out


def _date(rng: random.Random) -> str:
    return f"{rng.randint(1, 28)} {rng.choice(MONTHS)} {rng.randint(2024, 2027)}"


def _time(rng: random.Random) -> str:
    return f"{rng.randint(0, 23):02d}:{rng.choice((0, 5, 12, 20, 31, 40, 47, 55)):02d}"


_TASKS = (
    "add an alert on {sys} error rates",
    "write a runbook for restarting {sys}",
    "raise the connection limit of {sys}",
    "add jitter to client retries against {sys}",
    "rotate the credentials used by {sys}",
    "add a canary stage to the {sys} rollout",
    "backfill the missing records in {sys}",
    "load-test {sys} at twice the peak traffic",
    "document the failover procedure for {sys}",
    "remove the deprecated endpoints of {sys}",
)


def incident_report(rng: random.Random, short: bool = False) -> Document:
    sys_, other = rng.sample(SYSTEMS, 2)
    date, symptom, cause = _date(rng), rng.choice(SYMPTOMS), rng.choice(CAUSES)
    minutes, pct = rng.randint(7, 190), rng.randint(2, 60)
    owner, responder = _people(rng, 2)
    doc = Document(
        "incident report", f"Incident report: {symptom} on {sys_} ({date})", record_name="action items"
    )
    b = _Builder(doc)
    summary = f"On {date}, {sys_} showed {symptom} for {minutes} minutes, affecting about {pct}% of requests."
    root = f"The root cause was {cause}."
    b.heading("Summary")
    b.para([summary, f"{responder} was the incident commander.", root])
    if not short:
        b.heading("Timeline (UTC)")
        events = [
            f"{_time(rng)} An alert fired for {sys_}.",
            f"{_time(rng)} {responder} acknowledged the page and opened a bridge.",
            f"{_time(rng)} Traffic to {other} was drained as a precaution.",
            f"{_time(rng)} The team identified {cause}.",
            f"{_time(rng)} A fix was deployed and error rates returned to normal.",
        ]
        b.bullets(events[: rng.randint(3, 5)])
        b.heading("Impact")
        b.para(
            [
                f"Customers saw {symptom} during the incident window.",
                f"No data was lost, but {rng.randint(12, 4000)} requests had to be retried by clients.",
            ]
        )
    b.heading("Action items")
    actions = []
    for person, task in zip(
        [owner, *_people(rng, 3)], rng.sample(_TASKS, 4 if not short else 2), strict=False
    ):
        due = _date(rng)
        t = task.format(sys=rng.choice((sys_, other)))
        actions.append(f"{person} will {t} by {due}.")
        doc.records.append({"owner": person, "task": t, "due": due})
        doc.facts.append((f"Who is responsible for the action to {t}?", actions[-1]))
    b.bullets(actions)
    doc.facts += [
        (f"What was the root cause of the {sys_} incident on {date}?", root),
        (f"How long did the {sys_} incident on {date} last?", summary),
    ]
    doc.keywords += [sys_, responder, owner]
    return b.done()


def meeting_notes(rng: random.Random, short: bool = False) -> Document:
    team, date = rng.choice(TEAMS), _date(rng)
    people = _people(rng, rng.randint(3, 6))
    products = rng.sample(PRODUCTS, 3)
    doc = Document("meeting notes", f"{team} weekly sync, {date}", record_name="decisions")
    b = _Builder(doc)
    b.para([f"Attendees: {', '.join(people)}."])
    b.heading("Discussion")
    lines = [
        f"{people[0]} reported that the {products[0]} beta has {rng.randint(40, 900)} active users.",
        f"{people[1]} raised concerns about the {products[1]} launch date slipping to {_date(rng)}.",
        f"The budget for {products[2]} is {rng.randint(20, 400)} thousand euros for the quarter.",
        f"{people[-1]} suggested pairing with the {rng.choice(TEAMS)} team on on-call rotations.",
        f"Hiring: {rng.randint(1, 4)} open roles remain, interviews continue next week.",
    ]
    b.bullets(lines if not short else lines[:3])
    b.heading("Decisions")
    decisions = []
    for prod, person in zip(products[: 2 if short else 3], people, strict=False):
        verb = rng.choice(("ship", "pause", "rescope", "open-source", "sunset"))
        when = _date(rng)
        s = f"We will {verb} {prod} on {when}; {person} owns the announcement."
        decisions.append(s)
        doc.records.append({"product": prod, "decision": verb, "date": when, "owner": person})
        doc.facts.append((f"What did the {team} team decide about {prod}?", s))
    b.bullets(decisions)
    doc.facts.append((f"Who attended the {team} weekly sync on {date}?", f"Attendees: {', '.join(people)}."))
    doc.keywords += [*products, people[0], people[1]]
    return b.done()


def release_notes(rng: random.Random, short: bool = False) -> Document:
    product = rng.choice(PRODUCTS)
    version = f"{rng.randint(1, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 9)}"
    doc = Document("release notes", f"{product} {version} release notes", record_name="fixed issues")
    b = _Builder(doc)
    b.para([f"{product} {version} was released on {_date(rng)}.", "Upgrading is recommended for all users."])
    b.heading("New features")
    feats = [
        f"Added {rng.choice(('CSV export', 'dark mode', 'SSO login', 'bulk editing', 'audit trails'))} "
        f"to the {rng.choice(('dashboard', 'admin console', 'mobile app', 'API'))}.",
        f"The {rng.choice(SYSTEMS)} integration now supports "
        f"{rng.choice(('webhooks', 'pagination', 'retries'))}.",
        f"Startup time is {rng.randint(10, 70)}% faster on large workspaces.",
    ]
    b.bullets(feats[: 2 if short else 3])
    b.heading("Fixes")
    fixes = []
    whats = rng.sample(
        (
            "a crash when opening an empty project",
            "wrong totals in the monthly report",
            "a memory leak in the sync worker",
            "timezone errors in scheduled exports",
            "broken links in notification emails",
            "slow search on accounts with many files",
            "duplicate rows after an import",
        ),
        2 if short else rng.randint(3, 5),
    )
    for what in whats:
        issue = f"#{rng.randint(1000, 9999)}"
        s = f"Fixed {what} ({issue})."
        fixes.append(s)
        doc.records.append({"issue": issue, "fix": what})
        doc.facts.append((f"Which problem did {product} {version} fix under issue {issue}?", s))
        doc.keywords.append(issue)
    b.bullets(fixes)
    if not short:
        b.heading("Known issues")
        b.bullets([f"Importing files larger than {rng.randint(1, 8)} GB may time out."])
    return b.done()


def support_thread(rng: random.Random, short: bool = False) -> Document:
    customer, agent = _people(rng, 2)
    order = f"{rng.choice('ABCDEFGH')}{rng.randint(100000, 999999)}"
    amount = f"{rng.randint(12, 900)}.{rng.randint(0, 99):02d}"
    date = _date(rng)
    doc = Document("support thread", f"Support ticket {order}: refund request", record_name="commitments")
    b = _Builder(doc)
    days = str(rng.randint(3, 10))
    msgs = [
        f"Customer ({customer}): I ordered item {order} on {date} and was charged {amount} EUR twice.",
        f"Agent ({agent}): Thanks for reaching out, I can see two charges of {amount} EUR for order {order}.",
        "Customer: Can you refund the duplicate charge? I also never got a shipping confirmation.",
        f"Agent ({agent}): I have requested a refund of {amount} EUR; it takes {days} business days.",
        f"Agent ({agent}): The parcel left our warehouse in "
        f"{rng.choice(('Lyon', 'Porto', 'Gdansk', 'Leeds'))} and should arrive by {_date(rng)}.",
        "Customer: Great, thank you for the quick help.",
    ]
    b.bullets(msgs if not short else msgs[:4], prefix="")
    refund = msgs[3]
    doc.records.append({"order": order, "amount": amount, "refund_business_days": days})
    doc.facts += [
        (f"How much was refunded for order {order}?", refund),
        (f"When was order {order} placed?", msgs[0]),
    ]
    doc.keywords += [order, agent]
    return b.done()


def policy_memo(rng: random.Random, short: bool = False) -> Document:
    year = rng.randint(2025, 2027)
    team = rng.choice(TEAMS)
    doc = Document("policy memo", f"Travel and expense policy {year}, {team}", record_name="limits")
    b = _Builder(doc)
    b.para(
        [f"This memo replaces the {year - 1} policy for the {team} department.", "It applies to all trips."]
    )
    b.heading("Limits")
    cities = rng.sample(("Berlin", "Tokyo", "New York", "Nairobi", "São Paulo", "Madrid", "Seoul"), 4)
    rules = []
    for city in cities[: 2 if short else 4]:
        limit = rng.randint(90, 380)
        s = f"Hotels in {city} may cost up to {limit} EUR per night."
        rules.append(s)
        doc.records.append({"city": city, "hotel_limit_eur": str(limit)})
        doc.facts.append((f"What is the hotel limit in {city} under the {year} policy?", s))
    meals = rng.randint(30, 90)
    rules.append(f"Meals are reimbursed up to {meals} EUR per day with receipts.")
    b.bullets(rules)
    if not short:
        b.heading("Approvals")
        b.para(
            [
                f"Trips above {rng.randint(2, 6)} thousand EUR need approval from {_person(rng)}.",
                f"Claims must be filed within {rng.randint(14, 60)} days of the trip.",
            ]
        )
    doc.keywords += cities[:2]
    return b.done()


GENERATORS: tuple[Callable[[random.Random, bool], Document], ...] = (
    incident_report,
    meeting_notes,
    release_notes,
    support_thread,
    policy_memo,
)


def generate_document(rng: random.Random, short: bool = False) -> Document:
    return rng.choice(GENERATORS)(rng, short)

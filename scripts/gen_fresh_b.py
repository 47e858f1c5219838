"""Fresh trace generator B (issue 34): insurance, tutoring, fitness, analytics, smart home, farming.

``python scripts/gen_fresh_b.py --seed 101 --requests 3000 --out /tmp/fb101`` writes
``traces.jsonl`` and ``truth.json`` (format: ``scripts/fresh_common.py``). It shares no text with
generator A: its prompts are markdown sections with bullet rules and XML-like tags, some message
contents are lists of text parts, few-shot examples are user/assistant message pairs, there is no
``timestamp`` and the trace is audited on the auditor's default chat template (``audit_args``
is empty). The date family is therefore a date the application writes into the system prompt;
generator A covers the date a chat template writes.

Fourteen families, 3,000 requests by default:

=====================  =====================================================================
b_claims_caller        caller name + policy holder id (hex) in the second sentence; text parts
b_tutor_ticket         an escalation ticket number in the middle of an XML-tagged prompt
b_fitness_memory       <user_memory>: 3-5 of a member's 8 memories, retrieved per request
b_sql_fewshot          3 of 10 question/SQL pairs as messages, sampled and ordered per request
b_home_tools           six smart-home tools whose order changes per request
b_newsroom_date        the edition date on the first line, written by the application
b_depot_lastline       the depot region (a made-up town) on the last system line, then a
                       ~2k-token catalogue as the first text part of the user message
b_coop_batch           a hex batch id after the paragraph it shares with b_coop_grading
b_coop_grading         static
b_lease_static         static, ~2k tokens, long conversations
b_haiku_static         static, short
b_campaign_seed        a campaign seed made of two pseudo-words and a number, multi-turn
b_shift_clock          the local clock time and the employee's e-mail address
b_ledger_bearer        a JWT-shaped bearer token
=====================  =====================================================================

Cost: linear in ``--requests``; 3,000 requests in about a second.
"""

from __future__ import annotations

import base64
import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fresh_common import (
    EPOCH,
    Family,
    Msg,
    Trace,
    Users,
    ValuePools,
    chat,
    digits,
    drive,
    hex_string,
    parse_args,
    prose,
    rng_for,
    sample_shuffled,
    split_counts,
)

GEN = "gen_fresh_b"
MODEL = "qwen2.5-14b-instruct"
CHARS_PER_TOKEN = 4

FRAMES = [
    "always {verb} the {thing} before you {verb2} anything",
    "a {person} may ask for {thing}; {verb} it only with {proof}",
    "keep {thing} out of the answer unless the {person} brings it up",
    "escalate to {desk} when {thing} is {state}",
    "if the {person} disagrees, {verb} the {thing} and offer {remedy}",
    "answers about {thing} cite the {doc} section by name",
    "{remedy} is available only when {thing} is {state}",
    "the {desk} owns every decision about {thing}",
    "prefer short numbered steps when explaining {thing} to a {person}",
]
SLOTS: dict[str, list[str]] = {
    "verb": ["check", "restate", "validate", "summarise", "record", "double-check"],
    "verb2": ["approve", "schedule", "commit", "publish", "release"],
    "thing": ["the coverage limit", "the lesson plan", "the training load", "the query plan",
              "the thermostat schedule", "the harvest grade", "the lease clause",
              "the excess amount", "the attendance record", "the delivery slot",
              "the moisture reading", "the deposit"],
    "person": ["policyholder", "parent", "student", "member", "analyst", "tenant", "grower"],
    "proof": ["a signed form", "two-factor approval", "a supervisor's note", "the original invoice"],
    "desk": ["review panel", "duty supervisor", "second-line desk", "quality office"],
    "state": ["disputed", "missing", "out of date", "above the threshold", "flagged"],
    "remedy": ["a goodwill credit", "a free reassessment", "a make-up session", "a rebate"],
    "doc": ["handbook", "terms", "charter", "playbook", "schedule"],
}
GIVEN = ["Aiko", "Bram", "Catalina", "Dariusz", "Eilidh", "Femi", "Gunnhild", "Hamza", "Ilse",
         "Joaquin", "Keziah", "Leopold", "Maelle", "Nnamdi", "Orsolya", "Piet", "Rania", "Stellan",
         "Thandiwe", "Umar", "Valeria", "Wilhelmina", "Yannick", "Zainab", "Anouk", "Bogdan",
         "Consuelo", "Declan", "Eun-ji", "Florin"]


def pools(seed: int) -> ValuePools:
    return ValuePools(
        rng_for(seed, GEN, "pools"), given=GIVEN,
        surname_roots=["abel", "korv", "nyst", "ober", "rasm", "sill", "trev", "ukon", "wald",
                       "yarb", "belt", "cask", "drom", "hask"],
        surname_tails=["ström", "enko", "ani", "berg", "olu", "ier", "ovic", "wood", "ada", "ek"],
        place_heads=["glen", "stor", "ash", "kirk", "mell", "noss", "pry", "tarr", "ulv", "wyn"],
        place_tails=["dale", "holm", "brook", "gate", "vik", "bury", "ridge", "sand"],
        code_left=["Iron", "Pale", "Swift"], code_right=["Comet", "Delta", "Fjord"],
        syllables=["gra", "nu", "thel", "vo", "dak", "si", "orm", "pe", "lux", "tra", "bim"],
        mail_domains=["meridian.example", "staff.example", "work.example"],
    )


def rules(seed: int, fam: str, n_tokens: int, heading: str) -> str:
    """A markdown section of bullet rules of about ``n_tokens`` tokens."""
    body = prose(rng_for(seed, GEN, fam, "rules", heading), FRAMES, SLOTS,
                 n_tokens * CHARS_PER_TOKEN, bullet="* ", per_paragraph=(4, 7))
    return f"## {heading}\n\n{body}"


def ask(rng: Any) -> str:
    thing = rng.choice(SLOTS["thing"])
    forms = [f"hey, quick question on {thing}", f"Could you look at {thing} for me?",
             f"why is {thing} {rng.choice(SLOTS['state'])}??",
             f"I was told to ask you about {thing}. Ref {rng.randint(10, 9999)}",
             f"what happens to {thing} if I cancel next week"]
    return rng.choice(forms)


def answer(rng: Any) -> str:
    return (f"Here is what I found: {rng.choice(SLOTS['thing'])} is "
            f"{rng.choice(SLOTS['state'])}. Next, I will {rng.choice(SLOTS['verb'])} it.")


def parts(*texts: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": t} for t in texts]


def turns_of(rng: Any, history: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    """The user/assistant history up to user turn ``turn`` (grown on demand)."""
    while len(history) < 2 * turn + 1:
        role = "assistant" if history and history[-1]["role"] == "user" else "user"
        history.append({"role": role, "content": answer(rng) if role == "assistant" else ask(rng)})
    return history[: 2 * turn + 1]


def simple(trace: Trace, seed: int, fam: Family, n: int, turns: tuple[int, int],
           system: Any, tools: Any = None) -> None:
    """A family whose conversation state is its system message (text or parts) and tools."""
    rng = rng_for(seed, GEN, fam.name, "requests")

    def open_conv(conv: int) -> tuple[Any, Any, list[dict[str, Any]]]:
        return system(rng), tools(rng) if tools else None, []

    def request(state: tuple[Any, Any, list[dict[str, Any]]], turn: int) -> dict[str, Any]:
        sys_content, tool_list, history = state
        msgs = [{"role": "system", "content": sys_content}, *turns_of(rng, history, turn)]
        return chat(MODEL, msgs, **({"tools": tool_list} if tool_list else {}))
    drive(trace, fam, rng, n, turns, open_conv, request)


def claims_caller(trace: Trace, seed: int, n: int, vp: ValuePools) -> None:
    fam = trace.family("b_claims_caller")
    f_name = fam.field("caller_name", "name", "system")
    f_pol = fam.field("policy_holder_id", "hex_id", "system")

    def person(i: int) -> dict[str, str]:
        g, s = vp.person()
        return {"name": f"{g} {s}", "policy": hex_string(vp.rng, 10)}
    users = Users(rng_for(seed, GEN, fam.name, "users"), max(4, n // 5), person)
    body = [rules(seed, fam.name, 700, "Handling rules"), rules(seed, fam.name, 800, "Coverage notes")]

    def system(rng: Any) -> list[dict[str, str]]:
        u = users.pick()
        head = (Msg().lit("You take phone claims for Meridian Mutual. The caller on this line is ")
                .val(f_name, u["name"]).lit(" (policy holder ").val(f_pol, u["policy"])
                .lit("), already verified by the switchboard.").done())
        return parts(head, *body)
    simple(trace, seed, fam, n, (1, 3), system)


def tutor_ticket(trace: Trace, seed: int, n: int) -> None:
    fam = trace.family("b_tutor_ticket")
    f_t = fam.field("ticket_number", "numeric_id", "system")
    before = rules(seed, fam.name, 400, "Platform")
    after = rules(seed, fam.name, 900, "How to reply")

    def system(rng: Any) -> str:
        return (Msg().lit("<platform>Brightpath Tutoring parent support</platform>\n<instructions>\n"
                          + before + "\n</instructions>\n<escalation ticket=\"T-")
                .val(f_t, digits(rng, 7)).lit("\" priority=\"normal\">\nThe parent wrote in about "
                                              "a tutor change.\n</escalation>\n<style>\n" + after
                                              + "\n</style>").done())
    simple(trace, seed, fam, n, (1, 2), system)


MEMORY_FORMS = ["goal is {g}", "trains {d} times a week", "has a {inj} and avoids {ex}",
                "prefers {t} sessions", "ran a {race} in {y}", "dislikes {ex}", "eats {diet}"]


def fitness_memory(trace: Trace, seed: int, n: int) -> None:
    fam = trace.family("b_fitness_memory")
    f_mem = fam.field("retrieved_memories", "sampled_block", "system",
                      also_ok=["reordered_block", "other"])
    mrng = rng_for(seed, GEN, fam.name, "memories")
    slots = {"g": ["a first half marathon", "losing 5 kg", "a pull-up", "better sleep"],
             "d": ["two", "three", "four", "five"], "inj": ["sore knee", "bad shoulder", "weak ankle"],
             "ex": ["burpees", "deadlifts", "box jumps", "sprints"], "t": ["morning", "late", "short"],
             "race": ["10k", "trail race", "triathlon"], "y": ["2023", "2024", "2025"],
             "diet": ["vegetarian", "no dairy", "high protein"]}

    def member(i: int) -> dict[str, Any]:
        mems = {"* member " + mrng.choice(MEMORY_FORMS).format_map(
            {k: mrng.choice(v) for k, v in slots.items()}) for _ in range(12)}
        return {"memories": sorted(mems)[:8]}
    users = Users(rng_for(seed, GEN, fam.name, "users"), max(4, n // 4), member)
    tail = rules(seed, fam.name, 1000, "Coaching rules")

    def system(rng: Any) -> str:
        mems = users.pick()["memories"]
        picked = sample_shuffled(rng, mems, min(len(mems), rng.randint(3, 5)))
        return (Msg().lit("Pulse Gym virtual coach.\n<user_memory>\nThings we know about this "
                          "member:\n").block(f_mem, picked, "\n")
                .lit("\n</user_memory>\n\n" + tail).done())
    simple(trace, seed, fam, n, (1, 1), system)


def schema(seed: int) -> str:
    rng = rng_for(seed, GEN, "b_sql_fewshot", "schema")
    tables = ["orders", "customers", "shipments", "invoices", "products", "returns", "stores",
              "regions", "suppliers", "payments", "campaigns", "visits"]
    cols = ["id", "created_at", "amount", "status", "region_id", "store_id", "sku", "quantity",
            "discount", "channel", "currency", "updated_at", "customer_id", "note"]
    out = []
    for t in tables:
        cs = ["id BIGINT PRIMARY KEY"] + [f"{c} {rng.choice(['TEXT', 'INT', 'NUMERIC(12,2)'])}"
                                           for c in rng.sample(cols[1:], 8)]
        out.append(f"CREATE TABLE {t} (\n  " + ",\n  ".join(cs) + "\n);")
    return "\n\n".join(out)


def sql_fewshot(trace: Trace, seed: int, n: int) -> None:
    fam = trace.family("b_sql_fewshot")
    f_ex = fam.field("example_pairs", "sampled_block", "user", also_ok=["reordered_block"])
    erng = rng_for(seed, GEN, fam.name, "examples")
    metrics = ["revenue", "order count", "average basket", "return rate", "late shipments"]
    pairs = []
    for i in range(10):
        m, per = erng.choice(metrics), erng.choice(["region", "store", "channel", "month"])
        pairs.append((f"Example {i + 1}: {m} by {per} for the last {erng.randint(2, 12)} weeks?",
                      f"SELECT {per}, SUM(amount) FROM orders WHERE created_at > now() - "
                      f"interval '{erng.randint(2, 12)} weeks' GROUP BY {per};"))
    system = ("You turn analysts' questions into one PostgreSQL query. Schema:\n\n" + schema(seed))
    guide = rules(seed, fam.name, 300, "Query rules")
    rng = rng_for(seed, GEN, fam.name, "requests")

    def open_conv(conv: int) -> list[dict[str, Any]]:
        chosen = sample_shuffled(rng, pairs, 3)
        f_ex.note([text for pair in chosen for text in pair])
        shots: list[dict[str, Any]] = []
        for q, a in chosen:
            shots += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        return shots

    def request(shots: list[dict[str, Any]], turn: int) -> dict[str, Any]:
        final = {"role": "user", "content": guide + "\n\nQuestion: " + ask(rng)}
        return chat(MODEL, [{"role": "system", "content": system}, *shots, final])
    drive(trace, fam, rng, n, (1, 1), open_conv, request)


HOME_TOOLS = ["set_thermostat", "read_sensor", "lock_door", "unlock_door", "dim_lights",
              "list_devices"]


def home_tools(trace: Trace, seed: int, n: int) -> None:
    fam = trace.family("b_home_tools")
    f_order = fam.field("tool_order", "reordered_block", "tools")
    defs: list[dict[str, Any]] = [{"type": "function", "function": {
        "name": name, "description": f"{name.replace('_', ' ').capitalize()} in one room.",
        "parameters": {"type": "object", "properties": {"room": {"type": "string"},
                                                         "value": {"type": "number"}},
                       "required": ["room"]}}} for name in HOME_TOOLS]
    sys_text = "Nestwise home assistant.\n\n" + rules(seed, fam.name, 450, "Safety")

    def tools(rng: Any) -> list[dict[str, Any]]:
        order = sample_shuffled(rng, defs, len(defs))
        f_order.note([d["function"]["name"] for d in order])
        return order
    simple(trace, seed, fam, n, (1, 1), lambda rng: sys_text, tools)


def newsroom_date(trace: Trace, seed: int, n: int) -> None:
    fam = trace.family("b_newsroom_date")
    f_d = fam.field("edition_date", "date", "system")
    tail = rules(seed, fam.name, 1100, "Copy desk rules")

    def system(rng: Any) -> str:
        day = (EPOCH + timedelta(days=rng.randint(0, 13))).strftime("%A, %d %B %Y")
        return (Msg().lit("Edition date: ").val(f_d, day)
                .lit("\nYou sub-edit agricultural news for the Valley Courier.\n\n" + tail).done())
    simple(trace, seed, fam, n, (1, 2), system)


def depot_lastline(trace: Trace, seed: int, n: int, vp: ValuePools) -> None:
    fam = trace.family("b_depot_lastline")
    f_region = fam.field("depot_region", "other", "system")
    regions = vp.distinct(vp.place, 20)
    catalogue = "# Catalogue\n\n" + rules(seed, fam.name, 2000, "Stock lines and lead times")
    rng = rng_for(seed, GEN, fam.name, "requests")

    def open_conv(conv: int) -> str:
        return (Msg().lit("## Role\nYou answer stock questions for Cargoline depots.\n"
                          "Quote lead times in working days.\nRegion: ")
                .val(f_region, rng.choice(regions)).done())

    def request(sys_text: str, turn: int) -> dict[str, Any]:
        msgs: list[dict[str, Any]] = [{"role": "system", "content": sys_text},
                                      {"role": "user", "content": parts(catalogue, ask(rng))}]
        return chat(MODEL, msgs)
    drive(trace, fam, rng, n, (1, 1), open_conv, request)


def coop(trace: Trace, seed: int, n_batch: int, n_grading: int) -> None:
    shared = ("Greenfield Growers Co-op assistant. The co-op buys grain, pulses and oilseed from "
              "member farms and sells them on under one quality mark. Speak as the co-op, "
              "never as an individual buyer.")
    batch = trace.family("b_coop_batch")
    f_b = batch.field("batch_id", "hex_id", "system")
    b_tail = rules(seed, batch.name, 800, "Inspection")

    def b_system(rng: Any) -> str:
        return (Msg().lit(shared + "\n\nBatch under inspection: ").val(f_b, hex_string(rng, 12))
                .lit("\n\n" + b_tail).done())
    simple(trace, seed, batch, n_batch, (1, 2), b_system)
    grading = trace.family("b_coop_grading")
    g_text = shared + "\n\n" + rules(seed, grading.name, 900, "Grading scale")
    simple(trace, seed, grading, n_grading, (1, 3), lambda rng: g_text)


def statics(trace: Trace, seed: int, n_lease: int, n_haiku: int) -> None:
    lease = trace.family("b_lease_static")
    lease_text = ("You explain residential lease terms to tenants of Oakrow Lettings.\n\n"
                  + rules(seed, lease.name, 1000, "Clauses") + "\n\n"
                  + rules(seed, lease.name, 1000, "Deposits and repairs"))
    simple(trace, seed, lease, n_lease, (2, 6), lambda rng: lease_text)
    haiku = trace.family("b_haiku_static")
    simple(trace, seed, haiku, n_haiku, (1, 1),
           lambda rng: "Answer every message with a haiku about farming. No other text.")


def campaign_seed(trace: Trace, seed: int, n: int, vp: ValuePools) -> None:
    fam = trace.family("b_campaign_seed")
    f_s = fam.field("campaign_seed", "other", "system")
    tail = rules(seed, fam.name, 600, "Table rules")

    def system(rng: Any) -> str:
        value = f"{vp.word()}-{vp.word()}-{rng.randint(10, 99)}"
        return (Msg().lit("# Game master\nCampaign seed: ").val(f_s, value)
                .lit("\nRun a light fantasy campaign for one player.\n\n" + tail).done())
    simple(trace, seed, fam, n, (3, 6), system)


def shift_clock(trace: Trace, seed: int, n: int, vp: ValuePools) -> None:
    fam = trace.family("b_shift_clock")
    f_t = fam.field("local_clock", "time", "system")
    f_m = fam.field("employee_email", "email", "system")

    def emp(i: int) -> dict[str, str]:
        g, s = vp.person()
        return {"mail": vp.email(g, s)}
    users = Users(rng_for(seed, GEN, fam.name, "users"), max(4, n // 4), emp)
    tail = rules(seed, fam.name, 700, "Rota policy")

    def system(rng: Any) -> str:
        clock = f"{rng.randint(6, 22):02d}:{rng.randint(0, 59):02d}"
        return (Msg().lit("Shift-swap helper for Meridian's contact centre.\nLocal clock: ")
                .val(f_t, clock).lit("\nEmployee: ").val(f_m, users.pick()["mail"])
                .lit("\n\n" + tail).done())
    simple(trace, seed, fam, n, (1, 2), system)


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def ledger_bearer(trace: Trace, seed: int, n: int) -> None:
    fam = trace.family("b_ledger_bearer")
    f_tok = fam.field("bearer_token", "secret", "system")
    tail = rules(seed, fam.name, 900, "Ledger lookups")
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())

    def system(rng: Any) -> str:
        claims = {"sub": digits(rng, 6), "scope": "ledger:read", "exp": 1772500000 + rng.randint(0, 9999)}
        token = f"{header}.{b64url(json.dumps(claims).encode())}.{b64url(rng.randbytes(32))}"
        return (Msg().lit("Internal ledger assistant.\nAuthorization for lookups: Bearer ")
                .val(f_tok, token).lit("\nNever print the token.\n\n" + tail).done())
    simple(trace, seed, fam, n, (1, 1), system)


WEIGHTS = {"claims": 2.4, "tutor": 1.6, "fitness": 1.7, "sql": 1.5, "home": 1.5, "news": 1.3,
           "depot": 1.1, "batch": 1.4, "grading": 1.3, "lease": 2.2, "haiku": 0.7,
           "campaign": 1.6, "shift": 1.2, "ledger": 0.9}


def generate(seed: int, n_requests: int, out: Path) -> Trace:
    c = dict(zip(WEIGHTS, split_counts(n_requests, list(WEIGHTS.values())), strict=True))
    trace = Trace(GEN, seed)
    vp = pools(seed)
    claims_caller(trace, seed, c["claims"], vp)
    tutor_ticket(trace, seed, c["tutor"])
    fitness_memory(trace, seed, c["fitness"])
    sql_fewshot(trace, seed, c["sql"])
    home_tools(trace, seed, c["home"])
    newsroom_date(trace, seed, c["news"])
    depot_lastline(trace, seed, c["depot"], vp)
    coop(trace, seed, c["batch"], c["grading"])
    statics(trace, seed, c["lease"], c["haiku"])
    campaign_seed(trace, seed, c["campaign"], vp)
    shift_clock(trace, seed, c["shift"], vp)
    ledger_bearer(trace, seed, c["ledger"])
    trace.families = [f for f in trace.families if f.count]
    trace.write(out)
    return trace


def main() -> None:
    a = parse_args(__doc__.splitlines()[0])
    generate(a.seed, a.requests, a.out)


if __name__ == "__main__":
    main()

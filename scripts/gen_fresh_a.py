"""Fresh trace generator A (issue 34): hospitality, logistics, banking, travel, pharmacy, rail.

``python scripts/gen_fresh_a.py --seed 101 --requests 3000 --out /tmp/fa101`` writes
``traces.jsonl`` (OpenAI chat-completions bodies with an ISO ``timestamp``), ``truth.json``
(families, the volatile fields injected into each, their values and the literal text around
them: ``scripts/fresh_common.py``) and ``chat_template.jinja``, a ChatML-like template that
writes a house system prompt with today's date (``strftime_now``) when a request has no system
message. The evaluation must audit with ``--chat-template <out>/chat_template.jinja``
(``truth.json`` ``audit_args``).

Fifteen families, 3,000 requests by default; prose is plain paragraphs, structure is one system
message (sometimes a long static reference in the first user turn), some families are
multi-turn conversations that resend their history. Families and what varies in each:

=====================  =====================================================================
a_hotel_guest          guest name + loyalty number in the system prompt's second sentence
a_parcel_case          a case number in the middle of the system prompt
a_bank_memory          "facts about this user": 3-6 remembered facts per user
a_triage_fewshot       4 of 12 worked examples, sampled and ordered per request
a_trip_tools           seven tools whose order changes per conversation
a_review_nosys         no system message: the chat template writes the date
a_pharmacy_lastline    a trace UUID on the last system line, then a ~2.5k-token formulary
a_rail_refunds         static; shares its first paragraph with a_rail_station
a_rail_station         the station (a made-up town) right after the shared paragraph
a_wifi_faq             static, multi-turn
a_menu_translate       static, short
a_release_codename     a product codename (adjective + creature)
a_ops_snapshot         a snapshot timestamp, multi-turn
a_crm_mailkey          a sender e-mail address and a live API key
a_quiz_word            tonight's hidden word (a pseudo-word), multi-turn
=====================  =====================================================================

Cost: linear in ``--requests``; 3,000 requests in about a second.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
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
    conversation_times,
    digits,
    drive,
    hex_string,
    parse_args,
    prose,
    rng_for,
    sample_shuffled,
    split_counts,
    uuid_string,
)

GEN = "gen_fresh_a"
MODEL = "house-llm-8b"
CHARS_PER_TOKEN = 4

HOUSE_DEFAULT = ("You are the house assistant. Be courteous, keep answers under two hundred words, "
                 "and say so plainly when a request is outside what you can do.")
CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}\n"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] }}\n"
    "{%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "{{- '<|im_start|>system\\nHouse profile. Current date: ' + strftime_now('%d %B %Y') + '.\\n"
    + HOUSE_DEFAULT + "' }}\n"
    "{%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- if tools -%}\n"
    "{{- '\\n\\nCallable functions, one JSON object per line:\\n' }}\n"
    "{%- for t in tools -%}{{- t | tojson }}{{- '\\n' }}{%- endfor -%}\n"
    "{%- endif -%}\n"
    "{{- '<|im_end|>\\n' }}\n"
    "{%- for m in loop_messages -%}\n"
    "{{- '<|im_start|>' + m['role'] + '\\n' + (m['content'] or '') + '<|im_end|>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' }}{%- endif -%}\n"
)

FRAMES = [
    "when a {who} asks about {topic}, {act} before offering {offer}",
    "never {bad} unless the {who} has {cond}",
    "if {topic} cannot be settled in one reply, {act} and note it for the {team}",
    "the {team} reviews every note about {topic} within {span}",
    "offer {offer} only after you {act}",
    "a {who} who mentions {topic} should hear about {offer} in plain words",
    "keep a calm tone; {act} even when the {who} is upset about {topic}",
    "do not promise {offer}; the {team} decides on it within {span}",
    "explain {topic} in at most three short sentences and then {act}",
    "the {team} prefers that you {act} rather than {bad}",
]
SLOTS: dict[str, list[str]] = {
    "who": ["guest", "caller", "customer", "traveller", "member", "visitor", "client"],
    "topic": ["late checkout", "lost luggage", "a billing dispute", "a damaged item",
              "a missed connection", "room upgrades", "deposit holds", "loyalty points",
              "delivery windows", "accessibility needs", "a refund request", "noise complaints"],
    "act": ["confirm the booking reference", "restate the request", "check the account notes",
            "ask one clarifying question", "summarise the options", "quote the relevant policy",
            "log the conversation", "verify the contact details"],
    "offer": ["a voucher", "a callback", "a partial refund", "priority handling",
              "a complimentary night", "free rebooking", "an escalation"],
    "bad": ["share internal notes", "guess at prices", "speculate about staff",
            "reveal other guests' details", "change a reservation silently"],
    "cond": ["confirmed their identity", "asked twice", "given written consent",
             "shown the original receipt"],
    "team": ["duty manager", "service desk", "claims team", "night audit", "revenue office"],
    "span": ["one working day", "two hours", "the same shift", "forty-eight hours"],
}
GIVEN = ["Amara", "Bjorn", "Chiara", "Dmitri", "Esme", "Farid", "Greta", "Hiroshi", "Ines",
         "Jonas", "Kavya", "Lucien", "Mireille", "Nikolai", "Oona", "Pedro", "Quentin", "Rosa",
         "Soren", "Talia", "Ulrich", "Vesna", "Wendell", "Ximena", "Yusuf", "Zofia", "Anselm",
         "Beatriz", "Cormac", "Dalia", "Emeka", "Fenna", "Gideon", "Halima", "Ivo", "Jurgita"]


def pools(seed: int) -> ValuePools:
    return ValuePools(
        rng_for(seed, GEN, "pools"), given=GIVEN,
        surname_roots=["hart", "velm", "ostr", "kall", "brenn", "dov", "marr", "tesl", "quin",
                       "sadd", "lind", "porv", "gram", "wick", "zeld", "fenn"],
        surname_tails=["ing", "sson", "ova", "etti", "ford", "mann", "ez", "ski", "ley", "aro"],
        place_heads=["brack", "ell", "thorn", "mar", "cal", "wend", "ost", "hal", "pell", "dun",
                     "ast", "rook", "sel", "var"],
        place_tails=["mouth", "haven", "by", "stead", "wick", "ton", "more", "field", "ness"],
        code_left=["Amber", "Silent", "Copper", "Lunar", "Brisk", "Hollow", "Crimson", "Velvet",
                   "Frosted", "Gilded", "Rapid", "Quiet"],
        code_right=["Heron", "Marten", "Gecko", "Lynx", "Osprey", "Narwhal", "Ibex", "Tapir",
                    "Kestrel", "Axolotl", "Pangolin", "Caracal"],
        syllables=["ka", "lo", "mi", "ren", "tu", "sa", "vel", "ori", "pan", "zu", "qen", "dro"],
        mail_domains=["harbourline.example", "mailbox.example", "post.example", "inbox.example"],
    )


def static(seed: int, fam: str, n_tokens: int) -> str:
    return prose(rng_for(seed, GEN, fam, "static"), FRAMES, SLOTS, n_tokens * CHARS_PER_TOKEN)


QUESTIONS = [
    "Can you help me with {topic}? It happened {when}.",
    "I need to sort out {topic} before {when}.",
    "What are my options for {topic}?",
    "Someone told me {topic} is handled by the {team}; is that right?",
    "Quick one about {topic}: can it wait until {when}?",
]
WHEN = ["yesterday evening", "this morning", "last Tuesday", "an hour ago", "at the weekend",
        "on my previous stay", "twice this month", "right after check-in"]


def question(rng: Any) -> str:
    q = rng.choice(QUESTIONS).format(topic=rng.choice(SLOTS["topic"]), when=rng.choice(WHEN),
                                     team=rng.choice(SLOTS["team"]))
    if rng.random() < 0.5:
        q += f" My reference is {rng.randint(100, 99999)}."
    return q


def reply(rng: Any) -> str:
    return (f"Thank you. I have {rng.choice(['noted', 'checked', 'looked at'])} "
            f"{rng.choice(SLOTS['topic'])}; {rng.choice(SLOTS['act'])} is the next step.")


def conversation(sys_text: str | None, rng: Any, turn: int, history: list[dict[str, str]]
                 ) -> list[dict[str, str]]:
    """Grow ``history`` to ``turn`` + 1 user turns and return the messages of that request."""
    while len(history) < 2 * turn + 1:
        if history and history[-1]["role"] == "user":
            history.append({"role": "assistant", "content": reply(rng)})
        else:
            history.append({"role": "user", "content": question(rng)})
    head = [{"role": "system", "content": sys_text}] if sys_text is not None else []
    return head + history[: 2 * turn + 1]


def build(trace: Trace, seed: int, fam: Family, n: int, turns: tuple[int, int],
          system: Any, extra: Any = None) -> None:
    """Requests of one family: ``system(rng, conv)`` gives the system text of a conversation
    (built once per conversation); ``extra(rng, conv)`` optional body keys."""
    rng = rng_for(seed, GEN, fam.name, "requests")

    def open_conv(conv: int) -> tuple[str | None, dict[str, Any], list[dict[str, str]]]:
        return system(rng, conv), extra(rng, conv) if extra else {}, []

    def request(state: tuple[str | None, dict[str, Any], list[dict[str, str]]], turn: int
                ) -> dict[str, Any]:
        sys_text, keys, history = state
        return chat(MODEL, conversation(sys_text, rng, turn, history), **keys)
    drive(trace, fam, rng, n, turns, open_conv, request)


def hotel_guest(trace: Trace, seed: int, n: int, vp: ValuePools) -> None:
    fam = trace.family("a_hotel_guest")
    f_name = fam.field("guest_name", "name", "system")
    f_id = fam.field("loyalty_number", "numeric_id", "system")

    def user(i: int) -> dict[str, Any]:
        g, s = vp.person()
        return {"name": f"{g} {s}", "id": digits(vp.rng, 8)}
    users = Users(rng_for(seed, GEN, fam.name, "users"), max(4, n // 4), user)
    body = static(seed, fam.name, 1800)

    def system(rng: Any, conv: int) -> str:
        u = users.pick()
        return (Msg().lit("You are the front-desk assistant of Harbourline Hotels. This session "
                          "belongs to ").val(f_name, u["name"]).lit(", loyalty number ")
                .val(f_id, u["id"]).lit(". Greet them by first name once.\n\n" + body).done())
    build(trace, seed, fam, n, (1, 3), system)


def parcel_case(trace: Trace, seed: int, n: int) -> None:
    fam = trace.family("a_parcel_case")
    f_case = fam.field("case_number", "numeric_id", "system")
    head = static(seed, fam.name + "/head", 350)
    tail = static(seed, fam.name + "/tail", 1000)

    def system(rng: Any, conv: int) -> str:
        case = f"{digits(rng, 4)}-{digits(rng, 5)}"
        return (Msg().lit("You help depot staff at Parcelway Logistics resolve delivery exceptions."
                          "\n\n" + head + "\n\nThe parcel under review is filed as case ")
                .val(f_case, case).lit(" and was opened by the depot team.\n\n" + tail).done())
    build(trace, seed, fam, n, (1, 1), system)


FACT_FRAMES = ["prefers {p}", "has a {acct} account opened in {year}", "travels to {place} often",
               "asked about {topic} last month", "wants statements by {chan}",
               "is saving for {goal}", "was charged a fee for {topic} in {year}"]


def bank_memory(trace: Trace, seed: int, n: int, vp: ValuePools) -> None:
    fam = trace.family("a_bank_memory")
    f_mem = fam.field("user_facts", "sampled_block", "system", also_ok=["reordered_block", "other"])
    frng = rng_for(seed, GEN, fam.name, "facts")
    slots = {"p": ["phone calls", "short answers", "Spanish", "large print", "mornings"],
             "acct": ["joint", "savings", "student", "business", "pension"],
             "year": [str(y) for y in range(2009, 2026)], "place": [vp.place() for _ in range(12)],
             "topic": ["overdrafts", "card limits", "foreign transfers", "mortgage rates"],
             "chan": ["post", "e-mail", "the app"], "goal": ["a car", "a deposit", "tuition"]}

    def user(i: int) -> dict[str, Any]:
        k = frng.randint(3, 6)
        facts = {frng.choice(FACT_FRAMES).format_map({s: frng.choice(v) for s, v in slots.items()})
                 for _ in range(k)}
        return {"facts": [f"- The user {f}." for f in sorted(facts)]}
    users = Users(rng_for(seed, GEN, fam.name, "users"), max(4, n // 3), user)
    head = static(seed, fam.name + "/head", 200)
    tail = static(seed, fam.name + "/tail", 800)

    def system(rng: Any, conv: int) -> str:
        u = users.pick()
        return (Msg().lit("You are Larchmont Bank's personal banking helper.\n\n" + head +
                          "\n\nFacts about this user (from earlier sessions):\n")
                .block(f_mem, u["facts"], "\n").lit("\n\nUse these facts only when relevant.\n\n"
                                                    + tail).done())
    build(trace, seed, fam, n, (1, 2), system)


def triage_fewshot(trace: Trace, seed: int, n: int) -> None:
    fam = trace.family("a_triage_fewshot")
    f_ex = fam.field("worked_examples", "sampled_block", "system", also_ok=["reordered_block"])
    erng = rng_for(seed, GEN, fam.name, "examples")
    labels = ["billing", "damage", "delay", "account", "praise", "other"]
    pool = [f"Message: \"{question(erng)}\"\nLabel: {labels[i % len(labels)]}" for i in range(12)]
    tail = static(seed, fam.name + "/tail", 450)

    def system(rng: Any, conv: int) -> str:
        return (Msg().lit("Sort each incoming customer message into one label: "
                          + ", ".join(labels) + ".\n\nWorked examples:\n\n")
                .block(f_ex, sample_shuffled(rng, pool, 4), "\n\n")
                .lit("\n\nLabelling notes:\n" + tail).done())
    build(trace, seed, fam, n, (1, 1), system)


TRIP_TOOLS = [
    ("search_trains", "Find train connections between two stations on a date."),
    ("search_flights", "Find flights between two airports on a date."),
    ("hold_seat", "Hold a seat for fifteen minutes without charging."),
    ("quote_fare", "Return the fare for a held seat, with taxes."),
    ("issue_ticket", "Issue the ticket and charge the stored card."),
    ("cancel_hold", "Release a held seat."),
    ("traveller_profile", "Read the traveller's saved preferences."),
]


def trip_tools(trace: Trace, seed: int, n: int) -> None:
    fam = trace.family("a_trip_tools")
    f_tools = fam.field("tool_order", "reordered_block", "tools")
    tools: list[dict[str, Any]] = [{"type": "function", "function": {
        "name": name, "description": desc,
        "parameters": {"type": "object", "properties": {
            "reference": {"type": "string", "description": "booking or search reference"},
            "date": {"type": "string", "description": "travel date, YYYY-MM-DD"}},
            "required": ["reference"]}}} for name, desc in TRIP_TOOLS]
    body = static(seed, fam.name, 500)
    sys_text = "You are a trip-planning agent for Wayfarer Travel. Call tools, never invent fares.\n\n" + body

    def extra(rng: Any, conv: int) -> dict[str, Any]:
        order = sample_shuffled(rng, tools, len(tools))
        f_tools.note([t["function"]["name"] for t in order])
        return {"tools": order}
    build(trace, seed, fam, n, (1, 3), lambda rng, conv: sys_text, extra)


def review_nosys(trace: Trace, seed: int, n: int) -> Family:
    """No system message: chat_template.jinja writes the date; values recorded after stamping."""
    fam = trace.family("a_review_nosys")
    fam.field("template_date", "date", "template")
    guide = ("Rewrite the guest review below in the Harbourline house style. Style guide:\n\n"
             + prose(rng_for(seed, GEN, fam.name, "guide"), FRAMES, SLOTS, 1200 * CHARS_PER_TOKEN,
                     numbered="{n}. "))
    rng = rng_for(seed, GEN, fam.name, "requests")
    for _conv, _turn, when in conversation_times(rng, n, (1, 1)):
        fam.conversations += 1
        review = f"{question(rng)} {reply(rng)} Stars: {rng.randint(1, 5)}."
        trace.add(fam, chat(MODEL, [{"role": "user", "content": guide + "\n\nReview:\n" + review}]),
                  when)
    return fam


def pharmacy_lastline(trace: Trace, seed: int, n: int) -> None:
    fam = trace.family("a_pharmacy_lastline")
    f_trace = fam.field("dispatch_trace", "uuid", "system")
    formulary = ("Formulary and refill rules (reference):\n\n"
                 + static(seed, fam.name + "/formulary", 2500))

    def system(rng: Any, conv: int) -> str:
        return (Msg().lit("Refill desk assistant for Brightwell Pharmacies.\n"
                          "Answer with the dose schedule first.\n"
                          "Never confirm stock you cannot see.\nDispatch trace: ")
                .val(f_trace, uuid_string(rng)).done())
    rng = rng_for(seed, GEN, fam.name, "requests")
    for _conv, _turn, when in conversation_times(rng, n, (1, 1)):
        fam.conversations += 1
        msgs = [{"role": "system", "content": system(rng, 0)},
                {"role": "user", "content": formulary + "\n\nPatient question: " + question(rng)}]
        trace.add(fam, chat(MODEL, msgs), when)


def rail(trace: Trace, seed: int, n_refunds: int, n_station: int, vp: ValuePools) -> None:
    shared = ("Coastline Rail customer assistant. Coastline Rail runs regional and night services "
              "along the western shore. Speak for the company, be brief, and point to the "
              "published conditions of carriage when a rule applies.\n\n"
              + static(seed, "a_rail/shared", 150))
    refunds = trace.family("a_rail_refunds")
    r_text = shared + "\n\nThis desk handles refunds and delay repay.\n\n" + static(
        seed, "a_rail_refunds", 700)
    build(trace, seed, refunds, n_refunds, (1, 2), lambda rng, conv: r_text)

    station = trace.family("a_rail_station")
    f_city = station.field("station_town", "other", "system")
    towns = vp.distinct(vp.place, 25)
    s_tail = static(seed, "a_rail_station", 650)

    def system(rng: Any, conv: int) -> str:
        return (Msg().lit(shared + "\n\nYou are posted at the ").val(f_city, rng.choice(towns))
                .lit(" station desk; answer platform and timetable questions.\n\n" + s_tail).done())
    build(trace, seed, station, n_station, (1, 2), system)


def static_families(trace: Trace, seed: int, n_faq: int, n_menu: int) -> None:
    faq = trace.family("a_wifi_faq")
    faq_text = ("Harbourline guest Wi-Fi help. Walk the guest through one step at a time.\n\n"
                + static(seed, faq.name, 1000))
    build(trace, seed, faq, n_faq, (2, 5), lambda rng, conv: faq_text)
    menu = trace.family("a_menu_translate")
    menu_text = ("Translate restaurant menu items into English. Keep dish names in the original "
                 "language in brackets, and flag allergens with an asterisk.")
    build(trace, seed, menu, n_menu, (1, 1), lambda rng, conv: menu_text)


def release_codename(trace: Trace, seed: int, n: int, vp: ValuePools) -> None:
    fam = trace.family("a_release_codename")
    f_code = fam.field("build_codename", "other", "system")
    names = vp.distinct(vp.codename, 30)
    tail = static(seed, fam.name, 900)

    def system(rng: Any, conv: int) -> str:
        return (Msg().lit("You draft release notes for the Harbourline booking app.\nBuild codename: ")
                .val(f_code, rng.choice(names)).lit("\nWrite for front-desk staff, not engineers.\n\n"
                                                    + tail).done())
    build(trace, seed, fam, n, (1, 1), system)


def ops_snapshot(trace: Trace, seed: int, n: int) -> None:
    fam = trace.family("a_ops_snapshot")
    f_ts = fam.field("snapshot_time", "timestamp", "system")
    tail = static(seed, fam.name, 1200)

    def system(rng: Any, conv: int) -> str:
        t = EPOCH.timestamp() + rng.randint(0, 5 * 86400)
        stamp = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")
        return (Msg().lit("Incident helper for the booking platform on-call rota. Metrics snapshot "
                          "taken at ").val(f_ts, stamp).lit(" UTC.\n\n" + tail).done())
    build(trace, seed, fam, n, (2, 4), system)


def crm_mailkey(trace: Trace, seed: int, n: int, vp: ValuePools) -> None:
    fam = trace.family("a_crm_mailkey")
    f_mail = fam.field("sender_address", "email", "system")
    f_key = fam.field("mail_api_key", "secret", "system")

    def user(i: int) -> dict[str, Any]:
        g, s = vp.person()
        return {"mail": vp.email(g, s), "key": "sk_live_" + hex_string(vp.rng, 32)}
    users = Users(rng_for(seed, GEN, fam.name, "users"), max(4, n // 5), user)
    tail = static(seed, fam.name, 700)

    def system(rng: Any, conv: int) -> str:
        u = users.pick()
        return (Msg().lit("You write follow-up e-mails for Harbourline's sales team. Replies go out "
                          "from ").val(f_mail, u["mail"]).lit(".\nMail API key: ").val(f_key, u["key"])
                .lit("\n\n" + tail).done())
    build(trace, seed, fam, n, (1, 1), system)


def quiz_word(trace: Trace, seed: int, n: int, vp: ValuePools) -> None:
    fam = trace.family("a_quiz_word")
    f_word = fam.field("hidden_word", "other", "system")
    words = vp.distinct(vp.word, 40)
    tail = static(seed, fam.name, 400)

    def system(rng: Any, conv: int) -> str:
        return (Msg().lit("You host the hotel bar's quiz night. Tonight's hidden word is ")
                .val(f_word, rng.choice(words)).lit("; never say it before the final round.\n\n"
                                                   + tail).done())
    build(trace, seed, fam, n, (2, 4), system)


WEIGHTS = {"hotel": 2.6, "parcel": 1.6, "bank": 1.8, "triage": 1.4, "trip": 1.7, "review": 1.3,
           "pharmacy": 1.0, "refunds": 1.2, "station": 1.3, "faq": 2.0, "menu": 0.8,
           "release": 0.9, "ops": 1.5, "crm": 1.0, "quiz": 1.2}


def generate(seed: int, n_requests: int, out: Path) -> Trace:
    counts = dict(zip(WEIGHTS, split_counts(n_requests, list(WEIGHTS.values())), strict=True))
    trace = Trace(GEN, seed)
    vp = pools(seed)
    hotel_guest(trace, seed, counts["hotel"], vp)
    parcel_case(trace, seed, counts["parcel"])
    bank_memory(trace, seed, counts["bank"], vp)
    triage_fewshot(trace, seed, counts["triage"])
    trip_tools(trace, seed, counts["trip"])
    review = review_nosys(trace, seed, counts["review"])
    pharmacy_lastline(trace, seed, counts["pharmacy"])
    rail(trace, seed, counts["refunds"], counts["station"], vp)
    static_families(trace, seed, counts["faq"], counts["menu"])
    release_codename(trace, seed, counts["release"], vp)
    ops_snapshot(trace, seed, counts["ops"])
    crm_mailkey(trace, seed, counts["crm"], vp)
    quiz_word(trace, seed, counts["quiz"], vp)
    trace.families = [f for f in trace.families if f.count]
    f_date = review.fields[0]
    for req, t in trace.stamp(EPOCH, days=5):
        if req.family == review.name:
            f_date.note(t.strftime("%d %B %Y"), before="House profile. Current date: ",
                        after=".\n" + HOUSE_DEFAULT[:40])
    template = out / "chat_template.jinja"
    out.mkdir(parents=True, exist_ok=True)
    template.write_text(CHAT_TEMPLATE, encoding="utf-8")
    trace.write(out, ["--chat-template", str(template.resolve())])
    return trace


def main() -> None:
    a = parse_args(__doc__.splitlines()[0])
    generate(a.seed, a.requests, a.out)


if __name__ == "__main__":
    main()

"""Fresh trace generator C (issue 34), held out: utilities, clinics, libraries, aviation, councils.

``python scripts/gen_fresh_c.py --seed 101 --requests 3000 --out /tmp/fc101`` writes
``traces.jsonl`` (bodies with ``created_at`` in epoch milliseconds), ``truth.json`` (format:
``scripts/fresh_common.py``) and ``chat_template.jinja``, a header-style template (not ChatML)
that writes today's date into the system header of every request that carries ``tools``. The
evaluation passes ``--chat-template <out>/chat_template.jinja`` (``truth.json`` ``audit_args``).

Kept for a final check: the auditor is not developed against this generator. Prompts are
"key: value" headers followed by numbered paragraphs ("§ n"); fourteen families:

=====================  =====================================================================
c_utility_account      customer name + account number in the second sentence
c_vet_workorder        a work-order number in the middle of the prompt
c_library_patron       remembered reading preferences of the patron
c_museum_fewshot       2 of 8 JSON-line label examples, sampled and ordered per request
c_hangar_tools         tools in varying order, and the template's date (tools present)
c_permit_lastline      the clerk on duty (a name) on the last system line, then ~2k tokens of
                       by-laws at the start of the user message
c_telecom_outage       an outage time after the paragraph it shares with c_telecom_billing
c_telecom_billing      static
c_recipe_static        static, conversations
c_courier_static       static, short
c_film_reel            a reel codename and a 40-hex checksum
c_dental_visit         the visit date (ISO), written by the application
c_recycling_word       the pickup zone's pass-word (a pseudo-word), conversations
c_cloud_key            an access-key-shaped secret
=====================  =====================================================================

Cost: linear in ``--requests``; 3,000 requests in about a second.
"""

from __future__ import annotations

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

GEN = "gen_fresh_c"
MODEL = "llama-3.1-8b-instruct"
CHARS_PER_TOKEN = 4
DATE_BEFORE = "Knowledge cutoff: 2024-06\nToday: "
DATE_AFTER = "\n\nTools you may call (JSON, one per line):\n"

CHAT_TEMPLATE = (
    "{%- for m in messages -%}\n"
    "{%- if loop.first and m['role'] == 'system' -%}\n"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}\n"
    "{%- if tools -%}\n"
    "{{- '" + DATE_BEFORE.replace("\n", "\\n") + "' + strftime_now('%Y-%m-%d') + '"
    + DATE_AFTER.replace("\n", "\\n") + "' }}\n"
    "{%- for t in tools -%}{{- t | tojson }}{{- '\\n' }}{%- endfor -%}\n"
    "{{- '\\n' }}\n"
    "{%- endif -%}\n"
    "{{- m['content'] + '<|eot_id|>' }}\n"
    "{%- else -%}\n"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + (m['content'] or '')"
    " + '<|eot_id|>' }}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif -%}\n"
)

FRAMES = [
    "staff {must} {task} whenever {case}",
    "where {case}, the {office} {must} be told the same day",
    "a {party} is entitled to {right} once {case}",
    "{task} is recorded in the {log} with the time and the officer's initials",
    "no {party} may be refused {right} because {case}",
    "the {office} may waive {task} where {case}",
    "unless {case}, {task} happens before any {right} is offered",
    "every {party} receives a copy of the {log} entry on request",
]
SLOTS: dict[str, list[str]] = {
    "must": ["must", "should", "shall"],
    "task": ["a meter reading", "a second signature", "an identity check", "a site visit",
             "a written notice", "a fee estimate", "a safety inspection", "a record search"],
    "case": ["the account is in arrears", "the request arrives after hours",
             "a neighbour objects", "the animal is under sedation", "the reel is brittle",
             "the parts are on back-order", "the patron is under sixteen",
             "the appliance was installed before 2010"],
    "office": ["records office", "duty engineer", "practice manager", "licensing panel",
               "archive custodian", "billing unit"],
    "party": ["resident", "applicant", "owner", "patron", "operator", "account holder"],
    "right": ["a payment plan", "an appeal", "a second opinion", "a reading-room slot",
              "a refund of the fee", "priority scheduling"],
    "log": ["day book", "case file", "service ledger", "incident register"],
}
GIVEN = ["Agnieszka", "Benedikt", "Carmela", "Dorian", "Efua", "Frode", "Giedre", "Hassan",
         "Isolde", "Jarrah", "Kasimir", "Leilani", "Matthias", "Noor", "Octavia", "Pavel",
         "Radhika", "Sigrun", "Tobiah", "Ugne", "Vikram", "Wanjiru", "Xavier", "Yelena"]


def pools(seed: int) -> ValuePools:
    return ValuePools(
        rng_for(seed, GEN, "pools"), given=GIVEN,
        surname_roots=["ambr", "corv", "dell", "ferr", "gald", "holt", "jast", "kemp", "lorr",
                       "morv", "nedd", "pask"],
        surname_tails=["owski", "ard", "inen", "elli", "sen", "ho", "uk", "aby", "ingham"],
        place_heads=["brae", "coll", "dern", "fal", "hurst", "lang", "mire", "quar", "tolv"],
        place_tails=["ington", "ey", "wold", "port", "cross", "heath"],
        code_left=["Midnight", "Glass", "Northern", "Paper", "Winter", "Scarlet", "Tidal"],
        code_right=["Lantern", "Orchard", "Harbour", "Meridian", "Cascade", "Quarry", "Atlas"],
        syllables=["bor", "ea", "fin", "go", "hul", "ix", "ja", "mor", "ne", "ost", "ru"],
        mail_domains=["voltline.example", "council.example"],
    )


def sections(seed: int, fam: str, n_tokens: int, start: int = 1) -> str:
    body = prose(rng_for(seed, GEN, fam, "sections"), FRAMES, SLOTS, n_tokens * CHARS_PER_TOKEN,
                 numbered="§ {n} ", per_paragraph=(2, 5))
    return body


def header(**kv: str) -> str:
    return "\n".join(f"{k.replace('_', '-')}: {v}" for k, v in kv.items()) + "\n\n"


def user_text(rng: Any) -> str:
    return rng.choice([
        f"Is {rng.choice(SLOTS['task'])} needed if {rng.choice(SLOTS['case'])}?",
        f"please explain {rng.choice(SLOTS['right'])} to me",
        f"Who do I contact about {rng.choice(SLOTS['task'])}? (case {rng.randint(1, 999)})",
        f"My {rng.choice(SLOTS['log'])} entry looks wrong.",
    ])


def bot_text(rng: Any) -> str:
    return f"Noted. The {rng.choice(SLOTS['office'])} handles that; {rng.choice(SLOTS['task'])} comes first."


def family_requests(trace: Trace, seed: int, fam: Family, n: int, turns: tuple[int, int],
                    system: Any, tools: Any = None, first_user: str = "") -> None:
    rng = rng_for(seed, GEN, fam.name, "requests")

    def open_conv(conv: int) -> tuple[str, Any, list[dict[str, str]]]:
        return system(rng), tools(rng) if tools else None, []

    def request(state: tuple[str, Any, list[dict[str, str]]], turn: int) -> dict[str, Any]:
        sys_text, tool_list, hist = state
        while len(hist) < 2 * turn + 1:
            if hist and hist[-1]["role"] == "user":
                hist.append({"role": "assistant", "content": bot_text(rng)})
            else:
                prefix = first_user if not hist else ""
                hist.append({"role": "user", "content": prefix + user_text(rng)})
        msgs = [{"role": "system", "content": sys_text}, *hist[: 2 * turn + 1]]
        return chat(MODEL, msgs, **({"tools": tool_list} if tool_list else {}))
    drive(trace, fam, rng, n, turns, open_conv, request)


def utility_account(trace: Trace, seed: int, n: int, vp: ValuePools) -> None:
    fam = trace.family("c_utility_account")
    f_name = fam.field("holder_name", "name", "system")
    f_acct = fam.field("account_number", "numeric_id", "system")

    def holder(i: int) -> dict[str, str]:
        g, s = vp.person()
        return {"name": f"{s}, {g}", "acct": digits(vp.rng, 10)}
    users = Users(rng_for(seed, GEN, fam.name, "users"), max(4, n // 4), holder)
    body = sections(seed, fam.name, 1500)

    def system(rng: Any) -> str:
        u = users.pick()
        return (Msg().lit("Voltline Energy billing assistant for the western network. Customer on "
                          "file: ").val(f_name, u["name"]).lit("; account no. ").val(f_acct, u["acct"])
                .lit(" (verified at login).\n\n" + body).done())
    family_requests(trace, seed, fam, n, (1, 3), system)


def vet_workorder(trace: Trace, seed: int, n: int) -> None:
    fam = trace.family("c_vet_workorder")
    f_wo = fam.field("work_order", "numeric_id", "system")
    top = sections(seed, fam.name + "/top", 300)
    rest = sections(seed, fam.name + "/rest", 900)

    def system(rng: Any) -> str:
        return (Msg().lit(header(service="Fernhill Veterinary", channel="front desk") + top
                          + "\n\nThis conversation concerns work order ")
                .val(f_wo, "00" + digits(rng, 6)).lit(", raised by the duty nurse.\n\n" + rest)
                .done())
    family_requests(trace, seed, fam, n, (1, 2), system)


def library_patron(trace: Trace, seed: int, n: int) -> None:
    fam = trace.family("c_library_patron")
    f_p = fam.field("patron_profile", "sampled_block", "system", also_ok=["reordered_block", "other"])
    prng = rng_for(seed, GEN, fam.name, "profiles")
    genres = ["crime", "local history", "graphic novels", "poetry", "gardening", "sea stories",
              "chess", "cookery", "astronomy", "audio books", "large print", "Welsh"]

    def patron(i: int) -> dict[str, Any]:
        likes = prng.sample(genres, prng.randint(2, 4))
        lines = [f"likes {g}" for g in likes] + [f"{prng.randint(1, 40)} loans this year"]
        if prng.random() < 0.5:
            lines.append(f"has {prng.randint(1, 3)} overdue items")
        return {"lines": [f"  - {x}" for x in lines]}
    users = Users(rng_for(seed, GEN, fam.name, "users"), max(4, n // 3), patron)
    rest = sections(seed, fam.name, 800)

    def system(rng: Any) -> str:
        return (Msg().lit(header(service="Marlow Public Library", role="reader assistant")
                          + "Patron profile (remembered):\n").block(f_p, users.pick()["lines"], "\n")
                .lit("\n\n" + rest).done())
    family_requests(trace, seed, fam, n, (1, 2), system)


def museum_fewshot(trace: Trace, seed: int, n: int, vp: ValuePools) -> None:
    fam = trace.family("c_museum_fewshot")
    f_ex = fam.field("label_examples", "sampled_block", "system", also_ok=["reordered_block"])
    erng = rng_for(seed, GEN, fam.name, "examples")
    objects = ["bronze brooch", "tin toy tram", "whalebone comb", "glass float", "ration book",
               "wax cylinder", "cast-iron kettle", "silk sampler"]
    pool = [f'{{"object": "{o}", "label": "A {o} found near {vp.place()}, about '
            f'{erng.randint(60, 900)} years old."}}' for o in objects]
    rest = sections(seed, fam.name, 600)

    def system(rng: Any) -> str:
        return (Msg().lit("Write gallery labels for the Tollcross Museum in forty words or fewer.\n"
                          "Examples, one JSON object per line:\n")
                .block(f_ex, sample_shuffled(rng, pool, 2), "\n").lit("\n\n" + rest).done())
    family_requests(trace, seed, fam, n, (1, 1), system)


HANGAR_TOOLS = ["open_work_card", "close_work_card", "lookup_part", "order_part",
                "read_logbook", "schedule_check", "sign_off"]


def hangar_tools(trace: Trace, seed: int, n: int) -> Family:
    fam = trace.family("c_hangar_tools")
    f_order = fam.field("tool_order", "reordered_block", "tools")
    fam.field("template_date", "date", "template")      # values recorded after stamping
    defs: list[dict[str, Any]] = [{"type": "function", "function": {
        "name": t, "description": f"Maintenance system call: {t.replace('_', ' ')}.",
        "parameters": {"type": "object", "properties": {"tail_number": {"type": "string"},
                                                         "ata_chapter": {"type": "integer"}},
                       "required": ["tail_number"]}}} for t in HANGAR_TOOLS]
    sys_text = header(service="Skyreach Line Maintenance", role="hangar agent") + sections(
        seed, fam.name, 700)

    def tools(rng: Any) -> list[dict[str, Any]]:
        order = sample_shuffled(rng, defs, len(defs))
        f_order.note([d["function"]["name"] for d in order])
        return order
    family_requests(trace, seed, fam, n, (1, 3), lambda rng: sys_text, tools)
    return fam


def permit_lastline(trace: Trace, seed: int, n: int, vp: ValuePools) -> None:
    fam = trace.family("c_permit_lastline")
    f_clerk = fam.field("clerk_on_duty", "name", "system")
    clerks = [" ".join(vp.person()) for _ in range(9)]
    bylaws = "By-laws of the Harrowgate district council (extract):\n\n" + sections(
        seed, fam.name, 2000) + "\n\nApplicant's message: "

    def system(rng: Any) -> str:
        return (Msg().lit(header(service="Harrowgate permits desk") + "Answer in plain English.\n"
                          "Quote the by-law number you rely on.\nClerk on duty: ")
                .val(f_clerk, rng.choice(clerks)).done())
    family_requests(trace, seed, fam, n, (1, 1), system, first_user=bylaws)


def telecom(trace: Trace, seed: int, n_outage: int, n_billing: int) -> None:
    shared = ("Linkmere Telecom support. Linkmere sells broadband and mobile plans in the "
              "northern valleys; its support staff answer in the customer's language and never "
              "sell on a support call.")
    outage = trace.family("c_telecom_outage")
    f_t = outage.field("outage_opened", "time", "system")
    o_rest = sections(seed, outage.name, 700)

    def o_system(rng: Any) -> str:
        return (Msg().lit(shared + "\n\nOutage ticket opened at ")
                .val(f_t, f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}")
                .lit(" local time; affected exchange unknown.\n\n" + o_rest).done())
    family_requests(trace, seed, outage, n_outage, (1, 3), o_system)
    billing = trace.family("c_telecom_billing")
    b_text = shared + "\n\n" + sections(seed, billing.name, 800)
    family_requests(trace, seed, billing, n_billing, (1, 2), lambda rng: b_text)


def statics(trace: Trace, seed: int, n_recipe: int, n_courier: int) -> None:
    recipe = trace.family("c_recipe_static")
    text = header(service="Saltmarsh Kitchen", role="recipe helper") + sections(seed, recipe.name, 1300)
    family_requests(trace, seed, recipe, n_recipe, (2, 5), lambda rng: text)
    courier = trace.family("c_courier_static")
    family_requests(trace, seed, courier, n_courier, (1, 1),
                    lambda rng: "Reply to bike couriers in one line, with the drop-off address first.")


def film_reel(trace: Trace, seed: int, n: int, vp: ValuePools) -> None:
    fam = trace.family("c_film_reel")
    f_code = fam.field("reel_codename", "other", "system")
    f_sum = fam.field("reel_checksum", "hex_id", "system")
    reels = [(vp.codename(), hex_string(vp.rng, 40)) for _ in range(35)]
    rest = sections(seed, fam.name, 1000)

    def system(rng: Any) -> str:
        code, checksum = rng.choice(reels)
        return (Msg().lit(header(service="Eastgate Film Archive") + "Reel: ").val(f_code, code)
                .lit("\nChecksum: ").val(f_sum, checksum).lit("\n\n" + rest).done())
    family_requests(trace, seed, fam, n, (1, 2), system)


def dental_visit(trace: Trace, seed: int, n: int) -> None:
    fam = trace.family("c_dental_visit")
    f_d = fam.field("visit_date", "date", "system")
    rest = sections(seed, fam.name, 900)

    def system(rng: Any) -> str:
        day = (EPOCH + timedelta(days=rng.randint(0, 20))).strftime("%Y-%m-%d")
        return (Msg().lit(header(service="Brightsmile Dental", role="recall assistant")
                          + "Visit on ").val(f_d, day).lit("; confirm or move it.\n\n" + rest).done())
    family_requests(trace, seed, fam, n, (1, 1), system)


def recycling_word(trace: Trace, seed: int, n: int, vp: ValuePools) -> None:
    fam = trace.family("c_recycling_word")
    f_w = fam.field("zone_password", "other", "system")
    words = vp.distinct(vp.word, 30)
    rest = sections(seed, fam.name, 500)

    def system(rng: Any) -> str:
        return (Msg().lit("Kerbside recycling helper.\nPickup zone pass-word: ")
                .val(f_w, rng.choice(words)).lit("\nAsk for it before changing a collection.\n\n"
                                                 + rest).done())
    family_requests(trace, seed, fam, n, (2, 4), system)


def cloud_key(trace: Trace, seed: int, n: int) -> None:
    fam = trace.family("c_cloud_key")
    f_k = fam.field("access_key", "secret", "system")
    rest = sections(seed, fam.name, 800)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"

    def system(rng: Any) -> str:
        key = "AKIA" + "".join(rng.choice(alphabet) for _ in range(16))
        return (Msg().lit("Storage bucket helper for the council's records team.\naccess_key_id=")
                .val(f_k, key).lit("\nregion=north-1\n\n" + rest).done())
    family_requests(trace, seed, fam, n, (1, 1), system)


WEIGHTS = {"utility": 2.5, "vet": 1.5, "library": 1.6, "museum": 1.3, "hangar": 1.8,
           "permit": 1.1, "outage": 1.3, "billing": 1.2, "recipe": 2.0, "courier": 0.7,
           "film": 1.1, "dental": 1.2, "recycling": 1.4, "cloud": 0.9}


def generate(seed: int, n_requests: int, out: Path) -> Trace:
    c = dict(zip(WEIGHTS, split_counts(n_requests, list(WEIGHTS.values())), strict=True))
    trace = Trace(GEN, seed)
    vp = pools(seed)
    utility_account(trace, seed, c["utility"], vp)
    vet_workorder(trace, seed, c["vet"])
    library_patron(trace, seed, c["library"])
    museum_fewshot(trace, seed, c["museum"], vp)
    hangar = hangar_tools(trace, seed, c["hangar"])
    permit_lastline(trace, seed, c["permit"], vp)
    telecom(trace, seed, c["outage"], c["billing"])
    statics(trace, seed, c["recipe"], c["courier"])
    film_reel(trace, seed, c["film"], vp)
    dental_visit(trace, seed, c["dental"])
    recycling_word(trace, seed, c["recycling"], vp)
    cloud_key(trace, seed, c["cloud"])
    trace.families = [f for f in trace.families if f.count]
    f_date = hangar.fields[1]
    for req, t in trace.stamp(EPOCH, days=6, key="created_at", epoch_ms=True):
        if req.family == hangar.name:
            f_date.note(t.strftime("%Y-%m-%d"), before=DATE_BEFORE, after=DATE_AFTER)
    out.mkdir(parents=True, exist_ok=True)
    template = out / "chat_template.jinja"
    template.write_text(CHAT_TEMPLATE, encoding="utf-8")
    trace.write(out, ["--chat-template", str(template.resolve())])
    return trace


def main() -> None:
    a = parse_args(__doc__.splitlines()[0])
    generate(a.seed, a.requests, a.out)


if __name__ == "__main__":
    main()

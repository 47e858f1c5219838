"""The detectors as data: a stable name, a kind, compiled patterns and an optional validity check.

Each `Detector` names the pattern family that caught a value (`Match.detector`). A pattern may
carry a named group `v`: the value is that group and the rest of the match is context.
`anchor` detectors (a lone weekday, `7 PM`, `3:16`) never stand alone: scan keeps them only
when they merge with an adjacent date or time. `priority` breaks ties between equally long
overlapping candidates (lower wins), so the most specific detector names the value.

Speed rules (the router runs these on every request): every pattern starts with a literal or a
character class, never with a look-behind, an optional group or a case-insensitive group, so
`re` skips to the few positions where a match can start instead of trying every position. The
left boundary a look-behind would express is `reject_after` (a one-character class tested on the
character before the value, in Python), and cues that precede a value ("knowledge cutoff:",
"order #") are checked by the validator on the left context. Two cheap gates skip a detector
on a region that cannot hold its values: `gate` (one of these substrings must occur) and
`min_run` (the longest ASCII digit run of any value is at least this long; see regions.py); a
`token` detector's values are long tokens holding a digit (regions.py's long-token seeds), so
it only runs in windows that hold such a token.
Patterns have no nested unbounded repeats: each pass is linear.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from . import heuristics as h
from .kinds import CURRENT_YEAR, KNOWLEDGE_CUTOFF, Kind

Validator = Callable[[re.Match[str], str], bool]


@dataclass(frozen=True)
class Detector:
    """One named family of patterns for one kind (see the module docstring for the fields'
    roles: `validate`, `reject_after`, `anchor`, `priority`, `gate`, `min_run`, `token`)."""

    name: str
    kind: Kind
    patterns: tuple[re.Pattern[str], ...]
    validate: Validator | None = None
    reject_after: re.Pattern[str] | None = None
    anchor: bool = False
    priority: int = 50
    gate: tuple[str, ...] = ()
    min_run: int = 1
    token: bool = False


def _c(*sources: str) -> tuple[re.Pattern[str], ...]:
    # ASCII: `\d` is 0-9 like the digit seeds of regions.py, `\w` is [A-Za-z0-9_]
    return tuple(re.compile(s, re.ASCII) for s in sources)


# --- building blocks -------------------------------------------------------------------------
WORD = re.compile(r"[A-Za-z0-9_]")
WORD_OR = {
    chars: re.compile(rf"[A-Za-z0-9_{chars}]") for chars in (".:/-", ".:/+-", ".,$€£+-", "-", ".-")
}
# every alternative starts with a literal so the whole branch has a first-character set
MONTH = (
    r"(?:January|February|March|April|May|June|July|August|September|October|November|December"
    r"|Jan\.?|Feb\.?|Mar\.?|Apr\.?|Jun\.?|Jul\.?|Aug\.?|Sept\.?|Sep\.?|Oct\.?|Nov\.?|Dec\.?)"
)
WEEKDAY = (
    r"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday"
    r"|Mon\.?|Tues\.?|Tue\.?|Wed\.?|Thurs\.?|Thur\.?|Thu\.?|Fri\.?|Sat\.?|Sun\.?)"
)
# Gates (substrings every match holds): the first letters of every alternative above.
MONTH_GATE = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
WEEKDAY_GATE = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
# German, French, Spanish, Italian, Portuguese and Dutch month and weekday names, either case
# of the first letter (German and Dutch capitalise them, the others do not).
_L10N_MONTHS = (
    "Januar Februar März Maerz April Mai Juni Juli August September Oktober November Dezember "
    "janvier février mars avril juin juillet août septembre octobre novembre décembre "
    "enero febrero marzo abril mayo junio julio agosto septiembre setiembre octubre noviembre "
    "diciembre gennaio febbraio aprile maggio giugno luglio settembre ottobre dicembre "
    "janeiro fevereiro março maio junho julho setembro outubro novembro dezembro "
    "januari februari maart mei augustus"
).split()
_L10N_WEEKDAYS = (
    "Montag Dienstag Mittwoch Donnerstag Freitag Samstag Sonnabend Sonntag "
    "lundi mardi mercredi jeudi vendredi samedi dimanche "
    "lunes martes miércoles jueves viernes sábado domingo "
    "lunedì martedì mercoledì giovedì venerdì sabato domenica "
    "segunda-feira terça-feira quarta-feira quinta-feira sexta-feira "
    "maandag dinsdag woensdag donderdag vrijdag zaterdag zondag"
).split()


def _either_case(words: list[str]) -> str:
    forms = {f(w[0]) + w[1:] for w in words for f in (str.lower, str.upper)}
    return "(?:" + "|".join(sorted(forms, key=lambda w: (-len(w), w))) + ")"


L10N_MONTH = _either_case(_L10N_MONTHS)
L10N_WEEKDAY = _either_case(_L10N_WEEKDAYS)
# Gates: a substring of every name above, past its first letter (its case varies).
L10N_MONTH_GATE = tuple(sorted({w[1:4] for w in _L10N_MONTHS}))
L10N_WEEKDAY_GATE = tuple(sorted({w[1:4] for w in _L10N_WEEKDAYS}))
YEAR = r"(?:19|20|21)\d\d(?!\d)"
DAY = r"(?P<d>\d\d?)(?:st|nd|rd|th)?"
_CJK_WEEKDAY = rf"(?:\s*[（(]?(?:星期|礼拜|周|週)[一二三四五六日天][)）]?|\s*\({WEEKDAY}\))?"
# Timezone suffixes seen in real prompts: Z, UTC/GMT(+offset), US/EU abbreviations, numeric
# offsets, IANA zone names, and JavaScript's `GMT+0000 (Coordinated Universal Time)`.
IANA = (
    r"(?:Africa|America|Antarctica|Asia|Atlantic|Australia|Europe|Indian|Pacific|Etc)"
    r"/[A-Za-z_]+(?:/[A-Za-z_]+)?"
)
TZ_ABBR = (
    r"(?:UTC|GMT|[ECMPA][SD]T|AK[SD]T|HST|CES?T|CEDT|BST|IST|JST|KST|AE[SD]T|WE[SD]?T|EE[SD]?T"
    r"|MSK|SGT|HKT|NZ[SD]T)"
)
TZ = (
    rf"(?:Z(?![A-Za-z])|\s?{TZ_ABBR}(?:\s?[+-]\d{{1,2}}(?::?\d\d)?)?(?![A-Za-z])"
    rf"(?:\s\([A-Z][A-Za-z ]{{2,40}}\))?|\s?[+-](?:0\d|1[0-4])(?::?\d\d)?(?![\d:])"
    rf"|\s\(?{IANA}\)?)"
)
AMPM = r"\s?[AaPp]\.?[Mm]\.?(?![A-Za-z])"
_SECONDS = r":[0-5]\d(?:[.,]\d{1,9})?"

# --- dates, times, timestamps ----------------------------------------------------------------
ISO_DATETIME = Detector(
    "iso_datetime",
    Kind.TIMESTAMP,
    _c(
        rf"(?P<y>(?:19|20|21)\d\d)-(?P<mo>[01]\d)-(?P<d>[0-3]\d)(?:T|\s)(?P<h>[01]\d|2[0-3])"
        rf":[0-5]\d(?:{_SECONDS})?(?![\d:])(?:{TZ})?"
    ),
    h.iso_date_ok,
    WORD_OR[".:/-"],
    priority=10,
    gate=(":",),
    min_run=4,
)
EPOCH = Detector(
    "epoch",
    Kind.TIMESTAMP,
    _c(r"1\d{9}(?:\d{3})?(?![\w+@]|[.,]\d)"),
    h.epoch_ok,
    WORD_OR[".,$€£+-"],
    priority=20,
    min_run=10,
)
ISO_DATE = Detector(
    "iso_date",
    Kind.DATE,
    _c(
        r"(?P<y>(?:19|20|21)\d\d)(?P<sep>[-/.])(?P<mo>[01]?\d)(?P=sep)(?P<d>[0-3]?\d)"
        rf"{_CJK_WEEKDAY}(?![\w/-]|\.\d)"
    ),
    h.iso_date_ok,
    WORD_OR[".:/-"],
    priority=20,
    gate=("-", "/", "."),
    min_run=4,
)
NUMERIC_DATE = Detector(
    "numeric_date",
    Kind.DATE,
    _c(r"(?P<a>\d\d?)(?P<sep>[./-])(?P<b>\d\d?)(?P=sep)(?P<y>(?:19|20|21)\d\d)(?![\w/-]|\.\d)"),
    h.numeric_date_ok,
    WORD_OR[".:/-"],
    priority=20,
    gate=("-", "/", "."),
    min_run=4,
)
MONTH_NAME_DATE = Detector(
    "month_name_date",
    Kind.DATE,
    _c(
        rf"{MONTH}\s+{DAY},?\s+{YEAR}",  # December 07, 2022 / Aug 18 2025
        rf"{DAY}\s+(?:of\s+)?{MONTH},?\s+{YEAR}",  # 24 April 2025 / 7th of May, 2025
    ),
    h.day_ok,
    WORD,
    priority=20,
    gate=MONTH_GATE,
    min_run=4,
)
# `3. März 2025`, `5 de marzo de 2025`, `3 mars 2025`: a day, a localised month, a year.
L10N_MONTH_DATE = Detector(
    "month_name_date_l10n",
    Kind.DATE,
    _c(rf"{DAY}\.?\s+(?:de\s+)?{L10N_MONTH}(?:\s+de)?,?\s+{YEAR}"),
    h.day_ok,
    WORD,
    priority=21,
    gate=L10N_MONTH_GATE,
    min_run=4,
)
# `03/04/25`, `04.03.25`: day and month in either order and a two-digit year; both readings
# must be calendar dates or one of them (a dotted one is no version number after a cue).
SHORT_YEAR_DATE = Detector(
    "numeric_date_short_year",
    Kind.DATE,
    _c(r"(?P<a>\d\d)(?P<sep>[./])(?P<b>\d\d)(?P=sep)(?P<y>\d\d)(?![\w/-]|[.,]\d)"),
    h.short_year_date_ok,
    WORD_OR[".:/-"],
    priority=22,
    gate=("/", "."),
)
CJK_DATE = Detector(
    "cjk_date",
    Kind.DATE,
    _c(rf"(?:19|20|21)\d\d\s*[年년]\s*[01]?\d\s*[月월]\s*[0-3]?\d\s*[日号일]{_CJK_WEEKDAY}"),
    reject_after=re.compile(r"\d"),
    priority=20,
    gate=("年", "년"),
    min_run=4,
)
CLOCK_TIME = Detector(
    "clock_time",
    Kind.TIME,
    _c(
        # seconds, AM/PM or a timezone make a clock time unambiguous
        rf"(?P<h>\d\d?):[0-5]\d{_SECONDS}(?![\d:])(?P<ampm>{AMPM})?(?:{TZ})?",
        rf"(?P<h>\d\d?):[0-5]\d(?![\d:])(?:(?P<ampm>{AMPM})(?:{TZ})?|{TZ})",
        # bare HH:MM with a two-digit hour ("at 19:29")
        r"(?P<h>\d\d):[0-5]\d(?![\d:])",
    ),
    h.clock_ok,
    WORD_OR[".:/+-"],  # `+02:00` is an offset, not a time
    priority=30,
    gate=(":",),
)
# Ambiguous alone ("John 3:16", "at 7 PM", "on Monday"): kept only inside a merged timestamp.
SHORT_TIME = Detector(
    "short_time",
    Kind.TIME,
    _c(r"(?P<h>\d):[0-5]\d(?![\d:])", rf"(?P<h>\d\d?)(?P<ampm>{AMPM})(?:{TZ})?"),
    h.clock_ok,
    WORD_OR[".:/+-"],  # `+02:00` is an offset, not a time
    anchor=True,
    priority=40,
    gate=(":", "M", "m"),
)
# a weekday only ever merges with a date, so it needs a year's 4-digit run nearby
WEEKDAY_ANCHOR = Detector(
    "weekday",
    Kind.DATE,
    _c(rf"{WEEKDAY}(?![\w])"),
    reject_after=WORD,
    anchor=True,
    priority=45,
    gate=WEEKDAY_GATE,
    min_run=4,
)
WEEKDAY_L10N_ANCHOR = Detector(
    "weekday_l10n",
    Kind.DATE,
    _c(rf"{L10N_WEEKDAY}(?![\w])"),
    reject_after=WORD,
    anchor=True,
    priority=45,
    gate=L10N_WEEKDAY_GATE,
    min_run=4,
)
# Per-release and per-year values: the value first, the cue checked on the left context.
KNOWLEDGE_CUTOFF_D = Detector(
    KNOWLEDGE_CUTOFF,
    Kind.DATE,
    _c(rf"{MONTH}\s+{YEAR}", r"(?:19|20|21)\d\d(?:-[01]\d)?(?![\d-]|\.\d)"),
    h.cutoff_cue_ok,
    WORD_OR[".:/-"],
    priority=25,
    min_run=4,
)
# "It is currently June 2026": a month and year after a "now" cue change every month
MONTH_YEAR = Detector(
    "month_year",
    Kind.DATE,
    _c(rf"{MONTH}\s+{YEAR}"),
    h.now_cue_ok,
    WORD,
    priority=26,
    gate=MONTH_GATE,
    min_run=4,
)
CURRENT_YEAR_D = Detector(
    CURRENT_YEAR,
    Kind.DATE,
    _c(r"(?:19|20|21)\d\d(?![\d-]|\.\d)"),
    h.current_year_ok,
    WORD_OR[".:/-"],
    priority=25,
    min_run=4,
)

# --- identifiers -----------------------------------------------------------------------------
UUID = Detector(
    "uuid",
    Kind.UUID,
    _c(
        r"[0-9A-Fa-f][0-9A-Fa-f]{7}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
        r"(?![0-9A-Fa-f])"
    ),
    h.has_digit,  # `deadbeef-dead-…` is a placeholder, and windows are seeded by digits
    re.compile(r"[0-9A-Fa-f]"),
    priority=10,
    gate=("-",),
    token=True,
)
HEX_ID = Detector(
    "hex_run",
    Kind.HEX_ID,
    _c(r"[0-9A-Fa-f][0-9A-Fa-f]{15,}(?![\w-])"),
    h.hex_id_ok,
    priority=35,
    token=True,
)
PREFIXED_ID = Detector(
    "prefixed_id",
    Kind.HEX_ID,
    _c(
        r"(?:req|request|chatcmpl|cmpl|msg|call|run|thread|asst|sess|session|conv|resp"
        r"|file|toolu|trace|span|evt|batch)[_-](?P<body>[A-Za-z0-9]{12,})(?![\w-])"
    ),
    h.prefixed_id_ok,
    WORD_OR["-"],
    priority=30,
    gate=("_", "-"),
    token=True,
)
NUMERIC_ID = Detector(
    "numeric_id",
    Kind.NUMERIC_ID,
    # >= 8 digits alone, >= 5 after an id cue (`user 1234567`, `order #88812345`)
    _c(r"\d\d{4,}(?![\w+@]|[.,]\d)"),
    h.numeric_id_ok,
    WORD_OR[".,$€£+-"],
    priority=40,
    min_run=5,
)

# --- people, contacts, credentials, versions -------------------------------------------------
EMAIL = Detector(
    "email",
    Kind.EMAIL,
    _c(
        r"[A-Za-z0-9._%+-][A-Za-z0-9._%+-]{0,63}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*"
        r"\.[A-Za-z]{2,24}(?![\w-])"
    ),
    reject_after=WORD_OR[".,$€£+-"],
    priority=15,
    gate=("@",),
)
_NAME = r"[A-Z][a-z]+(?:[-'][A-Z]?[a-z]+)?"
_NAMES = rf"(?P<v>{_NAME}(?:[ \t]{_NAME}){{0,2}})"


def _both_cases(*cues: str) -> tuple[str, ...]:
    # one pattern per capitalisation: a literal first character lets `re` skip ahead, where a
    # case-insensitive group would be tried at every position
    return tuple(f"{c}{cue[1:]}" for cue in cues for c in (cue[0].lower(), cue[0].upper()))


NAME = Detector(
    "name_cue",
    Kind.NAME,
    _c(
        *(
            rf"{cue}[ \t:]*{_NAMES}(?![\w])"
            for cue in _both_cases(
                r"name\s+is",
                r"you\s+are\s+(?:talking|speaking|chatting)\s+(?:to|with)",
                r"you're\s+(?:talking|speaking|chatting)\s+(?:to|with)",
                r"user\s+is\s+(?:called|named)",
            )
        ),
        # a `Name:` field at the start of a line (indented `name:` keys are YAML/JSON schemas)
        rf"\n(?:User|Customer|Name|User name|Username):[ \t]*{_NAMES}[ \t]*(?=\n|$)",
        rf"\A(?:User|Customer|Name|User name|Username):[ \t]*{_NAMES}[ \t]*(?=\n|$)",
        rf"H(?:ello|i|ey)[ \t]+{_NAMES}(?=[,!])",
        rf"Dear[ \t]+{_NAMES}(?=[,!])",
    ),
    h.name_ok,
    priority=60,
    # every cue above holds one of these: (n|N)ame, (y|Y)ou, (u|U)ser, Customer, He(llo|y), Hi, Dear
    gate=("ame", "ou", "ser", "Customer", "He", "Hi", "Dear"),
)
SECRET = Detector(
    "api_key",
    Kind.SECRET,
    _c(
        r"(?:sk|rk|pk)-(?:(?:proj|ant|live|test|svcacct|admin)-)?(?P<body>[A-Za-z0-9_-]{20,})(?![\w-])",
        # Stripe-style `sk_live_…` / `rk_test_…` (secret and restricted keys; `pk_` is public)
        r"(?:sk|rk)_(?:live|test)_(?P<body>[A-Za-z0-9]{16,})(?![\w-])",
        r"(?:AKIA|ASIA)(?P<body>[0-9A-Z]{16})(?![\w])",
        r"gh[pousr]_(?P<body>[A-Za-z0-9]{30,})(?![\w])",
        r"github_pat_(?P<body>[A-Za-z0-9_]{30,})(?![\w])",
        r"xox[abposr]-(?P<body>[A-Za-z0-9-]{10,})(?![\w-])",
        r"AIza(?P<body>[0-9A-Za-z_-]{35})(?![\w-])",
        r"(?:hf|glpat)[_-](?P<body>[A-Za-z0-9_-]{20,})(?![\w-])",
        r"[Bb](?:earer|EARER)\s+(?P<body>[A-Za-z0-9._~+/-]{16,}=*)(?![\w])",
    ),
    h.secret_ok,
    WORD_OR["-"],
    priority=5,
    gate=(
        "sk-",
        "rk-",
        "sk_",
        "rk_",
        "pk-",
        "AKIA",
        "ASIA",
        "gh",
        "xox",
        "AIza",
        "hf",
        "glpat",
        "earer",
        "EARER",
    ),
)
JWT = Detector(
    "jwt",
    Kind.SECRET,
    _c(r"(?P<h>eyJ[A-Za-z0-9_-]{5,})\.(?P<p>[A-Za-z0-9_-]{8,})\.[A-Za-z0-9_-]*(?![\w-])"),
    h.jwt_ok,
    WORD_OR["-"],
    priority=4,
    gate=("eyJ",),
)
# `api_key=…`, `access_token: "…"`, `CLIENT_SECRET=…`: a credential keyword, then a long
# high-entropy value (the value alone; the keyword is context).
_SECRET_WORDS = (r"(?:api[_-]?key|apikey|access[_-]?token|auth[_-]?token|refresh[_-]?token"
                 r"|client[_-]?secret|secret[_-]?key|secret|token|password|passwd)")
KEYWORD_SECRET = Detector(
    "keyword_secret",
    Kind.SECRET,
    _c(*(rf"{words}[\"']?[ \t]*[:=][ \t]*[\"']?(?P<v>[A-Za-z0-9+/_~.-]{{16,}}={{0,2}})(?![\w+/=-])"
         for words in (_SECRET_WORDS, _SECRET_WORDS.upper()))),
    h.keyword_secret_ok,
    WORD,
    priority=6,
    gate=("key", "KEY", "oken", "OKEN", "ecret", "ECRET", "ass", "ASS"),
    token=True,
)
# `ORD-414359285`, `u_168566947`, `MBR-55410189`: a short letter prefix glued to 6+ digits.
PREFIXED_NUMBER = Detector(
    "prefixed_number",
    Kind.NUMERIC_ID,
    _c(r"[A-Za-z][A-Za-z]{0,7}[-_](?P<n>\d{6,})(?![\w-]|[.,]\d)"),
    h.prefixed_number_ok,
    WORD,
    priority=38,
    gate=("-", "_"),
    min_run=6,
)
VERSION = Detector(
    "version",
    Kind.VERSION,
    _c(
        # `v3.5.0`, `v2`, `node/v22.22.0`: a prompt/product version unless pinned like a dependency
        r"[vV]\d{1,4}(?:\.\d{1,5}){0,3}(?:-[0-9A-Za-z]+(?:\.[0-9A-Za-z]+)*)?(?!\w|\.\w)",
        # `version 2.1.4`, `OS Version: Darwin 24.6.0`: a dotted number after a version cue
        r"\d\d{0,4}(?:\.\d{1,6}){1,3}(?:-[0-9A-Za-z.]+)?(?!\w|\.\w)",
    ),
    h.version_ok,
    WORD_OR[".-"],
    priority=45,
    gate=("v", "V", "."),
)
# `build 7860`, `revision 20250304`, `Build #1234`: a number of 4-8 digits (a seed of
# regions.py) after a build/revision cue is a version, not a year or an id.
BUILD_NUMBER = Detector(
    "build_number",
    Kind.VERSION,
    _c(r"\d{4}\d{0,4}(?![\w.-]|[.,]\d)"),
    h.build_cue_ok,
    WORD_OR[".-"],
    priority=36,
    gate=("uild", "UILD", "rev", "Rev", "REV"),
    min_run=4,
)
DATED_MODEL_ID = Detector(
    "dated_model_id",
    Kind.VERSION,
    _c(r"(?:19|20)\d{6}(?![\w])"),
    h.dated_model_id_ok,
    priority=8,
    gate=("-",),
    min_run=8,
)

DETECTORS: tuple[Detector, ...] = (
    JWT,
    SECRET,
    DATED_MODEL_ID,
    ISO_DATETIME,
    UUID,
    EMAIL,
    EPOCH,
    ISO_DATE,
    NUMERIC_DATE,
    MONTH_NAME_DATE,
    L10N_MONTH_DATE,
    SHORT_YEAR_DATE,
    CJK_DATE,
    KNOWLEDGE_CUTOFF_D,
    MONTH_YEAR,
    CURRENT_YEAR_D,
    CLOCK_TIME,
    KEYWORD_SECRET,
    PREFIXED_ID,
    PREFIXED_NUMBER,
    HEX_ID,
    NUMERIC_ID,
    SHORT_TIME,
    WEEKDAY_ANCHOR,
    WEEKDAY_L10N_ANCHOR,
    BUILD_NUMBER,
    VERSION,
    NAME,
)
# Values without a digit: scan() runs these over the whole text, everything else only in the
# windows around digit runs (regions.py).
TEXT_WIDE: tuple[Detector, ...] = (JWT, EMAIL, NAME)
WINDOWED: tuple[Detector, ...] = tuple(d for d in DETECTORS if d not in TEXT_WIDE)
# What first_volatile runs (JWTs are found through `eyJ` seeds). Left out: detectors whose
# matches are never router kinds and never win an overlap against one (a name has no digit; a
# version, a knowledge cutoff or a year is never longer than a date/id/time it overlaps, and
# loses ties on priority). Kept although not router kinds: `dated_model_id` must beat
# `numeric_id` on `claude-sonnet-4-20250514`, an email must swallow `2024-05-20@x.io` (and is
# gated on `@`). The property tests check first_volatile against a full scan.
ROUTER_DETECTORS: tuple[Detector, ...] = tuple(
    d for d in DETECTORS if d not in (NAME, VERSION, KNOWLEDGE_CUTOFF_D, CURRENT_YEAR_D)
)

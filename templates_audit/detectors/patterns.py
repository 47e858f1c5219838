"""The detectors as data: a stable name, a kind, compiled patterns and an optional validity check.

Each `Detector` names the pattern family that caught a value (`Match.detector`). A pattern may
carry a named group `v`: the value is that group and the rest of the match is context (a cue such
as "knowledge cutoff:" or "user's name is"). `anchor` detectors (a lone weekday, `7 PM`, `3:16`)
never stand alone: they are kept only when classify/scan merges them with an adjacent date or
time into a timestamp. `priority` breaks ties between equally long overlapping candidates
(lower wins), so the most specific detector names the value.

Patterns are case-sensitive where case carries meaning (month names, capitalised names), use
look-arounds instead of `\\b` where a value may touch letters (`2025-10-18T15:58:49`), and are
bounded (no nested unbounded repeats), so every pattern runs in linear time.
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
    name: str
    kind: Kind
    patterns: tuple[re.Pattern[str], ...]
    validate: Validator | None = None
    anchor: bool = False
    priority: int = 50


def _c(*sources: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(s) for s in sources)


# --- building blocks -------------------------------------------------------------------------
MONTH = (
    r"(?:January|February|March|April|May|June|July|August|September|October|November|December"
    r"|(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\.?)"
)
WEEKDAY = (
    r"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday"
    r"|Mon|Tues|Tue|Wed|Thurs|Thur|Thu|Fri|Sat|Sun)\.?"
)
YEAR = r"(?:19|20|21)\d\d(?!\d)"
DAY = r"(?:[12]\d|3[01]|0?[1-9])(?:st|nd|rd|th)?"
_WD_PREFIX = rf"(?:{WEEKDAY},?\s+)?"
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
    rf"(?:Z(?![A-Za-z])|\s?(?:{TZ_ABBR})(?:\s?[+-]\d{{1,2}}(?::?\d\d)?)?(?![A-Za-z])"
    rf"(?:\s\([A-Z][A-Za-z ]{{2,40}}\))?|\s?[+-](?:0\d|1[0-4])(?::?\d\d)?(?![\d:])"
    rf"|\s\(?{IANA}\)?)"
)
AMPM = r"\s?[AaPp]\.?[Mm]\.?(?![A-Za-z])"
CLOCK = r"(?<![\d:.])(?:[01]?\d|2[0-3]):[0-5]\d(?::[0-5]\d(?:[.,]\d{1,9})?)?(?![\d:])"
ISO_DATE = r"(?P<y>(?:19|20|21)\d\d)(?P<sep>[-/.])(?P<mo>[01]?\d)(?P=sep)(?P<d>[0-3]?\d)(?!\d)"

# --- dates, times, timestamps ----------------------------------------------------------------
ISO_DATETIME = Detector(
    "iso_datetime",
    Kind.TIMESTAMP,
    _c(
        rf"(?<![\w.:/-]){_WD_PREFIX}(?P<y>(?:19|20|21)\d\d)-(?P<mo>[01]\d)-(?P<d>[0-3]\d)"
        rf"(?:T|\s)(?:[01]\d|2[0-3]):[0-5]\d(?::[0-5]\d(?:[.,]\d{{1,9}})?)?(?![\d:])(?:{TZ})?"
    ),
    h.iso_date_ok,
    priority=10,
)
RFC2822 = Detector(
    "rfc2822",
    Kind.TIMESTAMP,
    _c(
        rf"{WEEKDAY},?\s+\d{{1,2}}\s+{MONTH}\s+{YEAR}\s+{CLOCK}(?:{TZ})?",
        # JavaScript Date.toString(): `Thu May 14 2026 19:00:00 GMT+0000 (Coordinated ...)`
        rf"{WEEKDAY}\s+{MONTH}\s+\d{{1,2}}\s+{YEAR}\s+{CLOCK}(?:{TZ})?",
    ),
    priority=10,
)
EPOCH = Detector(
    "epoch",
    Kind.TIMESTAMP,
    _c(r"(?<![\w.,$€£+-])(?P<v>1\d{9}(?:\d{3})?)(?![\w]|[.,]\d)"),
    h.epoch_ok,
    priority=20,
)
ISO_DATE_D = Detector(
    "iso_date",
    Kind.DATE,
    _c(rf"(?<![\w.:/-]){_WD_PREFIX}{ISO_DATE}{_CJK_WEEKDAY}(?![\w/-]|\.\d)"),
    h.iso_date_ok,
    priority=20,
)
NUMERIC_DATE = Detector(
    "numeric_date",
    Kind.DATE,
    _c(
        rf"(?<![\w.:/-]){_WD_PREFIX}(?P<a>\d{{1,2}})(?P<sep>[./-])(?P<b>\d{{1,2}})(?P=sep)(?P<y>(?:19|20|21)\d\d)(?![\w/-]|\.\d)"
    ),
    h.numeric_date_ok,
    priority=20,
)
MONTH_NAME_DATE = Detector(
    "month_name_date",
    Kind.DATE,
    _c(
        rf"(?<![\w]){_WD_PREFIX}{MONTH}\s+{DAY},?\s+{YEAR}",
        rf"(?<![\w]){_WD_PREFIX}{DAY}\s+(?:of\s+)?{MONTH},?\s+{YEAR}",
    ),
    priority=20,
)
CJK_DATE = Detector(
    "cjk_date",
    Kind.DATE,
    _c(rf"(?:19|20|21)\d\d\s*[年년]\s*[01]?\d\s*[月월]\s*[0-3]?\d\s*[日号일]{_CJK_WEEKDAY}"),
    priority=20,
)
CLOCK_TIME = Detector(
    "clock_time",
    Kind.TIME,
    _c(
        # seconds, AM/PM or a timezone make a clock time unambiguous
        rf"(?<![\d:.])(?:[01]?\d|2[0-3]):[0-5]\d:[0-5]\d(?:[.,]\d{{1,9}})?(?![\d:])(?:{AMPM})?(?:{TZ})?",
        rf"(?<![\d:.])(?:[01]?\d|2[0-3]):[0-5]\d(?![\d:])(?:{AMPM}(?:{TZ})?|{TZ})",
        # bare HH:MM with a two-digit hour ("at 19:29")
        r"(?<![\d:.])(?:[01]\d|2[0-3]):[0-5]\d(?![\d:])",
    ),
    priority=30,
)
# Ambiguous alone ("John 3:16", "at 7 PM", "on Monday"): kept only inside a merged timestamp.
SHORT_TIME = Detector(
    "short_time",
    Kind.TIME,
    _c(
        r"(?<![\d:.])[1-9]:[0-5]\d(?![\d:])",
        rf"(?<![\w.:])(?:1[0-2]|0?[1-9]){AMPM}(?:{TZ})?",
    ),
    anchor=True,
    priority=40,
)
WEEKDAY_ANCHOR = Detector(
    "weekday", Kind.DATE, _c(rf"(?<![\w]){WEEKDAY}(?![\w])"), anchor=True, priority=45
)

KNOWLEDGE_CUTOFF_D = Detector(
    KNOWLEDGE_CUTOFF,
    Kind.DATE,
    _c(
        r"(?i:knowledge[\s_-]*cut-?off(?:\s+date)?|cut-?off\s+date|last\s+updated|trained\s+on\s+data"
        r"|training\s+data|information\s+up\s+to|knowledge\s+base)"
        rf"[^\n.!?\d]{{0,40}}?(?:\n\s*)?(?P<v>(?:{MONTH}\s+{YEAR}|(?:19|20)\d\d-[01]\d(?![\d-])|{YEAR}))"
    ),
    priority=25,
)
CURRENT_YEAR_D = Detector(
    CURRENT_YEAR,
    Kind.DATE,
    _c(
        rf"(?i:current\s+year|this\s+year\s+is|the\s+year\s+is)(?:\s+is)?[\s:(]*(?P<v>{YEAR})",
        rf"(?i:it\s+is|it's)\s+(?P<v>{YEAR})(?:\s+this\s+year)",
    ),
    priority=25,
)

# --- identifiers -----------------------------------------------------------------------------
UUID = Detector(
    "uuid",
    Kind.UUID,
    _c(
        r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}(?![0-9A-Fa-f])"
    ),
    priority=10,
)
HEX_ID = Detector(
    "hex_run",
    Kind.HEX_ID,
    _c(r"(?<![\w-])(?P<v>(?:0[xX])?[0-9A-Fa-f]{16,})(?![\w-])"),
    h.hex_id_ok,
    priority=35,
)
PREFIXED_ID = Detector(
    "prefixed_id",
    Kind.HEX_ID,
    _c(
        r"(?<![\w-])(?:req|request|chatcmpl|cmpl|msg|call|run|thread|asst|sess|session|conv|resp"
        r"|file|toolu|trace|span|evt|batch)[_-](?P<body>[A-Za-z0-9]{12,})(?![\w-])"
    ),
    h.prefixed_id_ok,
    priority=30,
)
NUMERIC_ID = Detector(
    "numeric_id",
    Kind.NUMERIC_ID,
    _c(
        # a bare run of >= 8 digits (shorter runs are counts, ports, years, amounts)
        r"(?<![\w.,$€£#+/:-])(?P<v>\d{8,})(?![\w]|[.,]\d)",
        # >= 5 digits after an id cue: `user 1234567`, `order #88812345`, `ticket: 55512`
        r"(?i:\b(?:id|user|order|account|ticket|session|request|customer|invoice|case|no\.?"
        r"|number)\b)\s*(?:#|:|=|is)?\s*#?(?P<v>\d{5,})(?![\w]|[.,]\d)",
        r"(?<![\w&])#(?P<v>\d{7,})(?![\w]|[.,]\d)",
    ),
    h.numeric_id_ok,
    priority=40,
)

# --- people, contacts, credentials, versions -------------------------------------------------
EMAIL = Detector(
    "email",
    Kind.EMAIL,
    _c(
        r"(?<![\w.+-])[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}(?![\w-])"
    ),
    priority=15,
)
_NAME = r"[A-Z][a-z]+(?:[-'][A-Z]?[a-z]+)?"
NAME = Detector(
    "name_cue",
    Kind.NAME,
    _c(
        rf"(?i:name\s+is|name:|you\s+are\s+(?:talking|speaking|chatting)\s+(?:to|with)"
        rf"|you're\s+(?:talking|speaking|chatting)\s+(?:to|with)|the\s+user\s+is\s+called"
        rf"|user\s+is\s+named)[\s:]*(?P<v>{_NAME}(?:\s{_NAME}){{0,2}})(?![\w])",
        rf"(?:^|\n)(?:User|Customer|Name):[ \t]*(?P<v>{_NAME}(?:\s{_NAME}){{0,2}})[ \t]*(?=\n|$)",
        rf"(?<![\w])(?:Hello|Hi|Hey|Dear)[ \t]+(?P<v>{_NAME}(?:\s{_NAME}){{0,2}})(?=[,!])",
    ),
    h.name_ok,
    priority=60,
)
SECRET = Detector(
    "api_key",
    Kind.SECRET,
    _c(
        r"(?<![\w-])(?:sk|rk|pk)-(?:(?:proj|ant|live|test|svcacct|admin)-)?(?P<body>[A-Za-z0-9_-]{20,})(?![\w-])",
        r"(?<![\w])(?:AKIA|ASIA)(?P<body>[0-9A-Z]{16})(?![\w])",
        r"(?<![\w])gh[pousr]_(?P<body>[A-Za-z0-9]{30,})(?![\w])",
        r"(?<![\w])github_pat_(?P<body>[A-Za-z0-9_]{30,})(?![\w])",
        r"(?<![\w])xox[abposr]-(?P<body>[A-Za-z0-9-]{10,})(?![\w-])",
        r"(?<![\w])AIza(?P<body>[0-9A-Za-z_-]{35})(?![\w-])",
        r"(?<![\w])(?:hf|glpat)[_-](?P<body>[A-Za-z0-9_-]{20,})(?![\w-])",
        r"(?<![\w])(?i:bearer)\s+(?P<body>[A-Za-z0-9._~+/-]{16,}=*)(?![\w])",
    ),
    h.secret_ok,
    priority=5,
)
JWT = Detector(
    "jwt",
    Kind.SECRET,
    _c(
        r"(?<![\w-])(?P<h>eyJ[A-Za-z0-9_-]{5,})\.(?P<p>eyJ[A-Za-z0-9_-]{5,})\.[A-Za-z0-9_-]*(?![\w-])"
    ),
    h.jwt_ok,
    priority=4,
)
VERSION = Detector(
    "version",
    Kind.VERSION,
    _c(
        # `v3.5.0`, `v2`, `node/v22.22.0`: a prompt/product version unless pinned like a dependency
        r"(?<![\w.-])(?P<v>[vV]\d{1,4}(?:\.\d{1,5}){0,3}(?:-[0-9A-Za-z]+(?:\.[0-9A-Za-z]+)*)?)(?![\w.]|\.\d)",
        # `version 2.1.4`, `OS Version: Darwin 24.6.0`, `release: 1.2`
        r"(?i:\bversion|\bver\.|\brelease|\bbuild)(?:\s+is)?[\s:=]*(?:[A-Za-z]+\s+)?"
        r"(?P<v>\d{1,5}(?:\.\d{1,6}){1,3}(?:-[0-9A-Za-z.]+)?)(?![\w.]|\.\d)",
    ),
    h.version_ok,
    priority=45,
)
DATED_MODEL_ID = Detector(
    "dated_model_id",
    Kind.VERSION,
    _c(r"(?<=[A-Za-z0-9.]-)(?P<v>(?:19|20)\d{6})(?![\w])"),
    h.compact_date_ok,
    priority=8,
)

DETECTORS: tuple[Detector, ...] = (
    JWT,
    SECRET,
    DATED_MODEL_ID,
    ISO_DATETIME,
    RFC2822,
    UUID,
    EMAIL,
    EPOCH,
    ISO_DATE_D,
    NUMERIC_DATE,
    MONTH_NAME_DATE,
    CJK_DATE,
    KNOWLEDGE_CUTOFF_D,
    CURRENT_YEAR_D,
    CLOCK_TIME,
    PREFIXED_ID,
    HEX_ID,
    NUMERIC_ID,
    SHORT_TIME,
    WEEKDAY_ANCHOR,
    VERSION,
    NAME,
)

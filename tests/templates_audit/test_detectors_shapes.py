"""Value shapes (detectors/shapes.py): names in any script and ids no pattern names."""

from __future__ import annotations

import pytest

from templates_audit.detectors.shapes import id_shaped, name_shaped


@pytest.mark.parametrize(("value", "expected"), [
    ("Olivia Whitfield", True),
    ("Zoë Ó Briain", True),  # diacritics, a one-letter capitalised word
    ("Aisha van der Berg", True),  # lowercase particles between capitalised words
    ("Mateo O'Connor", True),  # an apostrophe inside a word
    ("Anne-Marie Dubois", True),  # a hyphenated given name
    ("Jeanne d'Arc", True),  # an elided particle glued to a capitalised part
    ("Nguyễn Thị Mai", True),  # Vietnamese
    ("Дмитрий Иванов", True),  # Cyrillic
    ("田中 健", True),  # a caseless script, short words
    ("Ayşe", True),
    ("van der Berg", False),  # a particle cannot open a name
    ("EMEA", False),  # all capitals: a code
    ("The Customer", False),  # a stop word first
    ("Monday", False),
    ("Marco 2nd", False),  # digits
    ("Alice Bob Carol Dave Eve", False),  # five words
    ("お客様は小林大輔様です", False),  # a whole sentence of a caseless script
    ("hello world", False),
])
def test_name_shaped(value: str, expected: bool) -> None:
    assert name_shaped(value) is expected


@pytest.mark.parametrize(("token", "expected"), [
    ("E40522", True),  # a letter and five digits
    ("OD-227-568-Y", True),  # digit groups between letters
    ("usr_4vg8898eta", True),  # a prefix and a random body
    ("cus_Qhf9ZHiE2ZpMc4", True),  # a long mixed segment with few digits
    ("INC0012345", True),
    ("#48213", True),
    ("4412 0091 7730", True),  # digit groups split by spaces
    ("llama-3.1-70b", False),  # a model name: short numbers
    ("claude-sonnet-4", False),
    ("gpt-4o", False),
    ("12345", False),  # a plain number: the numeric rules judge it
    ("invoice", False),
    ("a b", False),
])
def test_id_shaped(token: str, expected: bool) -> None:
    assert id_shaped(token) is expected


@pytest.mark.parametrize(("before", "after", "thing"), [
    ("You are posted at the ", " station desk; answer", True),
    ("Build codename: ", "\nWrite for staff", True),
    ("Quote lead times.\nRegion: ", "", True),
    ("You are speaking with ", " (member #5).", False),
    ("The user's name is ", ".", False),
])
def test_thing_context_tells_places_and_things_from_people(before: str, after: str,
                                                           thing: bool) -> None:
    from templates_audit.slots import slot_kind, thing_context
    assert thing_context(before, after) is thing
    kind = slot_kind("other", distinct=30, capped=False, requests=200, multi_line=False,
                     name_like=30, pool=0, pool_full=False, pool_lines=0, switches=40,
                     thing=thing_context(before, after))
    assert kind == ("other" if thing else "name")

"""jsonargparse's wording, which the parser reads to turn its errors into one line: none of it is a promise.

A release that words them otherwise fails ``tests/test_upstream_jsonargparse.py`` (each pattern held against what
the installed jsonargparse says of a real bad input), not the one-line errors.
"""

import re

#: The jsonargparse releases these patterns are known to match: the lowest the library declares, to the newest tried.
KNOWN_VERSIONS = ("4.52", "4.53")

#: The headings of a nested message, one per level: a key (``Parser key "model.net":``, then ``Parser key "width":``
#: inside it) or the class a key names (``Problem with given class_path 'my.Net':``, whose arguments follow).
HEADINGS = re.compile(r"""Parser key "(?P<key>[^"]+)":|Problem with given class_path '[^']+':""")
#: Lines of a union's or a class's message that say nothing about the mistake (the alternatives tried, the None one).
NOISE = re.compile(r"Does not validate against|Subtypes:|Errors:|Expected a <class 'NoneType'>|Given value")
#: argparse's: flags no value was given for (``the following arguments are required: --model, --data``).
REQUIRED = re.compile(r"the following arguments are required: (.*)")
#: A number out of a restricted type's bounds (``jsonargparse.typing.restricted_number_type``): ``Not of type
#: BatchSize: 0 does not conform to restriction v>=1 and v<=2147483647``. In a union (``Folds | None``) the value
#: is left out, and said on a line of its own (``GIVEN_VALUE``).
RESTRICTION = re.compile(r"Not of type \w+: (?:(?P<value>\S+) )?does not conform to restriction (?P<bounds>[^\n]+)")
#: A union with None among its alternatives, which accepts null (``Folds | None``): ``Subtypes: [<class
#: 'jsonargparse.typing.AtLeastTwo'>, <class 'NoneType'>]``.
NULL_ALTERNATIVE = re.compile(r"Subtypes: \[[^\n]*<class 'NoneType'>\]")
#: The value a union's message was about: ``Given value: 1``.
GIVEN_VALUE = re.compile(r"Given value: (?P<value>[^\n]*)")


def out_of_bounds(message: str) -> tuple[str, str] | None:
    """The value given and what is accepted (the bounds, ``or null`` where its type takes None), where ``message`` is
    a restricted type's refusal; None otherwise. Read after the innermost key's heading: the classes around it say
    nothing of the value."""
    keys = [found for found in HEADINGS.finditer(message) if found["key"]]
    innermost = message[keys[-1].end() :] if keys else message
    found = RESTRICTION.search(innermost)
    if found is None:
        return None
    given = found["value"] or ((value := GIVEN_VALUE.search(innermost)) and value["value"].strip())
    return given or "", found["bounds"].strip() + (" or null" if NULL_ALTERNATIVE.search(innermost) else "")


def is_bounded_number(value) -> bool:
    """Whether ``value`` is a number jsonargparse parsed as one of its bounded types (made in its ``typing``)."""
    return isinstance(value, int | float) and type(value).__module__ == "jsonargparse.typing"

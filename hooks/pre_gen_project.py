"""Reject bad answers before anything is written: one line saying what is wrong and what is accepted.

Cookiecutter renders this file before running it. Each answer enters as a JSON
string literal, which is also a valid Python string literal, so quotes,
backslashes and non-ASCII characters in an answer are data, never code.
"""

import keyword
import re
import sys

PROJECT_NAME = {{cookiecutter.project_name | tojson}}
PROJECT_SLUG = {{cookiecutter.project_slug | tojson}}
AUTHOR_EMAIL = {{cookiecutter.author_email | tojson}}
VERSION = {{cookiecutter.version | tojson}}

# Packages a generated project imports, or tools that would be confused by a package of the same name.
SHADOWED = {
    "jsonargparse",
    "lightning",
    "lightning_fabric",
    "numpy",
    "pytest",
    "pytorch_lightning",
    "ruff",
    "setuptools",
    "src",
    "test",
    "tests",
    "torch",
    "torchmetrics",
    "torchvision",
}
SLUG = re.compile(r"[a-z_][a-z0-9_]*")
EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
# PEP 440 public versions: 1.0, 0.1.0, 2.0.0rc1, 1.0.post2, 1.1.dev3, ...
PEP440 = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?")


def problems() -> list[str]:
    found = []
    if not PROJECT_NAME.strip():
        found.append("project_name is empty: give the project a name, e.g. 'Vision Project'")
    if not SLUG.fullmatch(PROJECT_SLUG):
        found.append(
            f"project_slug {PROJECT_SLUG!r} is not a valid package name: "
            "use lowercase ASCII letters, digits and underscores, not starting with a digit"
        )
    elif keyword.iskeyword(PROJECT_SLUG) or keyword.issoftkeyword(PROJECT_SLUG):
        found.append(f"project_slug {PROJECT_SLUG!r} is a Python keyword: choose another package name")
    elif PROJECT_SLUG in sys.stdlib_module_names or PROJECT_SLUG in SHADOWED:
        found.append(
            f"project_slug {PROJECT_SLUG!r} would shadow the package of that name: "
            "choose a name of your own, e.g. 'vision_project'"
        )
    if not EMAIL.fullmatch(AUTHOR_EMAIL):
        found.append(f"author_email {AUTHOR_EMAIL!r} is not an email address: use the form name@example.com")
    if not PEP440.fullmatch(VERSION):
        found.append(f"version {VERSION!r} is not a PEP 440 version: use a form such as 0.1.0 or 1.0.0rc1")
    return found


if __name__ == "__main__":
    errors = problems()
    for error in errors:
        print(f"ERROR: {error}", file=sys.stderr)
    sys.exit(1 if errors else 0)

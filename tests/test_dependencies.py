"""What course_lib needs is declared, and the course's pins fit what is declared.

``pyproject.toml`` lists, as ranges, the third-party packages ``course_lib`` imports (enough to
install it elsewhere); ``requirements.txt`` pins exact versions for the course's environment. A
new import must be declared, and every pin must fall inside its range (``scripts/test.sh``
also runs ``pip check``, which compares what is installed with the same ranges).
"""

import ast
import functools
import importlib.metadata
import importlib.util
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(source: str) -> set[str]:
    """The top-level names of every absolute import in ``source``, inside functions too."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@functools.cache
def providers() -> dict[str, list[str]]:
    """Top-level module name -> the installed distributions that provide it."""
    return importlib.metadata.packages_distributions()


def third_party(names: set[str]) -> set[str]:
    """The distributions (canonical names) that provide the non-standard modules of ``names``."""
    found = set()
    for name in names - set(sys.stdlib_module_names) - {"course_lib", "__future__"}:
        found |= {canonicalize_name(d) for d in providers().get(name, [name])}
    return found


def declared() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(line) for line in project["dependencies"]]
    return {canonicalize_name(r.name): r for r in requirements}


def pins(text: str) -> dict[str, Version]:
    """``name==version`` lines of a requirements file, by canonical name."""
    found = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s#;]+)\s*(#.*)?", line)
        if match:
            found[canonicalize_name(match[1])] = Version(match[2])
    return found


def undeclared(sources: dict[str, str], wanted: dict[str, Requirement]) -> dict[str, set[str]]:
    """File -> the third-party distributions it imports that ``wanted`` does not declare."""
    missing = {path: third_party(imported_modules(text)) - set(wanted)
               for path, text in sources.items()}
    return {path: names for path, names in missing.items() if names}


def outside(pinned: dict[str, Version], wanted: dict[str, Requirement]) -> list[str]:
    """Each declared dependency whose pin is missing or falls outside its range, in words."""
    problems = []
    for name, requirement in wanted.items():
        if name not in pinned:
            problems.append(f"{name} is declared ({requirement}) but requirements.txt pins no "
                            "version of it")
        elif not requirement.specifier.contains(pinned[name], prereleases=True):
            problems.append(f"requirements.txt pins {name}=={pinned[name]}, outside "
                            f"pyproject.toml's {requirement}")
    return problems


def test_course_lib_imports_only_what_pyproject_declares():
    sources = {str(path.relative_to(ROOT)): path.read_text()
               for path in sorted((ROOT / "course_lib").rglob("*.py"))}
    assert len(sources) > 50  # the whole package was read
    missing = undeclared(sources, declared())
    assert not missing, ("course_lib imports packages pyproject.toml's [project] dependencies "
                         f"do not declare; add them with a range: {missing}")


def test_every_declared_dependency_is_pinned_inside_its_range():
    wanted = declared()
    assert {"torch", "numpy", "matplotlib"} <= set(wanted)
    problems = outside(pins((ROOT / "requirements.txt").read_text()), wanted)
    assert not problems, problems


def test_the_checks_catch_an_undeclared_import_and_a_pin_outside_its_range():
    wanted = {"torch": Requirement("torch>=2.6"), "numpy": Requirement("numpy>=1.24")}
    source = "import os\nimport torch.nn\n\ndef f():\n    from elsewhere import thing\n"
    assert undeclared({"m.py": source}, wanted) == {"m.py": {"elsewhere"}}  # in a function too
    assert undeclared({"m.py": "from . import x\nimport numpy as np\n"}, wanted) == {}
    assert outside(pins("torch==2.5.1\n# numpy==1.0\n"), wanted) == [
        "requirements.txt pins torch==2.5.1, outside pyproject.toml's torch>=2.6",
        "numpy is declared (numpy>=1.24) but requirements.txt pins no version of it"]
    assert outside(pins("torch==2.13.0  # the CPU build\nnumpy==2.4.6\n"), wanted) == []


def test_the_course_environment_has_no_iri_grammar_to_build():
    # scripts/env.sh removes rfc3987-syntax once installed: jsonschema would import it, and it
    # builds an IRI grammar on import (2.5 s of CPU in every process that imports nbformat)
    assert importlib.util.find_spec("rfc3987_syntax") is None, \
        "rfc3987-syntax is installed: scripts/env.sh should have removed it"

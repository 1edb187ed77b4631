"""The mutation run (scripts/mutation.sh) reruns only the unit tests [tool.mutmut] selects: a test of a
mutated module left out of that list would let its mutants survive, and the scores read low."""

import re
import tomllib

from tests.support import ROOT

# What imports a mutated module: results/trust.py, report/stats.py, report/findings/.
_IMPORTS = re.compile(
    r"^\s*(from labrunner\.(results\.trust|report\.stats|report\.findings)\b"
    r"|from labrunner\.results import .*\btrust\b"
    r"|from labrunner\.report import .*\b(stats|findings)\b)",
    re.MULTILINE,
)


def test_every_unit_test_of_a_mutated_module_is_in_the_mutation_selection() -> None:
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    selected = set(settings["pytest_add_cli_args_test_selection"])
    importing = {
        f"tests/unit/{path.name}"
        for path in sorted((ROOT / "tests" / "unit").glob("test_*.py"))
        if _IMPORTS.search(path.read_text())
    }
    assert importing, "no unit test imports trust, stats or findings: the pattern is stale"
    assert importing <= selected, f"missing from [tool.mutmut]: {sorted(importing - selected)}"
    assert all((ROOT / path).exists() for path in selected)

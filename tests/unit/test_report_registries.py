"""The report's two registries hold every section module and every finding builder, and nothing else:
a module in report/sections/ or report/findings/ left out of SECTIONS or QUESTIONS fails here, and so
does a registry line whose module is gone."""

import importlib
import shutil

import pytest
from labrunner.report.document import Heading
from labrunner.report.findings import QUESTIONS, for_run
from labrunner.report.runs import Run, load_run
from labrunner.report.sections import SECTIONS
from labrunner.report.sections.section import Report, Section

from tests.support import ROOT

REPORT = ROOT / "scripts" / "labrunner" / "report"
# The modules of each package that are neither a section nor a builder: what those share.
SHARED = {"sections": {"section"}, "findings": {"finding", "text"}}


def _modules(package: str) -> set[str]:
    return {p.stem for p in (REPORT / package).glob("*.py")} - SHARED[package] - {"__init__"}


def test_every_section_module_is_in_the_registry_and_the_registry_holds_only_them() -> None:
    # The Charts section is the registry's own: it gathers the others' charts.
    own = [s for s in SECTIONS if s.blocks.__module__ != "labrunner.report.sections"]
    modules = [s.blocks.__module__.rsplit(".", 1)[1] for s in own]
    assert sorted(modules) == sorted(_modules("sections"))  # each once
    for name in modules:
        assert importlib.import_module(f"labrunner.report.sections.{name}").SECTION in SECTIONS
    assert len({s.title for s in SECTIONS}) == len(SECTIONS)


def test_every_builder_module_answers_a_question_of_the_registry_and_only_they_do() -> None:
    assert {q.build.__module__.rsplit(".", 1)[1] for q in QUESTIONS} == _modules("findings")
    assert len({q.name for q in QUESTIONS}) == len(QUESTIONS)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    copy = tmp_path_factory.mktemp("report") / "run"
    shutil.copytree(ROOT / "tests" / "fixtures" / "run-0.2.0", copy)
    return load_run(copy)


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.title)
def test_a_section_opens_with_its_title(section: Section, run: Run) -> None:
    report = Report(run, baseline=run)
    if not section.applies(report):
        pytest.skip("the fixture run (release 0.2.0) has nothing for this section")
    first = section.blocks(report)[0]
    assert isinstance(first, Heading) and first.level == 2 and first.text.startswith(section.title)


def test_every_finding_of_a_run_answers_a_question_of_the_registry(run: Run) -> None:
    found = for_run(run.groups, run.manifest.get("matrix", {}).get("preset"))
    assert found and {f.question for f in found} <= {q.name for q in QUESTIONS}

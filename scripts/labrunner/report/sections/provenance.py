"""Provenance: where the run came from (host, versions, code, command), and the method in one line."""

from collections.abc import Sequence

from labrunner.report import host_conditions
from labrunner.report.document import Block, Bullets, Heading, Paragraph, table
from labrunner.report.sections.section import Report, Section, always
from labrunner.report.stats import METHOD_LINE, RATIO_METHOD_LINE
from labrunner.results.result import Result

TITLE = "Provenance"


def blocks(report: Report) -> list[Block]:
    run = report.run
    m = run.manifest
    if not m:
        return [Heading(2, TITLE), Paragraph("manifest.json is missing: no provenance for this run.")]
    host, versions, git = m.get("host", {}), m.get("versions", {}), m.get("git", {})
    planned = len(m.get("matrix", {}).get("scenarios", []))
    ok = sum(1 for r in run.results if r.status == "ok")
    state = "complete" if m.get("complete") else "partial (interrupted or still running)"
    memory = host.get("memory_bytes")
    rows = [
        ("run", f"{run.run_id}, preset `{m.get('matrix', {}).get('preset')}`"),
        ("state", f"{state}; {ok} of {len(run.results)} results ok, {planned} scenarios planned"),
        ("started / finished", f"{m.get('started_at')} / {m.get('finished_at') or '-'}"),
        ("backend", f"{m.get('backend', {}).get('name')} ({m.get('backend', {}).get('reason')})"),
        ("git", f"`{git.get('sha')}`" + (" with uncommitted changes" if git.get("dirty") else "")),
        (
            "host",
            f"{host.get('cpu_model')}, "
            f"{host.get('cpus_available')} of {host.get('cpu_count')} CPUs available, "
            + (f"{memory / 2**30:.1f} GiB, " if memory else "")
            + f"kernel {host.get('kernel')}",
        ),
        *host_conditions.fingerprint_rows(m.get("fingerprint")),
        *host_conditions.steal_clock_row(m.get("steal_clock")),
        *((name, str(version)) for name, version in versions.items()),
        *_service_paths(run.results),
        ("command", f"`{' '.join(m.get('argv', []))}`"),
    ]
    notes = sorted({note for r in run.results for note in r.notes})
    shown: list[Block] = [Heading(2, TITLE), table(("", "value"), rows, (False, False))]
    if notes:
        shown += [Paragraph("Conditions noted by the runner:"), Bullets(tuple(notes))]
    shown.append(
        Paragraph(
            f"Statistics over repeats: {METHOD_LINE} {RATIO_METHOD_LINE} Latency is of successful "
            "requests, in ms."
        )
    )
    return shown


def _service_paths(results: Sequence[Result]) -> list[tuple[str, str]]:
    """The services' Python builds and k6's network paths, as the results recorded them."""
    interpreters: set[str] = set()
    paths: set[str] = set()
    for r in results:
        if build := r.interpreter:
            interpreters.add(
                f"{build['implementation']} {build['version']} `{build['executable']}`, optimized: "
                f"{build['optimized']}, libpython {build['libpython']}"
            )
        if r.network_path:
            paths.add(r.network_path)
    rows = [("service interpreter", interpreters), ("k6 to service", paths)]
    return [(name, "; ".join(sorted(values))) for name, values in rows if values]


SECTION = Section(TITLE, always, blocks)

"""`--version` for both entry points: the release (CHANGELOG.md's newest entry, pyproject.toml's
version) and the checkout's git commit."""

import argparse
from collections.abc import Sequence
from typing import Any

from labrunner.paths import REPO, release
from labrunner.results.provenance import git_info


def describe(prog: str) -> str:
    """e.g. "run_matrix.py 0.2.0 (git 1a2b3c4, uncommitted changes)"."""
    version = release()
    git = git_info(REPO)
    if git["sha"] is None:
        return f"{prog} {version} (not a git checkout)"
    state = {True: ", uncommitted changes", False: "", None: ", state unknown"}[git["dirty"]]
    return f"{prog} {version} (git {git['sha'][:7]}{state})"


class ShowVersion(argparse.Action):
    """`--version`: prints describe(prog) and exits; git is asked only when the flag is given."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and git commit, then exit")

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        print(describe(parser.prog))  # on stdout, as argparse's own version action
        parser.exit()

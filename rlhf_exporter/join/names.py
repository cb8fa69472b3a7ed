"""One job name, one job: a job read from a verl file always wins its (project, experiment)
over a pushed one (issue 10). The verl file source `take`s a name when it starts watching a
file and `release`s it when the file's job expires; the push source refuses a name that is
`taken` (409) and, having said it `yields` to files, gives up a pushed job whose name a new
file takes."""

from __future__ import annotations

from typing import Protocol

from .ports import Labels


class Displaceable(Protocol):
    def displace(self, project: str, experiment: str) -> bool:
        """Drop the job of that name; whether there was one."""
        ...


class JobNames:
    """The names the verl files hold (set from the file source's thread, read from the push
    handler's: single set operations, atomic under the GIL)."""

    def __init__(self) -> None:
        self._files: set[Labels] = set()
        self._yielding: list[Displaceable] = []

    def yields(self, source: Displaceable) -> None:
        """`source` gives a name up (`displace`) when a file takes it."""
        self._yielding.append(source)

    def take(self, project: str, experiment: str) -> bool:
        """A file job takes its name (first: a push checks `taken` before it creates a job);
        whether a pushed job of that name was displaced."""
        self._files.add((project, experiment))
        return any([s.displace(project, experiment) for s in self._yielding])

    def release(self, project: str, experiment: str) -> None:
        self._files.discard((project, experiment))

    def taken(self, project: str, experiment: str) -> bool:
        return (project, experiment) in self._files

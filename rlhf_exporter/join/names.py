"""One job name, one job: a job read from a verl file always wins its (project, experiment)
over a pushed one and over one read from a trainer's printed steps (the console source),
and a job read from printed steps wins its name over a pushed one. The verl file source `take`s a name when it starts watching a
file and `release`s it when the file's job expires; the push source refuses a name that is
`taken` (409) and, having said it `yields` to files, gives up a pushed job whose name a new
file takes. The console source `claim`s the names of the jobs it reads (`unclaim` when one
expires), checks `file_holds` before it names a job, and yields to files as push does."""

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
        self._printed: set[Labels] = set()  # jobs read from their printed steps (console)
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
        """Whether a file or a trainer's printed steps hold the name (a push is refused)."""
        return (project, experiment) in self._files or (project, experiment) in self._printed

    def file_holds(self, project: str, experiment: str) -> bool:
        return (project, experiment) in self._files

    def claim(self, project: str, experiment: str, by: Displaceable) -> bool:
        """The console source (`by`) reads a job of this name from its printed steps: a
        pushed job of that name is given up; whether there was one."""
        self._printed.add((project, experiment))
        return any([s.displace(project, experiment) for s in self._yielding if s is not by])

    def unclaim(self, project: str, experiment: str) -> None:
        self._printed.discard((project, experiment))

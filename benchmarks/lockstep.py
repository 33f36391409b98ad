"""Two training runs stepping in turn, one optimizer step each, so that both are timed under the same machine speed.

Why: on the shared machine of BENCHMARKS.md the speed of one core swings by 2x within seconds (a fixed bf16 matmul
took 1.15 ms or 2.2-2.5 ms, switching every few seconds, with this VM idle: another tenant of the host), so two runs
timed one after the other, even in alternating rounds, differ by up to 50% for no reason of their own. Stepping in
turn puts each step of one run beside a step of the other, a few tens of milliseconds apart.

Each run goes in its own thread (a framework's loop, ``Trainer.fit`` or ``Trainer.train``, cannot be paused between
steps from outside), and calls :meth:`Lockstep.begin` at the start of each optimizer step and :meth:`Lockstep.end`
at its end: ``end`` hands the turn over and waits until it comes back, so exactly one run executes at any time (its
untimed work between steps too: the other's Python would otherwise hold the GIL while this one's step is timed).
The runs set up one after the other (Accelerate's process state is a singleton reset by each); the first step goes
to ``first`` once both have reached it. After its last step a run waits for the other's, then both tear down.

    >>> import threading
    >>> lock, seen = Lockstep(["a", "b"], first="b", steps=2), []
    >>> def run(side):
    ...     for _ in range(2):
    ...         lock.begin(side); seen.append(side); lock.end(side)
    >>> t = threading.Thread(target=run, args=("a",)); t.start(); lock.wait_ready("a")
    >>> run("b"); t.join(); seen
    ['b', 'a', 'b', 'a']
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

__all__ = ["Lockstep", "LockstepAborted"]

TIMEOUT_S = 600.0
"""The longest wait for the other run: a step or a setup that takes longer is a hang, reported, not waited out."""


class LockstepAborted(RuntimeError):
    """The other run failed (its error is the row's) or did not come back within :data:`TIMEOUT_S`."""


class Lockstep:
    """The turn between two runs named ``sides`` that take ``steps`` optimizer steps each (module docstring)."""

    def __init__(self, sides: Sequence[str], *, first: str, steps: int) -> None:
        if len(sides) != 2 or first not in sides or sides[0] == sides[1]:
            raise ValueError(f"Lockstep(sides={list(sides)!r}, first={first!r}): give two different names, first being one of them.")
        self.sides, self.first, self.steps = tuple(sides), first, steps
        self.turn: str | None = None  # None until both runs stand at their first step
        self.ready: set[str] = set()
        self.done: set[str] = set()
        self.count = dict.fromkeys(sides, 0)
        self.aborted = False
        self._cond = threading.Condition()

    def _other(self, side: str) -> str:
        return self.sides[1] if side == self.sides[0] else self.sides[0]

    def _wait(self, ready: object) -> None:
        if not self._cond.wait_for(lambda: self.aborted or ready(), timeout=TIMEOUT_S):  # type: ignore[operator]
            self.aborted = True
            self._cond.notify_all()
            raise LockstepAborted(f"the other run did not hand the turn back within {TIMEOUT_S:.0f} s")
        if self.aborted:
            raise LockstepAborted("the other run failed")

    def wait_ready(self, side: str) -> None:
        """Block until ``side`` stands at its first step (its setup done), or failed: the other may then set up."""
        with self._cond:
            self._wait(lambda: side in self.ready)

    def begin(self, side: str) -> None:
        """At the start of ``side``'s optimizer step: wait for its turn (at the first step, for both runs to be ready)."""
        with self._cond:
            if side not in self.ready:
                self.ready.add(side)
                if len(self.ready) == 2:
                    self.turn = self.first
                self._cond.notify_all()
            self._wait(lambda: self.turn == side or self._other(side) in self.done)

    def end(self, side: str) -> None:
        """At the end of ``side``'s optimizer step (its time taken): hand the turn over, and wait until it comes back, or,
        after the last step, until the other run has taken its last too."""
        with self._cond:
            self.count[side] += 1
            self.turn = self._other(side)
            if self.count[side] >= self.steps:
                self.done.add(side)
            self._cond.notify_all()
            if side in self.done:
                self._wait(lambda: len(self.done) == 2)
            else:
                self._wait(lambda: self.turn == side or self._other(side) in self.done)

    def abort(self) -> None:
        """A run failed: release the other (its waits raise :class:`LockstepAborted`)."""
        with self._cond:
            self.aborted = True
            self._cond.notify_all()

"""Inside each checked rank, a thread that watches the run (started by ``Tracer.install``).

- Where the learner's code is: every half second, the line of the learner's file the main
  thread is on, into ``where{R}.json`` (it tells an endless loop from a wait).
- Whether every rank waits: each rank's tracer notes what it waits in (a message, a
  collective, the checker's own barrier between cases), and this thread writes it to
  ``status{R}.json`` every ``WATCH_S``. When every rank of the launch waits, at least one of
  them in the learner's code, and no status has changed for ``STUCK_S``, no message can ever
  arrive: each rank records the deadlock as its error (kind "timeout", as the process
  group's timeout would) and leaves, seconds before that timeout.
  A wait the tracer cannot see (inside torch's DDP, say) still ends with the timeout.
"""

from __future__ import annotations

import json
import linecache
import os
import sys
import threading
import time

from course_lib.runtime.launch_child import leave, write_json_atomic

WATCH_S = 0.25  # how often the statuses are read
WHERE_EVERY_S = 0.5
STUCK_S = 1.5  # every rank waiting, nothing moving, this long: a deadlock
BETWEEN = "between cases"  # the status op of the checker's own barrier


def _read(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def all_waiting(statuses: list[dict]) -> bool:
    """Every rank waits, and not every one of them in the checker's own barrier."""
    return (all(s.get("op") for s in statuses)
            and any(s["op"] != BETWEEN for s in statuses))


class Watch:
    """The watching thread of one rank (``world_size`` ranks in the launch)."""

    def __init__(self, tracer, world_size: int):
        self.tracer, self.world_size = tracer, world_size
        self._main = threading.main_thread().ident
        self._line, self._last_where = None, 0.0
        self._seen, self._since = None, 0.0

    def start(self) -> None:
        threading.Thread(target=self.run, name="watch", daemon=True).start()

    def run(self) -> None:
        while True:
            time.sleep(WATCH_S)
            self.tracer.publish_status()  # what this rank does now, for its peers' watches
            now = time.monotonic()
            if now - self._last_where >= WHERE_EVERY_S:
                self._last_where = now
                self.where()
            if self.stuck(now):
                self.end_deadlocked()

    def where(self) -> None:
        tracer = self.tracer
        if tracer.log is None:
            return
        frame = tracer.learner_frame(sys._current_frames().get(self._main))
        line = None if frame is None else frame.f_lineno
        if line != self._line:
            self._line = line
            source = "" if line is None else linecache.getline(tracer.learner_file, line)
            write_json_atomic(tracer.where_path, {"line": line, "source": source.strip(),
                                                  "case": tracer.case, "time": time.time()})

    def stuck(self, now: float) -> bool:
        """Whether every rank has waited, nothing changing, for ``STUCK_S``."""
        folder = os.path.dirname(self.tracer.status_path)
        statuses = [_read(os.path.join(folder, f"status{r}.json"))
                    for r in range(self.world_size)]
        if not all_waiting(statuses):
            self._seen = None
            return False
        seen = tuple(s.get("time") for s in statuses)
        if seen != self._seen:
            self._seen, self._since = seen, now
        return now - self._since >= STUCK_S

    def end_deadlocked(self) -> None:
        """Record the deadlock as this rank's error, then leave (every rank does alike)."""
        tracer, report = self.tracer, self.tracer.report
        if report is not None:
            status = tracer.last
            report["error"] = {"kind": "timeout", "type": "Deadlock", "line": status.get("line"),
                               "message": f"every rank waited {STUCK_S:g} s, none moving",
                               "source": "", "function": "", "case": report.get("case"),
                               "status": status}
            write_json_atomic(os.path.join(os.path.dirname(tracer.status_path),
                                           f"result{tracer.rank}.json"),
                              {**report, "finished": True})
        leave(0)

"""Checkers that launch the learner's own file (``workspace/NAME.py``) on several processes.

The pieces, in the order a check goes through them:

- ``learner``: the file exists, parses and defines the functions (before any launch); inside
  the run, import it by path and describe an exception by the learner's own line.
- ``runner``: launch ``program`` quietly on N processes with a short process-group timeout,
  then read each rank's files from the run folder (``prelaunch``: the tests run several files
  in one launch, each as if alone, and the checker reads each one's run).
- ``program``: inside each rank: join the group, install the ``tracer``, run every case of an
  exercise's cases module, write ``result{R}.json`` after each case.
- ``tracer``: wraps torch.distributed's calls: status files (who waits on whom), bytes and
  messages sent, collectives called, handles never waited on; ``groups``, its checks of the
  peer and the group each call names.
- ``verdict``: not done, a learner's exception, a deadlock, a message too big for its buffer,
  time out; ``harness.check_file`` ties it all together, one launch per world size.

An exercise is one *cases module* in ``course_lib.check.cases`` (``ring``, ``zero2``, ...):
what each rank runs, its judge, its advice and explanations, declared as a
``harness.FileExercise`` that its entry point in ``check.nbNN`` hands to
``harness.check_exercise`` (see ``course_lib/check/cases/__init__.py``).
"""

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
  messages sent, collectives called, handles never waited on.
- ``verdict``: not done, a learner's exception, a deadlock, a message too big for its buffer,
  time out; ``harness.check_file`` ties it all together, one launch per world size.

An exercise adds one *cases module* in ``course_lib.check.cases`` (``token_ring_cases``,
``ring_cases``) with

    case_specs(world_size, options) -> [{"name": ..., "ranks": K, ...}, ...]
    run_case(learner_module, spec, group, tracer, options) -> JSON summary incl. "name", "ranks"

(``ranks`` < world size: the case gets a group of ranks 0 .. K-1; the others sit it out), and
a judge in its ``check.nbNN`` module that raises ``ExerciseError`` for a wrong summary.
"""

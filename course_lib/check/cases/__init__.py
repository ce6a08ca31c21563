"""The cases of each exercise that launches the learner's file, one module per exercise:
what ``course_lib.check.mp``'s program runs in every rank, and what the exercise's checker
(``course_lib.check.nbNN``) judges. The engine that launches, traces and reads them is
``course_lib.check.mp``; a module here provides

    case_specs(world_size, options) -> [{"name": ..., "ranks": K, ...}, ...]
    run_case(learner_module, spec, group, tracer, options) -> JSON summary incl. "name", "ranks"

- ``token_ring_cases`` (5.3, 5.4), ``ring_cases`` with ``ring_mistakes`` (6.3: a ring
  simulated step by step to name a learner's mistake), ``dp_step_cases`` (7.3),
  ``hook_cases`` (8.3), ``ddp_script_cases`` (9.3), ``zero_cases`` (10.4),
  ``bf16_hook_cases`` (10.5), ``zero2_cases`` (10.6), ``shard_unit_cases`` (10.7),
  ``capstone_cases`` (11.1).

A case that finds the learner's code left what it cannot go on with raises
``course_lib.check.mp.learner.CaseFinding``: its message is the checker's verdict.
"""

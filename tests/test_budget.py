"""The capstone's budget (course_lib/lessons/budget.py, notebook 11, section 4): plans priced
with the course's own models, and no plan that wins through the model's artefacts.

Time: compute measured on the course's CPU, every collective priced by the alpha-beta model of
notebook 05 (a ring all-reduce: 2(N-1) alphas + 2(N-1)/N bytes x beta; a reduce-scatter or an
all-gather: half), buckets of whole tensors as make_buckets plans them, overlap only for what
starts before backward ends, ZeRO-1's collectives after backward as Zero1.step runs them.
Memory: notebook 02's measured parts divided as each ZeRO stage says.
"""

import math
import random
from itertools import pairwise

import pytest
import torch

from course_lib.core.buckets import make_buckets
from course_lib.lessons import budget, capstone
from course_lib.lessons.budget import Budget, Machine, Plan
from course_lib.lessons.capstone import KIB

M = Machine()
ALPHA, BETA = M.link.alpha_s * 1e3, M.link.beta_s_per_byte * 1e3  # ms, ms per byte
GRADS = sum(capstone.gradient_bytes())
ONE_BUCKET = budget.DDP_CAP_KIB  # DDP's 25 MB: every gradient in one bucket


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """As the notebooks run (setup_notebook): two threads on a busy 2-core machine crawl."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def ring_ms(nbytes: float, n: int) -> float:
    """The ring all-reduce on the model, written out: 2(N-1) alphas + 2(N-1)/N bytes x beta."""
    return 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * nbytes * BETA


def comm_events(plan: Plan) -> list[dict]:
    return [e for e in budget.timeline(plan) if e["kind"] == "comm"]


def backward_end_s(plan: Plan) -> float:
    return max(e["end_s"] for e in budget.timeline(plan) if e["kind"] == "compute")


def never_rises(values: list[float]) -> bool:
    return all(a >= b - 1e-9 for a, b in pairwise(values))


def sweep_caps_kib() -> list[float]:
    """From far below the smallest gradient (56 bytes) to far above all of them (104 KiB):
    a geometric ladder, random caps, and a byte short of each cut the search tries."""
    ladder = [0.01 * 1.6 ** i for i in range(25)]  # 0.01 KiB .. about 800 KiB
    rng = random.Random(0)
    randoms = [rng.uniform(0.01, 2 * GRADS / KIB) for _ in range(15)]
    just_under = [c - 1 / KIB for c in budget.distinct_caps_kib()[1:]]  # a byte short of a cut
    return ladder + randoms + just_under


# ---- buckets: whole tensors, as make_buckets plans them ----------------------------------------


@pytest.mark.parametrize("cap_kib", [0.05, 2, 16, 50, 103.8, ONE_BUCKET])
def test_buckets_hold_whole_tensors_as_make_buckets_plans_them(cap_kib):
    params = list(capstone.trainer_model().parameters())[::-1]  # last layer first, as DDP
    theirs = make_buckets(params, bucket_cap_mb=cap_kib / 1024)
    assert budget.buckets(cap_kib) == tuple(b.buffer.numel() * 4 for b in theirs)


def test_every_cap_cuts_as_one_of_the_caps_the_search_tries():
    caps = budget.distinct_caps_kib()
    cuts = [budget.buckets(c) for c in caps]
    assert len(set(cuts)) == len(caps) and cuts[0] == budget.buckets(1e-6)
    for cap in sweep_caps_kib():
        below = max((c for c in caps if c <= cap), default=caps[0])
        assert budget.buckets(cap) == budget.buckets(below), cap
    counts = [len(budget.buckets(c)) for c in sorted(sweep_caps_kib())]
    assert never_rises(counts)  # a bigger cap: no more buckets


# ---- time: the ring on the model, overlap only before backward ends ---------------------------


@pytest.mark.parametrize("n", [2, 4, 8])
def test_each_bucket_costs_the_ring_on_the_model(n):
    for cap in (2, 20, ONE_BUCKET):
        plan = Plan(32 // n, 1, n, cap, 0)
        costs = [ring_ms(b, n) for b in budget.buckets(cap)]
        events = comm_events(plan)
        assert [1e3 * (e["end_s"] - e["start_s"]) for e in events] == pytest.approx(costs)
        assert budget.step_ms(plan)["link busy"] == pytest.approx(sum(costs))
        assert budget.step_ms(plan)["sent KiB"] == pytest.approx(2 * (n - 1) / n * GRADS / KIB)


def test_overlap_hides_only_what_starts_before_backward_ends():
    for cap in budget.distinct_caps_kib():
        plan = Plan(8, 1, 4, cap, 0)
        ms, events, end = budget.step_ms(plan), comm_events(plan), backward_end_s(plan)
        sizes = budget.buckets(cap)
        made = [sum(sizes[:i + 1]) / GRADS * end for i in range(len(sizes))]  # even pace
        assert all(e["start_s"] >= t - 1e-12 for e, t in zip(events, made, strict=True))
        assert events[-1]["start_s"] >= end  # the bucket filled last waits for backward's end
        assert ring_ms(sizes[-1], 4) - 1e-9 <= ms["communication"] <= ms["link busy"] + 1e-9
    one = budget.step_ms(Plan(8, 1, 4, ONE_BUCKET, 0))
    assert one["communication"] == pytest.approx(one["link busy"])  # one bucket: nothing hides
    assert one["link busy"] == pytest.approx(ring_ms(GRADS, 4))


def test_a_single_process_pays_no_communication():
    for stage in budget.STAGES:
        for cap in (0.05, ONE_BUCKET):
            plan = Plan(4, 8, 1, cap, stage)
            assert budget.step_ms(plan)["communication"] == budget.step_ms(plan)["link busy"] == 0
            assert set(budget.memory_kib(plan)) == {"parameters", "gradients", "optimizer state",
                                                    "activations", "total"}


def test_compute_is_the_micro_steps_one_after_the_other_then_the_optimizer():
    for b, k, n in ((1, 32, 1), (4, 2, 4), (8, 1, 4), (4, 1, 8)):
        per_micro = (M.forward_ms + M.backward_ms
                     + (M.forward_ms_per_example + M.backward_ms_per_example) * b)
        for stage in budget.STAGES:
            compute = budget.step_ms(Plan(b, k, n, 20, stage))["compute"]
            assert compute == pytest.approx(k * per_micro + M.optimizer_ms)


def test_zero1_communicates_after_backward_as_zero1_step_does():
    plan = Plan(8, 2, 4, 20, 1)
    events, end = comm_events(plan), backward_end_s(plan)
    assert [e["name"] for e in events] == [
        "all-reduce which gradients exist", "reduce-scatter gradients", "all-reduce gradient norm",
        "all-gather parameters"]
    assert all(e["start_s"] >= end for e in events)  # nothing overlaps backward
    costs = [ring_ms(4 * len(capstone.gradient_bytes()), 4), ring_ms(GRADS, 4) / 2,
             ring_ms(8, 4), ring_ms(GRADS, 4) / 2]  # one int32 per tensor; one float64
    ms = budget.step_ms(plan)
    assert ms["communication"] == pytest.approx(sum(costs)) == pytest.approx(ms["link busy"])
    assert budget.step_ms(Plan(8, 2, 4, 0.05, 1)) == ms  # no buckets: Zero1 has one flat vector


def collectives(plan: Plan) -> list[str]:
    """The names of the step's collectives, in launch order."""
    return [e["name"] for e in budget.timeline(plan, whole_step=True) if e["kind"] == "comm"]


def test_zero2_reduce_scatters_in_every_backward_the_bytes_of_data_parallel():
    cut = len(budget.buckets(20))
    for k in (1, 2):
        plan = Plan(16 // k, k, 2, 20, 2)
        names = collectives(plan)
        assert names == k * [f"reduce-scatter bucket {i}" for i in range(cut)] + [
            f"all-gather bucket {i}" for i in range(cut)]  # Zero2.step: one per bucket
        plain = budget.step_ms(Plan(16, 1, 2, 20, 0))["sent KiB"]
        assert budget.step_ms(plan)["sent KiB"] == pytest.approx(plain * (k + 1) / 2)
    steps = budget.timeline(Plan(16, 1, 2, 20, 2), whole_step=True)
    optimizer = next(e for e in steps if e["name"] == "optimizer")
    assert all(e["start_s"] >= optimizer["end_s"] for e in steps if "all-gather" in e["name"])


def test_zero3_gathers_in_forward_and_backward_one_and_a_half_times_the_bytes():
    plan, plain = Plan(8, 1, 4, ONE_BUCKET, 3), Plan(8, 1, 4, ONE_BUCKET, 0)
    assert budget.step_ms(plan)["sent KiB"] == pytest.approx(
        1.5 * budget.step_ms(plain)["sent KiB"])
    names = collectives(plan)
    assert names == [  # each gather launched as the module before it starts (prefetch)
        "all-gather root (forward)", "all-gather block 0 (forward)",
        "all-gather block 1 (forward)", "all-gather root (backward)",
        "all-gather block 1 (backward)", "all-gather block 0 (backward)",
        "reduce-scatter block 1", "reduce-scatter block 0", "reduce-scatter root"]
    assert collectives(Plan(4, 2, 4, ONE_BUCKET, 3)) == 2 * names  # each micro-step again


def test_time_grows_with_alpha_beta_and_compute_and_more_processes_compute_less():
    slower = [Machine(link=budget.AlphaBeta(2 * M.link.alpha_s, M.link.beta_s_per_byte)),
              Machine(link=budget.AlphaBeta(M.link.alpha_s, 2 * M.link.beta_s_per_byte)),
              Machine(forward_ms=2 * M.forward_ms), Machine(backward_ms=2 * M.backward_ms),
              Machine(optimizer_ms=2 * M.optimizer_ms)]
    for plan in budget.every_plan(Budget(machine=Machine(max_nproc=8)))[::7]:
        base = budget.step_ms(plan)["total"]
        assert all(budget.step_ms(plan, m)["total"] >= base - 1e-9 for m in slower), plan
    for b in (1, 2, 4):
        compute = [budget.step_ms(Plan(b, 32 // (n * b), n))["compute"] for n in (1, 2, 4, 8)]
        assert compute == sorted(compute, reverse=True)
    for n in (2, 4, 8):  # a ring on more processes pays more latencies, never fewer
        assert ring_ms(GRADS, n) < ring_ms(GRADS, 2 * n)


def test_a_longer_backward_hides_as_much_or_more():
    for cap in budget.distinct_caps_kib()[::3]:
        plan = Plan(8, 1, 4, cap, 0)
        exposed = [budget.step_ms(plan, Machine(backward_ms=ms))["communication"]
                   for ms in (0.5, 1.3, 3.0, 10.0)]
        assert never_rises(exposed), cap


def test_bigger_caps_put_less_on_the_link_for_the_same_bytes():
    caps = sorted(c for c in sweep_caps_kib() if c > 0)
    for n in (2, 4, 8):
        busy = [budget.step_ms(Plan(32 // n, 1, n, c, 0))["link busy"] for c in caps]
        assert never_rises(busy)
        sent = {round(budget.step_ms(Plan(32 // n, 1, n, c, 0))["sent KiB"], 6) for c in caps}
        assert len(sent) == 1


# ---- the challenge: more than one good answer ----------------------------------------------

def test_the_challenge_leaves_more_than_one_split_that_fits():
    """11.2 is a choice of split, not only of ZeRO stage and bucket cap: of every plan the
    checker accepts (tried one by one), at least two splits of the global batch (processes x
    accumulation steps x micro-batch) have plans that fit both caps, and each split's plans are
    the fitting plans of that split, each keeping the recipe."""
    challenge = Budget()
    families = budget.splits_that_fit(challenge)
    print({split: len(plans) for split, plans in families.items()})
    assert len(families) >= 2
    every = budget.every_plan(challenge)
    for (n, k, m), plans in families.items():
        assert n * k * m == challenge.global_batch
        same_split = [p for p in every if (p.nproc, p.accum_steps, p.micro_batch) == (n, k, m)]
        assert plans == [p for p in same_split if not budget.verdict(p, challenge)]
    others = [p for p in every if (p.nproc, p.accum_steps, p.micro_batch) not in families]
    assert others and all(budget.verdict(p, challenge) for p in others)


# ---- no plan wins through an artefact ------------------------------------------------------


@pytest.mark.parametrize("max_nproc", [4, 8])
def test_no_cap_or_world_size_beats_the_fastest_plan(max_nproc):
    challenge = Budget(machine=Machine(max_nproc=max_nproc))
    best = budget.fastest_plan(challenge)
    best_s = budget.run_seconds(best, challenge)
    assert not budget.verdict(best, challenge)
    swept = []
    for n in (1, 2, 4, 8):
        for micro in (m for m in range(1, 33) if 32 % (n * m) == 0):
            for stage in (0, 1, 2, 3) if n > 1 else (0,):
                caps = sweep_caps_kib() if stage in (0, 2) and n > 1 else [ONE_BUCKET]
                swept += [Plan(micro, 32 // (n * micro), n, c, stage) for c in caps]
    fitting = [p for p in swept if not budget.verdict(p, challenge)]
    assert all(budget.run_seconds(p, challenge) >= best_s - 1e-12 for p in fitting)
    winner = min(fitting, key=lambda p: budget.run_seconds(p, challenge))
    assert budget.run_seconds(winner, challenge) == pytest.approx(best_s, abs=1e-12)
    assert budget.buckets(winner.bucket_kib) == budget.buckets(best.bucket_kib)
    refused = [p for p in swept if p.nproc > max_nproc]
    assert all("the machine runs at most" in budget.verdict(p, challenge)[0] for p in refused)


def test_a_cap_just_under_the_gradients_does_not_beat_one_bucket():
    just_under = max(c for c in budget.distinct_caps_kib() if c < GRADS / KIB)
    for stage in (0, 2):
        one = budget.step_ms(Plan(8, 1, 4, ONE_BUCKET, stage))["total"]
        assert budget.step_ms(Plan(8, 1, 4, just_under, stage))["total"] > one


# ---- memory: the table of notebook 10, divided as each stage says -----------------------------


def test_each_stage_divides_its_parts_and_keeps_its_buffers():
    measured = {k: v / KIB for k, v in capstone.memory_per_process(4).items()}
    n = 4
    kib = {s: budget.memory_kib(Plan(4, 2, n, ONE_BUCKET, s)) for s in budget.STAGES}
    divided = {0: (1, 1, 1), 1: (1, 1, n), 2: (1, n, n), 3: (n, n, n)}  # params, grads, state
    for stage, by in divided.items():
        for part, d in zip(("parameters", "gradients", "optimizer state"), by, strict=True):
            assert kib[stage][part] == pytest.approx(measured[part] / d)
        assert kib[stage]["activations"] == measured["activations"]
        assert kib[stage]["total"] == pytest.approx(
            sum(v for k, v in kib[stage].items() if k != "total"))
    assert kib[0]["buckets"] == kib[1]["flat gradient"] == GRADS / KIB  # a copy of each grad
    assert kib[2]["buckets in flight"] == GRADS / KIB  # one bucket: all of it, for a while
    units = dict(capstone.shard_units())  # the root, then the blocks
    gathered = units["root"] + 2 * units["block 1"] + units["block 1"]  # prefetch; a gradient
    assert kib[3]["gathered modules"] == gathered / KIB
    totals = [kib[s]["total"] for s in budget.STAGES]
    assert totals == sorted(totals, reverse=True)  # each stage holds less than the one before


def test_zero2_holds_the_buckets_that_wait_for_the_link():
    tiny, one = (budget.memory_kib(Plan(8, 1, 4, c, 2))["buckets in flight"]
                 for c in (0.05, ONE_BUCKET))
    assert 0 < tiny < one == GRADS / KIB


# ---- the judge: every part, the cause, never the plan ---------------------------------------


def test_the_judge_names_each_memory_part_and_what_it_is():
    plan = Plan(8, 1, 4, 20, 0)
    (line,) = budget.verdict(plan, Budget())
    for words in ("956 KiB per process, 56 KiB over the 900 KiB cap",
                  "activations 437 KiB (8 examples at a time)",
                  "optimizer state 208 KiB (whole on each process)",
                  "buckets 104 KiB (DDP's copy of every gradient)"):
        assert words in line, line
    assert "time:" not in line and "zero_stage" not in line and "Plan(" not in line


def test_the_judge_names_the_part_of_the_time_that_takes_it_over():
    (compute,) = budget.verdict(Plan(4, 8, 1), Budget())
    assert "the compute alone is over the cap" in compute and "8 micro-steps of 4" in compute
    (waiting,) = budget.verdict(Plan(8, 1, 4, 0.05, 2), Budget())
    assert "the compute fits, the communication it does not hide takes it over" in waiting
    ms = budget.step_ms(Plan(8, 1, 4, 0.05, 2))
    assert f"communication not hidden by compute {ms['communication'] / 10:.2f} s" in waiting


def test_describe_gives_every_part_of_memory_and_time():
    memory, time = budget.describe(Plan(4, 2, 4, 20, 3), Budget())
    for part in ("parameters", "gradients", "optimizer state", "activations",
                 "gathered modules"):
        assert part in memory
    assert "compute" in time and "communication not hidden by compute" in time


def test_plans_are_priced_with_any_machines_figures():
    mine = capstone.measure_compute(sizes=(1, 4), repeats=2)
    assert set(mine) == set(Machine.__dataclass_fields__) - {"link", "max_nproc"}
    machine = Machine(link=budget.AlphaBeta(50e-6, 1e-9), **mine)
    ms = budget.step_ms(Plan(8, 1, 4), machine)
    assert math.isfinite(ms["total"]) and ms["total"] >= ms["compute"]


# ---- notebook 11, section 4: the claims its cells assert -------------------------------------


def test_notebook_claims_the_gradients_all_reduce_is_mostly_latency():
    latency, bytes_part = 6 * ALPHA, 1.5 * GRADS * BETA  # 4 processes
    assert latency > 5 * bytes_part
    assert GRADS < M.link.half_bandwidth_bytes  # below alpha / beta


def test_notebook_claims_about_the_three_caps():
    ms = {c: budget.step_ms(Plan(4, 2, 4, c, 0)) for c in (ONE_BUCKET, 20, 1)}
    latency = 6 * ALPHA  # 4 processes: 2(N-1) alphas
    assert [len(budget.buckets(c)) for c in ms] == [1, 6, 19]
    assert ms[ONE_BUCKET]["communication"] == pytest.approx(ms[ONE_BUCKET]["link busy"])
    assert latency < ms[20]["communication"] < 1.1 * latency
    assert ms[ONE_BUCKET]["communication"] < 1.2 * ms[20]["communication"]
    assert ms[1]["link busy"] > M.backward_ms + 4 * M.backward_ms_per_example  # > backward
    assert ms[1]["communication"] > 10 * ms[20]["communication"]


def test_notebook_claims_about_the_stages_on_one_split():
    plans = {s: Plan(4, 2, 4, ONE_BUCKET, s) for s in budget.STAGES}
    ms = {s: budget.step_ms(p) for s, p in plans.items()}
    kib = [budget.memory_kib(p)["total"] for p in plans.values()]
    assert kib == sorted(kib, reverse=True)  # each stage holds less than the one before
    sent = [ms[s]["sent KiB"] for s in plans]
    assert sent[0] < sent[1] < 1.01 * sent[0]  # the same bytes, plus two small all-reduces
    assert sent[2] == pytest.approx(1.5 * sent[0])  # reduce-scatters in both micro-steps
    assert sent[3] == pytest.approx(3 * sent[0])  # 1.5 x per micro-step, twice
    assert ms[2]["total"] == pytest.approx(ms[0]["total"])  # as fast as plain data parallel
    assert ms[0]["total"] < min(ms[1]["total"], ms[3]["total"])
    assert max(ms.values(), key=lambda m: m["communication"]) is ms[3]


def test_notebook_claims_two_plans_miss():
    alone, two = (budget.verdict(p, Budget()) for p in (Plan(4, 8, 1), Plan(8, 2, 2)))
    assert "the compute alone is over the cap" in alone[0] and len(alone) == 1
    assert len(two) == 1  # 2 processes of micro-batch 8: fast enough, too big
    assert two[0].startswith("memory") and "whole on each process" in two[0]

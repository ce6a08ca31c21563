"""Exercise 6.3: the learner's ring all-reduce in workspace/my_ring.py, launched on 2, 3 and 4
processes. Other right rings pass too (another chunk cut, another way to start the messages,
ranks that finish another chunk); each realistic wrong one, an edit of the notebook's answer,
gets the hint that names its mistake and no other."""

import pytest
from answer_edits import edited, reference, skeleton
from check_reports import file_hint
from shared_launch import share_launches

from course_lib.check import nb06
from course_lib.runtime.workspace import has_passed

pytestmark = pytest.mark.slow

RING = "my_ring.py"
EXCHANGE = """\
        sending = dist.isend(send_chunk, dst=right, group=group)
        receiving = dist.irecv(recv_into, src=left, group=group)
        sending.wait()
        receiving.wait()
"""
RS_SENDS = "exchange(chunks[(rank - step - 1) % n], incoming)"
RS_KEEPS = "mine = chunks[(rank - step - 2) % n]"
AG_STEP = "        exchange(chunks[(rank - step) % n], chunks[(rank - step - 1) % n])\n"
BOTH_PHASES = ("    # Reduce-scatter", AG_STEP)  # from the first comment to the last step: the ring


def between(first: str, last: str) -> str:
    """The reference's text from ``first`` to the end of ``last``."""
    text = reference(RING)
    start = text.index(first)
    return text[start:text.index(last, start) + len(last)]


CUT = between("    chunks = torch.tensor_split", "\n")  # the whole line

RIGHT = {  # other correct rings: (the world sizes launched, the edits)
    "the larger chunks last": ((4,), [(CUT, """\
    base, extra = divmod(flat.numel(), n)
    sizes = [base + (c >= n - extra) for c in range(n)]  # the larger chunks last
    chunks = torch.split(flat, sizes)
""")]),
    "batch_isend_irecv": ((3,), [(EXCHANGE, """\
        messages = [dist.P2POp(dist.isend, send_chunk, right, group),
                    dist.P2POp(dist.irecv, recv_into, left, group)]
        for handle in dist.batch_isend_irecv(messages):
            handle.wait()
""")]),
    "ranks that finish chunk r + 1": ((2,), [
        (RS_KEEPS, "mine = chunks[(rank - step - 1) % n]"),
        (RS_SENDS, "exchange(chunks[(rank - step) % n], incoming)"),
        (AG_STEP, "        exchange(chunks[(rank - step + 1) % n], chunks[(rank - step) % n])\n")]),
}


# (the world sizes that show it: none when it is refused before any launch, the edits,
#  words only its hint holds)
WRONG = {
    "the mean": ((2,), [("    return tensor\n",
                         "    tensor /= n  # the mean, as data parallelism wants\n"
                         "    return tensor\n")],
                 "every rank holds the sum divided by N, the mean"),
    "no all-gather": ((2,), [(between("    # All-gather", AG_STEP), "")],
                      "the reduce-scatter is done, but not the all-gather"),
    "replaces instead of adding": ((2,), [("mine += incoming", "mine.copy_(incoming)")],
                                   "replaces its chunk with the incoming one instead of adding"),
    "the all-gather adds": ((2,), [(AG_STEP, """\
        incoming = torch.empty_like(chunks[(rank - step - 1) % n])
        exchange(chunks[(rank - step) % n], incoming)
        chunks[(rank - step - 1) % n].add_(incoming)
""")], "the all-gather adds what arrives to the receiver's copy"),
    "sends chunk r - s": ((3,), [(RS_SENDS, "exchange(chunks[(rank - step) % n], incoming)")],
                          "in the reduce-scatter, rank r sends chunk (r - s) % N but adds what "
                          "arrives into chunk (r - s - 2) % N"),
    "no copy back": ((2,), [(between("    if flat.data_ptr()", "(tensor.shape))\n"), "")],
                     "a non-contiguous tensor came back unchanged"),
    "the whole tensor every step": ((2,), [
        (between("        incoming = torch.empty_like(mine)", "so far\n"),
         "        incoming = torch.empty_like(flat)  # the whole tensor from the left\n"
         "        exchange(flat, incoming)\n"
         "        mine += torch.tensor_split(incoming, n)[(rank - step - 2) % n]\n"),
        (AG_STEP, "        incoming = torch.empty_like(flat)\n"
                  "        exchange(flat, incoming)\n"
                  "        c = (rank - step - 1) % n\n"
                  "        chunks[c].copy_(torch.tensor_split(incoming, n)[c])\n")],
        "the whole tensor in every step"),
    "torch.chunk": ((2,), [("torch.tensor_split(flat, n)", "flat.chunk(n)")],
                    "torch.chunk can return fewer than N chunks"),
    "blocking sends first": ((2,), [(EXCHANGE, """\
        dist.send(send_chunk, dst=right, group=group)
        dist.recv(recv_into, src=left, group=group)
""")], "every rank sends before any receives"),
    "receives from the right": ((3,), [("src=left", "src=right")],
                                "but not from the rank that sends to it"),
    "a float32 buffer": ((2,), [("torch.empty_like(mine)", "torch.empty(mine.shape)")],
                         "or the buffer has another dtype than the tensor"),
    "dist.all_reduce": ((), [(between(*BOTH_PHASES), "    dist.all_reduce(flat, group=group)\n")],
                        "ring_all_reduce calls dist.all_reduce"),
    "the library's ring": ((), [
        ("import torch.distributed as dist\n", "import torch.distributed as dist\n"
         "from course_lib.core.collectives import ring_all_reduce as library_ring\n"),
        (between(*BOTH_PHASES), "    library_ring(flat, group)\n")],
        "ring_all_reduce calls the library's ring_all_reduce"),
}


def line_of(text: str, words: str) -> int:
    return next(i for i, line in enumerate(text.split("\n"), 1) if words in line)


def hint_of(workspace, mistake: str) -> str:
    """The hint the answer with ``mistake`` gets on the fewest processes that show it, after
    asserting that it names that mistake and no other of ``WRONG``."""
    world_sizes, edits, words = WRONG[mistake]
    path = workspace.put(edited(reference(RING), edits), RING)
    hint = file_hint(nb06.my_ring, path, world_sizes=world_sizes or (2,))
    assert words in hint, hint
    assert not [w for *_, w in WRONG.values() if w != words and w in hint], hint
    return hint


@pytest.fixture(scope="module", autouse=True)
def shared_launches():
    """One launch per world size for the answers that run to the end (shared_launch.py)."""
    ring = reference(RING)
    answers = [(ring, 3), *((edited(ring, edits), sizes[0]) for sizes, edits in RIGHT.values())]
    answers += [(edited(ring, WRONG[name][1]), WRONG[name][0][0]) for name in (
        "no all-gather", "replaces instead of adding", "the all-gather adds", "no copy back",
        "the whole tensor every step")]
    share_launches(nb06.RING_CASES, RING, answers)


def test_the_reference_passes_and_is_recorded(workspace, capsys):
    """On 3 processes (an odd ring); the notebook's own checker cell, which nbval runs, checks
    it on 2, 3 and 4."""
    path = workspace.put(reference(RING), RING)
    nb06.my_ring(path, world_sizes=(3,))
    assert capsys.readouterr().out == "Exercise 6.3: correct.\n"
    assert has_passed("6.3", path)


@pytest.mark.parametrize("name", RIGHT)
def test_another_right_ring_passes(workspace, capsys, name):
    world_sizes, edits = RIGHT[name]
    path = workspace.put(edited(reference(RING), edits), RING)
    nb06.my_ring(path, world_sizes=world_sizes)
    assert capsys.readouterr().out == "Exercise 6.3: correct.\n"
    assert has_passed("6.3", path)


def test_the_skeleton_is_not_done_yet_without_a_launch(workspace, capsys):
    nb06.my_ring(workspace.put(skeleton(RING), RING))
    assert "Exercise 6.3: not done yet" in capsys.readouterr().out


CLOSER = {"sends chunk r - s", "no copy back", "the whole tensor every step", "torch.chunk",
          "blocking sends first", "receives from the right", "a float32 buffer"}


@pytest.mark.parametrize("mistake", [m for m in WRONG if m not in CLOSER])
def test_a_wrong_ring_is_named(workspace, mistake):
    hint = hint_of(workspace, mistake)
    world_sizes = WRONG[mistake][0]
    if world_sizes:
        assert f"launched on {world_sizes[0]} processes" in hint, hint
    else:  # a collective or the library's ring is refused before any launch
        assert "launched" not in hint, hint


def test_an_index_one_off_names_both_indices_of_the_learner(workspace):
    hint = hint_of(workspace, "sends chunk r - s")
    assert "that is not the chunk its left neighbour sent in the same step" in hint
    assert "(r - s - 1)" not in hint  # the right index is the learner's to find


def test_a_non_contiguous_tensor_must_get_the_result_back(workspace):
    hint = hint_of(workspace, "no copy back")
    assert "case: a transposed (non-contiguous) float32 view" in hint
    assert "copy_" not in hint


def test_sending_the_whole_tensor_every_step_is_counted_in_bytes(workspace):
    hint = hint_of(workspace, "the whole tensor every step")
    numel, size = 12, 4  # the first case: 12 float32 numbers, on 2 ranks
    assert hint.startswith(f"each rank sent {2 * numel * size} bytes for a "
                           f"{numel * size}-byte tensor"), hint


def test_torch_chunk_runs_out_of_chunks(workspace):
    hint = hint_of(workspace, "torch.chunk")
    assert "IndexError: tuple index out of range" in hint
    assert "fewer than the 2 ranks" in hint
    assert "tensor_split" not in hint


def test_blocking_sends_first_deadlock_names_the_ranks(workspace):
    hint = hint_of(workspace, "blocking sends first")
    line = line_of(edited(reference(RING), WRONG["blocking sends first"][1]), "dist.send(")
    assert (f"rank 0 is blocked in send to rank 1 (line {line}), rank 1 in send to rank 0 "
            f"(line {line})") in hint, hint
    assert "each rank's receive must already be under way" in hint


def test_a_receive_from_the_wrong_neighbour_is_named_as_such(workspace):
    hint = hint_of(workspace, "receives from the right")
    line = line_of(reference(RING), "sending.wait()")
    assert (f"rank 0 is blocked waiting for its isend to rank 1 (line {line}), rank 1 waiting "
            f"for its isend to rank 2 (line {line})") in hint, hint
    assert "rank 0 sends to rank 1, which receives from rank 2" in hint
    assert "every rank sends before any receives" not in hint


def test_a_receive_buffer_of_another_dtype_is_named(workspace):
    hint = hint_of(workspace, "a float32 buffer")
    assert "was ended by Gloo" in hint and "float64" in hint, hint

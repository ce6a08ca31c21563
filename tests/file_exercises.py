"""Every file exercise's answers, as edits of the notebook's own file (``answer_edits``): one
entry per exercise drives the five tests of tests/test_check_file_exercises.py for all of them
(and scripts/bench_checkers.py's timings).

    Exercise(checker, "my_ring.py", right={name: Right(size, edits)},
             wrong={name: Wrong(edits, words, size)}, library={name: Wrong(...)})

A wrong answer's ``words`` are what its hint must say (``{line:TEXT}``: the number of the line
that holds TEXT first); the words of the exercise's other answers must not appear in it (a hint
names its own mistake, no other), nor its ``never`` (what would give the answer away).
``size``: the world size that shows it, None when it is refused before any launch; ``shared``:
every case runs to the end (the mistake is in the values), so it shares one launch per world
size with the others (tests/shared_launch.py). ``library`` answers call the course's (or
torch's) own solution and are refused by reading the file. ``DEADLOCK`` names, per exercise, the
wrong answer whose ranks wait on each other forever (the benchmark times its verdict).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from answer_edits import reference

from course_lib.check import nb05, nb06, nb07, nb08, nb09, nb10, nb10b, nb11
from course_lib.check.cases import bf16_hook, capstone
from course_lib.check.mp.harness import DECLARED


@dataclass(frozen=True)
class Right:
    size: int  # the world size it is launched on
    edits: list = field(default_factory=list)
    prints: tuple = ()  # lines the checker prints before "correct"
    shared: bool = True


@dataclass(frozen=True)
class Wrong:
    edits: list
    words: str | tuple
    size: int | None = 2
    shared: bool = False
    never: tuple = ()

    @property
    def said(self) -> tuple:
        return (self.words,) if isinstance(self.words, str) else self.words


@dataclass(frozen=True)
class Exercise:
    checker: Callable  # check.nbNN.my_x, what the notebook calls
    file: str  # workspace/FILE
    right: dict
    wrong: dict
    library: dict
    reference_size: int = 3  # the world size the reference is launched on
    prints: tuple = ()  # what the reference's check prints before "correct"
    says_where: bool = True  # each hint after a launch names the world size

    @property
    def declared(self):
        """The exercise's FileExercise (its cases module, options, ...)."""
        return DECLARED[self.checker.exercise_id]


def between(text: str, first: str, last: str) -> str:
    """``text`` from ``first`` to the end of the next ``last``."""
    start = text.index(first)
    return text[start:text.index(last, start) + len(last)]


# ---- 5.3 and 5.4: the token ring ---------------------------------------------------------------

EVEN_ODD = """\
    if rank % 2 == 0:  # even ranks send first...
        dist.send(token, group=group, group_dst=right)
        dist.recv(incoming, group=group, group_src=left)
    else:  # ...odd ranks receive first, so every send finds a recv waiting for it
        dist.recv(incoming, group=group, group_src=left)
        dist.send(token, group=group, group_dst=right)
"""
START_AND_WAIT = """\
    sending = dist.isend(token, group=group, group_dst=(rank + 1) % n)
    receiving = dist.irecv(incoming, group=group, group_src=(rank - 1) % n)
    sending.wait()  # the token may be changed again only once it is sent
    receiving.wait()  # incoming holds the left neighbour's token only after this
"""
GATHERED = """\
    tokens = [torch.empty_like(token) for _ in range(n)]
    dist.all_gather(tokens, token, group=group)  # every token, everywhere
    incoming = tokens[(rank - 1) % n]
"""
ALONE = ("alone on the ring, a rank gets its own token back, as a copy, without any message.")
TOKEN_RING = Exercise(nb05.token_ring, "token_ring.py", right={
    "rank 0 first, then each rank in turn": Right(2, [
        ("if rank % 2 == 0:  # even ranks send first...",
         "if rank == 0:  # rank 0 sends first, and receives last"),
        ("else:  # ...odd ranks receive first, so every send finds a recv waiting for it",
         "else:  # every other rank receives its left's token, then sends its own")])}, wrong={
    "every rank sends first": Wrong([(EVEN_ODD, """\
    dist.send(token, group=group, group_dst=right)
    dist.recv(incoming, group=group, group_src=left)
""")], ("rank 0 is blocked in send to rank 1 (line {line:dist.send(}), rank 1 in send to rank 0 "
        "(line {line:dist.send(})", "every rank sends before any receives",
        "a cycle of waits that no rank can leave"),
        never=("even rank", "odd rank", "% 2", "receive first", "recv first")),
    "odd ranks never send": Wrong([(
        "        dist.recv(incoming, group=group, group_src=left)\n"
        "        dist.send(token, group=group, group_dst=right)\n",
        "        dist.recv(incoming, group=group, group_src=left)\n")],
        "rank 0 is blocked in recv from rank 1 (line {line:dist.recv(incoming}): rank 0 receives "
        "from rank 1, but rank 1 never posted the matching send"),
    "the token goes left": Wrong([("right, left = (rank + 1) % n, (rank - 1) % n",
                                   "right, left = (rank - 1) % n, (rank + 1) % n")],
                                 "went round the ring the wrong way", 3, shared=True),
    "returns its own token": Wrong([("    return incoming\n", "    return token\n")],
                                   "returned the token it was given, the same tensor",
                                   shared=True),
    "receives into the token it sends": Wrong([
        ("    incoming = torch.empty_like(token)  # same shape and dtype as what the left "
         "sends\n", ""),
        ("dist.send(token, group=group, group_dst=right)\n        dist.recv(incoming",
         "dist.send(token, group=group, group_dst=right)\n        dist.recv(token"),
        ("dist.recv(incoming, group=group, group_src=left)\n        dist.send",
         "dist.recv(token, group=group, group_src=left)\n        dist.send"),
        ("    return incoming\n", "    return token\n")],
        "on rank 1 pass_token received rank 0's token into the token it was given: the "
        "caller's own token is overwritten", shared=True,
        never=("own token, not", "returned")),
    "a float32 buffer": Wrong([("torch.empty_like(token)", "torch.zeros(token.shape)")],
                              ("was ended by Gloo in recv from rank", "an int64 token",
                               "must have the token's shape and dtype"), never=("empty_like",)),
    "rank and size of the whole world": Wrong([
        ("rank, n = dist.get_rank(group), dist.get_world_size(group)",
         "rank, n = dist.get_rank(), dist.get_world_size()")],
        ("rank 0, workspace/token_ring.py line {line:send(} in pass_token:\n    dist.send(token, "
         "group=group, group_dst=right)\nPeerOutsideGroup: rank 0 called send to the group's "
         "rank 1, but the group passed to the function has 1 rank (ranks [0])",
         "dist.get_rank(group) and dist.get_world_size(group)")),
    "neighbours named by their global ranks": Wrong([(EVEN_ODD, EVEN_ODD.replace(
        "group=group, group_dst=right", "dst=right, group=group").replace(
        "group=group, group_src=left", "src=left, group=group"))],
        ("rank 1 called send with dst=1 (itself): dst= is a rank of the whole world",
         "a group of ranks [1, 2], the group's ranks [0, 1]",
         "name a rank of the group with group_dst= and group=group"), 3),
    "group_dst= without group=": Wrong([(EVEN_ODD, EVEN_ODD.replace("group=group, ", ""))], (
        "rank 1 called send with group_dst=1 and no group=: group_dst= without group= names a "
        "rank of the whole world's group", "pass group=group too"), 3,
        never=("dst= is a rank of the whole world", ALONE)),
    "a neighbour written as a number, no case for one process": Wrong([
        ("    if n == 1:\n        return token.clone()  # alone on the ring: my right "
         "neighbour is me\n", ""),
        ("if rank % 2 == 0:  # even ranks send first...\n        dist.send(token, group=group, "
         "group_dst=right)", "if rank == 0:\n        dist.send(token, group=group, group_dst=1)")],
        ("rank 0 called send to the group's rank 1, a number written in your code, but the "
         "group passed to the function has 1 rank (ranks [0]): rank 0 is alone in its group",
         ALONE), never=("take the rank and the size",)),
    "neighbours looked up in a list": Wrong([
        ("right, left = (rank + 1) % n, (rank - 1) % n",
         "ranks = list(range(n))\n    right, left = ranks[rank + 1], ranks[rank - 1]")],
        "rank 1, workspace/token_ring.py line {line:right, left = ranks} in pass_token:\n    "
        "right, left = ranks[rank + 1], ranks[rank - 1]\nIndexError: list index out of range",
        never=("Traceback", "torchrun")),
    "no case for one process": Wrong([
        ("    if n == 1:\n        return token.clone()  # alone on the ring: my right "
         "neighbour is me\n", "")],
        ("rank 0, workspace/token_ring.py line {line:dist.send(} in pass_token:",
         "(case: a float32 token of 3 numbers; launched on 1 process)", ALONE), 1,
        never=("clone",)),
    "isend and irecv": Wrong([(EVEN_ODD, """\
    for work in [dist.isend(token, right, group), dist.irecv(incoming, left, group)]:
        work.wait()
""")], "workspace/token_ring.py uses dist.isend (line {line:dist.isend(}): exercise 5.3 is the "
       "blocking version", None)}, library={
    "every token gathered": Wrong([(EVEN_ODD, GATHERED), (
        "    incoming = torch.empty_like(token)  # same shape and dtype as what the left "
        "sends\n", "")], "uses dist.all_gather (line {line:dist.all_gather(}): the token goes "
                         "round with point-to-point messages", None)})

TOKEN_RING_ASYNC = Exercise(nb05.token_ring_async, "token_ring_async.py", right={
    "batch_isend_irecv": Right(2, [(START_AND_WAIT, """\
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, token, group=group, group_peer=(rank + 1) % n),
        dist.P2POp(dist.irecv, incoming, group=group, group_peer=(rank - 1) % n),
    ])
    for work in works:
        work.wait()
""")])}, wrong={
    "no wait": Wrong([(START_AND_WAIT, """\
    dist.isend(token, group=group, group_dst=(rank + 1) % n)
    dist.irecv(incoming, group=group, group_src=(rank - 1) % n)
""")], "returned without waiting for its isend to rank 1", shared=True),
    "the token changed before the isend's wait": Wrong([(
        "    sending.wait()  # the token may be changed again only once it is sent\n",
        "    token.zero_()  # done with my token\n"
        "    sending.wait()  # the token may be changed again only once it is sent\n")],
        "rank 0 changed the tensor of its isend to rank 1 (line {line:dist.isend(}) before that "
        "isend's wait() returned", shared=True),
    "waits on the isend before starting the irecv": Wrong([(START_AND_WAIT, """\
    dist.isend(token, group=group, group_dst=(rank + 1) % n).wait()
    dist.irecv(incoming, group=group, group_src=(rank - 1) % n).wait()
""")], ("rank 0 is blocked waiting for its isend to rank 1 (line {line:isend(}), rank 1 waiting "
        "for its isend to rank 0 (line {line:isend(})",
        "Waiting on an isend's handle blocks like a send")),
    "neighbours named by their global ranks": Wrong([(START_AND_WAIT, START_AND_WAIT.replace(
        "group=group, group_dst=(rank + 1) % n", "dst=(rank + 1) % n, group=group").replace(
        "group=group, group_src=(rank - 1) % n", "src=(rank - 1) % n, group=group"))],
        ("rank 1 called isend with dst=1 (itself): dst= is a rank of the whole world",
         "name a rank of the group with group_dst= and group=group"), 3),
    "waits on the handles' futures": Wrong([(START_AND_WAIT, START_AND_WAIT.replace(
        ".wait()", ".get_future().wait()"))], "Work::getFuture not implemented: Gloo's isend "
        "and irecv handles have no future; wait on the handle itself"),
    "no case for one process": Wrong([("    if n == 1:\n        return token.clone()\n", "")],
                                     ("rank 0, workspace/token_ring_async.py line "
                                      "{line:dist.isend(} in pass_token_async:",
                                      "Pair is not connected", ALONE), 1, never=("clone",)),
    "blocking send and recv": Wrong([(START_AND_WAIT, """\
    dist.send(token, group=group, group_dst=(rank + 1) % n) if rank % 2 == 0 else None
    dist.recv(incoming, group=group, group_src=(rank - 1) % n)
""")], "uses dist.send (line {line:dist.send(}): in exercise 5.4 every message is started with "
       "dist.isend or dist.irecv", None)}, library={
    "every token gathered": Wrong([(START_AND_WAIT, GATHERED),
                                   ("    incoming = torch.empty_like(token)\n", "")],
                                  "uses dist.all_gather (line {line:dist.all_gather(})", None)})

# ---- 6.3: the ring all-reduce ------------------------------------------------------------------

RING = reference("my_ring.py")
EXCHANGE = """\
        sending = dist.isend(send_chunk, group=group, group_dst=right)
        receiving = dist.irecv(recv_into, group=group, group_src=left)
        sending.wait()
        receiving.wait()
"""
RS_SENDS = "exchange(chunks[(rank - step - 1) % n], incoming)"
RS_KEEPS = "mine = chunks[(rank - step - 2) % n]"
AG_STEP = "        exchange(chunks[(rank - step) % n], chunks[(rank - step - 1) % n])\n"
BOTH_PHASES = between(RING, "    # Reduce-scatter", AG_STEP)
MY_RING = Exercise(nb06.my_ring, "my_ring.py", right={
    "the larger chunks last": Right(4, [(between(RING, "    chunks = torch.tensor_split", "\n"),
                                         """\
    base, extra = divmod(flat.numel(), n)
    sizes = [base + (c >= n - extra) for c in range(n)]  # the larger chunks last
    chunks = torch.split(flat, sizes)
""")]),
    "batch_isend_irecv": Right(3, [(EXCHANGE, """\
        messages = [dist.P2POp(dist.isend, send_chunk, group=group, group_peer=right),
                    dist.P2POp(dist.irecv, recv_into, group=group, group_peer=left)]
        for handle in dist.batch_isend_irecv(messages):
            handle.wait()
""")]),
    "ranks that finish chunk r + 1": Right(2, [
        (RS_KEEPS, "mine = chunks[(rank - step - 1) % n]"),
        (RS_SENDS, "exchange(chunks[(rank - step) % n], incoming)"),
        (AG_STEP, AG_STEP.replace("step)", "step + 1)").replace("step - 1)", "step)"))])},
    wrong={
    "the mean": Wrong([("    return tensor\n", "    tensor /= n  # the mean, as data parallelism "
                                              "wants\n    return tensor\n")],
                      "every rank holds the sum divided by N, the mean"),
    "no all-gather": Wrong([(between(RING, "    # All-gather", AG_STEP), "")],
                           "the reduce-scatter is done, but not the all-gather", shared=True),
    "replaces instead of adding": Wrong([("mine += incoming", "mine.copy_(incoming)")],
                                        "replaces its chunk with the incoming one instead of "
                                        "adding", shared=True),
    "the all-gather adds": Wrong([(AG_STEP, """\
        incoming = torch.empty_like(chunks[(rank - step - 1) % n])
        exchange(chunks[(rank - step) % n], incoming)
        chunks[(rank - step - 1) % n].add_(incoming)
""")], "the all-gather adds what arrives to the receiver's copy", shared=True),
    "sends chunk r - s": Wrong([(RS_SENDS, "exchange(chunks[(rank - step) % n], incoming)")],
                               ("in the reduce-scatter, rank r sends chunk (r - s) % N but adds "
                                "what arrives into chunk (r - s - 2) % N", "that is not the chunk "
                                "its left neighbour sent in the same step"), 3,
                               never=("(r - s - 1)",)),
    "no copy back": Wrong([(between(RING, "    if flat.data_ptr()", "(tensor.shape))\n"), "")],
                          ("a non-contiguous tensor came back unchanged",
                           "case: a transposed (non-contiguous) float32 view"), shared=True,
                          never=("copy_",)),
    "the whole tensor every step": Wrong([
        (between(RING, "        incoming = torch.empty_like(mine)", "so far\n"),
         "        incoming = torch.empty_like(flat)  # the whole tensor from the left\n"
         "        exchange(flat, incoming)\n"
         "        mine += torch.tensor_split(incoming, n)[(rank - step - 2) % n]\n"),
        (AG_STEP, "        incoming = torch.empty_like(flat)\n"
                  "        exchange(flat, incoming)\n"
                  "        c = (rank - step - 1) % n\n"
                  "        chunks[c].copy_(torch.tensor_split(incoming, n)[c])\n")],
        "each rank sent 96 bytes for a 48-byte tensor: the whole tensor in every step",
        shared=True),
    "torch.chunk": Wrong([("torch.tensor_split(flat, n)", "flat.chunk(n)")],
                         ("IndexError: tuple index out of range", "fewer than the 2 ranks",
                          "torch.chunk can return fewer than N chunks"),
                         never=("tensor_split",)),
    "blocking sends first": Wrong([(EXCHANGE, """\
        dist.send(send_chunk, group=group, group_dst=right)
        dist.recv(recv_into, group=group, group_src=left)
""")], ("rank 0 is blocked in send to rank 1 (line {line:dist.send(}), rank 1 in send to rank 0 "
        "(line {line:dist.send(})", "each rank's receive must already be under way")),
    "blocking, even ranks first": Wrong([(EXCHANGE, """\
        if rank % 2 == 0:  # even ranks send first, odd ones receive first
            dist.send(send_chunk, group=group, group_dst=right)
            dist.recv(recv_into, group=group, group_src=left)
        else:
            dist.recv(recv_into, group=group, group_src=left)
            dist.send(send_chunk, group=group, group_dst=right)
""")], "ring_all_reduce calls dist.recv, which blocks: the exercise builds the ring from "
       "dist.isend and dist.irecv", shared=True),
    "a clone that keeps the strides": Wrong([(
        "flat = tensor.reshape(-1)  # (numel,): a view, or a copy if tensor is not contiguous",
        "flat = torch.atleast_1d(tensor.clone())  # my own copy to work in")],
        ("RuntimeError: input tensor has to be contiguous", "(case: a transposed "
         "(non-contiguous) float32 view", "isend and irecv take a tensor whose values lie in "
         "one run of memory")),
    "the all-gather's waits left to its end": Wrong([(between(RING, "    # All-gather", AG_STEP),
                                                       """\
    handles = []  # the all-gather: every step started now, all waited on at the end
    for step in range(n - 1):
        handles.append(dist.isend(chunks[(rank - step) % n], group=group, group_dst=right))
        handles.append(dist.irecv(chunks[(rank - step - 1) % n], group=group, group_src=left))
    for handle in handles:
        handle.wait()
""")], "rank 0 sent, at line {line:handles.append(dist.isend}, values that its irecv from rank 2 "
       "(line {line:handles.append(dist.irecv}) had not finished receiving", 3, shared=True),
    "receives from the right": Wrong([("group_src=left", "group_src=right")], (
        "rank 0 is blocked waiting for its isend to rank 1 (line {line:sending.wait()}), rank 1 "
        "waiting for its isend to rank 2 (line {line:sending.wait()})",
        "rank 0 sends to rank 1, which receives from rank 2"), 3,
        never=("every rank sends before any receives",)),
    "neighbours named by their global ranks": Wrong([(EXCHANGE, EXCHANGE.replace(
        "group=group, group_dst=right", "dst=right, group=group").replace(
        "group=group, group_src=left", "src=left, group=group"))],
        ("rank 1 called isend with dst=1 (itself): dst= is a rank of the whole world",
         "name a rank of the group with group_dst= and group=group"), 3),
    "chunks of numel // N numbers": Wrong([("torch.tensor_split(flat, n)",
                                            "[flat[c * (flat.numel() // n):(c + 1) * "
                                            "(flat.numel() // n)] for c in range(n)]")],
                                          ("the last 1 of the 11 numbers (numel mod N = 11 mod "
                                           "2) were never summed",
                                           "The chunks do not cover the tensor"), shared=True,
                                          never=("tensor_split",)),
    "a new tensor, not the chunk": Wrong([("mine += incoming", "mine = mine + incoming")], (
        "`mine = mine + incoming` (line {line:mine = mine + incoming}) makes a new tensor",
        "add in place (+= or add_) into the tensor's own chunk"), shared=True),
    "receives into its own chunk": Wrong([(
        "        incoming = torch.empty_like(mine)  # (chunk,) lands here first, then is added\n"
        "        exchange(chunks[(rank - step - 1) % n], incoming)\n"
        "        mine += incoming", "        exchange(chunks[(rank - step - 1) % n], mine)\n"
                                    "        mine += chunks[(rank - step - 1) % n]")],
        "rank r adds its own chunk (r - s - 1) % N, the one it sends, to the chunk its left "
        "neighbour sent, (r - s - 2) % N"),
    "adds what arrives twice": Wrong([("mine += incoming", "mine += 2 * incoming")],
                                     "rank 0 first differs from dist.all_reduce at number 0 of 12",
                                     shared=True),
    "a float32 buffer": Wrong([("torch.empty_like(mine)", "torch.empty(mine.shape)")],
                              ("was ended by Gloo", "float64",
                               "or the buffer has another dtype than the tensor"))}, library={
    "dist.all_reduce": Wrong([(BOTH_PHASES, "    dist.all_reduce(flat, group=group)\n")],
                             "uses dist.all_reduce (line {line:dist.all_reduce(flat}): the point "
                             "is to write the ring yourself", None),
    "the library's ring": Wrong([
        ("import torch.distributed as dist\n", "import torch.distributed as dist\n"
         "from course_lib.core.collectives import ring_all_reduce as library_ring\n"),
        (BOTH_PHASES, "    library_ring(flat, group)\n")],
        "uses the library's ring_all_reduce (line {line:import ring_all_reduce}): the point is "
        "to write the ring yourself", None)})

# ---- 7.3: one data-parallel step ---------------------------------------------------------------

BROADCAST = """    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p, group=group, group_src=0)  # the group's rank 0 sends
"""
SYNC = """    for p in model.parameters():  # after the last micro-batch only: one sync per step
        ring_all_reduce(p.grad, group)  # the sum over the ranks
        p.grad /= world_size  # the mean: what one process with the whole batch gets
"""
SCALED_LOSS = "loss = loss_fn(model, batch) / accum_steps  # K means add up to one mean"
BACKWARD = "        loss.backward()  # adds into .grad, no communication\n"
MY_DP_STEP = Exercise(nb07.my_dp_step, "my_dp_step.py", right={
    "one flat buffer, one all-reduce per step": Right(3, [(SYNC, """\
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])  # every gradient in one buffer
    ring_all_reduce(flat, group)  # one all-reduce per step
    flat /= world_size
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))  # back into each .grad
""")]),
    "one flat broadcast, the gradient divided once": Right(2, [
        (BROADCAST, """\
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    dist.broadcast(flat, group=group, group_src=0)  # one message for every parameter
    torch.nn.utils.vector_to_parameters(flat, model.parameters())
"""),
        (SCALED_LOSS, "loss = loss_fn(model, batch)  # divided once, after the ring"),
        ("p.grad /= world_size  #", "p.grad /= world_size * accum_steps  #")]),
    "gradients from autograd.grad, summed by hand, then assigned": Right(3, [
        ("    optimizer.zero_grad()\n" + "    for batch in micro_batches:\n"
         "        " + SCALED_LOSS + "\n" + BACKWARD + SYNC, """\
    params = list(model.parameters())
    sums = [torch.zeros_like(p) for p in params]
    for batch in micro_batches:
        for total, g in zip(sums, torch.autograd.grad(loss_fn(model, batch), params)):
            total += g / accum_steps
    for p, total in zip(params, sums):
        ring_all_reduce(total, group)  # a tensor of my own, not .grad
        p.grad = total / world_size
""")])}, wrong={
    "the ring's sum, not divided by the world size": Wrong(
        [("        p.grad /= world_size  # the mean: what one process with the whole batch "
          "gets\n", "")], "the gradient is 2 times too large: not divided by the world size",
        shared=True),
    "each micro-batch's loss not divided by K": Wrong(
        [(SCALED_LOSS, "loss = loss_fn(model, batch)")],
        "the gradient is 3 times too large: each micro-batch's loss is a mean", shared=True),
    "a sync after every micro-batch": Wrong([(BACKWARD + SYNC, BACKWARD + """\
        for p in model.parameters():  # keep every rank's .grad averaged as it grows
            ring_all_reduce(p.grad, group)
            p.grad /= world_size
""")], "ring_all_reduce ran after micro-batch 1 of 3", shared=True),
    "no broadcast": Wrong([(BROADCAST, "    pass  # every rank builds the same model anyway\n")],
                          "still has its own starting weights: here every rank builds its model",
                          shared=True),
    "every parameter broadcast twice": Wrong([(
        "            dist.broadcast(p, group=group, group_src=0)  # the group's rank 0 sends\n",
        "            for _ in range(2):  # to be sure\n"
        "                dist.broadcast(p, group=group, group_src=0)\n")],
        "broadcast_parameters broadcast 52 values on rank 0 for a model of 26: each parameter "
        "once", shared=True),
    "rank 0 skips the broadcast": Wrong([(BROADCAST, "    if dist.get_rank(group) == 0:\n"
                                                     "        return  # rank 0 holds rank 0's "
                                                     "weights already\n" + BROADCAST)],
                                        ("rank 1 waits in broadcast (line {line:dist.broadcast(}) "
                                         "for rank 0, which never called it",),
                                        never=("did not pair up",
                                               "ring_all_reduce on the same gradients")),
    "the parameters all-reduced": Wrong([("ring_all_reduce(p.grad, group)  # the sum over the "
                                          "ranks\n        p.grad /= world_size",
                                          "ring_all_reduce(p.data, group)\n        p.data /= "
                                          "world_size")],
                                         "ring_all_reduce was handed the parameters, not their "
                                         "gradients (line {line:ring_all_reduce(p.data})",
                                         shared=True),
    "the replicas averaged, not broadcast": Wrong([(BROADCAST, """\
    with torch.no_grad():
        for p in model.parameters():
            ring_all_reduce(p, group)  # every replica's weights, summed
            p /= dist.get_world_size(group)
""")], "after broadcast_parameters rank 0 no longer holds its own starting weights", shared=True),
    "the loss divided by the world size too": Wrong(
        [(SCALED_LOSS, "loss = loss_fn(model, batch) / accum_steps / world_size")],
        "the gradient is 2 times too small: it was divided by the world size twice",
        shared=True),
    "only rank 0 all-reduces": Wrong([("        ring_all_reduce(p.grad, group)  # the sum over "
                                       "the ranks\n", "        if dist.get_rank(group) == 0:\n"
                                       "            ring_all_reduce(p.grad, group)\n")],
                                      "rank 0 is blocked waiting for its irecv from rank 1, "
                                      "inside ring_all_reduce (line {line:    ring_all_reduce(}): "
                                      "rank 0 receives from rank 1, but rank 1 never posted"),
    "the world's rank 0 as the source": Wrong([("group=group, group_src=0)",
                                                "src=0, group=group)")],
                                              ("rank 1 called broadcast with src=0 (not in the "
                                               "group): src= is a rank of the whole world",
                                               "group_src="), 3),
    "the gradients zeroed before every micro-batch": Wrong(
        [("    optimizer.zero_grad()\n    for batch in micro_batches:\n",
          "    for batch in micro_batches:\n        optimizer.zero_grad()\n")],
        "only each step's last micro-batch counted: .grad was emptied between micro-batches",
        shared=True),
    "the gradients never zeroed": Wrong([("    optimizer.zero_grad()\n", "")],
                                        "step 2 used the gradients of step 1 as well",
                                        shared=True),
    "the weights averaged after the step": Wrong([(SYNC + "    optimizer.step()\n", """\
    optimizer.step()
    with torch.no_grad():
        for p in model.parameters():  # average the weights instead
            ring_all_reduce(p, group)
            p /= world_size
""")], ("ring_all_reduce ran on the parameters after optimizer.step() (line "
        "{line:ring_all_reduce(p, group)}), not on the gradients before it",
        "Average every .grad over the ranks after the last micro-batch"), shared=True),
    "the world's size": Wrong([("dist.get_world_size(group)", "dist.get_world_size()")],
                              "the gradients were divided by 3, the size of the whole world, "
                              "not by 2, the size of the group you were given", 3, shared=True),
    "the ring handed a copy of each gradient": Wrong(
        [("ring_all_reduce(p.grad, group)", "ring_all_reduce(p.grad.clone(), group)")],
        "the tensors ring_all_reduce summed were not the gradients themselves", shared=True,
        never=("ring_all_reduce(p.grad",))}, library={
    "torch's all_reduce": Wrong([("ring_all_reduce(p.grad, group)",
                                  "dist.all_reduce(p.grad, group=group)")],
                                "averaged with torch's all_reduce", None),
    "the library's broadcast": Wrong([
        ("from course_lib.runtime", "from course_lib.core.data_parallel import "
                                    "broadcast_parameters  # noqa: F401\nfrom course_lib.runtime"),
        ('def broadcast_parameters(model, group=None):\n    """Give every rank rank 0\'s '
         'parameters, in place."""\n' + BROADCAST, "")],
        "uses the library's broadcast_parameters (line {line:import broadcast_parameters}): that "
        "is the library's own answer", None),
    "the library's wrapper": Wrong([
        ("from course_lib.runtime", "from course_lib.core.data_parallel import "
                                    "AllReducePerParameter\nfrom course_lib.runtime"),
        ("    optimizer.zero_grad()\n", "    wrapped = AllReducePerParameter(model, group)\n"
                                      "    optimizer.zero_grad()\n"),
        (SYNC, "    wrapped.finish_gradient_sync()\n")],
        "uses the library's AllReducePerParameter (line {line:import AllReducePerParameter})",
        None)})

# ---- 8.3: gradient hooks -----------------------------------------------------------------------

LAUNCH = ("            handle = dist.all_reduce(self.flat[b], group=self.group, async_op=True)"
          "  # no wait\n")
FULL = "        if self.arrived[b] == len(self.buckets[b]):  # the bucket is full: send it now\n"
HOOK_SENDS = FULL + LAUNCH + "            self.handles.append((b, handle))\n"
WAIT = "            handle.wait()  # the bucket holds the sum over the ranks only from here on\n"
DIVIDE = "            self.flat[b].div_(self.world_size)  # the sum / N: the mean\n"
RESET = "        self.handles, self.arrived = [], [0] * len(self.buckets)"
EACH_HANDLE = "        for b, handle in self.handles:\n"
SEND_ALL = ("        for b, flat in enumerate(self.flat):  # backward is over: send every bucket\n"
            "            self.handles.append((b, dist.all_reduce(flat, group=self.group, "
            "async_op=True)))\n")
BLOCKING_SUM = "            dist.all_reduce(self.flat[b], group=self.group)  # the sum, now\n"
IN_FLIGHT = ("rank 0 changed a bucket while its all-reduce (started at line {line:async_op=True}) "
             "was still running")
MY_HOOKS = Exercise(nb08.my_hooks, "my_hooks.py", right={
    "divide before the sum, wait in reverse order": Right(3, [
        ("copy_(param.grad.reshape(-1))", "copy_(param.grad.reshape(-1) / self.world_size)"),
        (DIVIDE, ""),
        (EACH_HANDLE, "        for b, handle in reversed(self.handles):  # any order will do\n")]),
    "a set of missing gradients per bucket, every wait first": Right(2, [
        ("        self.arrived = [0] * len(self.buckets)  # gradients copied into each bucket",
         "        self.missing = [set(bucket) for bucket in self.buckets]  # gradients to come"),
        ("        self.arrived[b] += 1\n" + FULL,
         "        self.missing[b].discard(param)\n        if not self.missing[b]:\n"),
        (EACH_HANDLE + WAIT, "        for _, handle in self.handles:\n            handle.wait()\n"
                             "        for b, _ in self.handles:\n"),
        (RESET, "        self.handles, self.missing = [], [set(b) for b in self.buckets]")]),
    "each bucket divided in its future's callback": Right(2, [
        (LAUNCH, "            handle = dist.all_reduce(self.flat[b], group=self.group, "
                 "async_op=True).get_future()\n"
                 "            handle = handle.then(lambda done, b=b: self.flat[b].div_("
                 "self.world_size))\n"),
        (DIVIDE, "")]),
    ".grad a view of its bucket": Right(2, [(
        "p.grad.copy_(self.flat[b][start:start + p.numel()].view(p.shape))",
        "p.grad = self.flat[b][start:start + p.numel()].view(p.shape)  # DDP's "
        "gradient_as_bucket_view")])},
    wrong={
    "no wait": Wrong([(WAIT, "")], "never waited on the all-reduce started at line "
                                   "{line:async_op=True}", shared=True),
    "read early": Wrong([(WAIT, ""), (RESET, "        for _, handle in self.handles:\n"
                                             "            handle.wait()\n" + RESET)],
                        "a bucket was read before its all-reduce had finished", shared=True),
    "no divide": Wrong([(DIVIDE, "")], "the gradients are the SUM over the ranks", shared=True),
    "after backward": Wrong([(HOOK_SENDS, ""), (EACH_HANDLE, SEND_ALL + EACH_HANDLE)],
                            "no overlap: no all-reduce started while backward ran; the first "
                            "(line {line:async_op=True}) started after loss.backward() had "
                            "returned", shared=True),
    "blocking in the hook": Wrong([("group=self.group, async_op=True)", "group=self.group)"),
                                   (WAIT, "")], "the all-reduce at line {line:group=self.group)} "
                                                "blocks (it has no async_op=True)", shared=True),
    "blocking, waits on None": Wrong([("group=self.group, async_op=True)", "group=self.group)")],
                                     "dist.all_reduce returns a handle only with async_op=True"),
    "blocking in finish": Wrong([(HOOK_SENDS, ""), (EACH_HANDLE + WAIT,
                                                    "        for b in range(len(self.buckets)):\n"
                                                    + BLOCKING_SUM)],
                                "no overlap: no all-reduce started while backward ran; the first "
                                "(line {line:the sum, now}, blocking) started after", shared=True),
    "all-reduced twice": Wrong([(WAIT, BLOCKING_SUM)],
                               "line {line:the sum, now} all-reduces, after loss.backward() has "
                               "returned, a bucket whose all-reduce the hook already started "
                               "(line {line:async_op})", shared=True),
    "handles kept from the last step": Wrong(
        [(RESET, "        self.arrived = [0] * len(self.buckets)")],
        (IN_FLIGHT, "(case: two steps in a row,"), shared=True),
    "divided before the wait": Wrong([(WAIT + DIVIDE, DIVIDE + WAIT)],
                                     (IN_FLIGHT, "(case: one step,"), shared=True),
    "no reset": Wrong([(RESET, "        self.handles = []")],
                      "the first step was right, the second is not: in the second step the hooks "
                      "started no all-reduce", shared=True),
    "wait in the hook": Wrong([(LAUNCH, LAUNCH.replace("  # no wait", "")
                                + "            handle.wait()  # right here, in the hook\n")],
                              "the all-reduce started at line {line:async_op=True} is waited on "
                              "during backward", shared=True),
    "the world's size": Wrong([("dist.get_world_size(group)", "dist.get_world_size()")],
                              "you divided by the size of the whole world, not of the group", 3,
                              shared=True),
    "rank 0 never sends its buckets": Wrong([(FULL, FULL.replace(
        "):  # the bucket is full: send it now", ") and dist.get_rank(self.group) > 0:"))],
        "waits in all_reduce"),
    "one all-reduce per parameter": Wrong([
        ("        b, start = self.where[param]\n"
         "        self.flat[b][start:start + param.numel()].copy_(param.grad.reshape(-1))\n"
         "        self.arrived[b] += 1\n" + HOOK_SENDS,
         "        handle = dist.all_reduce(param.grad, group=self.group, async_op=True)\n"
         "        self.handles.append((param, handle))  # no buckets: each gradient alone\n"),
        (EACH_HANDLE + WAIT + DIVIDE + "            for p in self.buckets[b]:\n"
         "                start = self.where[p][1]\n"
         "                p.grad.copy_(self.flat[b][start:start + p.numel()].view(p.shape))\n",
         "        for p, handle in self.handles:\n            handle.wait()\n"
         "            p.grad /= self.world_size\n")],
        "one step started 8 all-reduces, one per parameter, for the 4 buckets of the plan",
        shared=True),
    "a bucket sent before its last gradient": Wrong(
        [(FULL, FULL.replace("== len(self.buckets[b])", "== max(1, len(self.buckets[b]) - 1)"))],
        "the all-reduce at line {line:async_op=True} started when its bucket held 2 of its 3 "
        "gradients", shared=True),
    "divided once per parameter": Wrong(
        [(DIVIDE + "            for p in self.buckets[b]:\n",
          "            for p in self.buckets[b]:\n    " + DIVIDE)],
        "some gradients were divided by the world size more than once", shared=True),
    "all_reduce on the whole world": Wrong(
        [("self.flat[b], group=self.group, async_op=True)  # no wait",
          "self.flat[b], async_op=True)  # no wait")],
        "rank 1 called all_reduce on the whole world, ranks 0..2, but this case gave your "
        "function a group of ranks [1, 2]", 3),
    "no class": Wrong([("class BucketHooks:", "class Hooks:")],
                      "defines no class BucketHooks", None)}, library={
    "the library's overlap": Wrong([("import torch.nn.functional as F\n",
                                     "import torch.nn.functional as F\n\nfrom course_lib.core."
                                     "overlap import OverlapDataParallel  # noqa: F401\n")],
                                   "uses the library's OverlapDataParallel (line "
                                   "{line:OverlapDataParallel}): the point is to write the hooks "
                                   "yourself", None),
    "torch's DDP": Wrong([("import torch.nn.functional as F\n", "import torch.nn.functional as F"
                           "\nfrom torch.nn.parallel import DistributedDataParallel as DDP  # "
                           "noqa: F401\n")], "uses torch.nn.parallel.DistributedDataParallel "
                                             "(line {line:as DDP})", None),
    "the library's buckets beside the plan": Wrong([(
        "from course_lib.core.buckets import MB, plan_buckets",
        "from course_lib.core.buckets import MB, BucketedDataParallel, plan_buckets")],
        ("uses the library's BucketedDataParallel (line {line:import MB, Bucketed}): the point is "
         "to write the hooks yourself", "the file may import only MB and plan_buckets"), None),
    "the buckets module whole": Wrong([(
        "from course_lib.core.buckets import MB, plan_buckets",
        "from course_lib.core import buckets\nfrom course_lib.core.buckets import MB, "
        "plan_buckets")], "uses the library's buckets (line {line:import buckets})", None)})

# ---- 9.3: a complete DDP script ----------------------------------------------------------------

MICRO_STEP = """\
            with contextlib.nullcontext() if last else model.no_sync():  # forward AND backward
                loss = F.cross_entropy(model(x.to(device)), y.to(device)) / config.accum_steps
                loss.backward()  # k scaled means add up to the mean over the step's examples
"""
LOGGED = """\
                dist.all_reduce(step_loss)  # the sum of every rank's mean
                losses.append(step_loss.item() / world_size)  # the mean over the global batch
"""
SAVE = """\
    if rank == 0:
        torch.save(model.module.state_dict(), config.checkpoint)  # one writer: rank 0
"""
MY_DDP_TRAIN = Exercise(nb09.my_ddp_train, "my_ddp_train.py", right={
    "if/else around the micro-step": Right(3, [(MICRO_STEP, """\
            if last:  # this backward synchronises
                loss = F.cross_entropy(model(x.to(device)), y.to(device)) / config.accum_steps
                loss.backward()
            else:
                with model.no_sync():  # forward AND backward without talking
                    loss = F.cross_entropy(model(x.to(device)), y.to(device)) / config.accum_steps
                    loss.backward()
""")]),
    "every step's loss all-reduced at once, at the end": Right(2, [
        (LOGGED, "                losses.append(step_loss)  # this rank's share, summed below\n"),
        (SAVE, """\
    shares = torch.stack(losses)  # one all-reduce for every step's loss
    dist.all_reduce(shares)
    losses = (shares / world_size).tolist()
""" + SAVE)]),
    "no_sync entered in an ExitStack, the losses gathered as objects": Right(2, [
        (MICRO_STEP, """\
            with contextlib.ExitStack() as stack:
                if not last:
                    stack.enter_context(model.no_sync())  # forward AND backward
                loss = F.cross_entropy(model(x.to(device)), y.to(device)) / config.accum_steps
                loss.backward()
"""),
        (LOGGED, """\
                everyone = [None] * world_size
                dist.all_gather_object(everyone, step_loss.item())  # every rank's mean
                losses.append(sum(everyone) / world_size)
""")])}, wrong={
    "no set_epoch": Wrong([("        sampler.set_epoch(epoch)  # a new shuffle each epoch, the "
                            "same on every rank\n", "")],
                          "every epoch saw its examples in the same order", shared=True),
    "no_sync around the backward only": Wrong([(MICRO_STEP, """\
            loss = F.cross_entropy(model(x.to(device)), y.to(device)) / config.accum_steps
            with contextlib.nullcontext() if last else model.no_sync():  # backward only
                loss.backward()
""")], "no_sync() wraps the backward only", shared=True),
    "each rank logs its own loss": Wrong([(LOGGED, "                losses.append(step_loss."
                                                   "item())\n")],
                                         "rank 0 and rank 1 logged different losses",
                                         shared=True),
    "the loss all-reduced every micro-step": Wrong([
        ("            step_loss += loss.detach()\n",
         "            mine = loss.detach().clone()\n"
         "            dist.all_reduce(mine)  # the micro-step's loss, summed over the ranks\n"
         "            step_loss += mine / world_size\n"),
        (LOGGED, "                losses.append(step_loss.item())\n")],
        "rank 0 all-reduced 24 loss values for 12 optimizer steps", shared=True),
    "every rank saves": Wrong([(SAVE, "    torch.save(model.module.state_dict(), "
                                      "config.checkpoint)\n")],
                              "rank 1 wrote the checkpoint too", shared=True),
    "the wrapper's state_dict": Wrong([("torch.save(model.module.state_dict()",
                                        "torch.save(model.state_dict()")],
                                      "the checkpoint's names start with 'module.'", shared=True),
    "the loss not divided by the micro-steps": Wrong([(") / config.accum_steps", ")")],
                                                     "each step's gradient is accum_steps times "
                                                     "too large", shared=True),
    "the group started inside train": Wrong([
        ("    rank, world_size, device = dist.get_rank()",
         '    dist.init_process_group("gloo")\n    rank, world_size, device = dist.get_rank()')],
        ('line {line:init_process_group("gloo")} in train:\n    dist.init_process_group("gloo")',
         "starting one inside train fails: that is main()'s job")),
    "rank 0 returns before the barrier": Wrong([(SAVE, SAVE + '        return {"model": '
                                                 'model.module, "losses": losses}  # done\n')],
                                               "waits in barrier"),
    "the DDP wrapper returned": Wrong([('return {"model": model.module,',
                                        'return {"model": model,')],
                                      ('train(config) returned the DistributedDataParallel '
                                       'wrapper as "model"', "model.module"), shared=True),
    "no_sync on every micro-step": Wrong([("with contextlib.nullcontext() if last else "
                                           "model.no_sync():", "with model.no_sync():")],
                                         "DDP all-reduced the gradients 0 times for 12 optimizer "
                                         "steps: no_sync() covered every micro-step",
                                         shared=True),
    "the forward through the model inside the wrapper": Wrong(
        [("F.cross_entropy(model(x.to(device))", "F.cross_entropy(model.module(x.to(device))")],
        ("DDP all-reduced the gradients 0 times for 12 optimizer steps: the DDP wrapper's "
         "forward never ran", "ddp(x) is what tells DDP a backward follows"), shared=True,
        never=("no_sync() covered",)),
    "no DistributedSampler": Wrong([
        ("    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, "
         "shuffle=True,\n                                 seed=config.seed)\n"
         "    loader = DataLoader(dataset, batch_size=config.micro_batch, sampler=sampler)\n",
         "    shuffled = torch.Generator().manual_seed(config.seed)  # the same on every rank\n"
         "    loader = DataLoader(dataset, batch_size=config.micro_batch, shuffle=True,\n"
         "                        generator=shuffled)\n"),
        ("        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank\n",
         "")], ("rank 0 ran 48 micro-steps, 2 times the 24 its share of the data gives",
                "A DistributedSampler"), shared=True),
    "the whole module saved": Wrong([("torch.save(model.module.state_dict(),",
                                      "torch.save(model.module,")],
                                    "the checkpoint is not a state_dict", shared=True,
                                    never=("wrote no checkpoint",)),
    "the sampler's own seed": Wrong([("shuffle=True,\n                                 "
                                      "seed=config.seed)", "shuffle=True)")],
                                    "shuffled with DistributedSampler's own seed, 0, not "
                                    "config.seed", shared=True),
    "the logged loss summed over the ranks": Wrong(
        [("losses.append(step_loss.item() / world_size)", "losses.append(step_loss.item())")],
        "the logged losses are 2 times too large: either they are the sum over the ranks, not "
        "their mean, or each micro-step's loss was added as it is", shared=True),
    "main never ends the group": Wrong([("    dist.destroy_process_group()\n", "")],
                                       "main() does not end the process group", None)}, library={
    "the course's trainer": Wrong([("from course_lib.tasks import toy\n",
                                    "from course_lib.tasks import toy\nfrom course_lib.train."
                                    "trainer import train as course_train  # noqa: F401\n")],
                                  "uses the library's train (line {line:course_train}): that is "
                                  "the course's own trainer", None)})

# ---- 10.4: a ZeRO-1 step -----------------------------------------------------------------------

IMPORTS = "chunk_bounds, ring_all_gather, ring_reduce_scatter"
SHARD = "torch.nn.Parameter(flat_params[start:end])"
CHUNK = "    start, end = chunk_bounds(flat_params.numel(), n)[rank]"
MY_CHUNK = CHUNK + "  # my chunk, cut as the ring cuts\n"  # in make_shard_optimizer
ITS_CHUNK = CHUNK + "\n"  # in zero1_step
REDUCE_SCATTER = "ring_reduce_scatter(flat_grad, group)"
MEAN = "shard.grad = flat_grad[start:end] / n"
STEP = "    optimizer.step()  # updates my chunk of flat_params, in place\n"
ALL_GATHER = ("    ring_all_gather(flat_params, group)  # every chunk from its owner, to every "
              "rank\n")
FLOOR = ("    size = flat_params.numel() // n  # values per rank\n"
         "    start, end = rank * size, (rank + 1) * size\n")
CEIL = ("    size = -(-flat_params.numel() // n)  # ceil(numel / N) values per rank\n"
        "    start, end = rank * size, min((rank + 1) * size, flat_params.numel())\n")
WORLD_RANK = "rank, n = dist.get_rank(group), dist.get_world_size(group)"
LARGER_LAST = '''

def my_bounds(numel, n):
    """Contiguous chunks, the larger ones last."""
    base, extra = divmod(numel, n)
    sizes = [base + (1 if r >= n - extra else 0) for r in range(n)]
    return [(sum(sizes[:r]), sum(sizes[:r + 1])) for r in range(n)]
'''
MY_ZERO = Exercise(nb10.my_zero, "my_zero.py", reference_size=4, right={
    "a copy of the chunk, copied back": Right(2, [
        (SHARD, "torch.nn.Parameter(flat_params[start:end].clone())  # a copy"),
        (STEP, "    optimizer.step()  # updates the copy\n"
               "    flat_params[start:end] = shard.detach()  # my new values, in flat_params\n")]),
    "the larger chunks last, summed with reduce, shared with broadcast": Right(3, [
        (IMPORTS + "\n", IMPORTS + "\n" + LARGER_LAST),
        (MY_CHUNK, "    start, end = my_bounds(flat_params.numel(), n)[rank]  # my chunk\n"),
        (ITS_CHUNK, "    start, end = my_bounds(flat_params.numel(), n)[rank]\n"),
        ("    " + REDUCE_SCATTER + "  # my chunk of flat_grad now holds the sum over ranks\n",
         "    for owner, (a, b) in enumerate(my_bounds(flat_params.numel(), n)):\n"
         "        if b > a:  # the sum of each chunk, on its owner\n"
         "            dist.reduce(flat_grad[a:b], group=group, group_dst=owner)\n"),
        (ALL_GATHER, "    for owner, (a, b) in enumerate(my_bounds(flat_params.numel(), n)):\n"
                     "        if b > a:  # each chunk from its owner, to every rank\n"
                     "            dist.broadcast(flat_params[a:b], group=group,\n"
                     "                           group_src=owner)\n")])}, wrong={
    "no average": Wrong([(MEAN, "shard.grad = flat_grad[start:end]")],
                        "the step used the SUM of the ranks' gradients", shared=True),
    "the mean divided again": Wrong([(MEAN, MEAN + " / n")],
                                    "after step 1, rank 0's step used the mean gradient divided "
                                    "by 2 again", shared=True),
    "no all-gather": Wrong([(ALL_GATHER, "")], "after step 1, rank 0's own chunk is updated but "
                                               "the other values are still the old ones",
                           shared=True),
    "a copy of the chunk": Wrong([(SHARD, "torch.nn.Parameter(flat_params[start:end].clone())")],
                                 "after step 1, rank 0's flat_params did not change, yet its "
                                 "optimizer updated the tensor it holds: that tensor is a copy of "
                                 "the chunk", shared=True),
    "chunks of numel // N": Wrong([(MY_CHUNK, FLOOR), (ITS_CHUNK, FLOOR)],
                                  "no rank's optimizer holds value 22 of the 23: no rank updates "
                                  "it; and rank 0's optimizer works on values 0..11 (end "
                                  "excluded), but ring_reduce_scatter leaves rank 0 the sum of "
                                  "0..12", shared=True),
    "chunks of ceil(numel / N)": Wrong([(MY_CHUNK, CEIL), (ITS_CHUNK, CEIL)], (
        "rank 1's optimizer works on values 4..8 (end excluded), but ring_reduce_scatter leaves "
        "rank 1 the sum of 4..7: the chunks are not cut as the ring cuts",
        "(case: 10 values, AdamW; launched on 3 processes)"), 3, shared=True),
    "the whole model": Wrong([(SHARD, "torch.nn.Parameter(flat_params)"),
                              (IMPORTS, "chunk_bounds, ring_all_reduce"),
                              (REDUCE_SCATTER, "ring_all_reduce(flat_grad, group)"),
                              (MEAN, "shard.grad = flat_grad / n"), (ALL_GATHER, "")],
                             "rank 0's optimizer holds all 23 values", shared=True),
    "an all-reduce": Wrong([(IMPORTS, "chunk_bounds, ring_all_gather, ring_all_reduce"),
                            (REDUCE_SCATTER, "ring_all_reduce(flat_grad, group)")],
                           "zero1_step all-reduces: every rank gets the sum of every value",
                           shared=True),
    "the whole gradient reduced to every owner": Wrong([
        ("    " + REDUCE_SCATTER + "  # my chunk of flat_grad now holds the sum over ranks\n",
         "    summed = flat_grad.clone()\n"
         "    for owner in range(n):  # every owner gets the sum of everything\n"
         "        mine = flat_grad.clone()\n"
         "        dist.reduce(mine, group=group, group_dst=owner)\n"
         "        if owner == rank:\n"
         "            summed = mine\n"
         "    flat_grad = summed\n")],
        "handed collectives 138 values in 2 steps of 23 values", 3, shared=True),
    "the rank in the whole world": Wrong([(f"    {WORLD_RANK}\n{chunk}", f"    rank, n = "
                                           f"dist.get_rank(), dist.get_world_size(group)\n{chunk}")
                                          for chunk in (MY_CHUNK, ITS_CHUNK)],
                                         "In a group of ranks [1, 2] rank 2 is the group's rank "
                                         "1: dist.get_rank() without the group", 3),
    "rank 0 broadcasts the starting values": Wrong([
        ("    return optimizer_class([shard], **options)",
         "    if rank == 0:  # rank 0's values are the ones to start from\n"
         "        dist.broadcast(flat_params, src=0, group=group)\n"
         "    return optimizer_class([shard], **options)")], "waits in broadcast")}, library={
    "the course's Zero1": Wrong([(IMPORTS + "\n", IMPORTS + "\nfrom course_lib.core.zero import "
                                 "Zero1  # noqa: F401\n")],
                                "uses the library's Zero1 (line {line:import Zero1}): that is the "
                                "course's ZeRO-1", None)})

# ---- 10.5: a DDP communication hook in bf16 ----------------------------------------------------

HOOK_GROUP = "    group = process_group if process_group is not None else dist.group.WORLD\n"
MESSAGE = "message = buffer.to(torch.bfloat16).div_(group.size())"
REDUCE = "    future = dist.all_reduce(message, group=group, async_op=True).get_future()\n"
BACK = """    def back_to_float32(done):
        buffer.copy_(done.value()[0])  # the bf16 sum, in place, as float32 from here on
        return buffer

    return future.then(back_to_float32)  # runs once the all-reduce has finished
"""
MY_BF16_HOOK = Exercise(nb10b.my_bf16_hook, "my_bf16_hook.py", right={
    "divided after the sum, in float32, a new tensor": Right(2, [
        (MESSAGE, "message = buffer.to(torch.bfloat16)"),
        (BACK, "    return future.then(lambda done: done.value()[0].float() / group.size())\n")]),
    "all-reduced at once, a future completed by hand": Right(2, [
        (REDUCE + "\n" + BACK, "    dist.all_reduce(message, group=group)  # waits here\n"
                               "    result = torch.futures.Future()\n"
                               "    result.set_result(message.to(buffer.dtype))\n"
                               "    return result\n")], prints=(bf16_hook.NO_OVERLAP,))}, wrong={
    "no average": Wrong([(MESSAGE, "message = buffer.to(torch.bfloat16)")],
                        "the gradients are the SUM over the ranks", shared=True),
    "float32 sent": Wrong([(MESSAGE, "message = buffer / group.size()")],
                          "your hook all-reduces float32", shared=True),
    "float16 sent": Wrong([(MESSAGE, "message = buffer.to(torch.float16).div_(group.size())")],
                          "your hook sends float16", shared=True),
    "the world's size": Wrong([(MESSAGE, "message = buffer.to(torch.bfloat16).div_("
                                         "dist.get_world_size())")],
                              "divided by 3, the size of the whole world", 3, shared=True),
    "the all-reduce on the whole world": Wrong([(REDUCE, "    future = dist.all_reduce(message, "
                                                         "async_op=True).get_future()\n")],
                                               ("called all_reduce on the whole world, ranks 0..2",
                                                "pass that group to dist.all_reduce"), 3),
    "the all-reduce's own future": Wrong([(BACK, "    return future\n")],
                                         "holds a list (what an all-reduce's own future holds)"),
    "the handle, not a future": Wrong([(REDUCE + "\n" + BACK,
                                        "    return dist.all_reduce(message, group=group, "
                                        "async_op=True)\n")],
                                      "returned the all-reduce's handle (a Work)"),
    "never all-reduced": Wrong([(REDUCE + "\n" + BACK, "    result = torch.futures.Future()\n"
                                                       "    result.set_result(buffer)\n"
                                                       "    return result\n")],
                               "handed nothing to an all-reduce", shared=True),
    "a future never completed": Wrong([(REDUCE + "\n" + BACK, "    dist.all_reduce(message, "
                                                               "group=group)\n"
                                                               "    return torch.futures.Future()"
                                                               "  # DDP waits for it\n")],
                                      "the future your hook returned never completed"),
    "process_group used as it comes": Wrong([(HOOK_GROUP, "    group = process_group\n")],
                                            "DDP hands the hook process_group=None"),
    "no async_op": Wrong([(REDUCE, "    future = dist.all_reduce(message, group=group)"
                                   ".get_future()\n")],
                         "returns None unless it is called with async_op=True"),
    "one all-reduce per parameter": Wrong([(REDUCE + "\n" + BACK, """\
    parts = [g.to(torch.bfloat16).div_(group.size()) for g in bucket.gradients()]
    futures = [dist.all_reduce(p, group=group, async_op=True).get_future()
               for p in parts]
    return torch.futures.collect_all(futures).then(lambda done: torch.cat(
        [f.value()[0].float().reshape(-1) for f in done.value()]))
""")], "one per parameter", shared=True),
    "the group's size by a message": Wrong([
        (HOOK_GROUP, HOOK_GROUP + "    count = torch.ones(1)\n"
                                  "    dist.all_reduce(count, group=group)  # how many ranks\n"),
        (MESSAGE, "message = buffer.to(torch.bfloat16)"),
        (BACK, "    return future.then(lambda done: done.value()[0].float() / count)\n")],
        "a float32 tensor of 1 value and a bfloat16 tensor", shared=True)}, library={
    "the course's hook": Wrong([("import torch.distributed as dist\n",
                                 "import torch.distributed as dist\nfrom course_lib.core.compress "
                                 "import bf16_comm_hook\n"),
                                ("    group = process_group", "    return bf16_comm_hook("
                                                            "process_group, bucket)\n    group = "
                                                            "process_group")],
                               "uses the library's bf16_comm_hook (line {line:import "
                               "bf16_comm_hook}): the course's bf16_comm_hook does what this "
                               "exercise builds", None),
    "torch's hook": Wrong([("import torch.distributed as dist\n",
                            "import torch.distributed as dist\nfrom torch.distributed.algorithms."
                            "ddp_comm_hooks.default_hooks import bf16_compress_hook\n"),
                           ("    group = process_group", "    return bf16_compress_hook("
                                                       "process_group, bucket)\n    group = "
                                                       "process_group")],
                          "torch's bf16_compress_hook does what this exercise builds", None)})

# ---- 10.6: ZeRO-2's two hooks -----------------------------------------------------------------

QUEUE_END = ("    if not zero2.in_backward:  # this backward's first gradient: at its end, reduce "
             "what is left\n        zero2.in_backward = True\n"
             "        Variable._execution_engine.queue_callback(zero2.end_of_backward)\n")
NEW_BUCKET = ("    if bucket.grads is None:  # the bucket's first gradient in this backward\n"
              "        bucket.grads = torch.zeros_like(bucket.flat)  # (N*s,) zeros: padding adds "
              "nothing\n")
INTO_SLOT = "    bucket.grads[start:start + param.numel()].copy_(param.grad.reshape(-1))\n"
FREE_GRAD = "    param.grad = None  # the full-size gradient lives on only in the bucket\n"
LAUNCH_NEXT = ("        zero2.reduce_scatter(zero2.buckets[zero2.reduced])  # the next bucket in "
               "the plan\n")
IN_ORDER = ("    while zero2.reduced < len(zero2.buckets) and zero2.buckets[zero2.reduced].waiting "
            "== 0:\n" + LAUNCH_NEXT)
ZERO2_SIZES = "    rank, n = dist.get_rank(group), dist.get_world_size(group)\n"
REDUCE_BUCKET = ("    ring_reduce_scatter(grads, group)  # my chunk of grads now holds the sum "
                 "over the ranks\n")
CHUNK_MEAN = "mean = grads[rank * s:(rank + 1) * s] / n"
ACCUMULATE = ("    if piece.grad is None:\n        piece.grad = mean\n    else:\n"
              "        piece.grad += mean  # a second backward before the step: gradients add "
              "up\n")
MY_ZERO2 = Exercise(nb10b.my_zero2, "my_zero2.py", reference_size=4, right={
    "divided before the reduce-scatter": Right(3, [
        (REDUCE_BUCKET, "    grads /= n  # each rank's share of the mean, before the sum\n"
                        "    ring_reduce_scatter(grads, group)  # my chunk: the mean itself\n"),
        (CHUNK_MEAN, "mean = grads[rank * s:(rank + 1) * s].clone()")]),
    "a copy divided in place, added in place": Right(3, [
        (CHUNK_MEAN, "mean = grads[rank * s:(rank + 1) * s].clone().div_(n)"),
        (ACCUMULATE, "    if piece.grad is None:\n        piece.grad = mean\n    else:\n"
                     "        piece.grad.add_(mean)\n")]),
    "added into the bucket, the launch written out": Right(3, [
        (INTO_SLOT, INTO_SLOT.replace("copy_", "add_")),
        (LAUNCH_NEXT, "        done = zero2.buckets[zero2.reduced]\n"
                      "        zero2.bucket_hook(done.grads, done.piece, zero2.process_group)\n"
                      "        done.grads, done.waiting = None, len(done.params)\n"
                      "        zero2.reduced += 1\n")])}, wrong={
    ".grad not freed": Wrong([(FREE_GRAD, "")], "rank 0's parameter 6.bias still held its .grad",
                             shared=True),
    "launched as soon as complete, out of order": Wrong([(
        IN_ORDER, "    if bucket.waiting == 0:  # complete: send it\n"
                  "        zero2.reduce_scatter(bucket)\n")],
        ("rank 0 reduce-scattered bucket 3 before bucket 1", "in one order, the plan's"),
        shared=True),
    "an incomplete bucket launched": Wrong([(IN_ORDER, "    zero2.reduce_scatter(bucket)  # send "
                                                       "what it holds\n")],
                                           "reduce-scattered bucket 0 while 2 of its 3 "
                                           "gradients had not come yet", shared=True),
    "a new buffer for every gradient": Wrong([(NEW_BUCKET, "    bucket.grads = torch.zeros_like("
                                                           "bucket.flat)  # (N*s,)\n")],
                                             "bucket 0 went to the reduce-scatter without the "
                                             "gradient of parameter 6.bias in its slot",
                                             shared=True),
    "every bucket left to the end of backward": Wrong([(IN_ORDER, "")],
                                                      "but your gradient_ready did not "
                                                      "reduce-scatter it: it waited for the end "
                                                      "of backward", shared=True),
    "the end of backward never queued": Wrong([(QUEUE_END, "")],
                                              "in the 2nd backward, bucket 0 was never "
                                              "reduce-scattered", shared=True),
    "a slot filled with the gradient's shape": Wrong([(INTO_SLOT, "    bucket.grads[start:start + "
                                                                  "param.numel()] = param.grad\n")],
                                                     ("line {line:= param.grad} in gradient_ready",
                                                      "A parameter's slot in the bucket is flat")),
    "no average": Wrong([(CHUNK_MEAN, "mean = grads[rank * s:(rank + 1) * s].clone()")],
                        "the step used the SUM of the ranks' gradients", shared=True),
    "a view of the bucket": Wrong([(CHUNK_MEAN, "mean = grads[rank * s:(rank + 1) * s].div_(n)")],
                                  "rank 0's piece.grad shares its memory with grads", shared=True),
    "overwritten, not accumulated": Wrong([(ACCUMULATE, "    piece.grad = mean\n")],
                                          "only the last one's gradient counted", shared=True),
    "an all-reduce": Wrong([("import ring_reduce_scatter", "import ring_all_reduce"),
                            (REDUCE_BUCKET, "    ring_all_reduce(grads, group)\n")],
                           "your hook all-reduces the bucket (ring_all_reduce)", shared=True),
    "torch's reduce_scatter_tensor": Wrong([(REDUCE_BUCKET,
                                             "    mine = torch.empty(s, dtype=grads.dtype)\n"
                                             "    dist.reduce_scatter_tensor(mine, grads, "
                                             "group=group)\n"), (CHUNK_MEAN, "mean = mine / n")],
                                           "your hook calls dist.reduce_scatter_tensor: Gloo runs "
                                           "it as an all-reduce", shared=True),
    "the next rank's chunk": Wrong([(CHUNK_MEAN, "k = (rank + 1) % n\n    mean = grads[k * s:"
                                                 "(k + 1) * s] / n")],
                                   "rank 0's piece.grad got the mean of chunk 1 of the bucket",
                                   shared=True),
    "the world's size": Wrong([(ZERO2_SIZES, "    rank, n = dist.get_rank(group), "
                                             "dist.get_world_size()\n")],
                              "the gradients were divided by 3, the size of the whole world", 3,
                              shared=True),
    "the rank in the whole world": Wrong([(ZERO2_SIZES, "    rank, n = dist.get_rank(), "
                                                        "dist.get_world_size(group)\n")],
                                         ("attempting to assign a gradient of size '[0]'",
                                          "In a group of ranks [1, 2] rank 2 is the group's rank "
                                          "1: dist.get_rank() without the group"), 3),
    "the whole gradient kept": Wrong([(CHUNK_MEAN, "mean = grads / n")],
                                     ("attempting to assign a gradient of size",
                                      "piece holds s values, this rank's chunk of the bucket")),
    "the ring on the whole world": Wrong([("ring_reduce_scatter(grads, group)",
                                           "ring_reduce_scatter(grads)")],
                                         "ring_reduce_scatter sent on the whole world, ranks "
                                         "0..2, but this case gave your function a group of ranks "
                                         "[1, 2]: pass that group to ring_reduce_scatter too", 3),
    "no gradient left": Wrong([(ACCUMULATE, "    if piece.grad is not None:\n"
                                            "        piece.grad += mean\n")],
                              "after your hook, rank 0's piece.grad is None"),
    "only rank 0 reduce-scatters": Wrong([(REDUCE_BUCKET, "    if rank == 0:\n    " +
                                           REDUCE_BUCKET)], "never posted the matching"),
    "zero2.reduced moved on twice": Wrong([(LAUNCH_NEXT, LAUNCH_NEXT + "        zero2.reduced += 1"
                                                         "\n")],
                                          "moves zero2.reduced on by itself", shared=True),
    "a bucket from torch.empty_like": Wrong([(NEW_BUCKET, NEW_BUCKET.replace("zeros_like",
                                                                             "empty_like"))],
                                            "values that no gradient put there", shared=True)},
    library={
    "the course's hook": Wrong([("from course_lib.core.collectives import ring_reduce_scatter\n",
                                 "from course_lib.core.collectives import ring_reduce_scatter\n"
                                 "from course_lib.core.zero2 import reduce_scatter_bucket as "
                                 "course_hook  # noqa: F401\n")],
                               "uses the library's reduce_scatter_bucket (line {line:as "
                               "course_hook}): that is the course's own ZeRO-2", None),
    "the course's Zero2": Wrong([("from torch.autograd import Variable\n",
                                  "from torch.autograd import Variable\n\nfrom course_lib.core."
                                  "zero2 import Zero2\n"),
                                 (QUEUE_END, "    Zero2.gradient_ready(zero2, param)\n    return\n"
                                  + QUEUE_END)],
                                "uses the library's Zero2 (line {line:import Zero2}): that is "
                                "the course's own ZeRO-2", None)})

# ---- 10.7: ZeRO-3's gather, free and reduce-scatter --------------------------------------------

DATA = ("    full = unit.full.data  # the same memory; writes here are not versions autograd "
        "counts\n")
WHOLE = "    if full.untyped_storage().nbytes() > 0:"
PLACE = ("    full[r * s:(r + 1) * s] = unit.shard.detach()  # my shard in its place (in full's "
         "dtype)\n")
GATHER = "    ring_all_gather(full, unit.process_group)  # every other shard, from its owner\n"
FREE = "    unit.full.untyped_storage().resize_(0)  # 0 bytes; the tensor and its views stay\n"
GRAD_FREED = ("    unit.full.grad = None  # the whole gradient lives on only until it is "
              "reduced\n")
HOOK = "    reduce_scatter_bucket(grad, unit.shard, unit.process_group)  # ZeRO-2's hook, as is\n"
OWN_REDUCE = ("    r, s, n = unit.rank, unit.shard_numel, unit.world_size\n"
              "    zero2.ring_reduce_scatter(grad, unit.process_group)\n")
ASYNC_GATHER = ("    mine = full[r * s:(r + 1) * s]\n    mine.copy_(unit.shard.detach())\n"
                "    unit.pending = dist.all_gather_into_tensor(full, mine.clone(), "
                "group=unit.process_group,\n"
                "                                               async_op=True)  # waited on "
                "before it computes\n")
MY_FLAT_SHARD = Exercise(nb10b.my_flat_shard, "my_flat_shard.py", right={
    "torch's all_gather_into_tensor, its own reduce-scatter": Right(2, [
        (PLACE + GATHER, "    mine = unit.shard.detach().to(full.dtype)\n"
                         "    dist.all_gather_into_tensor(full, mine, group=unit.process_group)\n"),
        (HOOK, "    n, r, s = unit.world_size, unit.rank, unit.shard_numel\n"
               "    ring_reduce_scatter(grad, unit.process_group)\n"
               "    mean = grad[r * s:(r + 1) * s] / n\n"
               "    unit.shard.grad = mean if unit.shard.grad is None else unit.shard.grad + "
               "mean\n"),
        ("from course_lib.core.collectives import ring_all_gather",
         "from course_lib.core.collectives import ring_reduce_scatter")]),
    "an async gather, its handle in unit.pending": Right(3, [(PLACE + GATHER, ASYNC_GATHER)]),
    "the gradient freed after it is reduced, through the full tensor": Right(2, [
        (GRAD_FREED, ""),
        ("    reshard(unit)  # the parameters too, until the next forward\n",
         "    unit.full.grad = None  # the whole gradient, freed once reduced\n"
         "    reshard(unit)\n")])}, wrong={
    "not freed after forward": Wrong([(FREE, "    unit.full.grad = None\n")],
                                     "after its forward, reshard(unit) for blocks.0, unit.full "
                                     "still holds"),
    "not freed after backward": Wrong([("    reshard(unit)  # the parameters too, until the next "
                                        "forward\n", "")],
                                      "after reduce_grad(unit) for blocks.1, unit.full still "
                                      "holds"),
    "the gradient kept": Wrong([(GRAD_FREED, "")], "unit.full.grad still holds this rank's whole "
                                                   "gradient"),
    "a write autograd counts": Wrong([(DATA, "    full = unit.full\n"), (
        PLACE + GATHER, "    with torch.no_grad():\n"
                        "        full[r * s:(r + 1) * s] = unit.shard.detach()\n"
                        "        ring_all_gather(full, unit.process_group)\n")],
        "backward could not use the parameters it saved in forward"),
    "never gathered": Wrong([(WHOLE, "    if full.numel() > 0:")],
                            "after unshard(unit) for the root before its forward, unit.full has "
                            "0 bytes of memory"),
    "no second gather before backward": Wrong([(
        WHOLE + "\n        return  # whole already\n",
        "    if full.untyped_storage().nbytes() > 0 or getattr(unit, 'gathered', False):\n"
        "        return  # gathered once already\n    unit.gathered = True\n")],
        "after unshard(unit) for the root before its backward, unit.full has 0 bytes"),
    "no memory given back before the gather": Wrong([(
        "    full.untyped_storage().resize_(full.numel() * full.element_size())  # N*s values "
        "again\n", "")], ("out of bounds for storage of size 0", "reshard gave its storage back "
                          "(0 bytes)", "before anything, the gather included, writes into it")),
    "an async gather, its handle kept nowhere": Wrong([(PLACE + GATHER, ASYNC_GATHER.replace(
        "unit.pending = ", ""))], "your gather had not finished when unshard returned: wait on "
                                  "it, or keep its handle in unit.pending"),
    "its shard put in after the gather": Wrong([(PLACE + GATHER, GATHER + PLACE)],
                                               "after unshard(unit) for the root, values "),
    "gathered again when whole": Wrong([(WHOLE + "\n        return  # whole already\n", "")],
                                       "unshard(unit) for blocks.0 gathered again while "
                                       "unit.full was whole already"),
    "other memory instead of none": Wrong([(FREE, "    unit.full.data = torch.empty(0, dtype="
                                                  "unit.full.dtype)\n")],
                                          "reshard(unit) for blocks.0 gave unit.full other memory"),
    "gathers in a different order on each rank": Wrong([(GATHER, """\
    n = dist.get_world_size(unit.process_group)
    for owner in [r] + [o for o in range(n) if o != r]:  # mine first
        dist.broadcast(full[owner * s:(owner + 1) * s], src=owner,
                       group=unit.process_group)
""")], "every rank waits in broadcast (line "),
    "a sum, not a mean": Wrong([(HOOK, OWN_REDUCE + "    unit.shard.grad = grad[r * s:(r + 1) * "
                                                    "s].clone()\n")],
                               "the steps used the SUM of the ranks' gradients", shared=True),
    "the shard's gradient a view of the whole": Wrong([(HOOK, OWN_REDUCE + "    unit.shard.grad "
                                                              "= grad[r * s:(r + 1) * s].div_(n)"
                                                              "\n")],
                                                      "unit.shard.grad shares its memory with "
                                                      "the module's whole gradient"),
    "overwritten, not accumulated": Wrong([(HOOK, OWN_REDUCE + "    unit.shard.grad = grad[r * s:"
                                                               "(r + 1) * s] / n\n")],
                                          "what an earlier one left in unit.shard.grad must "
                                          "stay", shared=True),
    "an all-reduce": Wrong([(HOOK, "    r, s, n = unit.rank, unit.shard_numel, unit.world_size\n"
                                   "    dist.all_reduce(grad, group=unit.process_group)\n"
                                   "    mean = grad[r * s:(r + 1) * s] / n\n"
                                   "    unit.shard.grad = mean if unit.shard.grad is None else "
                                   "unit.shard.grad + mean\n")],
                           "reduce_grad(unit) for blocks.1 all-reduces the gradient (all_reduce)"),
    "the whole gradient kept": Wrong([(HOOK, "    unit.shard.grad = grad / unit.world_size\n")],
                                     ("attempting to assign a gradient of size",
                                      "unit.shard holds s values, this rank's shard")),
    "its place from the whole world's rank": Wrong([(
        "    r, s = unit.rank, unit.shard_numel\n", "    r, s = dist.get_rank(), unit."
                                                    "shard_numel\n")],
        "In a group of ranks [1, 2] rank 2 is the group's rank 1", 3),
    "the hook without the unit's group": Wrong([(HOOK, "    reduce_scatter_bucket(grad, "
                                                       "unit.shard)\n")],
                                               "reduce_scatter_bucket sent on the whole world, "
                                               "ranks 0..2, but this case gave your function a "
                                               "group of ranks [1, 2]: pass that group to "
                                               "reduce_scatter_bucket too", 3)}, library={
    "the course's FlatShard": Wrong([("from course_lib.core import zero2\n",
                                      "from course_lib.core import zero2\nfrom course_lib.core."
                                      "flat_shard import FlatShard\n"),
                                     ("    full = unit.full.data  #", "    return FlatShard."
                                                                     "unshard(unit)\n    full = "
                                                                     "unit.full.data  #")],
                                    "uses the library's FlatShard (line {line:import FlatShard}):"
                                    " that is the course's own fully_shard", None),
    "section 2's functions": Wrong([(
        "from course_lib.core import zero2\n",
        "from course_lib.core import zero2\nfrom course_lib.core.flat_shard import reshard as "
        "course_reshard  # noqa: F401\n")], "uses the library's reshard (line {line:as "
                                            "course_reshard}): that is the course's own "
                                            "fully_shard", None)})

# ---- 11.1: the capstone's trainer --------------------------------------------------------------

RUNG_LINES = tuple(f"rung {k}: {claim}" for k, (_, claim) in enumerate(capstone.RUNGS, 1))
CAPSTONE = Exercise(nb11.capstone_trainer, "capstone_trainer.py", reference_size=2,
                    prints=RUNG_LINES, says_where=False, right={"another right one": Right(2, [
                        ("loss = token_losses * world_size / global_tokens  # DDP divides by "
                         "world_size", "loss = token_losses / (global_tokens / world_size)  # "
                                       "DDP's average undoes the /N"),
                        ("with nullcontext() if last else model.no_sync():",
                         "with model.no_sync() if not last else nullcontext():"),
                        ("for tensor in module.state_dict().values():",
                         "for tensor in [*module.parameters(), *module.buffers()]:"),
                        ("    dist.all_reduce(loss_sum, group=group)  # every rank's token losses\n"
                         "    return float(loss_sum / global_tokens)",
                         "    loss_sum /= global_tokens  # this rank's part of the global mean\n"
                         "    dist.all_reduce(loss_sum, group=group)\n    return loss_sum.item()"),
                        ("shuffle=True, seed=0)", "shuffle=True, seed=7)")], prints=RUNG_LINES)},
    wrong={
    "no loss scaling": Wrong([(
        "loss = token_losses * world_size / global_tokens  # DDP divides by world_size",
        "loss = token_losses / count_target_tokens(mb.targets)  # this micro-batch's mean")],
        ("rung 2 of 7 fails", "about 4 times the big batch's"), shared=True),
    "no_sync around backward only": Wrong([
        ("""        with nullcontext() if last else model.no_sync():  # forward AND backward inside
            token_losses = sum_token_loss(model(mb.inputs), mb.targets)  # (B, T) -> ()
            loss = """,
         """        token_losses = sum_token_loss(model(mb.inputs), mb.targets)  # (B, T) -> ()
        loss = """),
        ("""            loss.backward()  # .grad += this micro-step's share""",
         """        with nullcontext() if last else model.no_sync():  # talk on the last only
            loss.backward()  # .grad += this micro-step's share""")],
        ("rung 4 of 7 fails", "all-reduced its gradients 2 times in one optimizer step"),
        shared=True),
    "a rank that skips the broadcast": Wrong([(
        """    with torch.no_grad():
        for tensor""",
        """    if dist.get_rank(group) == 0:
        return  # rank 0 holds rank 0's weights already
    with torch.no_grad():
        for tensor""")],
        ("rung 5 of 7 fails", "rank 0 never joined it", "Rank 1 waited at line "
                                                        "{line:dist.broadcast}")),
    "mean of micro-batch means": Wrong([
        ("loss_sum += token_losses.detach().double()",
         "loss_sum += token_losses.detach().double() / count_target_tokens(mb.targets)"),
        ("return float(loss_sum / global_tokens)",
         "return float(loss_sum / (accum_steps * world_size))")],
        ("rung 6 of 7 fails", "is the mean of the micro-batches' means"), shared=True),
    "no set_epoch": Wrong([(
        "        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank\n",
        "")], ("rung 7 of 7 fails", "same examples in the same order in epoch 0 and epoch 1"),
        shared=True),
    "each micro-batch's own mean, / K": Wrong([(
        "loss = token_losses * world_size / global_tokens  # DDP divides by world_size",
        "loss = token_losses / count_target_tokens(mb.targets) / accum_steps")],
        ("rung 2 of 7 fails", "different numbers of scored tokens"), shared=True),
    "no_sync() on every micro-step": Wrong([("with nullcontext() if last else model.no_sync():",
                                             "with model.no_sync():")],
                                           ("rung 3 of 7 fails", "never all-reduced: there is no "
                                            "all-reduce in the step", "DDP syncs only in a "
                                            "backward outside no_sync()"), shared=True),
    "each rank the broadcast's root": Wrong([("src=0, group=group)",
                                              "src=dist.get_rank(group), group=group)")],
                                            ("rung 5 of 7 fails", "waited at line {line:src=dist"
                                             ".get_rank(group)}, dist.broadcast(tensor, src=dist."
                                             "get_rank(group), group=group): each called it, but "
                                             "with another root", "src=0 on every rank")),
    "a seed per rank": Wrong([(between(reference("capstone_trainer.py"), "    sampler = ",
                                       "the same on every rank\n"), """\
    orders = []
    for epoch in range(epochs):
        sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(group),
                                     rank=dist.get_rank(group), shuffle=True,
                                     seed=epoch + dist.get_rank(group))
""")],
                             ("rung 7 of 7 fails", "each rank shuffled differently", "The "
                              "sampler's seed must be the same on every rank"), shared=True),
    "a typo in the step": Wrong([("optimizer.step()", "optimiser.step()")],
                                ("rung 1 of 7 fails", "line {line:optimiser.step()} in train_step",
                                 "NameError: name 'optimiser' is not defined"))}, library={
    "the course's step": Wrong([("from course_lib.core.accumulation import",
                                 "from course_lib.core.train_step import train_step as course_step"
                                 "  # noqa: F401\nfrom course_lib.core.accumulation import")],
                               "uses the library's train_step (line {line:as course_step}): that "
                               "is the course's own trainer", None)})
BUGS = ("no loss scaling", "no_sync around backward only", "a rank that skips the broadcast",
        "mean of micro-batch means", "no set_epoch")  # what notebook 11 hands out, in rung order

EXERCISES = {"5.3": TOKEN_RING, "5.4": TOKEN_RING_ASYNC, "6.3": MY_RING, "7.3": MY_DP_STEP,
             "8.3": MY_HOOKS, "9.3": MY_DDP_TRAIN, "10.4": MY_ZERO, "10.5": MY_BF16_HOOK,
             "10.6": MY_ZERO2, "10.7": MY_FLAT_SHARD, "11.1": CAPSTONE}
DEADLOCK = {"5.3": "every rank sends first", "5.4": "waits on the isend before starting the irecv",
            "6.3": "blocking sends first", "7.3": "rank 0 skips the broadcast",
            "8.3": "rank 0 never sends its buckets", "9.3": "rank 0 returns before the barrier",
            "10.4": "rank 0 broadcasts the starting values", "10.5": "a future never completed",
            "10.6": "only rank 0 reduce-scatters",
            "10.7": "gathers in a different order on each rank",
            "11.1": "a rank that skips the broadcast"}
WRONG = {"5.3": "returns its own token", "5.4": "no wait", "6.3": "the mean",  # for the benchmark
         "7.3": "the ring's sum, not divided by the world size", "8.3": "no divide",
         "9.3": "no set_epoch", "10.4": "no average", "10.5": "no average", "10.6": "no average",
         "10.7": "a sum, not a mean", "11.1": "no loss scaling"}
MAIN = {  # the reference's __main__ block under torchrun: (processes, what every rank prints,
    # the same on every rank where the pattern has a group)
    "7.3": (2, [r"rank \d: weights after one step sum to (-?[\d.]+)"]),
    "10.4": (3, [r"rank \d: params\[:3\] = (\[[^\]]*\]), optimizer state: [86] numbers"]),
    "10.5": (2, [r"rank \d: \.grad is torch\.float32; bf16's largest error, relative to the "
                 r"largest gradient: (?:[1-7]\.\de-03|[1-9]\.\de-04)"]),
    "10.6": (2, [r"rank \d: weight\[0\] = (\[[^\]]*\]), my gradient: \[8\] values"]),
    "10.7": (2, [r"rank \d: gathered (\[[^\]]*\])", r"rank \d: freed, full holds 0 bytes"]),
}

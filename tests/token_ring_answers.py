"""Answers to exercises 5.3 and 5.4 (the token ring), as edits of notebook 05's own files.

    workspace.put(answer("token_ring.py", "every rank sends first"), "token_ring.py")

``RIGHT`` holds other correct answers, ``WRONG`` realistic mistakes, both per file
(``workspace/token_ring.py``: pass_token, blocking; ``token_ring_async.py``: isend/irecv).
"""

from answer_edits import edited, reference

EVEN_ODD = """\
    if rank % 2 == 0:  # even ranks send first...
        dist.send(token, dst=right, group=group)
        dist.recv(incoming, src=left, group=group)
    else:  # ...odd ranks receive first, so every send finds a recv waiting for it
        dist.recv(incoming, src=left, group=group)
        dist.send(token, dst=right, group=group)
"""
START_AND_WAIT = """\
    sending = dist.isend(token, dst=(rank + 1) % n, group=group)
    receiving = dist.irecv(incoming, src=(rank - 1) % n, group=group)
    sending.wait()  # the token may be changed again only once it is sent
    receiving.wait()  # incoming holds the left neighbour's token only after this
"""

RIGHT = {
    "token_ring.py": {
        "rank 0 first, then each rank in turn": [
            ("if rank % 2 == 0:  # even ranks send first...",
             "if rank == 0:  # rank 0 sends first, and receives last"),
            ("else:  # ...odd ranks receive first, so every send finds a recv waiting for it",
             "else:  # every other rank receives its left's token, then sends its own")],
    },
    "token_ring_async.py": {
        "batch_isend_irecv": [(START_AND_WAIT, """\
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, token, (rank + 1) % n, group=group),
        dist.P2POp(dist.irecv, incoming, (rank - 1) % n, group=group),
    ])
    for work in works:
        work.wait()
""")],
    },
}

WRONG = {
    "token_ring.py": {
        "every rank sends first": [(EVEN_ODD, """\
    dist.send(token, dst=right, group=group)
    dist.recv(incoming, src=left, group=group)
""")],
        "odd ranks never send": [(
            "        dist.recv(incoming, src=left, group=group)\n"
            "        dist.send(token, dst=right, group=group)\n",
            "        dist.recv(incoming, src=left, group=group)\n")],
        "the token goes left": [("right, left = (rank + 1) % n, (rank - 1) % n",
                                 "right, left = (rank - 1) % n, (rank + 1) % n")],
        "returns its own token": [("    return incoming\n", "    return token\n")],
        "receives into the token it sends": [
            ("    incoming = torch.empty_like(token)  # same shape and dtype as what the left "
             "sends\n", ""),
            ("dist.send(token, dst=right, group=group)\n        dist.recv(incoming",
             "dist.send(token, dst=right, group=group)\n        dist.recv(token"),
            ("dist.recv(incoming, src=left, group=group)\n        dist.send",
             "dist.recv(token, src=left, group=group)\n        dist.send"),
            ("    return incoming\n", "    return token\n")],
        "a float32 buffer": [("torch.empty_like(token)", "torch.zeros(token.shape)")],
        "rank and size of the whole world": [
            ("rank, n = dist.get_rank(group), dist.get_world_size(group)",
             "rank, n = dist.get_rank(), dist.get_world_size()")],
        "neighbours looked up in a list": [
            ("right, left = (rank + 1) % n, (rank - 1) % n",
             "ranks = list(range(n))\n    right, left = ranks[rank + 1], ranks[rank - 1]")],
        "no case for one process": [
            ("    if n == 1:\n        return token.clone()  # alone on the ring: my right "
             "neighbour is me\n", "")],
        "isend and irecv": [(EVEN_ODD, """\
    for work in [dist.isend(token, right, group), dist.irecv(incoming, left, group)]:
        work.wait()
""")],
    },
    "token_ring_async.py": {
        "no wait": [(START_AND_WAIT, """\
    dist.isend(token, dst=(rank + 1) % n, group=group)
    dist.irecv(incoming, src=(rank - 1) % n, group=group)
""")],
        "waits on the isend before starting the irecv": [(START_AND_WAIT, """\
    dist.isend(token, dst=(rank + 1) % n, group=group).wait()
    dist.irecv(incoming, src=(rank - 1) % n, group=group).wait()
""")],
        "no case for one process": [("    if n == 1:\n        return token.clone()\n", "")],
    },
}


def answer(file: str, name: str) -> str:
    """The reference ``file`` ("token_ring.py") with the edits of answer ``name``."""
    edits = {**RIGHT[file], **WRONG[file]}[name]
    return edited(reference(file), edits)


def line_of(text: str, code: str) -> int:
    """The number of the first line of ``text`` that holds ``code``."""
    return next(i for i, line in enumerate(text.split("\n"), 1) if code in line)

"""The capstone trainer's injected bugs (exercise 11.1), as edits of the fixed trainer (the
notebook's own answer cell, ``answer_edits.reference("capstone_trainer.py")``).

    buggy_text(["no loss scaling"])  # the fixed trainer with that one bug
    buggy_text(BUGS)                 # the file notebook 11 gives the learner

Each bug: (name, the rung of the ladder it breaks first, [(right text, wrong text), ...]).
"""

from answer_edits import edited, reference


def fixed() -> str:
    """The fixed trainer: the answer cell of notebook 11."""
    return reference("capstone_trainer.py")


BUGS = {
    "no loss scaling": (2, [(
        "loss = token_losses * world_size / global_tokens  # DDP divides by world_size",
        "loss = token_losses / count_target_tokens(mb.targets)  # this micro-batch's mean")]),
    "no_sync around backward only": (4, [
        ("""        with nullcontext() if last else model.no_sync():  # forward AND backward inside
            token_losses = sum_token_loss(model(mb.inputs), mb.targets)  # (B, T) -> ()
            loss = """,
         """        token_losses = sum_token_loss(model(mb.inputs), mb.targets)  # (B, T) -> ()
        loss = """),
        ("""            loss.backward()  # .grad += this micro-step's share""",
         """        with nullcontext() if last else model.no_sync():  # talk on the last only
            loss.backward()  # .grad += this micro-step's share""")]),
    "a rank that skips the broadcast": (5, [(
        """    with torch.no_grad():
        for tensor""",
        """    if dist.get_rank(group) == 0:
        return  # rank 0 holds rank 0's weights already
    with torch.no_grad():
        for tensor""")]),
    "mean of micro-batch means": (6, [
        ("loss_sum += token_losses.detach().double()",
         "loss_sum += token_losses.detach().double() / count_target_tokens(mb.targets)"),
        ("return float(loss_sum / global_tokens)",
         "return float(loss_sum / (accum_steps * world_size))")]),
    "no set_epoch": (7, [(
        "        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank\n",
        "")]),
}

# Another right trainer: the same sums and syncs, written differently.
ANOTHER_RIGHT = [
    ("loss = token_losses * world_size / global_tokens  # DDP divides by world_size",
     "loss = token_losses / (global_tokens / world_size)  # DDP's average undoes the /N"),
    ("with nullcontext() if last else model.no_sync():",
     "with model.no_sync() if not last else nullcontext():"),
    ("for tensor in module.state_dict().values():",
     "for tensor in [*module.parameters(), *module.buffers()]:"),
    ("""    dist.all_reduce(loss_sum, group=group)  # every rank's token losses
    return float(loss_sum / global_tokens)""",
     """    loss_sum /= global_tokens  # this rank's part of the global mean
    dist.all_reduce(loss_sum, group=group)
    return loss_sum.item()"""),
    ("shuffle=True, seed=0)", "shuffle=True, seed=7)"),
]

# A half fix a learner may try after rung 2's first report: not in the handed-out file.
HALF_FIXES = {
    "each micro-batch's own mean, / K": (2, [(
        "loss = token_losses * world_size / global_tokens  # DDP divides by world_size",
        "loss = token_losses / count_target_tokens(mb.targets) / accum_steps")]),
}


def buggy_text(names) -> str:
    """The fixed trainer with the bugs ``names`` (of BUGS and HALF_FIXES) put in."""
    every = {**BUGS, **HALF_FIXES}
    return edited(fixed(), [edit for name in names for edit in every[name][1]])

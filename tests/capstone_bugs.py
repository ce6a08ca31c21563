"""The capstone trainer's injected bugs (exercise 11.1), as edits of the fixed trainer.

    buggy_text(["no loss scaling"])  # the fixed trainer with that one bug
    buggy_text(BUGS)                 # the file notebook 11 gives the learner

Each bug: (name, the rung of the ladder it breaks first, [(right text, wrong text), ...]).
"""

from pathlib import Path

FIXED = Path(__file__).parent / "workspace_answers" / "capstone_trainer.py"

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

# A half fix a learner may try after rung 2's first report: not in the handed-out file.
HALF_FIXES = {
    "each micro-batch's own mean, / K": (2, [(
        "loss = token_losses * world_size / global_tokens  # DDP divides by world_size",
        "loss = token_losses / count_target_tokens(mb.targets) / accum_steps")]),
}


def buggy_text(names) -> str:
    text = FIXED.read_text()
    for name in names:
        for right, wrong in {**BUGS, **HALF_FIXES}[name][1]:
            assert text.count(right) == 1, (name, right)
            text = text.replace(right, wrong)
    return text

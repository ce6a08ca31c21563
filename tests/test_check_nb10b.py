"""Notebook 10b's checker: the reference and two other right answers pass, realistic wrong
answers get a hint that names their mistake."""

import pytest
import torch

from course_lib.check.checker import ExerciseError
from course_lib.check.nb10b import compressed_mean


def reference(grads):
    messages = [g.to(torch.bfloat16) for g in grads]  # 2 bytes a value on the wire
    return torch.stack([m.float() for m in messages]).sum(0) / len(grads)


def accumulate_in_place(grads):
    total = torch.zeros_like(grads[0])
    for g in grads:
        total += g.bfloat16().float()
    return total / len(grads)


def divide_each_message(grads):
    return sum(g.to(torch.bfloat16).to(torch.float32) / len(grads) for g in grads)


def no_cast_back(grads):
    return torch.stack([g.to(torch.bfloat16) for g in grads]).sum(0) / len(grads)


def no_division(grads):
    return torch.stack([g.to(torch.bfloat16).float() for g in grads]).sum(0)


def summed_in_bf16(grads):
    return sum(g.to(torch.bfloat16) for g in grads).float() / len(grads)


def never_compressed(grads):
    return torch.stack(grads).mean(0)


@pytest.mark.parametrize("answer", [reference, accumulate_in_place, divide_each_message])
def test_right_answers_pass(answer, capsys):
    compressed_mean(answer)
    assert capsys.readouterr().out == "Exercise 10.5: correct.\n"


@pytest.mark.parametrize("wrong, words, not_words", [
    (no_cast_back, "stay float32", "times the mean"),
    (no_division, "2 times the mean", "bfloat16"),
    (summed_in_bf16, "added up in bf16", "no bf16 rounding"),
    (never_compressed, "no bf16 rounding", "added up in bf16"),
])
def test_wrong_answers_get_a_hint_naming_their_mistake(wrong, words, not_words, capsys):
    with pytest.raises(ExerciseError) as error:
        compressed_mean(wrong)
    assert words in str(error.value) and not_words not in str(error.value)
    assert "correct" not in capsys.readouterr().out

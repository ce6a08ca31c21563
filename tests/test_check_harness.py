"""Which world sizes a multi-process checker launches."""

from course_lib.check.mp.harness import WORLD_SIZES, WORLD_SIZES_ENV, world_sizes_to_run


def test_every_world_size_unless_the_environment_names_some(monkeypatch):
    monkeypatch.delenv(WORLD_SIZES_ENV, raising=False)
    assert world_sizes_to_run(WORLD_SIZES) == [2, 3, 4]
    monkeypatch.setenv(WORLD_SIZES_ENV, "3")
    assert world_sizes_to_run(WORLD_SIZES) == [3]
    monkeypatch.setenv(WORLD_SIZES_ENV, "2,4")
    assert world_sizes_to_run((3, 4)) == [4]


def test_a_choice_outside_the_checkers_sizes_keeps_them_all(monkeypatch):
    monkeypatch.setenv(WORLD_SIZES_ENV, "5")  # a checker never runs on sizes it did not ask for
    assert world_sizes_to_run((2, 3)) == [2, 3]


def test_a_file_that_still_holds_its_marked_line_is_open(tmp_path, capsys):
    import ast

    from course_lib.check import nb06
    from course_lib.check.mp.learner import still_open

    text = ('def done(x):\n    return x\n\n\ndef open_one(x):\n'
            '    raise NotImplementedError("Exercise 6.3: replace this line with your code")\n')
    tree = ast.parse(text)
    assert still_open(tree, text, ("open_one",)) and still_open(tree, text, ())
    assert not still_open(tree, text, ("done",))  # another function's line is not this one's
    path = tmp_path / "my_ring.py"
    path.write_text(text.replace("open_one", "ring_all_reduce"))
    nb06.my_ring(str(path))  # no launch: reported at once
    assert capsys.readouterr().out.startswith("Exercise 6.3: not done yet")

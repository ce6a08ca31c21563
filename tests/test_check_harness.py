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

"""scripts/make_student_notebooks.py on small synthetic notebooks: marked lines, ids, errors,
%%writefile cells, keeping the learner's copies."""

import json
import os
import sys
import textwrap

import nbformat
import pytest
from answer_edits import reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))  # the script and the modules beside it
import make_student_notebooks as msn  # noqa: E402

from course_lib.check.student_copy import marked_line, reference_lines  # noqa: E402

CHECKERS = '''
from course_lib.check.checker import exercise


@exercise("9.1")
def doubled(fn):
    pass


@exercise("9.2")
def halved(fn):
    pass


def undecorated(fn):
    pass
'''

GOOD_CELL = '''\
def my_double(x):
    """Twice x."""
    # BEGIN SOLUTION
    y = 2 * x
    return y
    # END SOLUTION


check.nb99.doubled(my_double)'''


@pytest.fixture
def check_dir(tmp_path):
    folder = tmp_path / "check"
    folder.mkdir()
    (folder / "nb99.py").write_text(CHECKERS)
    return folder


def code(source, outputs=("done\n",)):
    cell = nbformat.v4.new_code_cell(textwrap.dedent(source))
    cell.execution_count = 1
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=t) for t in outputs]
    return cell


def notebook(*cells):
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 99 · Test"),
                                           code("x = 1\nprint(x)", ["1\n"]), *cells])


def test_a_block_becomes_one_marked_line_at_its_indentation(check_dir):
    nb = notebook(nbformat.v4.new_markdown_cell("**Exercise 9.1.** Double it."), code(GOOD_CELL))
    made = msn.make_student_copy(nb, "nb99", check_dir)
    cell = made.notebook.cells[-1]
    assert cell.source == textwrap.dedent('''\
        def my_double(x):
            """Twice x."""
            raise NotImplementedError("Exercise 9.1: replace this line with your code")


        check.nb99.doubled(my_double)''')
    assert made.cleared == {3}
    assert cell.outputs == [] and cell.execution_count is None  # exercise output cleared
    assert made.notebook.cells[2].outputs[0]["text"] == "1\n"  # other outputs are kept
    assert [b.exercise_id for b in made.blocks] == ["9.1"] and made.checks == {"9.1": 1}
    assert made.blocks[0].lines == ["    y = 2 * x", "    return y"]
    assert "BEGIN SOLUTION" in nb.cells[-1].source  # the original is left as it was
    assert made.notebook.cells[1].id == "student-copy-note"
    nbformat.validate(made.notebook)


def test_two_blocks_a_nested_function_and_a_later_checker_cell(check_dir):
    source = '''\
    class Halver:
        def my_half(self, x):
            def inner(v):
                # BEGIN SOLUTION
                return v / 2
                # END SOLUTION
            # BEGIN SOLUTION
            return inner(x)
            # END SOLUTION'''
    nb = notebook(code(source), code("check.nb99.halved(Halver().my_half)"))
    made = msn.make_student_copy(nb, "nb99", check_dir)
    assert [(b.function, b.exercise_id) for b in made.blocks] == [("inner", "9.2"),
                                                                   ("my_half", "9.2")]
    assert made.notebook.cells[-2].source.count("raise NotImplementedError") == 2
    assert made.notebook.cells[-1].outputs == []  # the checker's cell is cleared too
    assert made.checks == {"9.2": 1}


def test_a_function_name_reused_by_the_next_exercise(check_dir):
    second = GOOD_CELL.replace("9.1", "9.2").replace("doubled", "halved")
    made = msn.make_student_copy(notebook(code(GOOD_CELL), code(second)), "nb99", check_dir)
    assert [b.exercise_id for b in made.blocks] == ["9.1", "9.2"]


def test_exercise_id_from_markdown_when_the_checker_has_none(check_dir):
    nb = notebook(nbformat.v4.new_markdown_cell("**Exercise 9.7.** Something."),
                  code(GOOD_CELL.replace("doubled", "undecorated")))
    assert msn.make_student_copy(nb, "nb99", check_dir).blocks[0].exercise_id == "9.7"


GIVEN = """\
    # END SOLUTION
    # BEGIN STUDENT VERSION
    # y = 3 * x  # the given code: wrong, the learner fixes it
    #
    # return y
    # END STUDENT VERSION
"""
GIVEN_CELL = GOOD_CELL.replace("    # END SOLUTION\n", GIVEN)


def test_a_student_version_is_what_the_copy_holds_and_the_reference_leaves_out(check_dir):
    made = msn.make_student_copy(notebook(code(GIVEN_CELL)), "nb99", check_dir)
    assert made.notebook.cells[-1].source == textwrap.dedent('''\
        def my_double(x):
            """Twice x."""
            y = 3 * x  # the given code: wrong, the learner fixes it

            return y


        check.nb99.doubled(my_double)''')
    assert made.blocks[0].lines == ["    y = 2 * x", "    return y"]  # the solution
    assert made.blocks[0].exercise_id == "9.1" and made.cleared == {2}
    ran = "\n".join(reference_lines(GIVEN_CELL.split("\n")))  # what the reference runs
    assert ran == GOOD_CELL.replace("    # BEGIN SOLUTION\n", "").replace(
        "    # END SOLUTION\n", "")


MALFORMED = {
    "only in a class body": "class Doubler:\n    # BEGIN SOLUTION\n    factor = 2\n"
                            "    # END SOLUTION\ncheck.nb99.doubled(Doubler)",
    "without '# END SOLUTION'": GOOD_CELL.replace("    # END SOLUTION\n", ""),
    "without '# BEGIN SOLUTION'": GOOD_CELL.replace("    # BEGIN SOLUTION\n", ""),
    "cannot nest": GOOD_CELL.replace("    return y\n", "    # BEGIN SOLUTION\n    return y\n"),
    "write the marker exactly": GOOD_CELL.replace("# BEGIN SOLUTION", "#BEGIN SOLUTION"),
    "not indented like": GOOD_CELL.replace("    # END SOLUTION", "# END SOLUTION"),
    "empty solution block": "def my_double(x):\n    # BEGIN SOLUTION\n\n    # END SOLUTION\n"
                            "    return x\ncheck.nb99.doubled(my_double)",
    "only comments": "def my_double(x):\n    # BEGIN SOLUTION\n    # think\n    # END SOLUTION"
                     "\n    return x\ncheck.nb99.doubled(my_double)",
    "not inside a function": "# BEGIN SOLUTION\nanswer = 2\n# END SOLUTION\n"
                             "check.nb99.doubled(lambda x: answer * x)",
    "outside its checker": GOOD_CELL + "\nprint(my_double(3))",
    "no checker call receives": GOOD_CELL.replace("check.nb99.doubled(my_double)", "pass"),
    "cannot tell the exercise": GOOD_CELL.replace("doubled", "undecorated"),
    "with its marked line": "def my_double(x):\n    y = (x +\n    # BEGIN SOLUTION\n    x)\n"
                     "    # END SOLUTION\n    return y\ncheck.nb99.doubled(my_double)",
    "not valid Python": GOOD_CELL.replace("return y", "return y)"),
    "lines are commented out": GIVEN_CELL.replace("    # return y", "    return y"),
    "without a '# END STUDENT VERSION'": GIVEN_CELL.replace("    # END STUDENT VERSION\n", ""),
    "indent '# BEGIN STUDENT VERSION'": GIVEN_CELL.replace("    # BEGIN STUDENT",
                                                           "# BEGIN STUDENT"),
    "an empty student version": GOOD_CELL.replace(
        "    # END SOLUTION\n",
        "    # END SOLUTION\n    # BEGIN STUDENT VERSION\n    # END STUDENT VERSION\n"),
    "a student version right after": GOOD_CELL + "\n# BEGIN STUDENT VERSION",  # no block
}


@pytest.mark.parametrize("problem", sorted(MALFORMED))
def test_malformed_notebooks_fail_loudly(problem, check_dir):
    expected = "not inside a function" if problem == "only in a class body" else problem
    with pytest.raises(msn.MalformedNotebook, match=expected) as error:
        msn.make_student_copy(notebook(code(MALFORMED[problem])), "nb99", check_dir)
    assert "nb99, cell 2" in str(error.value)  # names the notebook and the cell


def test_a_call_guarded_against_the_open_exercise_is_allowed(check_dir):
    guarded = GOOD_CELL + "\ntry:\n    print(my_double(3))\nexcept NotImplementedError:\n" \
                          "    print('finish exercise 9.1 first')"
    made = msn.make_student_copy(notebook(code(guarded)), "nb99", check_dir)
    assert made.checks == {"9.1": 1}
    unguarded = guarded.replace("NotImplementedError", "ValueError")
    with pytest.raises(msn.MalformedNotebook, match="outside its checker"):
        msn.make_student_copy(notebook(code(unguarded)), "nb99", check_dir)


def test_magic_lines_are_allowed(check_dir):
    made = msn.make_student_copy(notebook(code("%matplotlib inline\n" + GOOD_CELL)), "nb99",
                                 check_dir)
    assert made.notebook.cells[-1].source.startswith("%matplotlib inline\n")


def write_source(folder, name, cells):
    folder.mkdir(exist_ok=True)
    path = folder / name
    nbformat.write(notebook(*cells), path)
    return path


def test_copies_keep_edits_until_reset(tmp_path):
    # no check_dir: the checkers of course_lib/check are the real ones
    cell = code("import course_lib.check.nb00\n\ndef f():\n    # BEGIN SOLUTION\n    return 1\n"
                "    # END SOLUTION\n\ncheck.nb00.hello_on_three(f)")
    src = write_source(tmp_path / "nbs", "99_test.ipynb", [cell])
    out = tmp_path / "student"
    assert msn.main([str(src), "--out", str(out)]) == 0
    copy = out / "99_test.ipynb"
    student = nbformat.read(copy, as_version=4)
    assert "    " + marked_line("0.1") in student.cells[-1].source.split("\n")
    manifest = json.loads((out / msn.MANIFEST).read_text())
    assert set(manifest) == {"99_test.ipynb"}

    student.cells[-1].source = student.cells[-1].source.replace(marked_line("0.1"), "return 1")
    nbformat.write(student, copy)  # the learner's answer, saved
    edited = copy.read_text()
    write_source(tmp_path / "nbs", "99_test.ipynb", [cell, code("print(2)")])  # course update
    messages = msn.write_copies([src], out, reset=False)
    assert copy.read_text() == edited and "newer version" in messages[0]

    messages = msn.write_copies([src], out, reset=True)
    backups = list((out / "previous").iterdir())
    assert len(backups) == 1 and backups[0].read_text() == edited
    assert "print(2)" in copy.read_text() and "return 1" not in copy.read_text()

    write_source(tmp_path / "nbs", "99_test.ipynb", [cell, code("print(3)")])
    msn.write_copies([src], out, reset=False)  # an unedited copy follows the course
    assert "print(3)" in copy.read_text()


def instructors_checkout(tmp_path):
    """A notebooks folder after the reference notebooks ran: every reference file of the
    course's file exercises and a pass record in workspace/, beside a folder of pictures."""
    nbs = tmp_path / "nbs"
    src = write_source(nbs, "99_test.ipynb", [code("print(1)")])
    (nbs / "workspace").mkdir()
    for name in ("token_ring", "my_ring", "my_dp_step", "my_hooks", "my_ddp_train", "my_zero"):
        (nbs / "workspace" / f"{name}.py").write_text(reference(f"{name}.py"))
    (nbs / "workspace" / ".passed.json").write_text('{"6.3": {"file": "my_ring.py"}}')
    (nbs / "pictures").mkdir()
    (nbs / "pictures" / "ring.svg").write_text("<svg/>")
    return src


def test_no_reference_work_reaches_a_student_copy(tmp_path):
    src = instructors_checkout(tmp_path)
    out = tmp_path / "student"
    assert msn.main([str(src), "--out", str(out)]) == 0
    assert not (out / "workspace").exists()
    copied = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert copied == {"99_test.ipynb", msn.MANIFEST, "pictures/ring.svg"}


def test_making_copies_again_keeps_every_file_the_learner_wrote(tmp_path):
    src = instructors_checkout(tmp_path)
    out = tmp_path / "student"
    mine = {"my_ring.py": "def ring_all_reduce(tensor, group=None):\n    pass  # mine\n",
            ".passed.json": '{"6.3": {"file": "my_ring.py", "sha256": "abc"}}',
            "notes_the_course_does_not_know.py": "x = 1\n"}
    (out / "workspace").mkdir(parents=True)
    for name, text in mine.items():
        (out / "workspace" / name).write_text(text)
    (out / "pictures").mkdir()
    (out / "pictures" / "ring.svg").write_text("<svg>my drawing</svg>")

    for _ in range(2):  # a workshop restarted twice
        messages = msn.write_copies([src], out, reset=False)
        assert {p.name: p.read_text() for p in (out / "workspace").iterdir()} == mine
        assert (out / "pictures" / "ring.svg").read_text() == "<svg>my drawing</svg>"
    assert f"kept your 3 file(s) in {out / 'workspace'}" in messages

    messages = msn.write_copies([src], out, reset=True)
    assert not (out / "workspace").exists()
    [backup] = (out / "previous").glob("workspace-*")
    assert {p.name: p.read_text() for p in backup.iterdir()} == mine
    assert f"moved your files in {out / 'workspace'} to {backup}" in messages


def test_one_bad_notebook_writes_nothing(tmp_path, capsys):
    good = write_source(tmp_path / "nbs", "98_good.ipynb", [code("print(1)")])
    bad = write_source(tmp_path / "nbs", "99_bad.ipynb", [code(MALFORMED["cannot nest"])])
    assert msn.main([str(good), str(bad), "--out", str(tmp_path / "student")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "99_bad.ipynb, cell 2" in err
    assert not (tmp_path / "student").exists()


IN_PLACE_CELL = '''\
def my_fill(t):
    # BEGIN SOLUTION
    for i in range(len(t)):
        t[i] = 2 * i
    # END SOLUTION


check.nb99.doubled(my_fill)'''


def answered(source: str, answer: str, check_dir):
    """The function of the student copy of ``source``, its marked line replaced by ``answer``."""
    made = msn.make_student_copy(notebook(code(source)), "nb99", check_dir)
    student = made.notebook.cells[-1].source.replace(marked_line("9.1"), answer)
    namespace = {}
    exec(student.split("\ncheck.")[0], namespace)  # the cell without its checker call
    return namespace[made.blocks[0].function]


def test_replacing_the_marked_line_works_for_a_function_that_returns(check_dir):
    assert answered(GOOD_CELL, "return 2 * x", check_dir)(3) == 6


def test_replacing_the_marked_line_works_for_a_function_that_changes_its_argument(check_dir):
    values = [0, 0, 0]
    my_fill = answered(IN_PLACE_CELL, "t[:] = [2 * i for i in range(len(t))]", check_dir)
    assert my_fill(values) is None and values == [0, 2, 4]


WRITEFILE_CELL = '''\
%%writefile workspace/ring.py
import sys

# BEGIN SOLUTION
print(2 * int(sys.argv[1]))
# END SOLUTION'''


def test_a_writefile_cell_gets_the_marked_line_and_the_checker_naming_its_file(check_dir):
    checker = code('check.nb99.halved("workspace/ring.py")')
    nb = notebook(code(WRITEFILE_CELL), code("print('between')"), checker)
    made = msn.make_student_copy(nb, "nb99", check_dir)
    assert made.notebook.cells[3].source == ("%%writefile workspace/ring.py\nimport sys\n\n"
                                             + marked_line("9.2"))
    assert made.checks == {"9.2": 1} and made.cleared == {2, 4}
    assert made.notebook.cells[4].outputs[0]["text"] == "done\n"  # the cell between is kept


def test_a_writefile_cell_without_a_checker_naming_its_file_is_refused(check_dir):
    nb = notebook(code(WRITEFILE_CELL), code('check.nb99.halved("workspace/other.py")'))
    with pytest.raises(msn.MalformedNotebook, match=r"nb99, cell 2: no checker call names "
                                                    r"ring\.py"):
        msn.make_student_copy(nb, "nb99", check_dir)


def test_a_notebook_named_without_its_folder_is_found_and_a_wrong_name_is_one_line(
        tmp_path, capsys):
    out = tmp_path / "student"
    assert msn.main(["05", "--check"]) == 0
    assert msn.main(["06_all_reduce_from_scratch.ipynb", "--out", str(out)]) == 0
    assert (out / "06_all_reduce_from_scratch.ipynb").exists()
    capsys.readouterr()
    assert msn.main(["06_all_reduce.ipynb", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no notebook 06_all_reduce.ipynb: give a path, or one of "), err
    assert "Traceback" not in err and len(err.splitlines()) == 1

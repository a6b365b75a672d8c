"""``quack-edu student`` and ``quack-edu grade``.

    quack-edu student                       regenerate notebooks/ from solutions/ (all lessons)
    quack-edu student --check               exit 1 if notebooks/ is out of date (CI)
    quack-edu grade notebooks/01_naive.ipynb [more.ipynb ...] [--json grade.json]
    quack-edu grade notebooks/01_naive.ipynb --only 01.rstd      one exercise, in seconds
    quack-edu grade SUBMISSIONS/ --lesson 01_naive --out grades/ -j 2   a class (class_grade)

``grade`` executes each notebook headless (fresh kernel, per-cell timeout) for its cell errors,
hangs and crashes, judges every exercise of its lesson outside that kernel (``judge``), prints
a table with points (and a summary for several notebooks), writes JSON with ``--json`` and
exits 1 unless every exercise that can run here passed. Given a folder, it grades a class: a
CSV gradebook and one feedback file per student (``class_grade``). The grader's own files are
hashed at its start and checked before it prints or writes a grade (``integrity``): if one
changed, it names them, writes nothing further and exits 2.

The package's ``quack_edu.tools.cli`` wires these in with ``add_commands(subparsers)``; they
also run on their own: ``python -m quack_edu.grading.cli grade ...``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .deadline import BUDGET_S, MAX_RESTARTS, RunBounds
from .isolate import MODES as ISOLATIONS

#: each command's arguments, in --help's order: (names, argparse's keywords)
_STUDENT_ARGS = [
    (
        ["solutions"],
        dict(nargs="*", type=Path, help="solution notebooks (default: every solutions/*.ipynb)"),
    ),
    (["--out"], dict(type=Path, help="output folder (default: notebooks/)")),
    (
        ["--release"],
        dict(
            type=Path,
            metavar="FOLDER",
            help="write a student's copy of the course into FOLDER (new): the lessons, the "
            "library and the self-check, without the solutions, the tests, the answer key "
            "(reference answers, mutants) or the hidden checks",
        ),
    ),
    (
        ["--partial"],
        dict(
            action="store_true",
            help="with --release: leave out the self-checks of lessons whose exercise modules "
            "have no answer-key block yet, rather than refuse",
        ),
    ),
    (
        ["--check"],
        dict(
            action="store_true",
            help="write nothing; exit 1 if the student notebooks are out of date",
        ),
    ),
]
_GRADE_ARGS = [
    (
        ["notebooks"],
        dict(
            nargs="+", type=Path, help="notebooks to grade, or one folder of submissions (a class)"
        ),
    ),
    (
        ["--only"],
        dict(metavar="ID", help="grade one exercise (e.g. 01.rstd) without running the notebook"),
    ),
    (["--json"], dict(type=Path, help="write the results as JSON here")),
    (
        ["--timeout"],
        dict(type=float, default=120.0, help="per-cell timeout in seconds (default 120)"),
    ),
    (
        ["--max-restarts"],
        dict(
            type=int,
            default=MAX_RESTARTS,
            metavar="N",
            help="fresh processes a notebook's crashing or hung cells may cost, each replaying "
            f"the cells before (default {MAX_RESTARTS}); then its cells left are not run, their "
            "exercises score 0 and the notebook is flagged",
        ),
    ),
    (
        ["--budget"],
        dict(
            type=float,
            default=BUDGET_S,
            metavar="SECONDS",
            help="seconds a notebook's cells may run in all, replays included (default "
            f"{BUDGET_S:g}); then as --max-restarts",
        ),
    ),
    (["--seed"], dict(type=int, help="seed of the hidden checks (default: a fresh secret one)")),
    (["--no-hidden"], dict(action="store_true", help="skip the hidden checks")),
    (
        ["--solutions"],
        dict(
            type=Path,
            help="folder of solution notebooks whose check cells are restored "
            "(default: solutions/)",
        ),
    ),
    (
        ["--executed"],
        dict(type=Path, help="save the executed notebooks (with outputs) in this folder"),
    ),
    (["--quiet"], dict(action="store_true", help="print only the summary line")),
    (
        ["--isolate"],
        dict(
            choices=ISOLATIONS,
            help="namespaces: run every learner process inside bubblewrap (bwrap), a read-only "
            "file system without the solutions, the results or other gradings' folders, its own "
            "process IDs, no network; stops with an error where it cannot (default: "
            "QUACK_EDU_ISOLATE, else none)",
        ),
    ),
]
#: ``grade``'s arguments for a class (the argument is a folder of submissions)
_CLASS_ARGS = [
    (["--lesson"], dict(help="the lesson handed in, e.g. 01_naive")),
    (["--out"], dict(type=Path, default=Path("grades"), help="gradebook folder (default grades/)")),
    (["-j", "--jobs"], dict(type=int, default=1, help="submissions graded at a time")),
    (["--force"], dict(action="store_true", help="grade again what is already graded")),
    (["--roster"], dict(type=Path, help="a file of student names, one a line")),
    (
        ["--deadline"],
        dict(help="ISO date-time (e.g. 2026-12-01T23:59); files modified later are marked late"),
    ),
]


def _add(parser, arguments) -> None:
    for names, keywords in arguments:
        parser.add_argument(*names, **keywords)


def add_commands(subparsers) -> None:
    """Register ``student`` and ``grade`` on an argparse subparsers object."""
    student = subparsers.add_parser(
        "student",
        help="regenerate the student notebooks from the solutions",
        description="Write notebooks/NN_*.ipynb from solutions/NN_*.ipynb: "
        "solutions replaced by stubs, hidden checks removed, outputs cleared.",
    )
    _add(student, _STUDENT_ARGS)
    student.set_defaults(func=run_student)
    grade = subparsers.add_parser(
        "grade",
        help="execute notebooks headless and grade their exercises",
        description="Execute each notebook in a fresh kernel, grade every "
        "exercise of its lesson (hidden checks included), print a table.",
    )
    _add(grade, _GRADE_ARGS)
    _add(grade.add_argument_group("a class (the argument is a folder of submissions)"), _CLASS_ARGS)
    grade.set_defaults(func=run_grade)


def run_student(args) -> int:
    from .nbfiles import generate_students, out_of_date

    if args.release:
        from .release import ReleaseError, write_release

        try:
            info = write_release(args.release, partial=args.partial)
        except ReleaseError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote a student's copy to {args.release}")
        print(f"  self-checks of lessons {', '.join(info['lessons'])} (public cases, seed "
              f"{info['seed']})")  # fmt: skip
        if info["left_out"]:
            print(f"  left out (no answer key block yet): lessons {', '.join(info['left_out'])}")
        return 0
    if args.check:
        stale = out_of_date(args.solutions or None, args.out)
        for s in stale:
            print(f"out of date: {s}")
        if stale:
            print("run `quack-edu student` (or `make student`) and commit notebooks/")
            return 1
        print("student notebooks are up to date")
        return 0
    try:
        written = generate_students(args.solutions or None, args.out)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for p in written:
        print(f"wrote {p}")
    if not written:
        print("no solution notebooks found")
    return 0


def _refuse(e) -> int:
    """A grader file or a result changed while grading (``integrity.GraderTampered``,
    ``class_grade.ResultTampered``): say which, exit 2."""
    print(f"error: {e}", file=sys.stderr)
    return 2


def run_class(args) -> int:
    from datetime import datetime

    from .class_grade import ClassLayoutError, ClassOptions, ResultTampered, grade_class
    from .integrity import GraderTampered

    if len(args.notebooks) != 1:
        print("error: give one folder of submissions", file=sys.stderr)
        return 2
    if args.executed:  # (red team 12: it was ignored without a word)
        print("note: --executed is for single notebooks; a class keeps none", file=sys.stderr)
    roster = None
    if args.roster:
        roster = [ln.strip() for ln in args.roster.read_text().splitlines() if ln.strip()]
    deadline = datetime.fromisoformat(args.deadline) if args.deadline else None
    options = ClassOptions(
        lesson=args.lesson,
        jobs=args.jobs,
        force=args.force,
        timeout=args.timeout,
        hidden=not args.no_hidden,
        seed=args.seed,
        roster=roster,
        deadline=deadline,
        solutions=args.solutions,
        only=args.only,
        max_restarts=args.max_restarts,
        budget=args.budget,
        isolate=args.isolate,
    )
    try:
        s = grade_class(args.notebooks[0], args.out, options)
    except (GraderTampered, ResultTampered, ClassLayoutError) as e:
        return _refuse(e)
    print(
        f"{s['submissions']} submissions: {s['graded']} graded, {s['skipped']} already graded "
        f"(--force grades them again), {s['missing']} missing, {s['flagged']} flagged; "
        f"{s['seconds']:.0f} s"
    )
    print(f"gradebook: {s['gradebook']}\nfeedback:  {s['feedback']}/<student>/<lesson>.txt")
    print(f"grader files: {s['grader_files']}")
    return 0


def run_grade(args) -> int:
    from . import isolate
    from .integrity import GraderTampered, check, grader_roots, snapshot
    from .notebook import grade_paths

    missing = [p for p in args.notebooks if not p.exists()]
    if missing:
        print(f"error: no such notebook: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    try:  # before anything runs: never graded without the isolation asked for
        isolate.use(args.isolate)
    except (ValueError, isolate.IsolationUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if any(p.is_dir() for p in args.notebooks):
        return run_class(args)  # takes its own snapshot (class_grade.grade_class)
    grader = snapshot(*grader_roots(args.solutions))  # before any notebook runs
    from .judge import Server, instructor_paths

    Server.hidden = tuple(instructor_paths(args.solutions, args.executed))  # (isolated view)
    Server.start()  # the judge server imports while the notebooks run
    run = grade_paths(
        args.notebooks,
        solutions=args.solutions,
        timeout=args.timeout,
        seed=args.seed,
        hidden=not args.no_hidden,
        executed_dir=args.executed,
        only=args.only,
        bounds=RunBounds(max_restarts=args.max_restarts, budget_s=args.budget),
    )
    try:
        check(grader)  # before any grade is printed or written
    except GraderTampered as e:
        return _refuse(e)
    run.grader_files = grader.summary()
    run.isolation = isolate.mode()
    if not args.quiet:
        print(run.table())
    print(
        f"score {run.score}/{run.max_score}"
        + (f" (+{run.skipped_points} GPU-tier points not run here)" if run.skipped_points else "")
        + (": pass" if run.passed else ": FAIL")
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(run.dumps() + "\n")
    return 0 if run.passed else 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quack-edu", description=__doc__.split("\n\n")[0])
    add_commands(p.add_subparsers(dest="command", required=True))
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    return args.func(args)


def student_main(argv=None) -> int:
    """``quack-edu student ARGS`` (argv without the subcommand)."""
    return main(["student", *(argv or [])])


def grade_main(argv=None) -> int:
    """``quack-edu grade ARGS`` (argv without the subcommand)."""
    return main(["grade", *(argv or [])])


if __name__ == "__main__":
    sys.exit(main())

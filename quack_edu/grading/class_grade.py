"""Grading a class: a folder of submissions to a CSV gradebook and one feedback file each.

    quack-edu grade SUBMISSIONS/ --lesson 00_setup_and_roofline --out grades/ -j 2

``SUBMISSIONS/`` holds one folder per student (``alice/00_setup_and_roofline.ipynb``) or one
notebook per student named by the student (``alice.ipynb``, ``alice_00_setup_and_roofline.ipynb``).
Each submission is graded as ``quack-edu grade`` grades one notebook (its cells run in a fresh
kernel; its answers judged outside it), ``-j N`` at a time. Written under ``--out``:

    gradebook.csv                    one row per student and lesson: points per exercise and tier,
                                     totals, late, missing, flags
    feedback/<student>/<lesson>.txt  the report the student gets: each exercise's checks, what
                                     was expected and seen, the hints (of a hidden check: that
                                     it failed and its hint, never its cases or source)
    results/<student>/<lesson>.json  the instructor's full result (hidden cases included), and
                                     the hash of the notebook it is for
    run.json                         the run's seed of the hidden checks (so a resumed run
                                     grades every submission on the same inputs) and the
                                     learner processes' isolation (``isolate``)

The grader's own files are hashed at the start (``integrity``) and checked before each
submission is graded and before each result, feedback file and the gradebook is written: if one
changed, ``GraderTampered`` names them and nothing further is graded or written.

A re-run grades only what is new or changed (a submission whose result is there, for the same
notebook bytes, is skipped) unless ``--force``. ``--roster`` names students who should have
submitted (the others are "missing"); ``--deadline`` marks files modified after it as late.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import secrets
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from .deadline import BUDGET_S, MAX_RESTARTS, RunBounds, TooSlow, cpu_bound
from .registry import TIERS, all_exercises, lessons
from .report import SKIP, ExerciseResult, NotebookResult, printable
from .submission import REFUSED, Refused, read_bytes, read_notebook

RESULT_VERSION = 1


@dataclass
class Submission:
    student: str
    lesson: str
    path: Path | None  # None: missing
    #: other notebooks of the student for the same lesson, not graded (the grade is flagged)
    also: tuple[Path, ...] = ()


class ClassLayoutError(ValueError):
    """A folder of submissions the grader cannot map one-to-one onto students."""


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@+-]", "_", name).strip("._") or "student"


def _student_of_file(stem: str) -> str:
    """The student a loose notebook is of: its name less the lesson's and the separators around
    it. Spaces are kept (red team 10: "ana .ipynb", a blank, was graded as ana's in place of
    her notebook; now it is a student of its own, whose results folder clashes with ana's: the
    class stops, naming both), and a notebook named for the lesson alone is a student named
    so, never a student folder's ("student")."""
    name = stem
    for le in sorted(lessons(), key=len, reverse=True):
        if le in name:
            name = name.replace(le, "")
            break
    return name.strip("_-.") or stem


def _notebooks(folder: Path) -> list[Path]:
    """The notebooks in a student's folder, links among them, and every folder in it that is a
    link, followed by none: a link is handed in to be refused, by name (``submission``)."""
    found = []
    for top, dirs, files in os.walk(folder):  # (never into a linked folder)
        here = Path(top)
        dirs[:] = [d for d in dirs if d != ".ipynb_checkpoints"]
        found += [here / d for d in dirs if (here / d).is_symlink()]
        found += [here / f for f in files if f.endswith(".ipynb")]
    return sorted(found, key=lambda p: (p.is_symlink(), p))


def _cells_lesson(path: Path, folder: Path) -> str | None:
    from .notebook import lesson_by_cells

    try:
        return lesson_by_cells(read_notebook(path, folder))
    except Exception:
        return None


def find_submissions(
    folder: Path, lesson: str | None = None, roster: list[str] | None = None
) -> list[Submission]:
    """Every (student, lesson) to grade in ``folder``; a roster student or a student folder
    without the lesson's notebook is a missing submission."""
    folder = Path(folder)
    found: dict[str, list[Path]] = {}
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_symlink() and (entry.suffix == ".ipynb" or entry.is_dir()):  # refused
            student = entry.name if entry.is_dir() else _student_of_file(entry.stem)
            found.setdefault(student, []).append(entry)
        elif entry.is_dir():
            found.setdefault(entry.name, []).extend(_notebooks(entry))
        elif entry.suffix == ".ipynb":
            found.setdefault(_student_of_file(entry.stem), []).append(entry)
    for s in roster or []:
        found.setdefault(s, [])
    by_folder: dict[str, list[str]] = {}  # (red team 5: "ana!" overwrote ana's results)
    for student in found:
        by_folder.setdefault(_safe(student), []).append(student)
    clashes = [names for names in by_folder.values() if len(names) > 1]
    if clashes:
        raise ClassLayoutError(
            "students whose results would share a folder: "
            + "; ".join(" and ".join(repr(n) for n in names) for names in clashes)
            + " (rename their submissions: letters, digits and _.@+- only)"
        )
    subs = []
    for student, paths in sorted(found.items()):
        by_lesson: dict[str, list[Path]] = {}
        for p in paths:
            le = _cells_lesson(p, folder) or (lesson if lesson and lesson in p.name else None)
            if le is None and lesson and len(paths) == 1:
                le = lesson  # the one notebook handed in: graded (and flagged) as the lesson
            if le:
                by_lesson.setdefault(le, []).append(p)
        if lesson:
            path, *also = by_lesson.get(lesson) or [None]
            if path is None and len(paths) == 1:
                path = paths[0]  # another lesson's notebook: graded as this one, flagged
            subs.append(Submission(student, lesson, path, tuple(also)))
        else:
            for le, (p, *also) in sorted(by_lesson.items()):
                subs.append(Submission(student, le, p, tuple(also)))
            if not by_lesson:
                subs.append(Submission(student, "?", None))
    return subs


# ---- one submission ---------------------------------------------------------------------------
def _digest(path: Path, lesson: str, options: dict, folder: Path) -> str:
    """The hash of the submission as the grader reads it (``submission.read_bytes``; a
    refused one: of the reason) and of what else decides its grade."""
    try:
        h = hashlib.sha256(read_bytes(path, folder))
    except Refused as e:
        h = hashlib.sha256(f"refused: {e}".encode())
    h.update(json.dumps({"lesson": lesson, **options}, sort_keys=True).encode())
    return h.hexdigest()


def notebook_record(res: NotebookResult) -> dict:
    """The instructor's record of a graded notebook: everything, the hidden checks' cases
    included (a student gets ``feedback_text``, which leaves them out)."""
    d = res.to_json(hidden_inputs=True)
    d["exercises"] = [e.to_record() for e in res.exercises]
    d["own_flags"] = list(res.flags)
    d["mode"] = res.mode
    return d


def notebook_from_record(d: dict) -> NotebookResult:
    res = NotebookResult(d["path"], d["lesson"], mode=d.get("mode", "compile-only"))
    res.exercises = [ExerciseResult.from_json(e) for e in d.get("exercises", [])]
    res.problems = list(d.get("problems", []))
    res.flags = list(d.get("own_flags", []))
    res.evidence = list(d.get("evidence", []))
    res.seconds = float(d.get("seconds", 0.0))
    return res


def feedback_text(student: str, res: NotebookResult, late: bool) -> str:
    """What the student reads: the table, then each exercise's checks with their hints; a
    hidden check's cases (its why, expected and seen) nowhere (``CheckResult.shown``)."""
    head = [
        f"{printable(student)}: lesson {res.lesson}",
        f"score {res.score}/{res.max_score}"
        + (f" (+{res.skipped_points} GPU-tier points not run here)" if res.skipped_points else "")
        + ("  (submitted late)" if late else ""),
        "",
        res.table(width=100, hidden_inputs=False),
        "",
    ]
    for e in res.exercises:
        head += [e.table(width=100, hidden_inputs=False), ""]
    return "\n".join(head)


def grade_one(job: dict) -> dict:
    """Grade one submission and write its result and feedback (runs in a pool process)."""
    from . import isolate
    from .integrity import check
    from .judge import Server
    from .notebook import grade_notebook

    grader = job["grader"]
    check(grader)  # an earlier submission may have written to the grader: grade no next one
    isolate.use(job.get("isolate"))  # (a pool process: as the run asked)
    Server.hidden = tuple(job.get("secrets", ()))  # (its isolated view's too)
    Server.start()  # imports while the notebook runs
    path, out = Path(job["path"]), Path(job["out"])
    student, lesson = job["student"], job["lesson"]
    folder = Path(job["folder"])
    rpath = out / "results" / _safe(student) / f"{lesson}.json"
    prev = read_result(out, rpath) if rpath.exists() else None
    rewritten = prev.get("rewritten") if prev else None  # by an earlier run's cells: remembered
    t0 = time.time()
    res = grade_notebook(
        path,
        lesson=job["lesson"],
        seed=job["seed"],
        timeout=job["timeout"],
        hidden=job["hidden"],
        solutions=job.get("solutions"),
        only=job.get("only"),
        bounds=RunBounds(
            tuple(job.get("secrets", ())), str(folder), job.get("max_restarts", MAX_RESTARTS),
            job.get("budget", BUDGET_S),
        ),
    )  # fmt: skip
    res.seconds = time.time() - t0
    check(grader)  # before its result and feedback are written
    after = _digest(path, lesson, job["options"], folder) if os.path.lexists(path) else None
    if after != job["digest"]:  # a cell wrote to the notebook (native code past the hook)
        rewritten = {"graded": job["digest"], "found": after, "at": datetime.now().isoformat()}
    if job.get("also"):  # the digest covers the graded notebook only: say what was left
        names = ", ".join(Path(p).name for p in job["also"])
        res.flags.append(
            f"more than one notebook for this lesson was handed in: {path.name} was graded, "
            f"not {names}"
        )
    if rewritten:
        res.flags.append(
            "the submission was rewritten on disk while it was graded "
            f"({rewritten['at'][:16]}): a cell wrote to it"
        )
    return _write_result(job, res, rewritten)


def _write_result(job: dict, res: NotebookResult, rewritten=None) -> dict:
    """The submission's signed result and its feedback, written; the progress line's data."""
    out, student, lesson = Path(job["out"]), job["student"], job["lesson"]
    rec = {
        "version": RESULT_VERSION,
        "for": "the instructor: the hidden checks' cases are in it; a student gets the feedback",
        "student": student,
        "lesson": lesson,
        "digest": job["digest"],
        "late": job["late"],
        "grader_files": job["grader"].summary(),
        "isolation": job.get("isolate") or "none",
        "result": notebook_record(res),
        "rewritten": rewritten,
    }
    rec["signature"] = _sign(out, rec)
    rdir = out / "results" / _safe(student)
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / f"{lesson}.json").write_text(json.dumps(rec, indent=1) + "\n")
    fdir = out / "feedback" / _safe(student)
    fdir.mkdir(parents=True, exist_ok=True)
    (fdir / f"{lesson}.txt").write_text(feedback_text(student, res, job["late"]))
    return {"student": student, "lesson": lesson, "score": res.score, "max": res.max_score}


#: what the feedback of a submission the grader failed on says
GRADER_FAILED = (
    "flagged: the grader failed while grading this submission ({what}): it scores 0 until "
    "the instructor looks at it"
)


def grade_failed(job: dict, error: BaseException) -> dict:
    """A submission whose grading raised ``error`` (the grader's bug, or a submission that found
    one): a result of 0 for each exercise, flagged with the error's name (its message, which
    may be the learner's text, is in the instructor's record only), so that the class goes on."""
    from .. import MODE
    from .integrity import check
    from .report import shown_text

    check(job["grader"])  # (a changed grader stops the class here too)
    what = type(error).__name__
    res = NotebookResult(job["path"], job["lesson"], mode="gpu" if MODE.gpu else "compile-only")
    for ex in all_exercises(job["lesson"]):
        if job.get("only") and ex.id != job["only"]:
            continue
        e = ExerciseResult(ex.id, ex.title, ex.lesson, dict(ex.points), mode=res.mode)
        e.forced_status, e.forced_message = "fail", GRADER_FAILED.format(what=what)
        res.exercises.append(e)
    res.flags.append(f"the grader failed while grading this submission ({what})")
    res.evidence.append(shown_text(f"{what}: {error}", 4000))
    return _write_result(job, res)


# ---- the class --------------------------------------------------------------------------------
def same_answer_flags(
    subs: list[Submission], folder: Path | None = None
) -> dict[tuple[str, str], list[str]]:
    """``{(student, lesson): flags}`` for answers handed in by more than one student (the same
    tokens; the page's own cell and short answers never count: ``similarity.same_answers``),
    each read from the submissions ``folder`` as ``submission.read_notebook`` reads it."""
    from .nbfiles import find_cell, notebooks_dir, read
    from .similarity import same_answers

    out: dict[tuple[str, str], list[str]] = {}
    for lesson in sorted({s.lesson for s in subs if s.path is not None}):
        books = {}
        for s in subs:
            if s.lesson == lesson and s.path is not None:
                try:
                    books[s.student] = read_notebook(s.path, folder)
                except Exception:  # noqa: BLE001  (unreadable or refused: its row says so)
                    continue
        page = notebooks_dir() / f"{lesson}.ipynb"
        blank = read(page) if page.exists() else None
        for ex in all_exercises(lesson):
            answers = {}
            for student, nb in books.items():
                cell = find_cell(nb, ex.cell_id)
                if cell is not None:
                    answers[student] = cell.source
            template = find_cell(blank, ex.cell_id) if blank is not None else None
            same = same_answers(answers, template.source if template is not None else None)
            for student, others in same.items():
                out.setdefault((student, lesson), []).append(
                    f"{ex.id}: the same answer as {', '.join(others)}"
                )
    return out


def _columns(lessons_: list[str], only: str | None) -> list[tuple[str, str]]:
    cols = []
    for le in lessons_:
        for ex in all_exercises(le):
            if only and ex.id != only:
                continue
            for tier in TIERS:
                if ex.points.get(tier):
                    cols.append((ex.id, tier))
    return cols


#: what a spreadsheet takes for the start of a formula (red team 6: a student who named a file
#: ``=HYPERLINK(...)_00_setup_and_roofline.ipynb``)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """A gradebook cell that a spreadsheet shows as the text it is: ``printable``, and after a
    ``'`` where it would begin a formula (a lone ``-``, a tier not run, is left as it is)."""
    if not isinstance(value, str) or value == "-":
        return value
    text = printable(value)
    return "'" + text if value.startswith(FORMULA_START) else text


def write_gradebook(path: Path, rows: list[dict], cols: list[tuple[str, str]]) -> None:
    """The CSV gradebook; every text cell as ``csv_cell`` writes it."""
    head = ["student", "lesson", "submission", "status", "late", "score", "max_score"]
    head += ["gpu_points_not_run", "flagged"]
    head += [f"{ex_id} {tier}" for ex_id, tier in cols]
    head += ["flags", "seconds"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=head, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: csv_cell(v) for k, v in r.items()})


def _row(sub: Submission, rec: dict | None, cols, out_path: Path) -> dict:
    row = {
        "student": sub.student,
        "lesson": sub.lesson,
        "submission": str(sub.path) if sub.path else "",
        "late": "",
    }
    if rec is None:
        row.update(status="missing", score=0, max_score="", flagged="no")
        return row
    res = notebook_from_record(rec["result"])
    by_id = {e.id: e for e in res.exercises}
    for ex_id, tier in cols:
        e = by_id.get(ex_id)
        if e is None:
            continue
        t = e.tiers().get(tier)
        if t is None:
            continue
        row[f"{ex_id} {tier}"] = "-" if t["status"] == SKIP else t["score"]
    flags = res.flagged
    unreadable = any(p.startswith("cannot read the notebook") for p in res.problems)
    refused = any(f.startswith(REFUSED) for f in res.flags)
    row.update(
        status="refused" if refused else "unreadable" if unreadable else "graded",
        late="yes" if rec.get("late") else "no",
        score=res.score,
        max_score=res.max_score,
        gpu_points_not_run=res.skipped_points,
        flagged="yes" if flags else "no",
        flags=" | ".join(flags),
        seconds=round(res.seconds, 1),
    )
    return row


class Progress:
    """A one-line progress bar on a terminal; a line per submission otherwise."""

    def __init__(self, total: int, stream=None):
        self.total, self.done, self.t0 = total, 0, time.time()
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def step(self, text: str) -> None:
        self.done += 1
        el = time.time() - self.t0
        eta = el / self.done * (self.total - self.done)
        width = 30
        fill = int(width * self.done / max(1, self.total))
        bar = "#" * fill + "." * (width - fill)
        line = f"[{bar}] {self.done}/{self.total}  {el:.0f} s, ~{eta:.0f} s left  {text}"
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


@dataclass
class ClassOptions:
    """How a class is graded (``quack-edu grade FOLDER``'s flags): ``lesson`` the lesson handed
    in, ``jobs`` submissions graded at a time, ``force`` grade again what is already graded,
    ``timeout`` per cell, ``hidden`` run the hidden checks, ``seed`` theirs (default: the one
    in ``run.json``, or a fresh one), ``roster`` students who should have submitted,
    ``deadline`` after which a file is late, ``solutions`` the folder of solution notebooks,
    ``only`` one exercise id, ``max_restarts`` and ``budget`` what one notebook's run may cost
    (``executor.Executor``), ``isolate`` the learner processes' OS isolation (``isolate``;
    None: ``QUACK_EDU_ISOLATE``'s)."""

    lesson: str | None = None
    jobs: int = 1
    force: bool = False
    timeout: float = 120.0
    hidden: bool = True
    seed: int | None = None
    roster: list[str] | None = None
    deadline: datetime | None = None
    solutions: Path | None = None
    only: str | None = None
    max_restarts: int = MAX_RESTARTS
    budget: float = BUDGET_S
    isolate: str | None = None


class ResultTampered(RuntimeError):
    """A result file no longer bears the signature the grader gave it."""

    def __init__(self, path: Path):
        super().__init__(f"the result {path} was changed after the grader wrote it")


def _key(out: Path) -> bytes:
    """The class's signing key (``out/.key``, made on the first run, readable by its owner
    only; no learner process may read the gradebook folder)."""
    path = out / ".key"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
    return path.read_bytes()


def _sign(out: Path, rec: dict) -> str:
    """HMAC-SHA256 of a result record (without its signature) under the class's key."""
    import hashlib
    import hmac

    body = json.dumps({k: v for k, v in rec.items() if k != "signature"}, sort_keys=True)
    return hmac.new(_key(out), body.encode(), hashlib.sha256).hexdigest()


def read_result(out: Path, rpath: Path) -> dict | None:
    """A result record the grader wrote: None if it is missing, unreadable, or not signed by
    this class's key (written by anything but the grader: it is graded again)."""
    import hmac

    try:
        rec = json.loads(rpath.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or not hmac.compare_digest(
        str(rec.get("signature", "")), _sign(out, rec)
    ):
        return None
    return rec


def _run_seed(out: Path, seed: int | None, isolation: str = "none") -> int:
    """The run's seed of the hidden checks: ``seed``, else the one kept in ``run.json`` (a
    resumed run), else a fresh one; kept in ``run.json``, with this run's ``isolation``."""
    state_path = out / "run.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    if seed is None:
        seed = state.get("seed")
    if seed is None:
        seed = secrets.randbits(31)
    state.update(seed=int(seed), isolation=isolation)
    state_path.write_text(json.dumps(state, indent=1) + "\n")
    return int(seed)


def _jobs(
    subs: list[Submission], out: Path, opts: ClassOptions, seed: int, grader, folder: Path
) -> tuple[list, int]:
    """The submissions to grade (as ``grade_one`` jobs, each with the ``grader``'s manifest
    to check) and how many are already graded."""
    from .judge import instructor_paths

    options = {"hidden": opts.hidden, "only": opts.only, "seed": seed}
    todo, skipped = [], 0
    for sub in subs:
        if sub.path is None:
            continue
        digest = _digest(sub.path, sub.lesson, options, folder)
        rpath = out / "results" / _safe(sub.student) / f"{sub.lesson}.json"
        if not opts.force and rpath.exists():
            rec = read_result(out, rpath)
            if rec is not None and rec.get("digest") == digest:
                skipped += 1
                continue
        deadline = opts.deadline
        mtime = sub.path.lstat().st_mtime  # (a link's own: it is refused)
        late = bool(deadline and datetime.fromtimestamp(mtime) > deadline)
        todo.append(
            dict(
                path=str(sub.path),
                out=str(out),
                folder=str(folder),
                student=sub.student,
                lesson=sub.lesson,
                seed=seed,
                timeout=opts.timeout,
                hidden=opts.hidden,
                solutions=str(opts.solutions) if opts.solutions else None,
                only=opts.only,
                max_restarts=opts.max_restarts,
                budget=opts.budget,
                isolate=opts.isolate,
                digest=digest,
                options=options,  # what the digest covers beside the notebook
                late=late,
                also=[str(p) for p in sub.also],
                grader=grader,
                # what the submission's cells and answers may not read: the class's
                # submissions (its own included: the grader hands it over), the gradebook
                # and a --solutions folder outside the repository
                secrets=[
                    str(folder.resolve()),
                    str(out.resolve()),
                    *instructor_paths(opts.solutions),
                ],
            )
        )
    return todo, skipped


def grade_class(
    folder: Path, out: Path, options: ClassOptions | None = None, progress_stream=None
) -> dict:
    """Grade every submission in ``folder``; returns a summary (counts, paths, seconds).
    Raises ``integrity.GraderTampered`` if the grader's files change while it grades."""
    from . import isolate
    from .integrity import GraderTampered, check, grader_roots, snapshot

    opts = options or ClassOptions()
    # (IsolationUnavailable: nothing is graded)
    opts = replace(opts, isolate=isolate.use(opts.isolate))
    grader = snapshot(*grader_roots(opts.solutions))  # before any submission runs
    t0 = time.time()
    folder, out = Path(folder), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seed = _run_seed(out, opts.seed, opts.isolate)
    subs = find_submissions(folder, opts.lesson, opts.roster)
    todo, skipped = _jobs(subs, out, opts, seed, grader, folder)
    bar = Progress(len(todo), progress_stream)

    def done(r: dict) -> None:
        bar.step(f"{printable(r['student'])} {r['lesson']}: {r['score']}/{r['max']}")

    def failed(job: dict, e: Exception) -> None:
        """One submission the grader failed on: 0 and flagged, named; the class goes on."""
        r = grade_failed(job, e)
        bar.step(
            f"{printable(r['student'])} {r['lesson']}: the grader failed on this submission "
            f"({type(e).__name__}): 0, flagged"
        )

    stop = (GraderTampered, ResultTampered)  # nothing further may be graded or written
    if opts.jobs <= 1 or len(todo) <= 1:
        for job in todo:
            try:
                done(grade_one(job))
            except stop:
                raise
            except Exception as e:  # noqa: BLE001  (red team 8: one submission ended the run)
                failed(job, e)
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        again = []  # the jobs of a pool that broke (a pool process died): graded here, in turn
        with ProcessPoolExecutor(max_workers=opts.jobs, mp_context=mp.get_context("spawn")) as pool:
            futs = {pool.submit(grade_one, job): job for job in todo}
            try:
                for f in as_completed(futs):
                    try:
                        done(f.result())
                    except stop:
                        raise
                    except BrokenProcessPool:
                        again.append(futs[f])
                    except Exception as e:  # noqa: BLE001
                        failed(futs[f], e)
            except stop:
                pool.shutdown(cancel_futures=True)  # grade no submission that has not started
                raise
        for job in again:
            try:
                done(grade_one(job))
            except stop:
                raise
            except Exception as e:  # noqa: BLE001
                failed(job, e)

    rows = []
    graded_lessons = sorted({s.lesson for s in subs if s.lesson != "?"})
    cols = _columns(graded_lessons, opts.only)
    for sub in subs:
        rec = None
        if sub.path is not None:
            rpath = out / "results" / _safe(sub.student) / f"{sub.lesson}.json"
            if rpath.exists():
                rec = read_result(out, rpath)
                if rec is None:  # changed since the grader wrote it this run: trust nothing
                    raise ResultTampered(rpath)
        rows.append(_row(sub, rec, cols, out))
    try:  # (the grader's own reading of every answer: it never ends the class's run)
        with cpu_bound(60.0 * max(1, len(subs)), "comparing the class's answers"):
            same = same_answer_flags(subs, folder)
    except (Exception, TooSlow) as e:  # noqa: BLE001
        same = {}
        print(f"quack-edu: the same-answer comparison did not finish ({type(e).__name__})",
              file=sys.stderr)  # fmt: skip
    for sub, row in zip(subs, rows, strict=True):
        for flag in same.get((sub.student, sub.lesson), ()):
            row["flags"] = " | ".join(f for f in (row.get("flags"), flag) if f)
            row["flagged"] = "yes"
    book = out / "gradebook.csv"
    check(grader)
    write_gradebook(book, rows, cols)
    return dict(
        gradebook=str(book),
        feedback=str(out / "feedback"),
        submissions=len(subs),
        graded=len(todo),
        skipped=skipped,
        missing=sum(1 for s in subs if s.path is None),
        flagged=sum(1 for r in rows if r.get("flagged") == "yes"),
        grader_files=grader.summary(),
        seconds=time.time() - t0,
    )

"""Results of grading, as data (JSON) and as the short tables learners and instructors read.

    RunResult            score / max_score for the whole run (one or more notebooks)
      NotebookResult     ... for one notebook, plus cell-level problems (errors, timeouts)
        ExerciseResult   ... for one exercise, per tier, with each failure's message
          CheckResult    one check: status, expected, seen, hint

Statuses of a check: ``pass``, ``fail``, ``skip`` (its tier cannot run on this machine),
``not attempted`` (the answer is missing or still raises NotImplementedError) and ``blocked``
(a check it needs failed). ``score``/``max_score`` count only tiers that ran; the points of
skipped tiers are reported as ``skipped_points``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace

from . import answer_key
from .registry import COMPILE, GPU, TIERS

PASS, FAIL, SKIP, NOT_ATTEMPTED, BLOCKED = "pass", "fail", "skip", "not attempted", "blocked"

#: what a skipped GPU tier leaves unchecked, in the report's words: a compile-tier pass is about
#: the compiled code, and a kernel can compile to the right instructions and compute wrong values
SKIPPED_GPU = "skipped (needs a Hopper GPU): values on the GPU and speed not checked"
COMPILE_ONLY_MEANS = (
    "the compile tier checks what your code compiles to (the PTX: loads, shuffles, barriers, "
    "registers), not the values it computes: a kernel can pass it and still be wrong; the GPU "
    "tier runs it against the reference"
)
#: the same where the compile tier also ran the kernel's PTX on the CPU (``sim_values``)
COMPILE_SIMULATED_MEANS = (
    "the compile tier checks what your code compiles to and, with the PTX run on this CPU "
    "(ptxsim), the values it computes at a few small shapes and the order of its shared-memory "
    "accesses; the GPU tier runs it on the GPU at larger shapes and times it"
)


#: the same where the exercise is a function run on the CPU (no kernel compiled: the row
#: formula of the backward, a fake implementation, a model's arithmetic)
COMPILE_HOST_MEANS = (
    "the compile tier ran your function here, on the CPU, and compared what it returns with "
    "the reference; the GPU tier checks it beside the library's kernel on a Hopper GPU"
)
#: a whole run's first lines, without a GPU: what the compile tier of its exercises checks
COMPILE_RUN_MEANS = (
    "the compile tier checks a kernel by what it compiles to (the PTX: loads, shuffles, "
    "barriers, registers; at most exercises also its values, the PTX run on this CPU) and a "
    "host function by the values it returns here; not the values a kernel computes on a GPU, "
    "nor its speed: a kernel can pass it and still be wrong there"
)


#: how much of a text that may come from the learner (an exception's message, a file name) a
#: student's report shows, in characters
SHOWN_MAX = 600


def printable(text: str) -> str:
    """``text`` with each character a terminal or a spreadsheet would act on (a newline, an
    escape) written as its escape: a learner's text is shown, not obeyed."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def shown_text(text, limit: int | None = SHOWN_MAX):
    """``printable(text)`` cut to ``limit`` characters (None: whole); None stays None."""
    if text is None:
        return None
    text = printable(text)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


#: a hidden check's failure in what a student reads: its inputs stay with the grader
HIDDEN_CASE_FAILED = (
    "a hidden case failed (its inputs are not shown: the class is graded with one seed, and "
    "the visible checks above show the same kind of case)"
)


@dataclass
class CheckResult:
    name: str
    tier: str
    status: str
    message: str = ""
    expected: str | None = None
    seen: str | None = None
    hint: str | None = None
    hidden: bool = False
    shortcut: bool = False
    seconds: float = 0.0

    def shown(self, hidden_inputs: bool = True) -> CheckResult:
        """The check as its reader sees it. ``hidden_inputs=False`` (what a student reads: a
        class's feedback, ``quack-edu grade``'s table and JSON) leaves a hidden check that ran
        its name, status and hint only: its why, expected, seen and a pass's detail name its
        cases, which a class keeps for every regrade (red team 6: a lookup table of them)."""
        if hidden_inputs:
            return self
        if not self.hidden or self.status not in (PASS, FAIL):  # (its text may be the learner's)
            return replace(self, message=shown_text(self.message), expected=shown_text(
                self.expected), seen=shown_text(self.seen))  # fmt: skip
        why = HIDDEN_CASE_FAILED if self.status == FAIL else ""
        return replace(self, message=why, expected=None, seen=None)

    def failure_text(self) -> str:
        parts = [f"[{self.tier}] {self.name}: {self.message or self.status}"]
        if self.expected is not None:
            parts.append(f"expected {self.expected}")
        if self.seen is not None:
            parts.append(f"seen {self.seen}")
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "; ".join(parts)


@dataclass
class ExerciseResult:
    id: str
    title: str
    lesson: str
    points: dict
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    forced_status: str | None = None  # set when the grader overrides (timeout, cell error)
    forced_message: str | None = None
    mode: str = "compile-only"
    #: what flagged it, whole, as the learner's process reported it (the sandbox's incidents):
    #: the instructor's record only; a student reads ``forced_message``, in fixed words
    evidence: list[str] = field(default_factory=list)

    # ---- scoring --------------------------------------------------------------------------
    def tier_status(self, tier: str) -> str:
        if self.forced_status:
            return SKIP if (tier == GPU and self.mode != "gpu") else self.forced_status
        mine = [c for c in self.checks if c.tier == tier]
        if not mine or all(c.status == SKIP for c in mine):
            return SKIP
        if any(c.shortcut for c in self.checks):  # a shortcut anywhere zeroes every tier
            return FAIL
        if any(c.status == NOT_ATTEMPTED for c in mine):
            return NOT_ATTEMPTED
        # (in a student's copy, a check left to the instructor is skipped, not failed)
        done = (PASS, SKIP) if answer_key.released() else (PASS,)
        return PASS if all(c.status in done for c in mine) else FAIL

    def tiers(self) -> dict:
        out = {}
        for tier in TIERS:
            pts = self.points.get(tier, 0)
            if not pts and not any(c.tier == tier for c in self.checks):
                continue
            st = self.tier_status(tier)
            ran = st != SKIP
            out[tier] = dict(
                status=st,
                score=pts if st == PASS else 0,
                max_score=pts if ran else 0,
                skipped_points=0 if ran else pts,
            )
        return out

    @property
    def score(self) -> int:
        return sum(t["score"] for t in self.tiers().values())

    @property
    def max_score(self) -> int:
        return sum(t["max_score"] for t in self.tiers().values())

    @property
    def skipped_points(self) -> int:
        return sum(t["skipped_points"] for t in self.tiers().values())

    @property
    def status(self) -> str:
        if self.forced_status:
            return self.forced_status
        sts = [t["status"] for t in self.tiers().values() if t["status"] != SKIP]
        if not sts:
            return SKIP
        if all(s == PASS for s in sts):
            return PASS
        if all(s == NOT_ATTEMPTED for s in sts):
            return NOT_ATTEMPTED
        return "partial" if PASS in sts else FAIL

    @property
    def flagged(self) -> bool:
        """The answer cell was flagged (it reached for the grader, the process or the library's
        own implementation): 0 points, for the instructor to look at."""
        return bool(self.forced_message and self.forced_message.startswith("flagged"))

    @property
    def failures(self) -> list[str]:
        """Why it lost points, the hidden checks' cases included (the instructor's words)."""
        return self.failure_lines(hidden_inputs=True)

    def failure_lines(self, hidden_inputs: bool = False) -> list[str]:
        """Why it lost points; ``hidden_inputs=False``: as a student may read it
        (``CheckResult.shown``)."""
        out = []
        if self.forced_message:
            out.append(shown_text(self.forced_message, None if hidden_inputs else SHOWN_MAX))
        out += [c.shown(hidden_inputs).failure_text() for c in self.checks if c.status == FAIL]
        if self.status == NOT_ATTEMPTED and not self.forced_message:
            first = next((c for c in self.checks if c.status == NOT_ATTEMPTED), None)
            out.append(first.message if first else "not attempted")
        return out + list(self.notes)

    def to_json(self, hidden_inputs: bool = True) -> dict:
        """As data; ``hidden_inputs=False``: as a student may read it (``CheckResult.shown``,
        no ``evidence``)."""
        extra = {"evidence": list(self.evidence)} if hidden_inputs else {}
        return dict(
            **extra,
            id=self.id,
            title=self.title,
            lesson=self.lesson,
            status=self.status,
            score=self.score,
            max_score=self.max_score,
            skipped_points=self.skipped_points,
            flagged=self.flagged,
            tiers=self.tiers(),
            failures=self.failure_lines(hidden_inputs),
            checks=[asdict(c.shown(hidden_inputs)) for c in self.checks],
        )

    @classmethod
    def from_json(cls, d: dict) -> ExerciseResult:
        r = cls(d["id"], d["title"], d["lesson"], d.get("points", {}))
        r.checks = [CheckResult(**c) for c in d.get("checks", [])]
        r.notes = list(d.get("notes", []))
        r.forced_status = d.get("forced_status")
        r.forced_message = d.get("forced_message")
        r.mode = d.get("mode", r.mode)
        r.evidence = list(d.get("evidence", []))
        return r

    def to_record(self) -> dict:
        """Everything needed to rebuild the result (what the notebook kernel sends the grader)."""
        d = self.to_json()
        d.update(
            points=self.points,
            notes=self.notes,
            forced_status=self.forced_status,
            forced_message=self.forced_message,
            mode=self.mode,
        )
        return d

    # ---- text -----------------------------------------------------------------------------
    def summary(self) -> str:
        t = self.tiers()
        bits = []
        for tier, v in t.items():
            if v["status"] == SKIP:
                bits.append(f"{tier} tier not run here ({v['skipped_points']} pt)")
            else:
                bits.append(f"{tier} {v['score']}/{v['max_score']}")
        return f"{self.id}: {self.score}/{self.max_score} points ({', '.join(bits)})"

    def __repr__(self) -> str:
        return f"<{self.summary()}>"

    def table(self, width: int = 96, *, hidden_inputs: bool = True) -> str:
        """The exercise's checks, one a line, each failure with why, expected, seen and hint;
        ``hidden_inputs=False`` (what a student reads: graded with a seed the class keeps)
        keeps a hidden check's why, expected and seen out: they name its inputs."""
        lines = [f"{self.id}  {self.title}"]
        if self.forced_message:
            limit = None if hidden_inputs else SHOWN_MAX
            lines.append(_wrap_line(f"  FAIL  {shown_text(self.forced_message, limit)}", width, 8))
        for c in (c.shown(hidden_inputs) for c in self.checks):
            mark = {
                PASS: "pass",
                FAIL: "FAIL",
                SKIP: "skip",
                NOT_ATTEMPTED: "----",
                BLOCKED: "----",
            }.get(c.status, c.status)
            name = c.name + (" (hidden)" if c.hidden else "")
            tail = ""
            if c.status == SKIP:
                tail = f"  {c.message}"
            elif c.status in (NOT_ATTEMPTED, BLOCKED):
                tail = f"  {c.status}"
            elif c.status == PASS and c.message:
                tail = f"  {c.message}"
            lines.append(_wrap_line(f"  {mark:4}  {c.tier:7}  {name}{tail}", width, 17))
            if c.status == FAIL:
                if c.message:
                    lines.append(_wrap("why", c.message, width))
                if c.expected is not None:
                    lines.append(_wrap("expected", c.expected, width))
                if c.seen is not None:
                    lines.append(_wrap("seen", c.seen, width))
                if c.hint:
                    lines.append(_wrap("hint", c.hint, width))
        if self.status == NOT_ATTEMPTED:
            first = next((c for c in self.checks if c.status == NOT_ATTEMPTED), None)
            if first and first.message:
                lines.append(_wrap("", first.message, width))
        for n in self.notes:
            lines.append(_wrap("note", shown_text(n, None if hidden_inputs else SHOWN_MAX), width))
        t = self.tiers()
        if t.get("gpu", {}).get("status") == SKIP and t.get("compile", {}).get("status") == PASS:
            simulated = any(
                c.status == PASS and "on the CPU (the PTX simulated" in c.name for c in self.checks
            )
            kernel = any(c.tier == COMPILE and c.name.startswith("compiles") for c in self.checks)
            if not kernel:
                note = COMPILE_HOST_MEANS
            else:
                note = COMPILE_SIMULATED_MEANS if simulated else COMPILE_ONLY_MEANS
            lines.append(_wrap("note", note, width))
        lines.append(f"  score  {self.summary().split(': ', 1)[1]}")
        return "\n".join(lines)


def _clip(s: str, width: int) -> str:
    return s if len(s) <= width else s[: width - 1] + "…"


def terminal_width(default: int = 100) -> int:
    """The terminal's width (``COLUMNS`` when set), at least 60."""
    import shutil

    return max(60, shutil.get_terminal_size((default, 24)).columns)


def _wrap_line(text: str, width: int, indent: int) -> str:
    """``text`` wrapped at ``width``, continuation lines indented: never clipped."""
    import textwrap

    lines = textwrap.wrap(
        text,
        width=max(40, width),
        subsequent_indent=" " * indent,
        break_long_words=False,
        break_on_hyphens=False,
        drop_whitespace=True,
    )
    return "\n".join(lines) if lines else text


def _wrap(label: str, text: str, width: int) -> str:
    import textwrap

    head = f"          {label + ':' if label else '':9} "
    body = textwrap.wrap(str(text), width=max(40, width - len(head)), break_long_words=False) or [
        ""
    ]
    pad = " " * len(head)
    return "\n".join([head + body[0]] + [pad + b for b in body[1:]])


@dataclass
class NotebookResult:
    path: str
    lesson: str
    exercises: list[ExerciseResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # cell errors/timeouts outside exercises
    seconds: float = 0.0
    mode: str = "compile-only"
    #: what the grader flagged about the notebook itself (metadata that claims another lesson)
    flags: list[str] = field(default_factory=list)
    #: the notebook's flags whole, as its cells' process reported them (the instructor's
    #: record only: ``flags`` says them in fixed words)
    evidence: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> list[str]:
        """Every flag: the notebook's and its flagged exercises' (for the instructor)."""
        return list(self.flags) + [
            f"{e.id}: {e.forced_message}" for e in self.exercises if e.flagged
        ]

    @property
    def score(self) -> int:
        return sum(e.score for e in self.exercises)

    @property
    def max_score(self) -> int:
        return sum(e.max_score for e in self.exercises)

    @property
    def skipped_points(self) -> int:
        return sum(e.skipped_points for e in self.exercises)

    @property
    def passed(self) -> bool:
        return all(e.status in (PASS, SKIP) for e in self.exercises) and bool(self.exercises)

    def to_json(self, hidden_inputs: bool = False) -> dict:
        """As data: as a student may read it unless ``hidden_inputs`` (``CheckResult.shown``)."""
        return dict(
            path=self.path,
            lesson=self.lesson,
            score=self.score,
            max_score=self.max_score,
            skipped_points=self.skipped_points,
            seconds=round(self.seconds, 2),
            problems=[shown_text(p, None if hidden_inputs else SHOWN_MAX) for p in self.problems],
            flags=[shown_text(f, None if hidden_inputs else SHOWN_MAX) for f in self.flagged],
            boundary=self.boundary(),
            exercises=[e.to_json(hidden_inputs) for e in self.exercises],
            **({"evidence": list(self.evidence)} if hidden_inputs else {}),
        )

    def boundary(self) -> dict:
        """Which boundary the grade was made behind (``sandbox.BOUNDARY``)."""
        from . import isolate
        from .confine import files_boundary
        from .sandbox import BOUNDARY

        return {
            "learner_processes": BOUNDARY,
            "files": files_boundary(),
            "isolation": isolate.describe(),
            "verdicts": "computed in the grader's process",
        }

    def table(self, width: int | None = None, hidden_inputs: bool = False) -> str:
        """The points per exercise and tier, each loss with why: as a student may read it
        unless ``hidden_inputs`` (``CheckResult.shown``)."""
        width = width or terminal_width()
        rows = [("exercise", "tier", "points", "result")]
        notes = {}
        for e in self.exercises:
            first = True
            for tier, v in e.tiers().items():
                if v["status"] == SKIP:
                    pts, res = f"-/{v['skipped_points']}", SKIPPED_GPU
                else:
                    pts, res = f"{v['score']}/{v['max_score']}", v["status"]
                rows.append((e.id if first else "", tier, pts, res))
                first = False
            notes[len(rows) - 1] = e.failure_lines(hidden_inputs)
        total = f"{self.score}/{self.max_score}"
        rows.append(
            (
                "total",
                "",
                total,
                f"(+{self.skipped_points} GPU-tier points not run here)"
                if self.skipped_points
                else "",
            )
        )
        w = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [f"{self.path}  ({self.lesson})"]
        for i, (a, b, c, d) in enumerate(rows):
            lines.append(f"  {a:<{w[0]}}  {b:<{w[1]}}  {c:>{w[2]}}  {d}".rstrip())
            pad = 8 + sum(w)
            for f in notes.get(i, []):
                lines.append(_wrap_line(" " * pad + f, width, pad))
        limit = None if hidden_inputs else SHOWN_MAX
        for p in self.problems:
            lines.append(_wrap_line(f"  note: {shown_text(p, limit)}", width, 8))
        for f in self.flags:
            lines.append(_wrap_line(f"  FLAGGED: {shown_text(f, limit)}", width, 11))
        return "\n".join(lines)


@dataclass
class RunResult:
    notebooks: list[NotebookResult]
    mode: str
    mode_reason: str
    hidden: bool
    seed: int | None
    #: that the grader's files were checked unchanged before the result was written
    #: (``integrity.Manifest.summary``); None where nothing checked them
    grader_files: str | None = None
    #: the OS isolation of the learner processes (``isolate.mode``); None where not said
    isolation: str | None = None

    @property
    def score(self) -> int:
        return sum(n.score for n in self.notebooks)

    @property
    def max_score(self) -> int:
        return sum(n.max_score for n in self.notebooks)

    @property
    def skipped_points(self) -> int:
        return sum(n.skipped_points for n in self.notebooks)

    @property
    def passed(self) -> bool:
        return bool(self.notebooks) and all(n.passed for n in self.notebooks)

    def to_json(self, hidden_inputs: bool = False) -> dict:
        """As data: as a student may read it (no hidden check's cases, no seed) unless
        ``hidden_inputs``."""
        return dict(
            score=self.score,
            max_score=self.max_score,
            skipped_points=self.skipped_points,
            passed=self.passed,
            mode=self.mode,
            mode_reason=self.mode_reason,
            tiers_run=[COMPILE] + ([GPU] if self.mode == "gpu" else []),
            hidden_checks=self.hidden,
            seed=self.seed if hidden_inputs else None,
            grader_files=self.grader_files,
            isolation=self.isolation,
            notebooks=[n.to_json(hidden_inputs) for n in self.notebooks],
        )

    def dumps(self, hidden_inputs: bool = False) -> str:
        return json.dumps(self.to_json(hidden_inputs), indent=2)

    def table(self, width: int | None = None, hidden_inputs: bool = False) -> str:
        out = []
        if self.mode != "gpu":
            out.append(
                f"mode: {self.mode} ({self.mode_reason}); gpu-tier checks are skipped and "
                "left out of max_score"
            )
            out.append(_wrap_line(COMPILE_RUN_MEANS, width or terminal_width(), 2))
        else:
            out.append(f"mode: gpu ({self.mode_reason}); both tiers run")
        for n in self.notebooks:
            out.append("")
            out.append(n.table(width, hidden_inputs))
        if len(self.notebooks) > 1:
            out.append("")
            out.append("summary")
            w = max(len(n.path) for n in self.notebooks)
            for n in self.notebooks:
                ok = "pass" if n.passed else "FAIL"
                out.append(f"  {n.path:<{w}}  {n.score:>3}/{n.max_score:<3}  {ok}")
            out.append(
                f"  {'total':<{w}}  {self.score:>3}/{self.max_score:<3}  "
                + ("pass" if self.passed else "FAIL")
            )
        if self.skipped_points:
            out.append(f"({self.skipped_points} GPU-tier points not run on this machine)")
        return "\n".join(out)

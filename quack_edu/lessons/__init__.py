"""What the notebooks use besides the library: pictures and models (``viz``, ``viz_cluster``),
the roofline's numbers (``roofline``), the recorded H200 results (``results``), lesson 07's
dw strategies (``bwd_strategies``), a stage's kernel shown with what changed, and the library's
version of an answer once the learner's passed its check (``show``), the DSL lesson's helpers
(``dsl``), the learner's own kernel after its exercise, as the checks compile and read it
(``evidence``), running a notebook without Jupyter (``nbexec``), and
``check``, an exercise's pass/fail table judged by a grader process outside the notebook
(``selfcheck``: this process imports nothing of ``quack_edu.grading`` for it).

``from quack_edu.lessons import check`` also starts the grader's process in the background
(``selfcheck.start``; not while ``quack-edu grade`` runs the notebook), so that it has imported
torch and the DSL by the time the learner's first answer is checked.
"""


def __getattr__(name):
    if name == "check":
        from . import selfcheck

        selfcheck.start()
        return selfcheck.check
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

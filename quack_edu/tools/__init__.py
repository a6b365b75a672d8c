"""The tools around the library, each behind a ``quack-edu`` subcommand (``cli``):

* ``bench``: GB/s of stages, the library and peers against the copy ceiling (``quack-edu bench``);
* ``inspect``: what a kernel compiles to, on any machine (``quack-edu ptx``);
* ``doctor``: what this machine has and which mode the lessons run in (``quack-edu doctor``).

The grader (``quack-edu student | grade``) is its own package, ``quack_edu.grading``.
"""

"""What the notebooks use besides the library: pictures and models (``viz``, ``viz_cluster``),
the roofline's numbers (``roofline``), the recorded H200 results (``results``), lesson 07's
dw strategies (``bwd_strategies``), a stage's kernel shown with what changed (``show``), the
DSL lesson's helpers (``dsl``), the learner's own kernel after its exercise, as the checks
compile and read it (``evidence``), and running a notebook without Jupyter (``nbexec``).
"""

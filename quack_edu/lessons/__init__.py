"""What the notebooks use besides the library: pictures and models (``viz``, ``viz_cluster``),
the roofline's numbers (``roofline``), the recorded H200 results (``results``), lesson 07's
dw strategies (``bwd_strategies``), a stage's kernel shown with what changed (``show``), the
DSL lesson's helpers (``dsl``) and running a notebook without Jupyter (``nbexec``).
"""

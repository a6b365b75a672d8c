"""What the notebooks use besides the library: pictures and models (``viz``, ``viz_cluster``),
the roofline's numbers (``roofline``), the recorded H200 results (``results``), lesson 07's
dw strategies (``bwd_strategies``) and running a notebook without Jupyter (``nbexec``).
"""

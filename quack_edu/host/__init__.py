"""The library's host layer, behind ``quack_edu.rmsnorm`` (its face, which re-exports it).

* ``checks``: the arguments' checks, with errors that name the argument and the fix;
* ``ops``: the ``torch.library`` registration and what every op shares (the tensor types a
  launch plan takes, when the registered op must be called, the autotuner);
* ``forward``, ``backward``: each op's body, fake, launch plans, public and tuned entries;
* ``policy``: which path a norm takes under ``torch.compile`` (kernels or inductor).
"""

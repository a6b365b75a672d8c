"""quack-edu: a speed-of-light RMSNorm in CuTe DSL, grown stage by stage.

Importing this package decides the mode once (see ``quack_edu._env``): on a Hopper GPU kernels
compile and run; elsewhere they compile for sm_90a and can be read, not run.

The library, with QuACK 0.6.5's names (``quack.rmsnorm``) and ``torch.nn.RMSNorm``'s module::

    from quack_edu import rmsnorm, rmsnorm_fwd, QuackRMSNorm

``quack_edu.rmsnorm`` is the function, as ``quack.rmsnorm`` is QuACK's; the module of the same
name is reached with ``from quack_edu.rmsnorm import ...``. ``rmsnorm_ref`` and
``rmsnorm_bwd_ref`` here are QuACK's references (outputs rounded to the inputs' dtypes); the
project's fp32 references, used by the tests, lessons and grader, are in ``quack_edu.reference``.
"""

from ._env import MODE  # noqa: F401  (must come before anything that imports cutlass)
from .reference import assert_close, rstd_ref  # noqa: F401
from .rmsnorm import (  # noqa: E402  (the library: QuACK's API over the final kernels)
    CompilePolicy,
    QuackRMSNorm,
    compile_policy,
    rmsnorm,
    rmsnorm_bwd,
    rmsnorm_bwd_ref,
    rmsnorm_bwd_tuned,
    rmsnorm_fwd,
    rmsnorm_fwd_tuned,
    rmsnorm_ref,
    set_compile_policy,
)

__version__ = "0.1.0"

__all__ = [
    "MODE",
    "rmsnorm",
    "rmsnorm_fwd",
    "rmsnorm_fwd_tuned",
    "rmsnorm_ref",
    "rmsnorm_bwd",
    "rmsnorm_bwd_tuned",
    "rmsnorm_bwd_ref",
    "QuackRMSNorm",
    "CompilePolicy",
    "compile_policy",
    "set_compile_policy",
    "rstd_ref",
    "assert_close",
    "__version__",
]

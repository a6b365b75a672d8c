"""quack-edu: a speed-of-light RMSNorm in CuTe DSL, grown stage by stage.

Importing this package decides the mode once (see ``quack_edu._env``): on a Hopper GPU kernels
compile and run; elsewhere they compile for sm_90a and can be read, not run.
"""

from ._env import MODE  # noqa: F401  (must come before anything that imports cutlass)
from .reference import assert_close, rmsnorm_bwd_ref, rmsnorm_ref, rstd_ref  # noqa: F401

__version__ = "0.1.0"

__all__ = ["MODE", "rmsnorm_ref", "rmsnorm_bwd_ref", "rstd_ref", "assert_close", "__version__"]

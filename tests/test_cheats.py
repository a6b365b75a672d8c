"""The cheat suite: known ways to game a same-process autograder, each of which must score 0 or
be flagged (kept with the mutants: a mutant is an honest mistake, a cheat a dishonest answer).

Answer-cell cheats are judged on their own (``judge.judge_exercise``, a second or so each): the
screen flags them, and, with the screen off, the process boundary alone still scores them 0
(the grader's checks never run where the learner's code ran). Cheats that live in the
notebook's other cells run in one graded notebook (``cheat_notebook``), shared with the class
test (``tests/test_class_grade.py``).
"""

from __future__ import annotations

import time

import pytest

from quack_edu.grading import get
from quack_edu.grading.answer_screen import screen
from quack_edu.grading.exercises.lesson03 import OWN_BUFFER
from quack_edu.grading.judge import judge_exercise
from quack_edu.grading.notebook import find_cell, read, solutions_dir

LESSON = "00_setup_and_roofline"
WRONG = "def bytes_moved(M, N, dtype):\n    return 0\n"

#: the seven lines of the issue, placed in an answer cell with a wrong answer
PATCH_RUN_EXERCISE = (
    "import quack_edu.grading as _g\n"
    "_orig = _g.run_exercise\n"
    "def _pass(ex, answer, **kw):\n"
    "    r = _orig(ex, answer, **kw)\n"
    "    for c in r.checks:\n"
    '        c.status = "pass"; c.shortcut = False\n'
    "    return r\n"
    "_g.run_exercise = _pass\n"
)


def solution(ex_id: str) -> str:
    ex = get(ex_id)
    return find_cell(read(solutions_dir() / f"{ex.lesson}.ipynb"), ex.cell_id).source


def code_of(ex_id: str, name: str):
    """The code object of function ``name`` in the solution of ``ex_id``, compiled here (in the
    test's process, never a learner's)."""
    import types

    module = compile(solution(ex_id), "<answer>", "exec")
    return next(c for c in module.co_consts if isinstance(c, types.CodeType) and c.co_name == name)


def marshalled(ex_id: str, name: str) -> str:
    """Red team 14: the solution's function as bytecode, unmarshalled by the import system's
    ``_compile_bytecode`` in the learner's process: no text is compiled there."""
    import marshal

    data = marshal.dumps(code_of(ex_id, name)).hex()
    return (
        f"_code = torch.importlib._bootstrap_external._compile_bytecode(bytes.fromhex('{data}'))\n"
        f"{name} = type(lambda: 0)(_code, globals())\n"
    )


def code_literal(ex_id: str, name: str) -> str:
    """Red team 14: the solution's function made by ``code.replace`` from literals of its
    fields (``CodeType(...)`` raises the same audit event)."""
    c = code_of(ex_id, name)
    fields = ("co_argcount", "co_nlocals", "co_stacksize", "co_flags", "co_code", "co_consts",
              "co_names", "co_varnames", "co_name", "co_qualname", "co_linetable",
              "co_exceptiontable")  # fmt: skip
    kwargs = ", ".join(f"{f}={getattr(c, f)!r}" for f in fields)
    return f"{name} = type(lambda: 0)((lambda: 0).__code__.replace({kwargs}), globals())\n"


def finished_text_reversed(dotted: str) -> str:
    """The library's finished function's text, reversed (text the screen and a paste check
    cannot read; the record of what is compiled at run time can)."""
    import importlib
    import inspect

    module, name = dotted.rsplit(".", 1)
    return inspect.getsource(getattr(importlib.import_module(module), name))[::-1]


#: (name, exercise, answer cell): each a cheat in the answer cell itself
#: red team 18: the eager sequence traced by make_fx on meta tensors, its nodes' bytes summed
MAKE_FX = (
    "from torch.fx.experimental.proxy_tensor import make_fx\n"
    "def eager_bytes(M, N, dtype):\n"
    "    def f(x, w):\n"
    "        xf = x.float()\n"
    "        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)\n"
    "        return (xf * r * w).to(x.dtype)\n"
    "    x = torch.empty(M, N, dtype=dtype, device='meta')\n"
    "    gm = make_fx(f)(x, torch.empty(N, dtype=dtype, device='meta'))\n"
    "    total = 0\n"
    "    for n in gm.graph.nodes:\n"
    "        if n.op == 'call_function':\n"
    "            ins = [a.meta['val'] for a in n.args if isinstance(a, torch.fx.Node)]\n"
    "            v = n.meta['val']\n"
    "            if 'to_copy' in str(n.target) and ins[0].dtype == v.dtype:\n"
    "                continue\n"
    "            total += sum(t.numel() * t.element_size() for t in [*ins, v])\n"
    "    return total\n"
)


#: red team 20: the DSL's code swap (``BaseDSL._preprocess_and_replace_code``) made to put a
#: function of the answer cell's into a probe of the grader's (the caller was the DSL's file)
def dsl_code_swap(target: str, said: str) -> str:
    return (
        "from cutlass.base_dsl.dsl import BaseDSL\n"
        f"def _said(answer, *args):\n    return {said}\n"
        "class _Mode:\n"
        "    def current_signature(self):\n"
        "        return 1\n"
        "class _Dsl:\n"
        "    def __init__(self, flips):\n"
        "        self.flips, self._preprocess_mode = list(flips), _Mode()\n"
        "        self.decorator_location = None\n"
        "    @property\n"
        "    def enable_preprocessor(self):\n"
        "        return self.flips.pop(0) if self.flips else False\n"
        "def _arm(fn, dsl):\n"
        "    fn._dsl_object, fn._decorator_location, fn._preprocess_enabled = dsl, None, True\n"
        "_arm(_said, _Dsl([False]))\n"
        "BaseDSL._preprocess_and_replace_code(_said)\n"
        f"_probe = torch._utils._import_dotted_name({target!r})\n"
        "_arm(_probe, _Dsl([True, False]))\n"
        "_probe._original_code, _probe._preprocessed = _said._original_code, True\n"
        "_probe._preprocessed_signature = 0\n"
        "BaseDSL._preprocess_and_replace_code(_probe)\n"
    )


ANSWER_CELL_CHEATS = [
    ("the seven-line run_exercise patch", "00.bytes_moved", PATCH_RUN_EXERCISE + WRONG),
    (
        "patching check and _record",
        "00.bytes_moved",
        "import quack_edu.grading as g\n"
        "g.check = lambda *a, **k: None\n"
        "g._record = lambda *a, **k: None\n"
        "from quack_edu.grading import runner as C\n"
        "C._run_checks = lambda *a, **k: None\n" + WRONG,
    ),
    (
        "an answer that compares equal to anything",
        "00.bytes_moved",
        "class Anything(int):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    def __float__(self):\n        return 1.0\n\n"
        "def bytes_moved(M, N, dtype):\n    return Anything(0)\n",
    ),
    (
        "reading the seed and the solutions from the environment and disk",
        "00.bytes_moved",
        "import os, json, pathlib\n"
        "seed = os.environ.get('QUACK_EDU_GRADE_SEED')\n"
        "nb = pathlib.Path(quack_edu.__file__).parents[1] / 'solutions' / "
        "'00_setup_and_roofline.ipynb'\n"
        "cells = json.loads(nb.read_text())['cells']\n"
        "src = next(''.join(c['source']) for c in cells if 'def bytes_moved' in ''.join("
        "c['source']))\n"
        "exec(src)\n",
    ),
    (
        "importing the library's reference as the answer",
        "00.eager_rmsnorm",
        "from quack_edu.reference import rmsnorm_ref as eager_rmsnorm\n",
    ),
    (
        "the library's own kernel under another name",
        "00.eager_rmsnorm",
        "def eager_rmsnorm(x, w, eps=1e-6):\n    return quack_edu.rmsnorm.rmsnorm_fwd(x, w, eps)\n",
    ),
    (
        "F.rms_norm as the answer",
        "00.eager_rmsnorm",
        "import torch.nn.functional as F\n\n"
        "def eager_rmsnorm(x, w, eps=1e-6):\n"
        "    return F.rms_norm(x, (x.shape[-1],), w, eps)\n",
    ),
    (
        "the stage's own helper as the answer",
        "02.warp_reduce",
        "from quack_edu.primitives.reduce import warp_reduce\n\n"
        "def warp_reduce_sum(val, width=32):\n"
        "    return warp_reduce(val, lambda a, b: a + b, width)\n",
    ),
    (
        "the stage's own helper: its kernel as the whole-kernel answer",
        "02.warp_kernel",
        "from quack_edu.primitives import copy as copy_utils\n"
        "from quack_edu.stages.warp import WarpRMSNorm\n\n"
        "warp_kernel = WarpRMSNorm.kernel\n",
    ),
    (
        "QuACK as the answer",
        "00.eager_rmsnorm",
        "from quack.rmsnorm import rmsnorm as eager_rmsnorm\n",
    ),
    (
        "deleting the check functions",
        "00.bytes_moved",
        "import quack_edu.grading\ndel quack_edu.grading.check\n" + WRONG,
    ),
    (
        "hiding tracebacks and output",
        "00.bytes_moved",
        "import sys, io\nsys.stdout = io.StringIO()\nsys.stderr = sys.stdout\n"
        "get_ipython().showtraceback = lambda *a, **k: None\n" + WRONG,
    ),
    (
        "exiting the process",
        "00.bytes_moved",
        "import os\n" + WRONG + "os._exit(0)\n",
    ),
    # the families of issue 49, each reaching past the screen (``torch.*`` names the process)
    (
        "the reference answer through an allowed module's attribute",
        "00.bytes_moved",
        "bytes_moved = torch.importlib.import_module("
        "'quack_edu.grading.exercises.lesson00').bytes_moved_ref\n",
    ),
    (  # red team 13: scored 1/1, unflagged, before rmsnorm_bwd_bytes was a finished version
        "the library's backward byte count less its extra terms, by a dotted name",
        "00.bytes_moved",
        "def bytes_moved(M, N, dtype):\n"
        "    f = torch._utils._import_dotted_name('quack_edu.tools.timing.rmsnorm_bwd_bytes')\n"
        "    es = torch.empty((), dtype=dtype).element_size()\n"
        "    return f(M, N, dtype) - M * N * es - 4 * M\n",
    ),
    (
        "the library's warp_reduce through torch.sys.modules",
        "02.warp_reduce",
        "def warp_reduce_sum(val, width=32):\n"
        "    lib = torch.sys.modules['quack_edu.primitives.reduce']\n"
        "    return lib.warp_reduce(val, lambda a, b: a + b, width)\n",
    ),
    (
        "the warp stage's kernel through torch.sys.modules",
        "02.warp_kernel",
        "from quack_edu.primitives import copy as copy_utils\n"
        "warp_kernel = torch.sys.modules['quack_edu.stages.warp'].WarpRMSNorm.kernel\n",
    ),
    (
        "the solution notebook's cell read and exec'd",
        "02.warp_reduce",
        "import json\n"
        "root = torch.os.path.dirname(torch.os.path.dirname(quack_edu.__file__))\n"
        "nb = json.load(torch.builtins.open(root + '/solutions/02_warp_reduction.ipynb'))\n"
        "src = next(''.join(c['source']) for c in nb['cells'] if 'def warp_reduce_sum' in "
        "''.join(c['source']))\n"
        "torch.builtins.exec(src)\n",
    ),
    (
        "the library's eager RMSNorm through a generator's frame",
        "00.eager_rmsnorm",
        "def eager_rmsnorm(x, w, eps=1e-6):\n"
        "    def g():\n        yield\n"
        "    lib = g().gi_frame.f_globals['quack_edu']\n"
        "    return lib.tools.kernels._composed(x, w)\n",
    ),
    (
        "the library's float64 backward by names built from strings",
        "07.dx_row",
        "def dx_row(x, w, dout, rstd, weight_offset):\n"
        "    def g():\n        yield\n"
        "    lib = g().gi_frame.f_globals['quack_edu']\n"
        "    b = g().gi_frame.f_globals['__builtins__']\n"
        "    s = b['getattr'](lib.lessons, 'bwd_' + 'strategies')\n"
        "    bwd = b['getattr'](s, 'auto' + 'grad_bwd')\n"
        "    return bwd(x, w, dout, 1e-6, weight_offset)[0].float()\n",
    ),
    (
        "autograd by a name built from a string",
        "07.dx_row",
        "def dx_row(x, w, dout, rstd, weight_offset):\n"
        "    xx = x.float().clone()\n"
        "    getattr(xx, 'requires' + '_grad_')()\n"
        "    h = xx * torch.rsqrt(xx.pow(2).mean(-1, keepdim=True) + 1e-6)\n"
        "    y = h * (w.float() + weight_offset) if w is not None else h\n"
        "    (gx,) = getattr(torch, 'auto' + 'grad').grad(y, xx, dout.float())\n"
        "    return gx\n",
    ),
    (  # red team 13: torch's vendored QuACK loaded under a package name of its own
        "torch's vendored QuACK under another name",
        "02.warp_reduce",
        "_imp = torch._utils._import_dotted_name\n"
        "_spec = _imp('importlib.machinery.ModuleSpec')('tvq', None, is_package=True)\n"
        "_spec.submodule_search_locations.append(\n"
        "    torch.os.path.dirname(torch.__file__) + '/_vendor/quack')\n"
        "_imp('sys.modules')['tvq'] = _imp('importlib.util.module_from_spec')(_spec)\n"
        "_reduce = _imp('importlib.import_module')('tvq.reduce')\n"
        "def warp_reduce_sum(val, width=32):\n"
        "    x = cute.make_rmem_tensor(cute.make_layout(1), Float32)\n"
        "    x[0] = val\n"
        "    return _reduce.sum_swap_shuffle(x, 1, 1, width)[0]\n",
    ),
    (
        "the solution as marshalled bytecode",
        "00.bytes_moved",
        marshalled("00.bytes_moved", "bytes_moved"),
    ),
    (
        "the solution as a code object of literals",
        "00.bytes_moved",
        code_literal("00.bytes_moved", "bytes_moved"),
    ),
    (  # red team 15: sys.modules reached through a class pattern, which reads attributes
        "attributes read by a match statement",
        "00.bytes_moved",
        "def _lib(name):\n"
        "    match torch.is_tensor:\n"
        "        case object(__globals__={'sys': s}):\n"
        "            match s:\n"
        "                case object(modules=m):\n"
        "                    return m[name]\n"
        "def bytes_moved(M, N, dtype):\n"
        "    return _lib('quack_edu.tools.timing').rmsnorm_bytes(M, N, dtype)\n",
    ),
    (  # red team 15: RMSNorm is LayerNorm of [x, -x] (mean 0, variance mean(x^2))
        "torch's LayerNorm of the mirrored row",
        "00.eager_rmsnorm",
        "def eager_rmsnorm(x, w, eps=1e-6):\n"
        "    xf = x.float()\n"
        "    n = xf.shape[-1]\n"
        "    y = torch.nn.functional.layer_norm(torch.cat([xf, -xf], dim=-1), [2 * n], eps=eps)\n"
        "    return (y[..., :n] * w.float()).to(x.dtype)\n",
    ),
    (
        "torch's LayerNorm backward of the mirrored row",
        "07.dx_row",
        "def dx_row(x, w, dout, rstd, weight_offset):\n"
        "    xf, g = x.float(), dout.float()\n"
        "    if w is not None:\n"
        "        g = g * (w.float() + weight_offset)\n"
        "    n = xf.shape[-1]\n"
        "    z = torch.cat([xf, -xf], dim=-1)\n"
        "    gz = torch.cat([g, torch.zeros_like(g)], dim=-1)\n"
        "    r = rstd.float().reshape(-1, 1)\n"
        "    dz = torch.ops.aten.native_layer_norm_backward(\n"
        "        gz, z, [2 * n], torch.zeros_like(r), r, None, None, [True, False, False])[0]\n"
        "    return dz[..., :n] - dz[..., n:]\n",
    ),
    (  # red team 16: forward-mode autodiff (the unweighted norm's Jacobian is symmetric)
        "forward-mode autodiff",
        "07.dx_row",
        "def dx_row(x, w, dout, rstd, weight_offset):\n"
        "    xf, g = x.float(), dout.float()\n"
        "    if w is not None:\n"
        "        g = g * (w.float() + weight_offset)\n"
        "    def f(t):\n"
        "        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)\n"
        "    return torch.func.jvp(f, (xf,), (g,))[1]\n",
    ),
    # red team 18: answers the exercises' value checks accepted without the work asked
    (
        "a complex-step derivative of the forward",
        "07.dx_row",
        "def dx_row(x, w, dout, rstd, weight_offset):\n"
        "    xf, g = x.double(), dout.double()\n"
        "    if w is not None:\n"
        "        g = g * (w.double() + weight_offset)\n"
        "    z = xf + 1e-30j * g\n"
        "    y = z / torch.sqrt((z * z).mean(-1, keepdim=True) + 1e-6)\n"
        "    return (y.imag / 1e-30).float()\n",
    ),
    (
        "a finite difference of F.normalize",
        "07.dx_row",
        "import math\n"
        "import torch.nn.functional as F\n"
        "def dx_row(x, w, dout, rstd, weight_offset):\n"
        "    xf, g, n = x.double(), dout.double(), x.shape[-1]\n"
        "    if w is not None:\n"
        "        g = g * (w.double() + weight_offset)\n"
        "    def f(z):\n"
        "        pad = torch.full(z.shape[:-1] + (1,), math.sqrt(n * 1e-6), dtype=z.dtype)\n"
        "        return F.normalize(torch.cat([z, pad], -1), dim=-1)[..., :n] * math.sqrt(n)\n"
        "    return ((f(xf + 1e-6 * g) - f(xf - 1e-6 * g)) / 2e-6).float()\n",
    ),
    (
        "F.normalize of the row padded with sqrt(N * eps)",
        "00.eager_rmsnorm",
        "import math\n"
        "import torch.nn.functional as F\n"
        "def eager_rmsnorm(x, w, eps=1e-6):\n"
        "    xf, n = x.float(), x.shape[-1]\n"
        "    pad = torch.full(xf.shape[:-1] + (1,), math.sqrt(n * eps), device=x.device)\n"
        "    y = F.normalize(torch.cat([xf, pad], -1), dim=-1)[..., :n] * math.sqrt(n)\n"
        "    return (y * w.float()).to(x.dtype)\n",
    ),
    (
        "the eager sequence traced by make_fx on meta tensors",
        "00.eager_bytes",
        MAKE_FX,
    ),
    # red team 19: a torch helper that imports by a string (no name the screen reads) reached
    # library code that was no tripwire, and the grader's own code in the learner's process
    (
        "the naive stage run in the CPU simulator",
        "00.eager_rmsnorm",
        "from torch._dynamo.trace_rules import _load_obj_from_str as _load\n"
        "def eager_rmsnorm(x, w, eps=1e-6):\n"
        "    run = _load('quack_edu.ptxsim.stages.' + 'run_stage')\n"
        "    return run('naive', x, w, eps)\n",
    ),
    (
        "traffic run on tiny meta tensors as the cell loads, the count fitted",
        "00.eager_bytes",
        "from torch._dynamo.trace_rules import _load_obj_from_str as _load\n"
        "def _seq(x, w):\n"
        "    xf = x.float()\n"
        "    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w).to(x.dtype)\n"
        "def _count(m, n, dt):\n"
        "    tr = _load('quack_edu.lessons.roofline.' + 'traffic')\n"
        "    e = lambda *s: torch.empty(*s, dtype=dt, device='meta')\n"
        "    return sum(op.total for op in tr(_seq, e(m, n), e(n)))\n"
        "_F = {dt: [_count(m, n, dt) for m, n in ((1, 1), (1, 2), (2, 1), (2, 2))]\n"
        "      for dt in (torch.bfloat16, torch.float16, torch.float32)}\n"
        "def eager_bytes(M, N, dtype):\n"
        "    f11, f12, f21, f22 = _F[dtype]\n"
        "    a = f22 - f21 - f12 + f11\n"
        "    b, c = f21 - f11 - a, f12 - f11 - a\n"
        "    return a * M * N + b * M + c * N + f11 - a - b - c\n",
    ),
    (
        "the grader's probe rebound in its module",
        "00.eager_bytes",
        "from torch._dynamo.trace_rules import _load_obj_from_str as _load\n"
        "_load('quack_edu.grading.probes.' + 'lesson00_06').tensor_ops = lambda a, c: []\n"
        + MAKE_FX,
    ),
    (
        "a torch function the probe calls rebound",
        "00.eager_bytes",
        "from torch._dynamo.trace_rules import _load_obj_from_str as _load\n"
        "_load('torch.utils.' + '_pytree').tree_leaves = lambda *a, **k: []\n" + MAKE_FX,
    ),
    # red team 20 (reading the grader): library helpers by a dotted string, and the DSL's code
    # swap putting the answer's code into the grader's probes
    (
        "the block stage's heuristic by a dotted string",
        "03.threads_per_row",
        "def threads_per_row(N, dtype):\n"
        "    cfg = torch._utils._import_dotted_name('quack_edu.config.' + 'block_config')\n"
        "    return cfg(N, dtype).threads_per_row\n",
    ),
    (
        "the library's byte count by a dotted string",
        "09.call_us",
        "def call_us(M, N, dtype, weight_dtype, host_us, gbps):\n"
        "    load = torch._utils._import_dotted_name\n"
        "    count = load('quack_edu.tools.timing.rmsnorm_' + 'bytes')\n"
        "    return max(host_us, count(M, N, dtype, weight_dtype) / (gbps * 1e3))\n",
    ),
    (
        "the kernel-listing probe's code swapped by the DSL",
        "00.eager_rmsnorm",
        "import math\n"
        "def eager_rmsnorm(x, w, eps=1e-6):\n"
        "    xf, n = x.float(), x.shape[-1]\n"
        "    pad = torch.full(xf.shape[:-1] + (1,), math.sqrt(n * eps), device=x.device)\n"
        "    y = torch.nn.functional.normalize(torch.cat([xf, pad], -1), dim=-1)[..., :n]\n"
        "    return (y * math.sqrt(n) * w.float()).to(x.dtype)\n"
        + dsl_code_swap(
            "quack_edu.grading.probes.lesson00_06.eager_kernels",
            "['_to_copy', 'pow', 'mean', 'add', 'rsqrt', 'mul', 'mul', '_to_copy']",
        ),
    ),
    (
        "the counting probe's code swapped by the DSL",
        "00.eager_bytes",
        MAKE_FX + dsl_code_swap("quack_edu.grading.probes.lesson00_06.tensor_ops", "[]"),
    ),
    # red teams 21 (blind) and 22 (reading the grader): the DSL and the lessons' helpers by
    # dotted strings where the screen bans their names, a count measured as the cell loads, and
    # a probe's helper rebound during a call and put back from inside the probe
    (
        "the DSL evaluating the layout by dotted names",
        "01.layout_offset",
        "_get = torch._utils._import_dotted_name\n"
        "def layout_size(shape):\n"
        "    return shape if isinstance(shape, int) else sum(0 for _ in ())\n"
        "def layout_offset(shape, stride, coord):\n"
        "    mk, out = _get('cutlass' + '.cute.make_' + 'layout'), []\n"
        "    def trace():\n"
        "        out.append(int(mk(shape, stride=stride)(coord)))\n"
        "    _get('cutlass' + '.cute.compile')(_get('cutlass' + '.cute.jit')(trace))\n"
        "    return out[0]\n",
    ),
    (
        "the library's tv_coords by dotted names",
        "01.thread_elements",
        "_get = torch._utils._import_dotted_name\n"
        "def thread_elements(t, thr_shape, thr_stride, vec):\n"
        "    c = 'cutlass' + '.cute.'\n"
        "    lay, atom = _get(c + 'make_' + 'layout'), _get(c + 'make_copy_' + 'atom')\n"
        "    tiled, op = _get(c + 'make_tiled_copy' + '_tv'), _get(c + 'nvgpu.CopyUniversalOp')\n"
        "    f16 = _get('cutlass' + '.Float16')\n"
        "    coords = _get('quack' + '_edu.tools.inspect.tv' + '_coords')\n"
        "    res = coords(lambda: tiled(atom(op(), f16, num_bits_per_copy=16 * vec),\n"
        "                               lay(thr_shape, stride=thr_stride), lay((1, vec))))\n"
        "    return [tuple(p) for p in res['coords'][t]]\n",
    ),
    (
        "the lessons' byte counter on torch.mul",
        "00.bytes_moved",
        "_traffic = torch._utils._import_dotted_name('quack_edu.lessons.roofline.traf' + 'fic')\n"
        "def bytes_moved(M, N, dtype):\n"
        "    x = torch.empty(M, N, dtype=dtype, device='meta')\n"
        "    w = torch.empty(N, dtype=dtype, device='meta')\n"
        "    return sum(op.total for op in _traffic(torch.mul, x, w))\n",
    ),
    (
        "the lessons' byte counter on an in-place mul",
        "09.call_us",
        "_traffic = torch._utils._import_dotted_name('quack_edu.lessons.roofline.traf' + 'fic')\n"
        "def call_us(M, N, dtype, weight_dtype, host_us, gbps):\n"
        "    x = torch.empty(M, N, dtype=dtype, device='meta')\n"
        "    w = torch.empty(N, dtype=weight_dtype, device='meta')\n"
        "    nbytes = sum(op.total for op in _traffic(lambda a, b: a.mul_(b), x, w))\n"
        "    return max(host_us, nbytes / (gbps * 1e3))\n",
    ),
    (
        "the eager sequence traced as the cell loads, then fitted",
        "00.eager_bytes",
        "from torch.fx.experimental.proxy_tensor import make_fx\n"
        "def _seq(x, w):\n"
        "    xf = x.float()\n"
        "    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w).to(x.dtype)\n"
        "def _measure(m, n, dt):\n"
        "    x = torch.empty(m, n, dtype=dt, device='meta')\n"
        "    w = torch.empty(n, dtype=dt, device='meta')\n"
        "    total = 0\n"
        "    for nd in make_fx(_seq)(x, w).graph.nodes:\n"
        "        if nd.op == 'call_function':\n"
        "            ins = [a.meta['val'] for a in nd.args if isinstance(a, torch.fx.Node)]\n"
        "            v = nd.meta['val']\n"
        "            if 'to_copy' in str(nd.target) and ins[0].dtype == v.dtype:\n"
        "                continue\n"
        "            total += sum(t.numel() * t.element_size() for t in [*ins, v])\n"
        "    return total\n"
        "_F = {str(d): [_measure(m, n, d) for m, n in ((1, 1), (1, 2), (2, 1), (2, 2))]\n"
        "      for d in (torch.bfloat16, torch.float16, torch.float32)}\n"
        "def eager_bytes(M, N, dtype):\n"
        "    f11, f12, f21, f22 = _F[str(dtype)]\n"
        "    a = f22 - f21 - f12 + f11\n"
        "    b, c = f21 - f11 - a, f12 - f11 - a\n"
        "    return a * M * N + b * M + c * N + f11 - a - b - c\n",
    ),
    (
        "the kernel lister's helper rebound in a call, put back inside the probe",
        "00.eager_rmsnorm",
        "import math\n"
        "_get, _state = torch._utils._import_dotted_name, []\n"
        "class _Op:\n"
        "    def __init__(self, op):\n"
        "        self.op = op\n"
        "def _install():\n"
        "    mod = _get('quack' + '_edu.lessons.roofline')\n"
        "    orig, calls = mod.traffic, []\n"
        "    def counted(fn, *args, **kwargs):\n"
        "        calls.append(1)\n"
        "        if len(calls) == 1:\n"
        "            return orig(fn, *args, **kwargs)\n"
        "        mod.traffic = orig\n"
        "        names = ['_to_copy', 'pow', 'mean', 'add', 'rsqrt', 'mul', 'mul', '_to_copy']\n"
        "        return [_Op(n) for n in names]\n"
        "    mod.traffic = counted\n"
        "def eager_rmsnorm(x, w, eps=1e-6):\n"
        "    if not _state:\n"
        "        _state.append(1)\n"
        "        _install()\n"
        "    xf, n = x.float(), x.shape[-1]\n"
        "    pad = torch.full(xf.shape[:-1] + (1,), math.sqrt(n * eps), device=x.device)\n"
        "    y = torch.nn.functional.normalize(torch.cat([xf, pad], -1), dim=-1)[..., :n]\n"
        "    return (y * math.sqrt(n) * w.float()).to(x.dtype)\n",
    ),
    # red team 23 (reading the grader, after 21 and 22's fixes): torch's own copy of CuTe's
    # layout algebra, and a wrapper subclass whose numel() says 1
    (
        "torch's pure-Python CuTe evaluating the layout",
        "01.layout_offset",
        "_L = torch._utils._import_dotted_name('torch.distributed._pycute.layout.Lay' + 'out')\n"
        "def _rev(x):\n"
        "    return tuple(_rev(e) for e in reversed(x)) if isinstance(x, tuple) else x\n"
        "def layout_offset(shape, stride, coord):\n"
        "    return _L(_rev(shape), _rev(stride))(_rev(coord))\n",
    ),
    (
        "torch's pure-Python CuTe inverting the thread layout",
        "01.thread_elements",
        "_pc = torch._utils._import_dotted_name('torch.distributed._pycute')\n"
        "_L = torch._utils._import_dotted_name('torch.distributed._pycute.layout.Lay' + 'out')\n"
        "def thread_elements(t, thr_shape, thr_stride, vec):\n"
        "    r, c = _pc.idx2crd(_pc.left_inverse(_L(thr_shape, thr_stride))(t), thr_shape)\n"
        "    return [(r, c * vec + j) for j in range(vec)]\n",
    ),
    (
        "a wrapper subclass that says numel() is 1 measuring as the cell loads",
        "00.eager_bytes",
        "from torch.utils._pytree import tree_leaves, tree_map\n"
        "_LOG = []\n"
        "def _un(t):\n"
        "    return t.inner if isinstance(t, _T) else t\n"
        "def _wrap(t):\n"
        "    return _T.make(t) if isinstance(t, torch.Tensor) and not isinstance(t, _T) else t\n"
        "def _disp(cls, func, types, args=(), kwargs=None):\n"
        "    a, k = tree_map(_un, args), tree_map(_un, kwargs or {})\n"
        "    out = func(*a, **k)\n"
        "    ins = [t for t in tree_leaves((a, k)) if isinstance(t, torch.Tensor)]\n"
        "    outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]\n"
        "    _LOG.append((str(func), ins, outs))\n"
        "    return tree_map(_wrap, out)\n"
        "def _make(cls, inner):\n"
        "    r = torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype,\n"
        "                                            device=inner.device, strides=inner.stride())\n"
        "    r.inner = inner\n"
        "    return r\n"
        "_T = type('_T', (torch.Tensor,), {'__torch_' + 'dispatch__': classmethod(_disp),\n"
        "    '__torch_' + 'function__': torch._C._disabled_torch_function_impl,\n"
        "    'make': classmethod(_make), 'numel': lambda self: 1})\n"
        "def _measure(m, n, dt):\n"
        "    x = _T.make(torch.empty(m, n, dtype=dt, device='meta'))\n"
        "    w = _T.make(torch.empty(n, dtype=dt, device='meta'))\n"
        "    _LOG.clear()\n"
        "    xf = x.float()\n"
        "    (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w).to(x.dtype)\n"
        "    total = 0\n"
        "    for name, ins, outs in _LOG:\n"
        "        if not ('to_copy' in name and ins[0].dtype == outs[0].dtype):\n"
        "            total += sum(t.nelement() * t.element_size() for t in ins + outs)\n"
        "    return total\n"
        "_F = {str(d): [_measure(m, n, d) for m, n in ((1, 1), (1, 2), (2, 1), (2, 2))]\n"
        "      for d in (torch.bfloat16, torch.float16, torch.float32)}\n"
        "def eager_bytes(M, N, dtype):\n"
        "    f11, f12, f21, f22 = _F[str(dtype)]\n"
        "    a = f22 - f21 - f12 + f11\n"
        "    b, c = f21 - f11 - a, f12 - f11 - a\n"
        "    return a * M * N + b * M + c * N + f11 - a - b - c\n",
    ),
    (  # red team 16: the hook read its rules as the module's names, which learner code rebinds
        "the hook's rules rebound in its module",
        "00.bytes_moved",
        "_dn = torch._utils._import_dotted_name\n"
        "_dn('quack_edu.grading.sandbox').RECORD_CHUNK = -1\n"
        f"_dn('builtins.exec')({finished_text_reversed('quack_edu.tools.timing.rmsnorm_bytes')!r}"
        "[::-1], globals())\n"
        "bytes_moved = rmsnorm_bytes\n",
    ),
    (  # red team 16: a guard's closure held the hook's own learner_asks, shared with the hook
        "the hook's helpers rebound through a guard's closure",
        "00.bytes_moved",
        "_dn = torch._utils._import_dotted_name\n"
        "_get = _dn('builtins.getattr')\n"
        "for _c in _get(_dn('_imp._fix_co_filename'), '__closure__') or ():\n"
        "    if _get(_get(_c, 'cell_contents'), '__name__', '') == 'learner_asks':\n"
        "        _dn('builtins.setattr')(_c, 'cell_contents', lambda: False)\n"
        + code_literal("00.bytes_moved", "bytes_moved"),
    ),
    (  # red team 17: the autograd engine's C entry on a Parameter (the Python entries are
        # tripwires): the worker keeps autograd off for a gradient asked by hand
        "the C autograd engine on a Parameter",
        "07.dx_row",
        "_run = torch._C._ImperativeEngine().run_backward\n"
        "def dx_row(x, w, dout, rstd, weight_offset):\n"
        "    xd = torch.nn.Parameter(x.double())\n"
        "    r = rstd.double().unsqueeze(-1)\n"
        "    eps = 1.0 / (r * r) - x.double().pow(2).mean(-1, keepdim=True)\n"
        "    wt = (w.double() + weight_offset) if w is not None else 1.0\n"
        "    y = xd * (xd.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * wt\n"
        "    (g,) = _run((y,), (dout.double(),), False, False, (xd,), False, False)\n"
        "    return g.float()\n",
    ),
    (  # red team 13: a reference RMSNorm of torch's own test suite
        "torch's test suite's reference RMSNorm",
        "00.eager_rmsnorm",
        "_imp = torch._utils._import_dotted_name\n"
        "_mods = _imp('sys.modules')\n"
        "_proc = _imp('importlib.import_module')('platform')._Processor\n"
        "_imp('builtins.setattr')(_proc, 'get', classmethod(lambda cls: 'x86_64'))\n"
        "_et = _mods.setdefault('expecttest', type(torch)('expecttest'))\n"
        "_et.TestCase = _imp('unittest.TestCase')\n"
        "_cm = _imp('importlib.import_module')('torch.testing._internal.common_modules')\n"
        "_ref = _cm.module_inputs_torch_nn_RMSNorm(None, 'cpu', torch.float32, False, False)[0]\n"
        "class _M:\n"
        "    def parameters(self):\n"
        "        return iter(())\n"
        "def eager_rmsnorm(x, w, eps=1e-6):\n"
        "    m = _M()\n"
        "    m.eps, m.normalized_shape, m.weight = eps, (x.shape[-1],), w\n"
        "    return _ref.reference_fn(m, x)\n",
    ),
    (
        "the solutions read from the checkout's git history",
        "00.bytes_moved",
        "root = torch.os.path.dirname(torch.os.path.dirname(quack_edu.__file__))\n"
        "head = torch.builtins.open(root + '/.git/HEAD').read()\n"
        "torch.os.listdir(root + '/.git/objects')\n" + WRONG,
    ),
    (
        "a test's copy of an answer read",
        "00.bytes_moved",
        "root = torch.os.path.dirname(torch.os.path.dirname(quack_edu.__file__))\n"
        "torch.builtins.open(root + '/tests/test_cheats.py').read()\n" + WRONG,
    ),
    (
        "the worker's request handler replaced",
        "00.bytes_moved",
        "worker = torch.sys.modules['quack_edu.grading.worker']\n"
        "worker.serve = lambda *a, **k: {'verdict': 'pass', 'value': {'t': 'int', 'v': '0'}}\n"
        + WRONG,
    ),
    (
        "the grader's files edited on disk",
        "00.bytes_moved",
        "grading = torch.os.path.join(torch.os.path.dirname(quack_edu.__file__), 'grading')\n"
        "torch.builtins.open(grading + '/judge.py', 'a').write('\\n')\n" + WRONG,
    ),
    (
        "a process left running to rewrite the results",
        "00.bytes_moved",
        "torch.sys.modules['subprocess'].Popen(['sleep', '30'], start_new_session=True)\n" + WRONG,
    ),
    (
        "reading the grader's command line",
        "00.bytes_moved",
        "cmd = torch.builtins.open(f'/proc/{torch.os.getppid()}/cmdline').read()\n" + WRONG,
    ),
    (
        "stopping the grader",
        "00.bytes_moved",
        "torch.os.kill(torch.os.getppid(), 19)\n" + WRONG,
    ),
    (
        "switching the shortcut guard off around F.rms_norm",
        "00.eager_rmsnorm",
        "def eager_rmsnorm(x, w, eps=1e-6):\n"
        "    torch.sys.setprofile(None)\n"
        "    f = torch.builtins.getattr(torch.nn.functional, 'rms' + '_norm')\n"
        "    return f(x, (x.shape[-1],), w, eps)\n",
    ),
    # found by the red team of 2026-12-06 (a helper that had not read the grader)
    (
        "torch's RMSNorm decomposition",
        "00.eager_rmsnorm",
        "from torch._decomp.decompositions import _fused_rms_norm as _frn\n\n"
        "def eager_rmsnorm(x, w, eps=1e-6):\n"
        "    return _frn(x, [x.shape[-1]], w, eps)[0]\n",
    ),
    (
        "the library's byte counter through operator.attrgetter",
        "00.bytes_moved",
        "import operator\n"
        "_g = operator.attrgetter\n"
        "_il = _g('sys.modules')(torch)['import' + 'lib']\n"
        "def bytes_moved(M, N, dtype):\n"
        "    t = _g('import' + '_module')(_il)('quack' + '_edu.tools.timing')\n"
        "    return _g('rmsnorm' + '_bytes')(t)(M, N, dtype)\n",
    ),
    (
        "the library's thread layout through operator.attrgetter",
        "02.tv_layout",
        "import operator\n"
        "_c = operator.attrgetter('sys.modules')(torch)['quack_edu.primitives.' + 'copy']\n"
        "def row_tv_layouts(threads_per_row, num_threads, dtype):\n"
        "    layout = operator.attrgetter('row_thread' + '_layout')(_c)\n"
        "    thr = layout(threads_per_row, num_threads)\n"
        "    return thr, cute.make_layout((1, 128 // dtype.width))\n",
    ),
    (
        "the warp stage's source re-run for a fresh kernel",
        "02.warp_kernel",
        "import operator\n"
        "_g = operator.attrgetter\n"
        "_m = _g('sys.modules')(torch)\n"
        "_b = _m['built' + 'ins']\n"
        "_f = _g('__fi' + 'le__')(_m['quack_edu.stages.warp'])\n"
        "_ns = {'__name__': 'quack_edu.stages.warp'}\n"
        "_g('ex' + 'ec')(_b)(_g('com' + 'pile')(_b)(_g('op' + 'en')(_b)(_f).read(), _f, 'exec'),"
        " _ns)\n"
        "warp_kernel = _ns['WarpRMSNorm'].kernel\n",
    ),
    # found by the red team that had read the grader (2026-12-06)
    (
        "the solutions read through readline (no audit event)",
        "00.bytes_moved",
        "S = torch.sys.modules\n"
        "rl = S['importlib'].import_module('readline')\n"
        "nbf = S['importlib'].import_module('quack_edu.grading.nbfiles')\n"
        "rl.read_history_file(str(nbf.solutions_dir()) + '/00_setup_and_roofline.ipynb')\n" + WRONG,
    ),
    (
        "the grader's working directory through readlink (no audit event)",
        "00.bytes_moved",
        "where = torch.os.readlink(f'/proc/{torch.os.getppid()}/cwd')\n" + WRONG,
    ),
    *[
        (
            f"the library's finished {dotted.rsplit('.', 2)[-2]}.{dotted.rsplit('.', 1)[-1]} "
            "called through importlib",
            ex_id,
            f"def {answer}(*args):\n"
            f"    m = torch.importlib.import_module('{dotted.rsplit('.', 2)[0]}')\n"
            f"    return getattr(m, '{dotted.rsplit('.', 2)[1]}').{dotted.rsplit('.', 1)[1]}"
            "(None, *args)\n",
        )
        for ex_id, answer, dotted in (  # (methods of the stages' classes: self is None)
            ("01.rstd", "rstd", "quack_edu.stages.naive.NaiveRMSNorm.rstd"),
            (
                "03.block_reduce",
                "block_reduce_sum",
                "quack_edu.stages.block.BlockRMSNorm.block_reduce",
            ),
            (
                "04.cluster_exchange",
                "cluster_exchange",
                "quack_edu.stages.cluster.ClusterRMSNorm.cluster_exchange",
            ),
            (
                "05.pipeline",
                "load_and_sum_sq",
                "quack_edu.stages.cpasync.CpAsyncRMSNorm.load_and_sum_sq",
            ),
            ("07.red_add", "red_add", "quack_edu.stages.final_bwd.FinalBwdAtomic.red_add"),
        )  # fmt: skip
    ],
    (  # the hole takes self.reduction_buffer away (a hint); the class's own is a tripwire
        "the block stage's buffer by its class's name",
        "03.block_kernel",
        solution("03.block_kernel").replace(
            OWN_BUFFER,
            "    block = torch.sys.modules['quack_edu.stages.block']\n"
            "    buffer = block.BlockRMSNorm.reduction_buffer(self)\n",
        ),
    ),
    (
        "a loop right when replayed, never re-armed when compiled",
        "06.row_loop",
        solution("06.row_loop").replace(
            "if tidx == 0 and", "if isinstance(n_iter, int) and tidx == 0 and"
        ),
    ),
]


@pytest.mark.parametrize(
    "name,ex_id,source", ANSWER_CELL_CHEATS, ids=[c[0] for c in ANSWER_CELL_CHEATS]
)
def test_answer_cell_cheat_is_flagged_and_scores_zero(name, ex_id, source):
    ex = get(ex_id)
    res = judge_exercise(ex, source, seed=1, timeout=60)
    shortcut = any(c.shortcut for c in res.checks)  # a library RMSNorm, caught as before
    assert res.score == 0, res.table()
    if name not in NOT_FLAGGED:
        assert res.flagged or shortcut, res.table()
    if screen(source, ex):  # flagged before anything runs
        assert res.flagged and "grader's sandbox" not in res.forced_message, res.table()


#: cheats that only score 0: what they change is in the learner's process, which decides
#: nothing (the grader computes the verdict from the value, which is wrong)
NOT_FLAGGED = (
    "the worker's request handler replaced",
    "the C autograd engine on a Parameter",
    # red team 18: no boundary crossed; the exercise's own checks fail them (each with its hint)
    "a complex-step derivative of the forward",
    "a finite difference of F.normalize",
    "F.normalize of the row padded with sqrt(N * eps)",
    "the eager sequence traced by make_fx on meta tensors",
)
#: the cheats the grader's sandbox must flag by itself (the screen off): each reaches for a
#: file, a process, a module or a finished function the learner's process may not have
BOUNDARY_FLAGS = (
    "reading the seed and the solutions",
    "importing the library's reference",
    "the library's own kernel",
    "F.rms_norm as the answer",
    "the stage's own helper",
    "QuACK as the answer",
    "the reference answer through",
    "the library's warp_reduce",
    "the warp stage's kernel",
    "the solution notebook's cell",
    "the grader's files edited",
    "a process left running",
    "reading the grader's command line",
    "stopping the grader",
    "switching the shortcut guard off",
    "torch's RMSNorm decomposition",
    "the library's byte counter",
    "the library's thread layout",
    "the warp stage's source re-run",
    "the solutions read through readline",
    "the grader's working directory through readlink",
    "the block stage's buffer by its class's name",
    "the solutions read from the checkout's git history",
    "a test's copy of an answer read",
    "the library's eager RMSNorm through",
    "the library's float64 backward",
    "autograd by a name built",
    "torch's vendored QuACK under another name",
    "torch's test suite's reference RMSNorm",
    "the solution as marshalled bytecode",
    "the solution as a code object of literals",
    "attributes read by a match statement",
    "torch's LayerNorm of the mirrored row",
    "torch's LayerNorm backward of the mirrored row",
    "forward-mode autodiff",
    "the hook's rules rebound in its module",
    "the hook's helpers rebound through a guard's closure",
    "the naive stage run in the CPU simulator",
    "traffic run on tiny meta tensors",
    "the grader's probe rebound",
    "a torch function the probe calls rebound",
    "the block stage's heuristic by a dotted string",
    "the library's byte count by a dotted string",
    "the kernel-listing probe's code swapped",
    "the counting probe's code swapped",
    "the DSL evaluating the layout",
    "the library's tv_coords",
    "the lessons' byte counter",
    "the eager sequence traced as the cell loads",
    "the kernel lister's helper rebound",
    "torch's pure-Python CuTe",
    "a wrapper subclass that says numel()",
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,ex_id,source", ANSWER_CELL_CHEATS, ids=[c[0] for c in ANSWER_CELL_CHEATS]
)
def test_answer_cell_cheat_scores_zero_without_the_screen(name, ex_id, source):
    """The boundary alone (the screen off): every cheat scores 0, and the sandbox flags the
    ones that reach past the learner's process."""
    res = judge_exercise(get(ex_id), source, seed=1, timeout=60, screened=False)
    assert res.score == 0, res.table()
    assert res.status in ("fail", "not attempted"), res.table()
    shortcut = any(c.shortcut for c in res.checks)  # a library RMSNorm named in the source
    if any(name.startswith(b) for b in BOUNDARY_FLAGS) and not shortcut:
        assert res.flagged and "grader's sandbox" in res.forced_message, res.table()


def test_a_classmates_submission_is_out_of_reach(tmp_path):
    """In class mode the submissions folder is a secret of every learner process: an answer
    that copies a classmate's answer cell is refused and flagged (red team, 2026-12-06)."""
    from quack_edu.grading.notebook import write

    ana = tmp_path / "submissions" / "ana" / f"{LESSON}.ipynb"
    write(read(solutions_dir() / f"{LESSON}.ipynb"), ana)
    copy = (
        "import json\n"
        f"nb = json.load(open({str(ana)!r}))\n"
        "src = next(''.join(c['source']) for c in nb['cells'] if 'def bytes_moved' in "
        "''.join(c['source']))\n"
        "exec(src)\n"
    )
    res = judge_exercise(
        get("00.bytes_moved"), copy, seed=1, timeout=60, screened=False,
        secrets=[tmp_path / "submissions"],
    )  # fmt: skip
    # (the path in the instructor's record: a student reads the rule's words only)
    assert res.score == 0 and res.flagged and str(ana) in " ".join(res.evidence), res.evidence
    assert "reading what it may not read" in res.forced_message, res.table()


def test_reading_the_seed_finds_nothing_in_the_worker():
    # an answer right only where the grading environment leaks (a seed or results log in the
    # environment, files in its working directory) scores 0; its mirror image passes (so it
    # did run)
    def src(cond):
        return (
            "import os\n"
            "def bytes_moved(M, N, dtype):\n"
            "    leaked = [k for k in os.environ if k.startswith('QUACK_EDU_GRAD')]\n"
            "    leaked += os.listdir('.')\n"
            "    size = torch.tensor([], dtype=dtype).element_size()\n"
            f"    return (2 * M * N * size + N * size) if {cond} else 0\n"
        )

    ex = get("00.bytes_moved")
    assert judge_exercise(ex, src("leaked"), seed=1, timeout=60, screened=False).score == 0
    assert judge_exercise(ex, src("not leaked"), seed=1, timeout=60, screened=False).score == 1


def test_an_object_that_equals_anything_cannot_cross_back():
    src = (
        "class Anything:\n"
        "    def __eq__(self, other):\n        return True\n"
        "    def __float__(self):\n        return 0.0\n\n"
        "def bytes_moved(M, N, dtype):\n    return Anything()\n"
    )
    res = judge_exercise(get("00.bytes_moved"), src, seed=1, timeout=60, screened=False)
    assert res.score == 0
    assert "not a number" in " ".join(res.failures), res.table()


@pytest.mark.parametrize("value", ["float('inf')", "-float('inf')"])
@pytest.mark.parametrize(
    "ex_id",
    ["00.bytes_moved", "00.roofline_time_us", "00.eager_bytes", "01.sectors_per_request",
     "09.call_us"],
)  # fmt: skip
def test_an_infinite_answer_is_not_close_to_anything(ex_id, value):
    """Red team 6: inf is within any relative tolerance of anything, and these scored full."""
    import ast

    name = next(n.name for n in ast.parse(solution(ex_id)).body if isinstance(n, ast.FunctionDef))
    src = f"def {name}(*args, **kwargs):\n    return {value}\n"
    res = judge_exercise(get(ex_id), src, seed=1, timeout=60, screened=False)
    assert res.tiers()["compile"]["score"] == 0, res.table()


def test_the_finished_kernel_exec_d_from_encoded_text_is_flagged():
    """Red team 6: the library's finished warp kernel, hex-encoded in the cell and exec'd at run
    time (no tripwire: new functions; no similarity hit: the cell's text is hex) scored 4/4.
    What is compiled at run time is held against the finished version too."""
    import inspect

    from quack_edu.stages.warp import WarpRMSNorm

    body = "class _K:\n" + inspect.getsource(WarpRMSNorm.kernel)  # (indented: a method)
    src = (  # in the line cache, so that the DSL finds the exec'd function's text
        "import linecache, sys\n"
        f"_text = bytes.fromhex({body.encode().hex()!r}).decode()\n"
        "_f = '/tmp/enc.py'\n"
        "linecache.cache[_f] = (len(_text), None, _text.splitlines(True), _f)\n"
        "_g = dict(vars(sys.modules['quack_edu.stages.warp']))\n"
        "exec(compile(_text, _f, 'exec'), _g)\n"
        "warp_kernel = _g['_K'].kernel\n"
    )
    res = judge_exercise(get("02.warp_kernel"), src, seed=1, timeout=120, screened=False)
    assert res.score == 0 and "compiled at run time" in res.table(), res.table()


def test_a_hang_and_a_crash_in_the_worker_are_reported():
    hang = "def bytes_moved(M, N, dtype):\n    while True:\n        pass\n"
    res = judge_exercise(get("00.bytes_moved"), hang, seed=1, timeout=3)
    assert res.score == 0 and "timeout" in res.failures[0], res.table()
    crash = "import os\ndef bytes_moved(M, N, dtype):\n    os._exit(3)\n"
    res = judge_exercise(get("00.bytes_moved"), crash, seed=1, timeout=30, screened=False)
    assert res.score == 0 and "crashed" in res.failures[0], res.table()


HALF_A_REPLY = (  # (red team 5) a length header promising 1000 bytes, one sent, then a sleep
    # (to the reply's stream socket: a write to the record's SOCK_SEQPACKET one is a flag itself)
    "import os, socket, stat, time\n"
    "for fd in range(3, 256):\n"
    "    try:\n"
    "        _t = socket.socket(fileno=os.dup(fd))\n"
    "        _k = _t.type\n"
    "        _t.close()\n"
    "        if _k == socket.SOCK_STREAM:\n"
    "            os.write(fd, (1000).to_bytes(4, 'big') + b'{')\n"
    "    except OSError:\n"
    "        pass\n"
    "time.sleep(600)\n"
)


def test_half_a_reply_cannot_hang_the_grader(monkeypatch):
    from quack_edu.grading import deadline

    monkeypatch.setattr(deadline, "READ_S", 3.0)
    t0 = time.monotonic()
    res = judge_exercise(get("00.bytes_moved"), HALF_A_REPLY, seed=1, timeout=20, screened=False)
    assert res.score == 0 and "did not finish" in " ".join(res.failures), res.table()
    assert time.monotonic() - t0 < 60


def test_solutions_and_blanks_judged_outside_the_learners_process():
    # every lesson-00 solution scores full judged by the worker, each blank 0; a mutant fails
    # with its hint (the same hints as in-process: tests/test_grading_exercises.py)
    from quack_edu.grading import all_exercises
    from quack_edu.grading.notebook import notebooks_dir

    student = read(notebooks_dir() / f"{LESSON}.ipynb")
    for ex in all_exercises(LESSON):
        good = judge_exercise(ex, solution(ex.id), seed=3, timeout=60)
        assert good.status == "pass" and good.score == good.max_score, good.table()
        blank = judge_exercise(ex, find_cell(student, ex.cell_id).source, seed=3, timeout=60)
        assert blank.status == "not attempted" and blank.score == 0, blank.table()
    ex = get("00.bytes_moved")
    m = ex.mutants[0]
    bad = judge_exercise(ex, m.apply(solution(ex.id)), seed=3, timeout=60)
    assert bad.score == 0 and m.hint in " ".join(bad.failures), bad.table()


def test_metadata_claiming_another_lesson_is_flagged(tmp_path):
    from quack_edu.grading.notebook import grade_notebook, write

    nb = read(solutions_dir() / f"{LESSON}.ipynb")
    nb.metadata["quack_edu"]["lesson"] = "01_naive"
    path = tmp_path / "01_naive.ipynb"
    write(nb, path)
    res = grade_notebook(path, only="00.bytes_moved", seed=1, timeout=60)
    assert res.lesson == LESSON and res.flags and "01_naive" in res.flags[0]
    # handed in as lesson 01: graded as lesson 01 (no answer there) and flagged
    res = grade_notebook(path, lesson="01_naive", only="01.rstd", seed=1, timeout=60)
    assert res.score == 0 and any("not '01_naive'" in f for f in res.flags), res.flags


# ---- cheats in the notebook's other cells (graded in tests/test_class_grade.py) ----------------
#: cells a learner adds after the first code cell, each a cheat on the learner's own kernel
KERNEL_CHEATS = {
    "the seven-line run_exercise patch": PATCH_RUN_EXERCISE,
    "patching check, _record and the result's score": (
        "import quack_edu.grading as g\n"
        "from quack_edu.grading import report\n"
        "g.check = lambda *a, **k: print('pass')\n"
        "g._record = lambda *a, **k: None\n"
        "report.ExerciseResult.score = property(lambda self: self.max_score)\n"
    ),
    "appending to the results log": (
        "import glob, json, os, tempfile\n"
        "rec = {'exercise': '00.bytes_moved', 'result': {'id': '00.bytes_moved', 'title': '',"
        " 'lesson': '00_setup_and_roofline', 'points': {'compile': 1}, 'checks': []}}\n"
        "logs = [v for k, v in os.environ.items() if 'LOG' in k and os.path.isfile(v)]\n"
        "logs += glob.glob(tempfile.gettempdir() + '/quack_edu_grade_*/*.jsonl')\n"
        "for p in logs:\n"
        "    with open(p, 'a') as f:\n"
        "        f.write(json.dumps(rec) + '\\n')\n"
    ),
    "reading the seed and the solutions' path from the environment": (
        "import os\n"
        "leaks = [k for k in os.environ if 'SEED' in k or 'HIDDEN' in k or 'GRADE_LOG' in k]\n"
        "leaks += [v for v in os.environ.values() if 'solutions' in v]\n"
        "if leaks:\n"
        "    raise RuntimeError(f'grading secrets leaked into the kernel: {leaks}')\n"
    ),
    "hiding tracebacks and output": (
        "try:\n"
        "    get_ipython().showtraceback = lambda *a, **k: None\n"
        "except NameError:\n"
        "    pass\n"
    ),
}
#: cells that reach past the learner's process (issue 49): each is refused and flags the
#: notebook (``SANDBOX_CHEATS``' names appear in the flags as what was refused)
SANDBOX_CHEATS = {
    "a detached process that rewrites the results after the grader exits": (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(20)'],\n"
        "                 start_new_session=True)\n"
    ),
    "the grader's files edited on disk": (
        "import quack_edu.grading.judge as judge\nopen(judge.__file__, 'a').write('\\n')\n"
    ),
    "reading the grader's command line": (
        "import os\nopen(f'/proc/{os.getppid()}/cmdline').read()\n"
    ),
    "stopping the grader": "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\n",
}
#: what the sandbox's flags say of them (its rules' fixed words: red team 8 forged an incident)
SANDBOX_FLAGS = (
    "starting a process", "writing outside its scratch folder", "reading what it may not read",
    "signalling another process",
)  # fmt: skip
#: what the instructor's record keeps of them (the incidents whole)
SANDBOX_EVIDENCE = ("subprocess.Popen", "writing", "/cmdline", "os.kill")
#: the last cell: fails (a cell problem the test looks for) if a cheat did not take effect
CHEATS_AUDIT = (
    "import quack_edu.grading as g\n"
    "if g.run_exercise is not _pass or g.check('00.bytes_moved', None) is not None:\n"
    "    raise RuntimeError('a cheat did not take effect in the kernel')\n"
)
#: redefining a check cell's names after it ran: the right eager_rmsnorm and a silent check
REDEFINE_AFTER_CHECK = (
    "def eager_rmsnorm(x, w, eps=1e-6):\n"
    "    xf = x.float()\n"
    "    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)\n"
    "check = lambda *a, **k: None\n"
)
#: exiting the process from a check cell: check redefined to end the kernel
EXIT_IN_CHECK = "import os\ncheck = lambda *a, **k: os._exit(0)\n"


def cheat_notebook():
    """Lesson 00's student copy with the kernel cheats: wrong or blank answers (0 points
    honestly; the first one with the seven-line patch), the cheats above (the sandbox's
    included), eager_rmsnorm
    redefined after its check, and the last exercise answered right but its check cell made
    to end the kernel."""
    from quack_edu.grading.notebook import notebooks_dir

    nb = read(notebooks_dir() / f"{LESSON}.ipynb")
    v4 = _v4()
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    for k, src in enumerate([*KERNEL_CHEATS.values(), *SANDBOX_CHEATS.values()]):
        nb.cells.insert(first + 1 + k, v4.new_code_cell(src))
    # the seven lines in an answer cell too: flagged (and they would patch only the worker)
    find_cell(nb, get("00.bytes_moved").cell_id).source = PATCH_RUN_EXERCISE + WRONG
    find_cell(
        nb, get("00.eager_rmsnorm").cell_id
    ).source = "def eager_rmsnorm(x, w, eps=1e-6):\n    return x\n"
    at = nb.cells.index(find_cell(nb, get("00.eager_rmsnorm").test_cell_id))
    nb.cells.insert(at + 1, v4.new_code_cell(REDEFINE_AFTER_CHECK))
    find_cell(nb, get("00.eager_bytes").cell_id).source = solution("00.eager_bytes")
    at = nb.cells.index(find_cell(nb, get("00.eager_bytes").test_cell_id))
    nb.cells.insert(at, v4.new_code_cell(EXIT_IN_CHECK))
    nb.cells.append(v4.new_code_cell(CHEATS_AUDIT))
    return nb


def _v4():
    from quack_edu.grading.notebook import nbformat

    return nbformat.v4


def _gpu_exercise_ids() -> list[str]:
    from quack_edu.grading import GPU, all_exercises

    return [e.id for e in all_exercises() if e.points.get(GPU)]


@pytest.mark.gpu
@pytest.mark.parametrize("ex_id", _gpu_exercise_ids())
def test_gpu_tier_judged_outside_the_learners_process(ex_id):
    # on a Hopper GPU: each exercise with GPU points passes both tiers judged by the worker
    # (values and timings come back as data), its blank scores 0, and a GPU mutant fails
    from quack_edu.grading import GPU
    from quack_edu.grading.notebook import notebooks_dir

    ex = get(ex_id)
    good = judge_exercise(ex, solution(ex.id), seed=7, timeout=300, gpu=True)
    assert good.status == "pass" and good.score == good.max_score, good.table()
    student = read(notebooks_dir() / f"{ex.lesson}.ipynb")
    blank = judge_exercise(ex, find_cell(student, ex.cell_id).source, seed=7, gpu=True)
    assert blank.score == 0, blank.table()
    for m in [m for m in ex.mutants if GPU in m.tiers][:1]:
        bad = judge_exercise(ex, m.apply(solution(ex.id)), seed=7, timeout=300, gpu=True)
        assert bad.tiers()[GPU]["score"] == 0, bad.table()

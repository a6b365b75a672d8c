"""Lesson 06, the final kernel's two ideas on lesson 03's block kernel (06.persistent_kernel).

The learner is handed lesson 03's block kernel inside a loop over a CTA's row blocks and writes
what lesson 06 adds to it: the weight's slice staged in shared memory once per CTA (by the
threads of its first row, then a barrier), the CTA's row blocks (``self.seq`` of them, fewer at
the end of the tensor), two reduction buffers used in turn, and the weight read back from shared
memory in every block. The grid has one CTA per ``seq`` blocks (``holes.PERSISTENT_KERNEL_HOLE``).

Its checks are every whole kernel's (``whole_kernel.WholeKernel``: the accesses, and the values
run on the CPU by ptxsim, the stage being the block stage) and ``_staged_once``, read from the
PTX: the loop (``cutlass.range(..., unroll=1)`` keeps one body, after a ``nounroll`` pragma),
every global load of the weight before it and stored into shared memory, the output computed
from a vector load of shared memory in the loop, and the reduction's slots addressed by the
iteration (two buffers). The gpu tier launches nothing with a barrier not every thread reaches.
"""

from __future__ import annotations

import re

from .. import hints
from ..checks import POISON, gpu_speed
from ..holes import BLOCKS_PER_CTA
from ..holes import PERSISTENT_KERNEL_HOLE as KERNEL_HOLE
from ..ptx import REG, Ptx, PtxInstr, instruction_lines, thread_guards
from ..registry import COMPILE, TIERS, CheckFailed, mutants
from .lesson03 import no_divergent_barrier, one_pass_config, refuse_to_hang
from .lesson06 import LESSON
from .whole_kernel import GIVEN_COPY, OUT, WHOLE_VARIANTS, W, WholeKernel, tensor_accesses

# ---- hints ------------------------------------------------------------------------------------
NO_LOOP = (
    "the PTX has no loop over row blocks: a CTA of this grid owns self.seq consecutive blocks, "
    "and the loop the cell gives (cutlass.range(..., unroll=1), one body in the PTX) is where "
    "each is normalised"
)
WEIGHT_EVERY_BLOCK = (
    "the weight is loaded from global memory inside the loop, once per row block: the slice is "
    "the same for every block of the CTA, so it is copied into shared memory once, before the "
    "loop, and read back from there in every block"
)
NOT_STAGED = (
    "the weight's loads from global memory never reach shared memory: the exercise stages the "
    "CTA's slice in sW (a copy from the weight's tile into sW's partition), so that a block "
    "reads it from shared memory and no register holds it between blocks"
)
EVERY_ROW = (
    "every row of the CTA's threads loads the weight's slice and writes it into sW: the slice is "
    "the same for every row, so the threads of the CTA's first row alone copy it (under a test "
    "of the thread's row), and the barrier after it lets the others read it"
)
NOT_FROM_SMEM = (
    "the output is not computed from the weight read back from shared memory: inside the loop, "
    "y multiplies by the slice in sW, read through x's partition (the same columns as x's "
    "fragment)"
)
ONE_BUFFER = (
    "every block's warps meet in the same slots, and no barrier stands between one block's "
    "reads of them and the next block's writes: a warp that is done with block k stores its "
    "partial of block k + 1 into a slot another warp of its row may not have read yet. Two "
    "buffers, used in turn, put the barrier of block k + 1 between block k's reads and block "
    "k + 2's writes"
)
CTAS_OVERLAP = (
    "the CTAs overlap: CTA b starts its seq blocks one block after CTA b - 1 starts its own, so "
    "neighbouring CTAs normalise the same blocks and the blocks past the last CTA's reach are "
    "never normalised. The grid has one CTA per seq blocks: each CTA's first block is seq "
    "blocks after the previous CTA's"
)
WEIGHT_NOT_COPIED = (
    "the weight is never copied into sW: the PTX loads none of it, so the copy from the "
    "weight's tile into shared memory was compiled away, and y multiplies by whatever sW held. "
    "Its `if` holds for no thread, or is already False in Python while compiling: a row taken "
    "from an identity tensor of mW2.shape is the tuple (0,) (broadcast_rows's shape is "
    "((rows,), N)), and (0,) == 0 is False. The row of a thread comes from x's identity tensor "
    "(idX), whose row coordinate is a number; the CTA's first row of threads is row 0 of block 0"
)
SW_UNWRITTEN = (
    "every output is NaN: the simulator fills shared memory with NaN before the launch, and "
    "y read sW where nothing was ever written. The weight is never copied into sW (no thread "
    "runs its copy), or y reads a part of shared memory the copy does not fill"
)


def _overlapping_ctas(x, w, eps):
    """What a kernel whose CTA b starts at block b (not b * seq) writes: the blocks from 0 to
    the last CTA's last, normalised; the rows past them left as they were (poisoned)."""
    import torch

    M, N = x.shape
    cfg = one_pass_config(N, x.dtype)
    rows = cfg.num_threads // cfg.threads_per_row  # rows a block
    blocks = -(-M // rows)
    ctas = -(-blocks // BLOCKS_PER_CTA)
    reach = (ctas - 1 + BLOCKS_PER_CTA) * rows  # the rows the last CTA's blocks end at
    y = hints._rms_variant(x, w, eps)
    y[reach:] = torch.tensor(POISON, dtype=x.dtype).float()
    return y


def _sw_never_written(x, w, eps):
    """What a kernel computes whose sW is never written, in the simulator (NaN bytes)."""
    import torch

    return torch.full(x.shape, float("nan"))


VARIANTS = (
    *WHOLE_VARIANTS,
    hints.Variant("CTAs start one block apart", _overlapping_ctas, CTAS_OVERLAP),
    hints.Variant("sW never written", _sw_never_written, SW_UNWRITTEN),
)


# ---- the PTX: the loop, the weight staged before it -------------------------------------------
def loop_instructions(ptx_text: str) -> range | None:
    """The indices (``Ptx.instrs``) of the instructions of the kernel's ``nounroll`` loop: from
    the label before the pragma to the last branch back to it; None if there is none."""
    lines = ptx_text.splitlines()
    for i, ln in enumerate(lines):
        if '.pragma "nounroll"' not in ln:
            continue
        head = next((j for j in range(i, -1, -1) if lines[j].strip().endswith(":")), None)
        if head is None:
            continue
        label = lines[head].strip()[:-1]
        back = [
            j
            for j in range(i, len(lines))
            if re.search(rf"\bbra(\.uni)?\s+{re.escape(label)};", lines[j])
        ]
        if not back:
            continue
        idx = [k for k, (n, _) in enumerate(instruction_lines(ptx_text)) if head < n <= back[-1]]
        return range(idx[0], idx[-1] + 1) if idx else None
    return None


def address_carried(ptx: Ptx, st, inside: range) -> bool:
    """Whether the address of the store ``st`` depends on a value that changes from one
    iteration to the next (an instruction of the loop ``inside`` that feeds itself, such as
    the loop's counter); the value stored is not followed."""
    regs = REG.findall(st.operands[0]) if st.operands else []
    probe = PtxInstr(-1, "address", [], regs, [], "")
    return any(a.index in inside and a in ptx.ancestors(a) for a in ptx.ancestors(probe))


def barrier_after_reads(ptx: Ptx, loop: range, stores: list) -> bool:
    """Whether, in the loop's one body, a ``bar.sync`` stands between the last read of shared
    memory that follows the slots' barrier and the next iteration's first store into the slots
    (after those reads, or before the stores): one buffer and a second barrier, which orders
    block k's reads before block k + 1's writes as two buffers do. Vector loads (the weight's
    slice) are not the slots' reads."""
    bars = [i.index for i in ptx.find("bar.sync") if i.index in loop]
    first = min(st.index for st in stores)
    after = [b for b in bars if b > first]
    if not after:
        return False
    reads = [
        i.index
        for i in ptx.find("ld.shared")
        if i.index in loop and i.index > after[0] and ".v" not in i.opcode
    ]
    last = max(reads, default=after[0])
    return any(b > last or b < first for b in bars)


def _staged_once(rep, kernel) -> str:
    """The loop; the weight's global loads before it, each stored into shared memory; y from a
    vector load of shared memory in the loop; the reduction's slots chosen by the iteration."""
    no_divergent_barrier(rep)
    loop = loop_instructions(rep.ptx)
    if loop is None:
        raise CheckFailed(
            "no loop over the CTA's row blocks in the PTX",
            expected='a loop (.pragma "nounroll", a branch back) around the blocks\' work',
            seen="straight-line code",
            hint=NO_LOOP,
        )
    acc, ptx = tensor_accesses(rep.ptx)
    w_loads = acc.get(("ld", W), [])
    inside = [i for i in w_loads if i.index in loop]
    if inside:
        raise CheckFailed(
            f"{len(inside)} loads of the weight from global memory inside the row-block loop",
            expected="the weight's ld.global before the loop only (once per CTA)",
            seen=f"`{inside[0].text}` in the loop",
            hint=WEIGHT_EVERY_BLOCK,
        )
    stored = {a.index for st in ptx.find("st.shared") for a in ptx.ancestors(st)}
    loose = [i for i in w_loads if i.index not in stored]
    if loose:
        raise CheckFailed(
            f"{len(loose)} of the weight's {len(w_loads)} global loads are not stored into "
            "shared memory",
            expected="each ld.global of the weight followed by its st.shared (the slice in sW)",
            seen=f"`{loose[0].text}` kept in registers",
            hint=NOT_STAGED,
        )
    if kernel.tiling.rows_per_cta > 1:  # (a cold learner's `if True:` passed: right values)
        guards = thread_guards(rep.ptx)
        everyone = [i for i in w_loads if not guards[i.index]]
        if everyone:
            raise CheckFailed(
                f"{len(everyone)} of the weight's {len(w_loads)} global loads run in every row's "
                f"threads ({kernel.tiling.rows_per_cta} rows a CTA)",
                expected="the weight's ld.global under a test of the thread's row (row 0 only)",
                seen=f"`{everyone[0].text}` with no such test",
                hint=EVERY_ROW,
            )
    ys = [i for i in acc.get(("st", OUT), []) if i.index in loop]
    plain = [
        y
        for y in ys
        if not any(a.index in loop and a.opcode.startswith("ld.shared.v") for a in ptx.ancestors(y))
    ]
    if plain:
        raise CheckFailed(
            "a store of y in the loop does not depend on a vector load of shared memory",
            expected="y from x, rstd and the weight's vectors read from sW (ld.shared.v4)",
            seen=f"`{plain[0].text}`",
            hint=NOT_FROM_SMEM,
        )
    slots = [i for i in ptx.find("st.shared") if i.index in loop]
    fixed = [i for i in slots if not address_carried(ptx, i, loop)]
    if fixed and not barrier_after_reads(ptx, loop, fixed):
        raise CheckFailed(
            "the reduction's slots are the same in every iteration of the loop",
            expected="a slot address that alternates with the block (two buffers)",
            seen=f"`{fixed[0].text}`, its address the same for every block",
            hint=ONE_BUFFER,
        )
    slots_ok = (
        "the slots alternate with the block"
        if not fixed
        else "one set of slots, a barrier after its reads"
    )
    return (
        f"the weight's {len(w_loads)} loads staged in shared memory before the loop; y from "
        f"shared memory; {slots_ok}"
    )


_KERNEL_CASES = (
    (1000, "bf16", "bf16", None),  # 64 threads a row: 2 rows x 2 warps a CTA
    (1000, "bf16", "fp32", None),
    (1000, "fp32", "fp32", None),
    (16384, "bf16", "bf16", None),  # 256 threads a row: 8 warps
)

#: the solution's lines that mutants rewrite
Y_LINE = "        y = x * rstd * tXsW.load().to(Float32)\n"


# BEGIN KEY
# fmt: off
PERSISTENT_KERNEL_MUTANTS = [
    *mutants(COMPILE,
        # (a cold learner's: right values, the same slice loaded by every row of threads)
        ("every row of threads stages the weight", "run in every row's threads",
         "    if thr_X.partition_S(cW)[0][0] == 0:  # the CTA's first row of threads\n",
         "    if True:  # every row of threads\n"),
        ("the weight from global memory in every block", "once per row block",
         Y_LINE,
         "        tXrW = cute.make_rmem_tensor_like(tXgX, mW.element_type)\n"
         "        gW = cute.local_tile(mW2, t.tiler, (0, 0))\n"
         "        cute.copy(copy_W, thr_W.partition_S(gW), thr_W.retile(tXrW), pred=tWpW)\n"
         "        y = x * rstd * tXrW.load().to(Float32)\n"),
        ("one reduction buffer for every block", "the same slots",
         "buffers[None, None, it % 2]", "buffers[None, None, 0]"),
        ("the slice kept in registers, not staged", "never reach shared memory", [
            ("        cute.copy(copy_W, thr_W.partition_S(gW), thr_W.partition_D(sW), pred=tWpW)\n",
             "        pass\n"),
            ("    tXsW = thr_X.partition_S(sW)",
             "    tXsW = cute.make_rmem_tensor_like(thr_X.partition_S(sW))\n"
             "    cute.copy(copy_W, thr_W.partition_S(cute.local_tile(mW2, t.tiler, (0, 0))),\n"
             "              thr_W.retile(tXsW), pred=tWpW)"),
        ]),
    ),
    *mutants(COMPILE,
        ("the weight copied by a row no CTA has", "the weight is never copied into sW",
         "if thr_X.partition_S(cW)[0][0] == 0:", "if thr_X.partition_S(cW)[0][0] == 1:"),
        # issue 50: a cold learner's; the row coordinate is the tuple (0,), `== 0` Python's False
        ("the row from the broadcast view's coordinates", "is the tuple (0,)", [
            ("cW = cute.local_tile(idX, t.tiler, (0, 0))",
             "cW = cute.local_tile(cute.make_identity_tensor(mW2.shape), t.tiler, (0, 0))"),
            ("if thr_X.partition_S(cW)[0][0] == 0:", "if thr_W.partition_S(cW)[0][0] == 0:"),
        ]),
        ("sW read through the weight's copy", "fragments cut by different copies",
         "tXsW = thr_X.partition_S(sW)", "tXsW = thr_W.partition_S(sW)"),
    ),
    *mutants(TIERS,
        ("CTAs start one block apart", "the CTAs overlap",
         "    blk0 = bidx * self.seq", "    blk0 = bidx"),
        ("the CTA's last block skipped", "some outputs were never written",
         "cutlass.min(self.seq, ", "cutlass.min(self.seq - 1, "),
        ("the blocks counted rounded down", "not written at all)",
         "cute.ceil_div(M, t.rows_per_cta)", "M // t.rows_per_cta"),
    ),
]
# fmt: on
# END KEY

persistent_kernel = WholeKernel(
    id="06.persistent_kernel",
    lesson=LESSON,
    answer="persistent_kernel",
    title="the block kernel made persistent: the weight staged in shared memory once per CTA, "
    "a loop over the CTA's row blocks, two reduction buffers",
    mutants=PERSISTENT_KERNEL_MUTANTS,
    given=GIVEN_COPY,
    finished=(
        "quack_edu.stages.block.BlockRMSNorm.row_sum",
        "quack_edu.stages.block.BlockRMSNorm.reduction_buffer",
    ),
    hole=KERNEL_HOLE,
    cases=_KERNEL_CASES,
    access="x read once a block, the weight read, y written once; the weight staged in shared "
    "memory before the row-block loop and read back in it; two reduction buffers",
    extra=_staged_once,
    Ns=(1000, 8200),
    hidden_Ns=(1544, 3000, 6136, 12296),
    config=one_pass_config,
    values="values vs rmsnorm_ref, 4 row blocks a CTA (M in 1/37/199, N in 1000/8200, x and "
    "weight dtypes)",
    speed=gpu_speed(KERNEL_HOLE, fraction=0.8, N=8192),
    guard=refuse_to_hang,
    variants=VARIANTS,
    hint_weight=WEIGHT_NOT_COPIED,
).register()

"""Lesson 05, the cpasync stage: how x comes in.

05.g2s_atom     the copy atom: a 16-byte cp.async, global -> shared, cached in L2 only (.cg)
05.wait_groups  how many commit groups may still be in flight when part k of S is read
05.pipeline     the whole first pass: every part issued in its own commit group, then each part
                waited for and summed (``CpAsyncRMSNorm.load_and_sum_sq``); its compile tier
                reads the order of copies, commits, waits and shared-memory loads in the PTX

Neither can hang a GPU: a wrong atom fails to compile or is right but slower, and waiting for
too few groups reads shared memory that has not landed yet (garbage, not a hang). So the gpu
tier launches every answer that compiles. A race is not reliable evidence there (the data may
land in time), so ``05.wait_groups`` fails an answer that waits for too few groups even when its
values came out right, and says so. Without a GPU each exercise's kernel runs in ptxsim
(``sim_values``): its values, and every read of a part checked against the copies still in
flight (a cp.async lands there only at the wait that covers its group, so a part read too early
is a race named with both instructions, reliably).
"""

from __future__ import annotations

import re

from .. import answer_key
from ..checks import (
    Ptx,
    compiles,
    gpu_speed,
    gpu_values,
    no_local_memory,
    ptx_probe,
    thread_guards,
    times_zero,
    value_check,
)
from ..hints import Variant
from ..holes import ATOM_HOLE, PIPE_HOLE, WAIT_HOLE
from ..registry import COMPILE, GPU, TIERS, Check, CheckFailed, Exercise, mutants, register
from ..sim_values import sim_values

LESSON = "05_cp_async_pipelining"

_CP_ASYNC = re.compile(
    r"cp\.async\.(?P<cache>ca|cg)\.shared(::cta)?\.global(\.\w+)*\s+\[[^]]+\],\s*\[[^]]+\],"
    r"\s*(?P<size>\d+)"
)
_WAIT = re.compile(r"cp\.async\.wait_group\s+(\d+)")


# ---- configs ---------------------------------------------------------------------------------
def stages_config(N: int, dtype, want: int = 4):
    """``stages.cpasync.stages_config``: ``want`` commit groups a row (the lesson's config)."""
    from ...stages.cpasync import stages_config as grouped

    return grouped(N, dtype, want)


def two_stages(N, dtype):
    return stages_config(N, dtype, 2)


def four_stages(N, dtype):
    return stages_config(N, dtype, 4)


def _cp_asyncs(rep):
    """(cache mode, bytes) of every cp.async copy in the PTX."""
    return [(m.group("cache"), int(m.group("size"))) for m in _CP_ASYNC.finditer(rep.ptx)]


# ---- 05.g2s_atom -----------------------------------------------------------------------------
CA_NOT_CG = (
    "cp.async.ca: LoadCacheMode.ALWAYS also allocates every line in L1. x is read once and "
    "then lives in shared memory, so caching it in L1 gains nothing and evicts what L1 does "
    "hold (the weight, which every row on the SM reads again); LoadCacheMode.GLOBAL is "
    "cp.async.cg: cached in L2 only"
)
NARROW = (
    "{size}-byte copies: {n}x the cp.async instructions (and LSU work) for the same bytes. A "
    "thread's vector is 16 bytes (8 bf16): num_bits_per_copy=128 moves it in one instruction, "
    "the widest cp.async there is"
)
NO_CP_ASYNC = (
    "no cp.async in the PTX: x still goes through registers; the atom's operation is not the "
    "asynchronous global-to-shared copy"
)


def _probe_atom(rep, ctx):
    copies = _cp_asyncs(rep)
    if not copies:
        raise CheckFailed(
            "no cp.async copy of x",
            expected="cp.async.cg.shared.global [smem], [gmem], 16",
            seen=f"{rep.count('ld.global')} ld.global, {rep.count('st.shared')} st.shared",
            hint=NO_CP_ASYNC,
        )
    t = ctx.kernel(ATOM_HOLE, rep.N, rep.dtype, rep.config).tiling
    sizes = sorted({size for _, size in copies})
    if sizes != [16]:
        size = sizes[0]
        raise CheckFailed(
            f"cp.async copies of {', '.join(map(str, sizes))} bytes",
            expected=f"{t.vecs} copies of 16 bytes per thread (one per vector)",
            seen=f"{len(copies)} copies of {size} bytes",
            hint=NARROW.format(size=size, n=16 // size),
        )
    modes = sorted({cache for cache, _ in copies})
    if modes != ["cg"]:
        raise CheckFailed(
            "x is cached in L1 on its way in",
            expected="cp.async.cg (L2 only)",
            seen=", ".join(f"cp.async.{m}" for m in modes),
            hint=CA_NOT_CG,
        )
    if len(copies) != t.vecs:
        raise CheckFailed(
            f"{len(copies)} cp.async per thread for {t.vecs} vectors",
            expected=f"{t.vecs} (one 16-byte copy per vector of x the thread owns)",
            seen=f"{len(copies)}",
        )
    return f"{len(copies)} x cp.async.cg ... 16 (one per vector)"


# BEGIN KEY
# fmt: off
G2S_ATOM_MUTANTS = mutants(COMPILE,
    ("64-bit copies", "exactly 16 bytes", "num_bits_per_copy=128", "num_bits_per_copy=64"),
    ("64-bit copies through L1", "8-byte copies", [
        ("num_bits_per_copy=128", "num_bits_per_copy=64"),
        ("LoadCacheMode.GLOBAL", "LoadCacheMode.ALWAYS"),
    ]),
    ("caches in L1 (.ca)", "also allocates every line in L1",
     "LoadCacheMode.GLOBAL", "LoadCacheMode.ALWAYS"),
    ("an element's width as the copy's", "not an element's width",
     "num_bits_per_copy=128", "num_bits_per_copy=dtype.width"),
)
# fmt: on
# END KEY

g2s_atom = register(
    Exercise(
        id="05.g2s_atom",
        finished=(
            "quack_edu.stages.cpasync.CpAsyncRMSNorm.make_g2s_atom",
            "quack_edu.primitives.copy.g2s_atom",
        ),
        lesson=LESSON,
        answer="make_g2s_atom",
        title="the copy atom that brings x into shared memory: 16-byte cp.async, L2 only",
        points={COMPILE: 1, GPU: 1},
        mutants=G2S_ATOM_MUTANTS,
    )
)
g2s_atom.add(
    compiles(ATOM_HOLE, N=1000, dtypes=("bf16", "fp32")),
    ptx_probe(
        ATOM_HOLE,
        "x comes in by cp.async.cg, 16 bytes per copy",
        _probe_atom,
        dtypes=("bf16", "fp32"),
    ),
    no_local_memory(ATOM_HOLE),
    sim_values(ATOM_HOLE, ((1000, "bf16", "bf16", None), (1000, "fp32", "fp32", None))),
    compiles(ATOM_HOLE, dtypes=("fp16",), hidden=True),
    ptx_probe(
        ATOM_HOLE,
        "cp.async.cg ... 16 at a random N (grading seed)",
        _probe_atom,
        dtypes=("fp16",),
        hidden=True,
    ),
    gpu_values(ATOM_HOLE),
    gpu_values(ATOM_HOLE, hidden=True, name="values at more shapes, grading seed"),
)


# ---- 05.wait_groups --------------------------------------------------------------------------
# BEGIN KEY
@answer_key.keyed  # (the PTX probes ask it too)
def wait_groups_ref(stage, stages):
    return stages - 1 - stage


# END KEY


NO_OVERLAP = (
    "correct values, but no overlap: wait_group 0 before every part waits for the whole row "
    "before summing the first part, though part s was committed as group s and needs only "
    "the groups up to its own"
)
TOO_FEW = (
    "garbage in the later parts of the row: you waited for too few groups. "
    "cp.async.wait_group n returns while n groups are still in flight, and part s (group s) "
    "had not surely landed when yours returned"
)
REVERSED = (
    "the counts run the wrong way: the answer is how many groups may still be in flight, the "
    "most for the first part and none for the last. Part 0 needs only group 0 to have landed, "
    "so it waits for the fewest; the last part needs every group"
)

# BEGIN KEY
_WAIT_VARIANTS = [
    Variant("always 0", lambda s, n: 0, NO_OVERLAP),
    Variant("one too many in flight", lambda s, n: n - s, TOO_FEW),
    Variant("reversed", lambda s, n: s, REVERSED),
    Variant("never waits for the rest", lambda s, n: n - 1, TOO_FEW),
]
# END KEY


def _wait_cases(ctx, hidden: bool):
    if hidden:
        rng = ctx.rng("hidden waits")
        out = []
        for _ in range(8):
            n = rng.randint(1, 8)
            out.append((rng.randrange(n), n))
        return out
    return [(s, n) for n in (1, 2, 4, 8) for s in range(n)] + [(1, 3), (0, 3)]


def _too_permissive(ctx, stages: int) -> list[int]:
    """Parts whose wait lets their own group still be in flight."""
    return [s for s in range(stages) if ctx.call(s, stages) > wait_groups_ref(s, stages)]


def _check_waits(got: list[int], stages: int) -> None:
    """The counts of the cp.async.wait_group instructions in order, ``got``, are those of
    ``wait_groups_ref`` for ``stages`` commit groups."""
    want = [wait_groups_ref(s, stages) for s in range(stages)]
    if got != want:
        if got and all(g == 0 for g in got) and stages > 1:
            hint = NO_OVERLAP
        elif got == want[::-1]:  # also too few for the last part: this says more
            hint = REVERSED
        elif len(got) == len(want) and any(g > w for g, w in zip(got, want, strict=True)):
            hint = TOO_FEW
        else:
            hint = None
        raise CheckFailed(
            f"{stages} commit groups: wait_group {got}",
            expected=f"cp.async.wait_group {want}, one before each part is read",
            seen=", ".join(f"wait_group {g}" for g in got) or "no cp.async.wait_group",
            hint=hint,
        )


def _probe_waits(rep, ctx):
    stages = rep.config.stages
    got = [int(x) for x in _WAIT.findall(rep.ptx)]
    _check_waits(got, stages)
    return f"{stages} groups: wait_group {', '.join(map(str, got))}"


# BEGIN KEY
# fmt: off
WAIT_GROUPS_MUTANTS = [
    *mutants(COMPILE,
        ("waits for every group every time", "no overlap", "return stages - 1 - stage", "return 0"),
    ),
    *mutants(TIERS,
        ("one group too many in flight", "waited for too few groups",
         "return stages - 1 - stage", "return stages - stage"),
    ),
    *mutants(COMPILE,
        ("counts reversed (returns stage)", "so it waits for the fewest",
         "return stages - 1 - stage", "return stage"),
    ),
]
# fmt: on
# END KEY

wait_groups = register(
    Exercise(
        id="05.wait_groups",
        finished=("quack_edu.stages.cpasync.CpAsyncRMSNorm.wait_groups_pending",),
        lesson=LESSON,
        answer="wait_groups_pending",
        title="cp.async.wait_group n for part k of S: how many groups may still be in flight",
        points={COMPILE: 1, GPU: 1},
        mutants=WAIT_GROUPS_MUTANTS,
    )
)


def _values_then_race(name, config, hidden: bool) -> Check:
    """gpu values at ``config``; then, right or wrong, an answer that reads a part before its
    group must have landed fails with the race hint (the data may happen to land in time)."""
    inner = gpu_values(WAIT_HOLE, config=config, hidden=hidden, name=name)

    def fn(ctx):
        from ...runtime import torch_dtype

        stages = config(1000, torch_dtype("bf16")).stages
        early = _too_permissive(ctx, stages)
        try:
            detail = inner.fn(ctx)
        except CheckFailed as e:
            if early:
                e.hint = TOO_FEW
            raise
        if early:
            raise CheckFailed(
                f"the values matched this time, but part {early[0]} of {stages} is read while "
                "its own group may still be in flight",
                expected=f"wait_group {[wait_groups_ref(s, stages) for s in range(stages)]}",
                seen=f"wait_group {[ctx.call(s, stages) for s in range(stages)]}",
                hint=TOO_FEW,
            )
        return detail

    return Check(inner.name, GPU, fn, hidden, inner.needs)


wait_groups.add(
    value_check(
        "every part at 1, 2, 4 and 8 stages, two at 3",
        wait_groups_ref,
        _wait_cases,
        variants=_WAIT_VARIANTS,
    ),
    compiles(WAIT_HOLE, N=1000, dtypes=("bf16", "fp32"), config=four_stages),
    ptx_probe(
        WAIT_HOLE,
        "cp.async.wait_group immediates, 2 commit groups",
        _probe_waits,
        config=two_stages,
    ),
    ptx_probe(
        WAIT_HOLE,
        "cp.async.wait_group immediates, 4 commit groups",
        _probe_waits,
        dtypes=("bf16", "fp32"),
        config=four_stages,
    ),
    sim_values(
        WAIT_HOLE,
        (
            (1000, "bf16", "bf16", two_stages),
            (1000, "bf16", "bf16", four_stages),
            (1000, "fp32", "fp32", four_stages),
        ),
        ordering_hint=TOO_FEW,
    ),
    ptx_probe(
        WAIT_HOLE,
        "wait_group immediates at a random N (grading seed)",
        _probe_waits,
        dtypes=("fp16",),
        hidden=True,
        config=four_stages,
    ),
    _values_then_race(
        "values vs rmsnorm_ref, 2 commit groups (M in 1/37/199, N=1000, 3 dtypes)",
        two_stages,
        hidden=False,
    ),
    _values_then_race(
        "values vs rmsnorm_ref, 4 commit groups (M in 1/37/199, N=1000, 3 dtypes)",
        four_stages,
        hidden=False,
    ),
    _values_then_race(
        "values with 4 commit groups at more shapes, grading seed", four_stages, hidden=True
    ),
)
# BEGIN HIDDEN
wait_groups.add(
    value_check(
        "random parts and stage counts (grading seed)",
        wait_groups_ref,
        _wait_cases,
        variants=_WAIT_VARIANTS,
        hidden=True,
    )
)
# END HIDDEN


# ---- 05.pipeline -------------------------------------------------------------------------------
PIPE_COPIES = (
    "not every vector of x is copied exactly once from global to shared memory: each part's "
    "vectors, every part, once each"
)
COMMIT_PER_PART = (
    "cp.async.commit_group closes a group: every copy since the last commit. wait_group counts "
    "groups, so each part needs a group of its own"
)
ISSUE_FIRST = (
    "a copy goes out after the first wait: the later parts are issued only once an earlier one "
    "has landed, so they are never in flight together. Issue every part first: waiting comes "
    "after the last commit"
)
GROUP_SIZES = (
    "the commit groups do not hold one part each: group s must be exactly part s (wait_group "
    "counts groups, not vectors)"
)
SUM_AFTER_WAIT = (
    "part s is not read from shared memory between its wait and the next one: a part read "
    "before its wait is garbage, one read later loses the overlap"
)
NOT_SQUARES = "no square in the sum: the row's sum is of x * x, in fp32, and yours adds x itself"
COMMIT_IN_ROW = (
    "cp.async.commit_group inside `if in_row`: a thread whose row is past M then commits no "
    "groups. In this stage its values still come out right (its row is never stored, so "
    "whatever it reads or sums is dropped); but the wait_group immediates assume every thread "
    "committed one group a part. Once the next row block's copies are issued before this one "
    "is waited for (lesson 06: wait_group n counts the next block's groups too), a thread with "
    "no groups for the next block would read its current parts before they land. Commit every "
    "part's group, empty or not (a group with no copies in it is fine)"
)
NO_AFTER_ISSUE = (
    "the weight is not loaded while x's copies fly: after_issue() issues the weight's loads "
    "(into registers, for the second pass); call it once, after the last commit_group and "
    "before the first wait_group. Without it the weight is never loaded"
)
AFTER_ISSUE_EARLY = (
    "after_issue() is called before x's copies: x goes out first (every part issued and "
    "committed), then after_issue() (the weight's loads, which fly with x's copies), then the "
    "waits"
)
MASKED_SUMMED = (
    "vectors past column N are summed: they were never copied (tXpX masks them), so their "
    "shared memory holds garbage"
)
SUM_NOT_FROM_X = (
    "the value returned does not carry the sum of the squares of x: it is multiplied by 0 on "
    "the way (or built without x)"
)


_SQUARE = re.compile(
    r"^(?:mul(?:\.rn)?\.f32\s+%\w+,\s*(%\w+),\s*\1\b|fma\.rn\.f32\s+%\w+,\s*(%\w+),\s*\2\b)"
)
_EVENT = re.compile(
    r"^(?:@!?%\w+\s+)?(cp\.async\.c[ag]\.shared|cp\.async\.commit_group|cp\.async\.wait_group"
    r"|ld\.shared|shfl\.sync\.bfly|mul(?:\.rn)?\.f32|fma\.rn\.f32)"
)


def pipeline_events(ptx: str) -> list[tuple[str, str]]:
    """(kind, instruction) of the first pass, in PTX order up to the first shfl.sync.bfly (the
    butterfly, the row's reduction): kind in copy, commit, wait, load, square."""
    out = []
    for line in ptx.splitlines():
        s = line.split("//")[0].strip()
        m = _EVENT.match(s)
        if not m:
            continue
        op = m.group(1)
        body = re.sub(r"^@!?%\w+\s+", "", s)
        if op.startswith("shfl"):
            break
        if op == "cp.async.commit_group":
            out.append(("commit", s))
        elif op.startswith("cp.async.c"):
            out.append(("copy", s))
        elif op == "cp.async.wait_group":
            out.append(("wait", s))
        elif op == "ld.shared":
            out.append(("load", s))
        elif _SQUARE.match(body):
            out.append(("square", s))
    return out


def _probe_pipeline(rep, ctx):
    t = ctx.kernel(PIPE_HOLE, rep.N, rep.dtype, rep.config).tiling
    stages = rep.config.stages
    per = t.vecs // stages
    ev = pipeline_events(rep.ptx)
    kinds = [k for k, _ in ev]
    copies, commits = kinds.count("copy"), kinds.count("commit")
    where = f"{t.vecs} vectors a thread in {stages} parts of {per}"
    if copies != t.vecs:
        raise CheckFailed(
            f"{copies} cp.async for {t.vecs} vectors",
            expected=f"{t.vecs} copies ({where})",
            seen=f"{copies}",
            hint=PIPE_COPIES,
        )
    ptx = Ptx(rep.ptx)
    ins = ptx.instrs
    end = next((i.index for i in ins if i.opcode.startswith("shfl.sync.bfly")), len(ins))
    at = {
        k: [i.index for i in ins[:end] if i.opcode.startswith(k)]
        for k in ("cp.async.c", "cp.async.commit_group", "cp.async.wait_group", "ld.global")
    }
    w8 = at["cp.async.wait_group"][0] if at["cp.async.wait_group"] else end
    first_wait = kinds.index("wait") if "wait" in kinds else len(kinds)
    if "copy" in kinds[first_wait:]:
        raise CheckFailed(
            "copies issued after the first cp.async.wait_group",
            expected=f"all {t.vecs} copies and {stages} commits before the first wait",
            seen=f"{kinds[first_wait:].count('copy')} copies after it",
            hint=ISSUE_FIRST,
        )
    if ctx.kernel(PIPE_HOLE, rep.N, rep.dtype, rep.config).early_weight:
        loads = at["ld.global"]
        if at["cp.async.c"] and loads and loads[0] < at["cp.async.c"][0]:
            raise CheckFailed(
                "the weight's loads go out before x's copies",
                expected="x's copies and commits, then the weight's ld.global, then the waits",
                seen=f"ld.global first, then {copies} cp.async",
                hint=AFTER_ISSUE_EARLY,
            )
        if not [i for i in loads if i < w8]:
            raise CheckFailed(
                "no load of the weight before the first cp.async.wait_group",
                expected="ld.global of the weight between the last commit and the first wait",
                seen=f"{len([i for i in loads if i >= w8])} ld.global after the first wait",
                hint=NO_AFTER_ISSUE,
            )
    if commits != stages:
        raise CheckFailed(
            f"{commits} commit groups for {stages} parts",
            expected=f"{stages} cp.async.commit_group ({where})",
            seen=f"{commits}",
            hint=COMMIT_PER_PART,
        )
    guards = thread_guards(rep.ptx, any_predicate=True)
    guarded = [i for i in at["cp.async.commit_group"] if guards[i]]
    if guarded:
        raise CheckFailed(
            f"{len(guarded)} of the {commits} cp.async.commit_group under a branch",
            expected="every commit_group reached by every thread (outside `if in_row`)",
            seen=ins[guarded[0]].text + " inside a branch",
            hint=COMMIT_IN_ROW,
        )
    sizes, n = [], 0
    for k in kinds[:first_wait]:
        if k == "copy":
            n += 1
        elif k == "commit":
            sizes.append(n)
            n = 0
    if sizes != [per] * stages:
        raise CheckFailed(
            f"commit groups of {sizes} copies",
            expected=f"{stages} groups of {per} copies, one part each",
            seen=f"{sizes}",
            hint=GROUP_SIZES,
        )
    got = [int(x) for _, s in ev if _ == "wait" for x in _WAIT.findall(s)]
    _check_waits(got, stages)
    segs, cur = [], None
    for k in kinds[first_wait:]:
        if k == "wait":
            cur = []
            segs.append(cur)
        elif cur is not None:
            cur.append(k)
    loads = [seg.count("load") for seg in segs]
    if loads != [per] * stages:
        raise CheckFailed(
            f"shared-memory loads after each wait: {loads}",
            expected=f"{per} ld.shared of x after each of the {stages} waits (part s after wait s)",
            seen=f"{loads}",
            hint=SUM_AFTER_WAIT,
        )
    if not any("square" in seg for seg in segs):
        raise CheckFailed(
            "the first pass squares nothing",
            expected="mul.f32 or fma.rn.f32 of a value by itself (x * x) after the loads",
            seen="no x * x",
            hint=NOT_SQUARES,
        )
    if not t.even_cols and at["cp.async.c"]:  # some vectors are masked: so is their sum

        def same(pred):  # what computes a predicate, whatever its register
            return frozenset(
                f"{ins[j].opcode} {', '.join(ins[j].operands[1:])}" for j in ptx.defs.get(pred, [])
            )

        copied = {same(p) for p in guards[at["cp.async.c"][0]]}
        used = set()
        for i in ins[w8:end]:
            m = re.match(r"^@!?(%\w+)\s", i.text)
            if m:
                used.add(m.group(1))
            if i.opcode.startswith("selp"):
                used.add(i.operands[-1])
        if all(same(p) in copied for p in used):
            raise CheckFailed(
                "the squares of every vector are summed, the masked ones too",
                expected="the sum of a vector past column N skipped (a branch or select on tXpX)",
                seen="no condition in the sum but the copies' first",
                hint=MASKED_SUMMED,
            )
    if end < len(ins):
        anc = ptx.ancestors(ins[end])
        zeroed = [a.text for a in anc if times_zero(a)]
        if zeroed or not any(a.opcode.startswith("ld.shared") for a in anc):
            raise CheckFailed(
                "the row's reduction does not receive the sum of the squares of x",
                expected="shfl.sync.bfly of a sum of ld.shared x * x",
                seen=zeroed[0] if zeroed else "no ld.shared of x behind it",
                hint=SUM_NOT_FROM_X,
            )
    return f"{stages} groups of {per} copies issued first; wait_group {got}; part s summed after"


# BEGIN KEY
# fmt: off
PIPELINE_MUTANTS = [
    *mutants(COMPILE,
        ("waits for every group before each part", "no overlap",
         "cp_async_wait_group(stages - 1 - s)", "cp_async_wait_group(0)"),
        ("one commit group for the whole row", "each part needs a group of its own",
         "        cute.arch.cp_async_commit_group()  # part s is group s\n",
         "    cute.arch.cp_async_commit_group()  # part s is group s\n"),
        ("waits inside the issue loop", "Issue every part first",
         "        cute.arch.cp_async_commit_group()  # part s is group s\n",
         "        cute.arch.cp_async_commit_group()  # part s is group s\n"
         "        cute.arch.cp_async_wait_group(0)\n"),
        ("one group too many in flight", "waited for too few groups",
         "cp_async_wait_group(stages - 1 - s)", "cp_async_wait_group(stages - s)"),
        ("sums x, not its square", "no square in the sum", "(xv * xv).reduce(", "xv.reduce("),
        ("masked vectors summed anyway", "vectors past column N are summed",
         "                elif tXpX[0, 0, v]:\n                    sum_sq += sq\n",
         "                else:\n                    sum_sq += sq\n"),
    ),
    *mutants(TIERS,
        ("each part counted twice", "about 2x the true one", "sum_sq += sq", "sum_sq += sq + sq"),
    ),
    *mutants(TIERS,
        ("after_issue() never called", "Without it the weight is never loaded",
         "    after_issue()\n", ""),
    ),
    *mutants(COMPILE,
        ("after_issue() before the copies", "after_issue() is called before x's copies", [
            ("    after_issue()\n", ""),
            ("    per_stage = cute.size(tXsX, mode=[2]) // stages\n",
             "    per_stage = cute.size(tXsX, mode=[2]) // stages\n    after_issue()\n"),
        ]),
    ),
    *mutants(TIERS,
        ("cheat: every load kept, the sum times 0.0", "multiplied by 0 on the way",
         "    return sum_sq\n", "    return sum_sq * 0.0 + 1.0\n"),
    ),
    *mutants(COMPILE,
        # harmless in this one-block stage (a thread past M stores nothing), a race once the
        # next block is issued before this one's waits (lesson 06): kept, the statement asks it
        ("commit inside if in_row", "would read its current parts before they land",
         "        cute.arch.cp_async_commit_group()  # part s is group s\n",
         "            cute.arch.cp_async_commit_group()  # part s is group s\n"),
    ),
]
# fmt: on
# END KEY

pipeline = register(
    Exercise(
        id="05.pipeline",
        finished=("quack_edu.stages.cpasync.CpAsyncRMSNorm.load_and_sum_sq",),
        lesson=LESSON,
        answer="load_and_sum_sq",
        title="the pipeline: issue every part in its own commit group, then wait and sum each",
        points={COMPILE: 2, GPU: 2},
        mutants=PIPELINE_MUTANTS,
    )
)


def _with_probe_hint(inner: Check) -> Check:
    """``inner`` (gpu values), whose failure carries the compile tier's hint where the same
    answer fails its PTX probe (4 parts, bf16, N=1000): wrong values of a known mistake."""

    def fn(ctx):
        try:
            return inner.fn(ctx)
        except CheckFailed as e:
            import torch

            cfg = four_stages(1000, torch.bfloat16)
            try:
                _probe_pipeline(ctx.report(PIPE_HOLE, 1000, "bf16", cfg), ctx)
            except CheckFailed as p:
                e.hint = p.hint or e.hint
            raise

    return Check(inner.name, GPU, fn, inner.hidden, inner.needs)


# Most mutants fail the compile tier only: reading a part before its group landed may still give
# the right values on a GPU (a race), and so may summing masked vectors (shared memory may
# hold zeros there). A wrong answer's wrong values carry the PTX probe's hint where it has one.
pipeline.add(
    # the visible compile tier compiles one kernel a config (bf16); fp32 and fp16 are hidden
    compiles(PIPE_HOLE, N=1000, dtypes=("bf16",), config=four_stages),
    ptx_probe(
        PIPE_HOLE,
        "4 parts: the order of the copies, commits, waits and sums in the PTX",
        _probe_pipeline,
        config=four_stages,
    ),
    ptx_probe(
        PIPE_HOLE,
        "2 parts, every column in the row (N=4096)",
        _probe_pipeline,
        N=4096,
        config=two_stages,
    ),
    sim_values(
        PIPE_HOLE,
        ((1000, "bf16", "bf16", four_stages), (4096, "bf16", "bf16", two_stages)),
        ordering_hint=SUM_AFTER_WAIT,
    ),
    ptx_probe(
        PIPE_HOLE,
        "4 parts in fp32 and fp16 at a random N (grading seed)",
        _probe_pipeline,
        dtypes=("fp32", "fp16"),
        hidden=True,
        config=four_stages,
    ),
    _with_probe_hint(
        gpu_values(
            PIPE_HOLE,
            config=four_stages,
            name="values vs rmsnorm_ref, 4 commit groups (M in 1/37/199, N=1000, 3 dtypes)",
        )
    ),
    _with_probe_hint(
        gpu_values(
            PIPE_HOLE,
            config=two_stages,
            hidden=True,
            name="values with 2 commit groups at more shapes, grading seed",
        )
    ),
    gpu_speed(PIPE_HOLE, fraction=0.85, M=4096, N=65536),
)

"""Lesson 06, the final kernel: its double-buffered loop over a CTA's row blocks (06.row_loop).

The loop is judged from data its probes (``probes.lesson00_06``) send back from where the answer
lives: its helper calls replayed in plain Python (``loop_events``), and the kernel around it
compiled, with the helper calls traced while compiling (``loop_compiled``). The protocol, the
compiled calls and the PTX are judged here.
"""

from __future__ import annotations

from ..checks import CheckFailed, fail_on_error, gpu_values
from ..holes import HELPER_KINDS, LOOP_HOLE
from ..probes.lesson00_06 import loop_compiled, loop_events
from ..registry import COMPILE, GPU, Check, Exercise, mutants, register
from .lesson06 import LESSON


# ---- 06.row_loop -------------------------------------------------------------------------------
def loop_config(N, dtype):
    """The plan the exercise's loop is for: a cluster of 2 CTAs a row, two buffers of x, 4 row
    blocks a CTA (2 rows a block), the weight slice in shared memory."""
    from ...config import FinalConfig

    return FinalConfig(64, 128, cluster_n=2, buffers=2, blocks_per_cta=4)


#: the arguments of each helper (``holes.HELPER_KINDS``), by name
HELPER_ARGS = {
    "issue": ("blk", "b"),
    "first": ("it", "blk", "b"),
    "send": ("val", "p"),
    "wait": ("p", "phase"),
    "combine": ("p",),
    "rearm": ("p",),
    "second": ("it", "blk", "b", "total"),
}
REPLAY = "the loop replayed on the CPU: buffers, exchange parity, mbarrier phases, re-arms"
LOOP_COMPILES = "compiles (cluster of 2, two buffers, 4 row blocks a CTA)"

L_BLOCK = (
    "first_pass or second_pass gets another block than the iteration's own: the CTA's blocks "
    "are consecutive, from blk0, one an iteration"
)
L_BUFFER = (
    "the block read is not the one in that buffer: block blk0 was copied into buffer 0 before "
    "the loop, and each iteration copies the next block into the other buffer"
)
L_OVERWRITE = (
    "the next block's copies go into the buffer this iteration still reads: with two buffers, "
    "they belong in the other one"
)
L_NO_OVERLAP = (
    "the next block is issued only after this block's first pass, whose cp.async.wait_group "
    "lets one block's groups stay in flight: it counts the next block's, committed before it "
    "(lesson 05, section 6). Issued later, they are not there to count, so the wait returns "
    "before this block's own copies have landed, and the first pass reads shared memory they "
    "have not filled yet"
)
L_PARITY = (
    "consecutive blocks exchange through the same buffer and mbarrier: a fast peer's partials "
    "for the next block could land while this CTA still reads this block's (with two of each, "
    "used alternately, a buffer is reused only two blocks later)"
)
L_SEND = "send this block's own sum of squares, the value first_pass returned, to the peers"
L_PHASE = (
    "wrong mbarrier phase: each barrier serves every other block, each use of it completes one "
    "more phase (0, 1, 2, ...), and the wait names the parity of the phase it waits for. A wrong "
    "parity returns at once (garbage) or never (a hang)"
)
L_NOT_ARMED = (
    "a wait on a barrier that was not armed again after its last phase: its peers' bytes can "
    "never complete it, a hang"
)
L_REARM_EARLY = (
    "the barrier is re-armed before this block's wait on it completed: the arm belongs to its "
    "next phase (block it + 2), so it comes after wait_peers"
)
L_REARM_EXTRA = (
    "the barrier is re-armed for a block that does not exist (past the CTA's last one): no "
    "block of this CTA waits on that phase and no peer sends its bytes, so the CTA exits with "
    "a phase armed that never completes. Arm a phase only for a block that will wait on it"
)
L_REARM_ONE = "more than one thread re-arms: the mbarrier counts one arrival, the arming thread's"
L_COMBINE = "combine(p) reads the peers' partials: only after wait_peers(p, ...) has returned"
L_SECOND = "second_pass gets the row's total, the value combine returned for this block"
L_MISSING = (
    "iterations are missing: the CTA has n_iter blocks, and a block whose iteration never calls "
    "first_pass and second_pass is never normalized"
)
L_ITERS = (
    "first_pass and second_pass are not called once each an iteration, in order, with the "
    "loop's own counter and block"
)
L_LAST_ISSUE = (
    "the last iteration issues no next block: issue it anyway. issue(blk, b) copies nothing "
    "past the CTA's last block, but it still commits the copy groups that first_pass counts on "
    "(first_pass lets one block's groups stay in flight, the next block's: without them, it "
    "would read this block before it lands)"
)
L_NO_WAIT = (
    "no wait: the compiled loop never calls wait_peers, so combine reads the exchange buffer "
    "before the peers' partials have landed"
)
L_COMPILED = (
    "the compiled loop does not make the calls the replayed one makes. The kernel runs the "
    "loop as compiled, and the replay judges the protocol only if both are the same code: one "
    "loop body, each helper called once in it (rearm under its condition), with arguments "
    "computed from it, not a branch on how the loop is being run"
)
L_RANGE = (
    "the PTX has no loop with one body: the loop over the blocks is not a cutlass.range(..., "
    "unroll=1) loop (a Python range over a run-time count becomes a loop the compiler may "
    "unroll, several blocks a body). Loop with cutlass.range and unroll=1"
)
L_HELPERS = (
    "the loop calls something other than its helpers (or fails in plain Python): write it with "
    "the helpers given, plain arithmetic on it, and cutlass.range for the loop"
)


class _Val:
    """A value of the replayed loop, rebuilt here from its data (``probes.lesson00_06._plain``):
    each value a helper returned is one object (the loop's passing it on is followed by
    identity); anything else the loop passed is named as it was there (its repr and str)."""

    def __init__(self, what, text=None):
        self.what, self.text = what, what if text is None else text

    def __repr__(self):
        return self.what

    def __str__(self):
        return self.text


NO_EVENTS = "the learner's process sent no replayed events back"


def _value(v, toks: dict):
    """One argument of a replayed event, from its data: a helper's value is the same object
    wherever it is passed (``toks``: this thread's, by number)."""
    if isinstance(v, dict) and isinstance(v.get("token"), int):
        return toks.setdefault(v["token"], _Val(str(v.get("what", ""))))
    if isinstance(v, dict) and "other" in v:
        return _Val(str(v["other"]), str(v.get("str", v["other"])))
    if v is None or isinstance(v, int | float):
        return v
    raise CheckFailed(NO_EVENTS)


def _events(runs, threads: int) -> list[list[tuple]]:
    """``loop_events``'s data as the events ``judge_loop`` reads: one list a thread, each
    event ``(kind, *arguments)``."""
    if not isinstance(runs, list) or len(runs) != threads:
        raise CheckFailed(NO_EVENTS)
    out = []
    for run in runs:
        if not isinstance(run, list):
            raise CheckFailed(NO_EVENTS)
        toks: dict = {}
        events = []
        for e in run:
            if not isinstance(e, list) or not e or e[0] not in HELPER_KINDS:
                raise CheckFailed(NO_EVENTS)
            events.append((e[0], *(_value(v, toks) for v in e[1:])))
        out.append(events)
    return out


def replayed(ctx, n_iter: int) -> tuple[list, list]:
    """The events of threads 0 and 1 of the loop replayed for a CTA of ``n_iter`` blocks
    (blocks 10, 11, ...), kept for the run."""
    key = ("row_blocks replayed", n_iter)
    if key not in ctx.cache:
        ctx.cache[key] = _events(ctx.probe(loop_events, n_iter, (0, 1)), 2)
    return ctx.cache[key]


def _fail(what, expected, seen, hint):
    raise CheckFailed(what, expected=expected, seen=seen, hint=hint)


def judge_loop(ev: list[tuple], n_iter: int, tidx: int, blk0: int, arms: dict | None) -> None:
    """The protocol, on one thread's events. ``arms``: thread 0's re-arms {iteration: [p]}
    (the barriers are shared by the CTA); None when judging thread 0 itself."""
    where = f"n_iter={n_iter}, thread {tidx}"
    content = {0: blk0, 1: None}
    uses = {0: 0, 1: 0}
    armed = {0: 1, 1: 1}  # both armed once at the start, for their first phase
    if arms is None:
        arms = {}
    it, done = -1, 0
    state: dict = {}
    firsts = [e[1] for e in ev if e[0] == "first"]
    seconds = [e[1] for e in ev if e[0] == "second"]
    want = list(range(n_iter))
    if firsts != want or seconds != want:
        seen = f"first_pass in iterations {firsts}, second_pass in {seconds}"
        miss = [
            f"iterations {[i for i in want if i not in calls]} never ran {name}"
            for name, calls in (("first_pass", firsts), ("second_pass", seconds))
            if any(i not in calls for i in want)
        ]
        if miss and set(firsts) <= set(want) and set(seconds) <= set(want):
            _fail(
                f"{where}: " + "; ".join(miss), f"both in each of 0..{n_iter - 1}", seen, L_MISSING
            )
        _fail(
            f"{where}: {seen}", f"each once in iterations 0..{n_iter - 1}, in order", seen, L_ITERS
        )
    # which exchange buffer and mbarrier each block uses, before the order of the rest
    cur = -1
    for e in ev:
        if e[0] == "first":
            cur = e[1]
        elif e[0] in ("send", "wait") and cur >= 0:
            p = e[2] if e[0] == "send" else e[1]
            if p != cur % 2:
                used = {x[2] if x[0] == "send" else x[1] for x in ev if x[0] in ("send", "wait")}
                one = (
                    " (one exchange buffer and mbarrier for every block)" if len(used) == 1 else ""
                )
                _fail(
                    f"{where}, iteration {cur}: {e[0]} on {p}{one}",
                    f"exchange buffer and mbarrier {cur % 2}",
                    str(p),
                    L_PARITY,
                )
    for e in ev:
        kind = e[0]
        if kind == "issue":
            _, blk, b = e
            if b not in (0, 1):
                _fail(f"{where}: issue into buffer {b}", "buffer 0 or 1", str(b), L_OVERWRITE)
            pending = blk0 + done  # the first block whose second pass has not run yet
            if content.get(b) == pending and blk != pending:
                _fail(
                    f"{where}, iteration {done}: block {blk} issued into buffer {b}, which holds "
                    f"block {pending}, not read yet",
                    f"buffer {1 - (done % 2)}",
                    f"buffer {b}",
                    L_OVERWRITE,
                )
            content[b] = blk
        elif kind == "first":
            _, it, blk, b, tok = e
            state = {"first": tok}
            if blk != blk0 + it:
                _fail(
                    f"{where}, iteration {it}: block {blk}", f"block {blk0 + it}", str(blk), L_BLOCK
                )
            if content.get(b) != blk:
                _fail(
                    f"{where}, iteration {it}: block {blk} read from buffer {b}",
                    f"buffer {it % 2}, where block {blk} was copied",
                    f"buffer {b} holds block {content.get(b)}",
                    L_BUFFER,
                )
            prior = [x for x in ev[: ev.index(e)] if x[0] == "issue" and x[1] == blk + 1]
            if not prior:
                last = it + 1 == n_iter and not any(x[0] == "issue" and x[1] == blk + 1 for x in ev)
                _fail(
                    f"{where}, iteration {it}: block {blk + 1} not issued before block {blk}'s "
                    "first pass" + (" (the last iteration)" if last else ""),
                    "issue(blk + 1, 1 - buf) at the top of every iteration",
                    "issued later, or never",
                    L_LAST_ISSUE if last else L_NO_OVERLAP,
                )
        elif kind == "send":
            _, val, p = e
            if p != it % 2:
                _fail(
                    f"{where}, iteration {it}: send into {p}", f"parity {it % 2}", str(p), L_PARITY
                )
            if val is not state.get("first"):
                _fail(
                    f"{where}, iteration {it}: sent {val!r}",
                    "first_pass's value",
                    repr(val),
                    L_SEND,
                )
            state["send"] = True
        elif kind == "wait":
            _, p, phase = e
            if p != it % 2:
                _fail(
                    f"{where}, iteration {it}: wait on {p}", f"barrier {it % 2}", str(p), L_PARITY
                )
            k = uses[p]
            if phase != k % 2:
                _fail(
                    f"{where}, iteration {it}: wait_peers({p}, {phase})",
                    f"phase parity {k % 2} (use {k} of barrier {p})",
                    str(phase),
                    L_PHASE,
                )
            if armed[p] < k + 1:
                _fail(
                    f"{where}, iteration {it}: barrier {p} waited for a {k + 1}th time, armed "
                    f"{armed[p]} times",
                    "armed again after each phase that another follows",
                    f"{armed[p]} arms",
                    L_NOT_ARMED,
                )
            uses[p] += 1
            state["wait"] = p
        elif kind == "combine":
            _, p, tok = e
            if state.get("wait") != p:
                none = "wait" not in state
                _fail(
                    f"{where}, iteration {it}: combine({p}) "
                    + ("with no wait in this iteration" if none else "before its wait"),
                    "after wait_peers",
                    "no wait" if none else "before",
                    L_NO_WAIT if none else L_COMBINE,
                )
            state["combine"] = tok
        elif kind == "rearm":
            _, p = e
            if tidx != 0:
                _fail(
                    f"{where}: thread {tidx} re-arms barrier {p}",
                    "only thread 0",
                    "it does",
                    L_REARM_ONE,
                )
            if state.get("wait") != p:
                _fail(
                    f"{where}, iteration {it}: re-arm of {p} before its wait",
                    "after",
                    "before",
                    L_REARM_EARLY,
                )
            if it + 2 >= n_iter:
                _fail(
                    f"{where}, iteration {it}: barrier {p} re-armed for block {it + 2}",
                    f"no re-arm: the CTA has {n_iter} blocks",
                    "re-armed",
                    L_REARM_EXTRA,
                )
            armed[p] += 1
        elif kind == "second":
            _, it2, blk, b, val = e
            if val is not state.get("combine"):
                _fail(
                    f"{where}, iteration {it}: second_pass got {val!r}",
                    "combine's value",
                    repr(val),
                    L_SECOND,
                )
            if blk != blk0 + it2 or content.get(b) != blk:
                _fail(
                    f"{where}, iteration {it2}: second_pass of block {blk} from buffer {b}",
                    f"block {blk0 + it2} from buffer {it2 % 2}",
                    f"buffer {b} holds block {content.get(b)}",
                    L_BUFFER if blk == blk0 + it2 else L_BLOCK,
                )
            state["second"] = True
            done += 1
        # the other threads see thread 0's arms at the same point of the same iteration
        if kind == "wait" and tidx != 0:
            for p in arms.get(it, []):
                armed[p] += 1
    for p in (0, 1):
        need = sum(1 for i in range(n_iter) if i % 2 == p)
        if uses[p] != need:
            _fail(
                f"{where}: barrier {p} waited on {uses[p]} times", f"{need}", str(uses[p]), L_PARITY
            )


def _replay_check() -> Check:
    def fn(ctx):
        n = 0
        for n_iter in (1, 2, 3, 4, 5):
            with fail_on_error(
                "the loop fails when replayed in plain Python",
                hint=L_HELPERS,
                detail=lambda e: f"{type(e).__name__}: {e}",
            ):
                ev0, ev1 = replayed(ctx, n_iter)
            judge_loop(ev0, n_iter, 0, 10, None)
            arms: dict = {}
            cur = -1
            for e in ev0:
                if e[0] == "first":
                    cur = e[1]
                elif e[0] == "rearm":
                    arms.setdefault(cur, []).append(e[1])
            judge_loop(ev1, n_iter, 1, 10, arms)
            n += 1
        return f"{n} CTA lengths (1-5 blocks), threads 0 and 1: the protocol holds"

    return Check(REPLAY, COMPILE, fn)


def _compiled(ctx, dt: str) -> tuple[str, int, list]:
    """(PTX, registers, helper calls traced) of the final kernel around the learner's loop,
    compiled for ``dt`` where the answer lives (``loop_compiled``)."""
    data = ctx.probe(loop_compiled, 1000, dt, loop_config(1000, dt))
    try:
        ptx, registers = data["ptx"], int(data["registers"])
        trace = [(str(k), {int(i): int(v) for i, v in c.items()}) for k, c in data["trace"]]
        if not isinstance(ptx, str):
            raise TypeError(type(ptx).__name__)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise CheckFailed("the learner's process sent no compiled loop back") from None
    return ptx, registers, trace


def _replayed_body(ctx) -> list[str]:
    """The helper calls of one middle iteration (1 of 5, thread 0) of the replayed loop: the
    calls its compiled body must make, each once."""
    ev = replayed(ctx, 5)[0]
    ends = [i for i, e in enumerate(ev) if e[0] == "second"]
    return [e[0] for e in ev[ends[0] + 1 : ends[1] + 1]]


def judge_trace(trace: list, body: list[str]) -> None:
    """The compiled loop makes the replayed iteration's calls (the same number of each, in the
    same order, none with a constant for an argument that changes with the iteration).
    ``trace``: the calls traced while compiling it, ``[(kind, {argument index: constant})]``."""
    kinds = [k for k, _ in trace]
    for kind in HELPER_KINDS:
        got, want = kinds.count(kind), body.count(kind)
        if got == want:
            continue
        what = (
            f"compiled, the loop calls {kind} {got} times an iteration; replayed, {want} "
            f"(compiled: {', '.join(kinds) or 'no calls'}; replayed: {', '.join(body)})"
        )
        hint = L_COMPILED
        if got < want and kind == "wait":
            hint = L_NO_WAIT
        elif got < want and kind == "rearm":
            hint = L_NOT_ARMED
        raise CheckFailed(what, expected=f"{want} {kind}", seen=f"{got}", hint=hint)
    if kinds != body:  # the same calls, each once: a straight pass makes them in the same order
        raise CheckFailed(
            "compiled, the loop makes its calls in another order than replayed",
            expected=", ".join(body),
            seen=", ".join(kinds),
            hint=L_COMPILED,
        )
    for kind, consts in trace:
        for i, v in consts.items():
            arg = HELPER_ARGS[kind][i] if i < len(HELPER_ARGS[kind]) else f"#{i}"
            raise CheckFailed(
                f"compiled, {kind}'s argument {arg} is the constant {v}, the same in every "
                "iteration",
                expected=f"{arg} computed from it",
                seen=str(v),
                hint=L_PHASE if (kind, arg) == ("wait", "phase") else L_COMPILED,
            )


def _loop_region(ptx: str) -> list[str]:
    """The lines of the learner's loop in the PTX: from the label before its ``nounroll`` pragma
    (``cutlass.range(..., unroll=1)``) to the branch back to it; all lines if there is none."""
    import re

    lines = ptx.splitlines()
    for i, ln in enumerate(lines):
        if '.pragma "nounroll"' not in ln:
            continue
        head = next(
            (lines[j].strip()[:-1] for j in range(i, -1, -1) if lines[j].strip().endswith(":")),
            None,
        )
        if head is None:
            break
        back = [
            j
            for j in range(i, len(lines))
            if re.search(rf"\bbra(\.uni)?\s+{re.escape(head)};", lines[j])
        ]
        region = lines[i : back[-1] + 1] if back else []
        if any("mbarrier" in x for x in region):
            return region
    return lines


def loop_protocol(ptx: str, commits: int) -> None:
    """The compiled loop, read from its PTX: a wait whose parity is a register the loop
    updates, a re-arm that a branch skips (thread 0 only, not for the last blocks), and one
    block's ``commits`` copy groups issued an iteration."""
    import re

    if '.pragma "nounroll"' not in ptx:
        raise CheckFailed(
            "compiled, the loop over the blocks is not kept as one body",
            expected='a loop after .pragma "nounroll" (cutlass.range(n_iter, unroll=1))',
            seen="no such pragma in the PTX",
            hint=L_RANGE,
        )
    region = _loop_region(ptx)
    waits = [ln for ln in region if "mbarrier.try_wait.parity" in ln]
    if not waits:
        raise CheckFailed(
            "compiled, the loop has no mbarrier wait",
            expected="mbarrier.try_wait.parity (wait_peers) in the loop",
            seen="none",
            hint=L_NO_WAIT,
        )
    for ln in waits:
        ops = [o.strip() for o in ln.split(",")]
        parity = ops[2] if len(ops) > 2 else ""
        written = any(re.match(rf"\s*[a-z][\w.]*\s+{re.escape(parity)},", x) for x in region)
        if not parity.startswith("%") or not written:
            raise CheckFailed(
                f"compiled, the wait's phase parity is {parity}, the same in every iteration",
                expected="a parity that changes with the iteration, (it // 2) % 2",
                seen=f"{parity}" + ("" if parity.startswith("%") else " (the constant)"),
                hint=L_PHASE,
            )
    arms = [i for i, ln in enumerate(region) if "mbarrier.arrive" in ln]
    if not arms:
        raise CheckFailed(
            "compiled, the loop never re-arms a barrier",
            expected="mbarrier.arrive.expect_tx (rearm) in the loop",
            seen="none",
            hint=L_NOT_ARMED,
        )
    for i in arms:
        skipped = False
        for j in range(i - 1, -1, -1):
            m = re.match(r"\s*@!?%p\w*\s+bra(\.uni)?\s+(\S+);", region[j])
            if m:
                label = m.group(2)
                skipped = any(x.strip() == f"{label}:" for x in region[i + 1 :])
                break
            if region[j].strip().endswith(":"):
                break
        if not skipped:
            raise CheckFailed(
                "compiled, every thread re-arms the barrier in every iteration",
                expected="the re-arm under a condition (tidx == 0 and it + 2 < n_iter)",
                seen="unconditional",
                hint=L_REARM_ONE,
            )
    n = sum(1 for ln in region if "cp.async.commit_group" in ln)
    if n != commits:
        raise CheckFailed(
            f"compiled, the loop issues {n} copy groups an iteration",
            expected=f"{commits}: one block's (issue once an iteration)",
            seen=str(n),
            hint=L_COMPILED,
        )


def _loop_compiles(dtypes=("bf16",), hidden: bool = False) -> Check:
    def fn(ctx):
        out = []
        for dt in dtypes:
            with fail_on_error(
                f"the final kernel with your row_blocks does not compile ({dt}, N=1000)"
            ):
                ptx, registers, trace = _compiled(ctx, dt)
            judge_trace(trace, _replayed_body(ctx))
            loop_protocol(ptx, loop_config(1000, dt).stages)
            if "mbarrier.try_wait.parity" not in ptx:
                raise CheckFailed(
                    "no mbarrier wait in the PTX",
                    expected="mbarrier.try_wait.parity (wait_peers)",
                    seen="none",
                    hint=L_NO_WAIT,
                )
            out.append(f"{dt}: {registers} registers")
        return "; ".join(out)

    if hidden:
        return Check(LOOP_COMPILES + ", fp32 and fp16", COMPILE, fn, True, (LOOP_COMPILES,))
    return Check(LOOP_COMPILES, COMPILE, fn, needs=(REPLAY,))


def _loop_speed(fraction=0.8, M=8192, N=32768) -> Check:
    def fn(ctx):
        import torch

        from ...config import FinalConfig
        from ...tools.bench import rmsnorm_bytes
        from ..checks import launch_time_us, rmsnorm_inputs, speed_vs_copy

        cfg = FinalConfig(256, 256, cluster_n=4, buffers=2, blocks_per_cta=4)
        _, launch = ctx.launcher(LOOP_HOLE, N, "bf16", cfg)
        x, w = rmsnorm_inputs(M, N, torch.bfloat16, torch.Generator().manual_seed(1))
        out = torch.empty_like(x)
        us = launch_time_us(launch, x, w, out, 1e-6)
        return speed_vs_copy(rmsnorm_bytes(M, N, x.dtype, w.dtype), us, fraction, f"{M}x{N} bf16")

    return Check(
        f"speed >= {100 * fraction:.0f}% of copy ({M}x{N} bf16, cluster of 4, two buffers)",
        GPU,
        fn,
        needs=(LOOP_COMPILES,),
    )


#: builtins that ask what a value is: the loop has no use for them, and they could tell the
#: replay's plain ints from the kernel's values (the compile tier checks the compiled loop too)
INTROSPECTION = (
    "isinstance",
    "issubclass",
    "type",
    "hasattr",
    "getattr",
    "vars",
    "dir",
    "callable",
    "id",
    "repr",
)
WHY_NOT_INTROSPECT = "the loop does not ask what its arguments are: one loop, run as it is written"

# BEGIN KEY
# fmt: off
ROW_LOOP_MUTANTS = mutants(COMPILE,
    ("one exchange buffer", "the same buffer and mbarrier", "parity = it % 2", "parity = 0"),
    ("the phase from it % 2", "wrong mbarrier phase",
     "wait_peers(parity, (it // 2) % 2)", "wait_peers(parity, it % 2)"),
    ("re-armed for the last blocks too", "no block of this CTA waits on that phase",
     "if tidx == 0 and it + 2 < n_iter:", "if tidx == 0:"),
    ("every thread re-arms", "more than one thread re-arms",
     "if tidx == 0 and it + 2 < n_iter:", "if it + 2 < n_iter:"),
    ("the last block skipped", "never ran first_pass",
     "cutlass.range(n_iter, unroll=1)", "cutlass.range(n_iter - 1, unroll=1)"),
    ("an empty loop body", "never ran first_pass",
     "for it in cutlass.range(n_iter, unroll=1):",
     "for it in cutlass.range(n_iter, unroll=1):\n        pass\n    if False:"),
    ("one exchange buffer, re-armed for the next block",
     "one exchange buffer and mbarrier for every block", [
        ("parity = it % 2", "parity = 0"),
        ("it + 2 < n_iter", "it + 1 < n_iter"),
    ]),
    ("a Python range", "Loop with cutlass.range",
     "for it in cutlass.range(n_iter, unroll=1):", "for it in range(n_iter):"),
    ("no issue in the last iteration", "the last iteration issues no next block",
     "issue(blk + 1, 1 - buf)", "if it + 1 < n_iter:\n            issue(blk + 1, 1 - buf)"),
    ("the next block into the buffer being read", "still reads",
     "issue(blk + 1, 1 - buf)", "issue(blk + 1, buf)"),
    ("the next block issued after the first pass", "not there to count", [
        ("issue(blk + 1, 1 - buf)  # the next block's copies", "# issued below"),
        ("sum_sq = first_pass(it, blk, buf)",
         "sum_sq = first_pass(it, blk, buf)\n        issue(blk + 1, 1 - buf)"),
    ]),
    # cheats that tell the replay (plain Python ints) from the compile, right replayed and
    # wrong compiled, by a test the screen lets through (it flags isinstance and the
    # like). The compiled trace's calls and the loop's PTX give them away: the compile
    # tier only (the gpu tier's checks need it, so they are blocked, not failed)
    ("compiled, never re-armed", "not armed again",
     "if tidx == 0 and", "if cutlass.Int32 is int and tidx == 0 and"),
    ("compiled, phase 0 always", "the constant 0",
     "wait_peers(parity, (it // 2) % 2)",
     "wait_peers(parity, (it // 2) % 2 if cutlass.Int32 is int else 0)"),
    ("compiled, the current block issued again", "calls issue 2 times",
     "issue(blk + 1, 1 - buf)",
     "issue(blk + 1, 1 - buf)\n        if cutlass.Int32 is not int:\n"
     "            issue(blk, buf)"),
    ("compiled, no wait", "no wait",
     "wait_peers(parity, (it // 2) % 2)",
     "if cutlass.Int32 is int:\n            wait_peers(parity, (it // 2) % 2)"),
)
# fmt: on
# END KEY

row_loop = register(
    Exercise(
        id="06.row_loop",
        # the library's own loop, inline in the final kernel (which runs around the answer)
        copy_of=("quack_edu.stages.final.FinalRMSNorm.kernel",),
        lesson=LESSON,
        answer="row_blocks",
        title="the double-buffered loop over a CTA's row blocks: buffers, mbarrier phases, re-arms",
        forbidden=dict.fromkeys(INTROSPECTION, WHY_NOT_INTROSPECT),
        points={COMPILE: 2, GPU: 2},
        mutants=ROW_LOOP_MUTANTS,
    )
)
row_loop.add(
    _replay_check(),
    _loop_compiles(),
    _loop_compiles(("fp32", "fp16"), hidden=True),
    gpu_values(
        LOOP_HOLE,
        config=loop_config,
        needs=(LOOP_COMPILES,),
        name="values vs rmsnorm_ref, cluster of 2, two buffers, 4 blocks a CTA (M 1/37/199)",
    ),
    gpu_values(
        LOOP_HOLE,
        config=loop_config,
        hidden=True,
        needs=(LOOP_COMPILES,),
        name="values at more shapes, grading seed",
    ),
    _loop_speed(),
)

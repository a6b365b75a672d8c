"""Every number lesson 09 quotes, recomputed from the record it reads (benchmarks/results/:
model_h2048.json, model_h2048_compiled.json, model_h2048_aa.json, model_h4096.json,
model_h4096_aa.json, host_cost.json, host_module.json, ladder.json's copy), and the claims its
prose makes of them."""

from __future__ import annotations

import functools
import math

import pytest

from quack_edu.grading.exercises.lesson09 import call_us_ref, step_speedup_ref
from quack_edu.grading.notebook import read, solutions_dir
from quack_edu.lessons import results
from quack_edu.rmsnorm import CompilePolicy
from quack_edu.tools import model_bench

LESSON = "09_in_a_model"
RECORDS = (
    "model_h2048", "model_h2048_compiled", "model_h2048_aa", "model_h4096", "model_h4096_aa",
    "host_cost", "host_module",
)  # fmt: skip


@functools.cache  # the committed notebook, read once a process (not once a quote)
def _nb():
    return read(solutions_dir() / f"{LESSON}.ipynb")


@functools.cache
def _prose() -> str:
    text = " ".join(c.source for c in _nb().cells if c.cell_type == "markdown")
    return " ".join(text.split())  # one space between words: quotes may wrap


def _row(name, workload, mode, norm) -> dict:
    (r,) = [
        r
        for r in results.load(name)["rows"]
        if (r["workload"], r["mode"], r["norm"]) == (workload, mode, norm)
    ]
    return r


def _vs(name, workload, mode, norm="quack_edu") -> str:
    """A norm's ratio to nn.RMSNorm (the library's by default), as the prose writes it."""
    return f"{_row(name, workload, mode, norm)['vs_torch']:.3f}"


def _ms(name, workload, mode, norm, field="step_ms") -> str:
    return f"{_row(name, workload, mode, norm)[field]:.3f}"


def _host(norm, mode, pass_="fwd") -> float:
    (r,) = [
        r
        for r in results.load("host_cost")["rows"]
        if (r["norm"], r["mode"], r["pass_"], r["M"], r["N"]) == (norm, mode, pass_, 1, 1024)
    ]
    return r["us_per_norm"]


def _h(norm, mode, pass_="fwd") -> str:
    return f"{_host(norm, mode, pass_):.1f}"


def _module(call) -> str:
    (r,) = [m for m in results.load("host_module")["module"] if m["call"] == call]
    return f"{r['us_per_call']:.1f}"


def _gpu_bound_from(host_us, N=4096) -> int:
    """The fewest rows at which a call of N bf16 elements (an fp32 weight) at the copy's
    bandwidth outlasts ``host_us``: what the lesson's search cell prints."""
    import torch

    copy = results.load("ladder")["copy_gbps"]
    M = 1
    while call_us_ref(M, N, torch.bfloat16, torch.float32, host_us, copy) == host_us:
        M += 1
    return M


def _share(name, workload) -> float:
    return _row(name, workload, "default", "torch")["norm_share"]


def _amdahl(name, workload) -> tuple[str, str]:
    s = _share(name, workload)
    return f"{100 * s:.1f}%", f"{step_speedup_ref(s, math.inf):.3f}x"


def _span(values) -> str:
    return f"{min(values):.2f}-{max(values):.2f}x"


@functools.cache
def _recomputed() -> dict[str, str]:
    """Quoted -> the same, recomputed from the records and formatted as the prose writes it."""
    A, C, B = "model_h2048", "model_h2048_compiled", "model_h4096"
    A2, B2 = "model_h2048_aa", "model_h4096_aa"  # with the policy and an A/A control
    eager = [
        r["vs_torch"]
        for name in (A2, B)
        for r in results.load(name)["rows"]
        if r["norm"] == "quack_edu" and r["mode"] == "eager"
    ]
    train_c, prefill_c, train_b = _amdahl(A2, "train"), _amdahl(A2, "prefill"), _amdahl(B2, "train")
    return {
        # section 2: the host's cost per norm
        "costs the host 15.5 us a norm eager and 4.9 us compiled": "costs the host {} us a norm "
        "eager and {} us compiled".format(_h("quack_edu", "eager"), _h("quack_edu", "compiled")),
        "inductor's own norm costs 4.5 us": "inductor's own norm costs {} us".format(
            _h("torch", "compiled")
        ),
        "QuACK's costs 41.1 us compiled, more than its 38.1 us eager": "QuACK's costs {} us "
        "compiled, more than its {} us eager".format(_h("quack", "compiled"), _h("quack", "eager")),
        "70.4 us for the library, 68.5 us for `F.rms_norm`, 273.4 us for QuACK": "{} us for the "
        "library, {} us for `F.rms_norm`, {} us for QuACK".format(
            *(_h(n, "compiled", "fwd+bwd") for n in ("quack_edu", "torch", "quack"))
        ),
        # section 3: decode steps against the GPU's busy time
        "took 7.645 ms eager while the GPU was busy for 0.895 ms": "took {} ms eager while the "
        "GPU was busy for {} ms".format(
            _ms(A, "decode@1", "eager", "torch"),
            _ms(A, "decode@1", "eager", "torch", "gpu_busy_ms"),
        ),
        "and 1.996 ms compiled against 0.666 ms": "and {} ms compiled against {} ms".format(
            _ms(C, "decode@1", "default", "torch"),
            _ms(C, "decode@1", "default", "torch", "gpu_busy_ms"),
        ),
        "in one launch: 0.694 ms against 0.671 ms": "in one launch: {} ms against {} ms".format(
            _ms(A, "decode@1", "reduce-overhead", "torch"),
            _ms(A, "decode@1", "reduce-overhead", "torch", "gpu_busy_ms"),
        ),
        "(2.032 ms, busy 1.919 ms)": "({} ms, busy {} ms)".format(
            _ms(B, "decode@1", "default", "torch"),
            _ms(B, "decode@1", "default", "torch", "gpu_busy_ms"),
        ),
        "about three times the weights": "about {} times the weights".format(
            {3: "three"}.get(
                round(results.load(B)["model"]["params"] / results.load(A)["model"]["params"])
            )
        ),
        "at 0.606 of nn.RMSNorm's speed (3.296 ms against 1.996 ms)": "at {:.3f} of nn.RMSNorm's "
        "speed ({} ms against {} ms)".format(
            _row(C, "decode@1", "default", "quack")["vs_torch"],
            _ms(C, "decode@1", "default", "quack"),
            _ms(C, "decode@1", "default", "torch"),
        ),
        "(0.027 ms against 0.027 ms a step)": "({} ms against {} ms a step)".format(
            f"{_row(C, 'decode@1', 'default', 'quack')['norm_gpu_ms']:.3f}",
            f"{_row(C, 'decode@1', 'default', 'torch')['norm_gpu_ms']:.3f}",
        ),
        # after 09.call_us: where the GPU takes over at N = 4096
        "With the eager call's 15.5 us, a call at N = 4096 stays host-bound up to about 4000 rows; "
        "compiled, at 4.9 us, up to about 1300": "With the eager call's {} us, a call at N = 4096 "
        "stays host-bound up to about {} rows; compiled, at {} us, up to about {}".format(
            _h("quack_edu", "eager"),
            round(_gpu_bound_from(_host("quack_edu", "eager")), -2),
            _h("quack_edu", "compiled"),
            round(_gpu_bound_from(_host("quack_edu", "compiled")), -2),
        ),
        # section 4: the kernels where inductor would fuse (the first record)
        "the training step ran at 0.989 and the prefill at 0.943": "the training step ran at {} "
        "and the prefill at {}".format(_vs(A, "train", "default"), _vs(A, "prefill", "default")),
        "the kernels took 0.539 ms of GPU time against 0.430 ms": "the kernels took {} ms of GPU "
        "time against {} ms".format(
            _ms(A, "prefill", "default", "quack_edu", "norm_gpu_ms"),
            _ms(A, "prefill", "default", "torch", "norm_gpu_ms"),
        ),
        # section 5: one module call
        "costs the host 9.4 us, against 12.1 us for `nn.RMSNorm`": "costs the host {} us, "
        "against {} us for `nn.RMSNorm`".format(
            _module("QuackRMSNorm (fp32 weight)"), _module("nn.RMSNorm (bf16 weight)")
        ),
        # section 6: eager against compiled
        "at hidden 2048, 1.153 for a training step, 1.186 for a prefill, 1.116, 1.124 and 1.124 "
        "for decoding 1, 8 and 64 rows; at 4096, 1.102, 1.146 and 1.120": "at hidden 2048, {} for "
        "a training step, {} for a prefill, {}, {} and {} for decoding 1, 8 and 64 rows; at 4096, "
        "{}, {} and {}".format(
            *(
                _vs(A2, w, "eager")
                for w in ("train", "prefill", "decode@1", "decode@8", "decode@64")
            ),
            *(_vs(B, w, "eager") for w in ("train", "prefill", "decode@1")),
        ),
        "the GPU was busy 25.6 ms a training step at 2048 against 29.4 ms": "the GPU was busy "
        "{:.1f} ms a training step at 2048 against {:.1f} ms".format(
            _row(A2, "train", "eager", "quack_edu")["gpu_busy_ms"],
            _row(A2, "train", "eager", "torch")["gpu_busy_ms"],
        ),
        "At 2048 the control reads 0.995 for a training step and 0.982 decoding 64 rows, where the "
        "library reads 1.002 and 0.995": "At 2048 the control reads {} for a training step and {} "
        "decoding 64 rows, where the library reads {} and {}".format(
            *(_vs(A2, w, "default", "control") for w in ("train", "decode@64")),
            *(_vs(A2, w, "default") for w in ("train", "decode@64")),
        ),
        "judges a cell from its 15 round-by-round ratios": "judges a cell from its {} "
        "round-by-round ratios".format(results.load(A2)["options"]["rounds"]),
        "0.920 ms a step against 1.089 ms at 2048, 2.046 ms against 2.417 ms at 4096": "{} ms a "
        "step against {} ms at 2048, {} ms against {} ms at 4096".format(
            *(
                _ms(X, "train", "default", n, "norm_gpu_ms")
                for X in (A2, B2)
                for n in ("quack_edu", "torch")
            )
        ),  # fmt: skip
        "20.96-21.45 ms at 2048, 65.60-66.94 ms at 4096": "{:.2f}-{:.2f} ms at 2048, {:.2f}-{:.2f} "
        "ms at 4096".format(
            *(
                f(_row(X, "train", "default", "torch")["turn_ms"])
                for X in (A2, B2)
                for f in (min, max)
            )
        ),  # fmt: skip
        # after 09.step_speedup: Amdahl on the norms' share
        "the training step spends 5.3% of its GPU time in the norms' kernels: norms that took no "
        "time would make it at most 1.056x faster. A prefill spends 11.4%, at most 1.128x; at "
        "hidden 4096 a training step spends 3.8%, at most 1.039x": "the training step spends {} "
        "of its GPU time in the norms' kernels: norms that took no time would make it at most {} "
        "faster. A prefill spends {}, at most {}; at hidden 4096 a training step spends {}, at "
        "most {}".format(*train_c, *prefill_c, *train_b),
        # the summary
        "QuACK's decode step ran at 0.606 of nn.RMSNorm's speed": "QuACK's decode step ran at "
        f"{_row(C, 'decode@1', 'default', 'quack')['vs_torch']:.3f} of nn.RMSNorm's speed",
        "1.10-1.19x eager; compiled, a tie in every cell": f"{_span(eager)} eager; "
        "compiled, a tie in every cell",
    }


@pytest.mark.parametrize("quoted", list(_recomputed()))
def test_lesson09_quotes_are_the_recorded_ones(quoted):
    assert _recomputed()[quoted] == quoted
    assert quoted in _prose()


def test_lesson09_claims_on_the_records():
    prose = _prose()
    for name in RECORDS:
        assert results.load(name)["gpu"] == "NVIDIA H200", name
    # "Compiled, every cell is a tie; none is slower": the bench's verdicts on the records with
    # the A/A control; "a norm that needs no gradient goes to inductor ... op for op": no kernel
    # of the library in an inference step's profile, the QK-norms' kernels in a training
    # step's, "and the norms' kernels take less GPU time" there than nn.RMSNorm's and the
    # control's; "less than the spread of one norm's turns"
    assert "Compiled, every cell is a tie; none is slower" in prose
    for name in ("model_h2048_aa", "model_h4096_aa"):
        rows = [dict(r) for r in results.load(name)["rows"]]
        model_bench.judge(rows)
        compiled = [r for r in rows if r["norm"] == "quack_edu" and r["mode"] != "eager"]
        assert compiled and {r["verdict"] for r in compiled} == {"tie"}, name
        for r in compiled:
            ours = [k for k in r["norm_kernels"] if "quack_edu" in k["name"]]
            assert bool(ours) == (r["workload"] == "train"), (name, r["workload"], r["mode"])
            if r["workload"] == "train":
                for other in ("torch", "control"):
                    assert r["norm_gpu_ms"] < _row(name, "train", r["mode"], other)["norm_gpu_ms"]
        t, q = (_row(name, "train", "default", n) for n in ("torch", "quack_edu"))
        assert t["norm_gpu_ms"] - q["norm_gpu_ms"] < max(t["turn_ms"]) - min(t["turn_ms"])
    # "Eager, the library is faster at every workload"
    assert "Eager, the library is faster at every workload" in prose
    eager = [
        r["vs_torch"]
        for name in ("model_h2048_aa", "model_h4096")
        for r in results.load(name)["rows"]
        if r["norm"] == "quack_edu" and r["mode"] == "eager"
    ]
    assert len(eager) == 10 and min(eager) > 1
    # "Both are host-bound" (decode at 2048, eager and compiled): the GPU idle most of the step;
    # "the compiled step is mostly GPU work" at 4096
    for name, mode in (("model_h2048", "eager"), ("model_h2048_compiled", "default")):
        r = _row(name, "decode@1", mode, "torch")
        assert r["gpu_busy_ms"] < 0.5 * r["step_ms"], (name, mode)
    r = _row("model_h4096", "decode@1", "default", "torch")
    assert r["gpu_busy_ms"] > 0.9 * r["step_ms"]
    # "its norm kernels took the same GPU time" (QuACK against nn.RMSNorm, compiled decode)
    q, t = (_row("model_h2048_compiled", "decode@1", "default", n) for n in ("quack", "torch"))
    assert abs(q["norm_gpu_ms"] / t["norm_gpu_ms"] - 1) < 0.05
    # "a training step's GPU is busy nearly all of it"
    for name in ("model_h2048_compiled", "model_h4096"):
        r = _row(name, "train", "default", "torch")
        assert r["gpu_busy_ms"] > 0.95 * r["step_ms"], name
    # the policy's thresholds, as the lesson states them, are the library's defaults
    p = CompilePolicy()
    assert p.mode == "auto" and p.inductor_max_n == 16384 and p.inductor_max_elems == 2**20
    assert p.grad_kernel_max_n == 256 and "rows of at most 256 elements" in prose
    assert "rows of at most 16384 elements, and calls of at most 2^20 elements" in prose
    assert "rows longer than 16384" in prose
    # the decode step's calls "have 1 to 64 rows": the records' decode workloads
    for name in ("model_h2048", "model_h4096"):
        assert results.load(name)["options"]["decode_m"] == [1, 8, 64]
    assert "A decode step's calls have 1 to 64 rows" in prose
    # the model: "4 layers", "a prefill (2 x 2048 tokens at hidden 2048)"; the module call at
    # "8 x 4096"
    m = results.load("model_h2048")["model"]
    assert (m["layers"], m["batch"], m["seq"], m["hidden"]) == (4, 2, 2048, 2048)
    assert "4 layers" in prose and "a prefill (2 x 2048 tokens at hidden 2048)" in prose
    assert {(r["M"], r["N"]) for r in results.load("host_module")["module"]} == {(8, 4096)}
    assert "one eager call at 8 x 4096" in prose
    # a chain of 32 norms, rows of 1024 elements
    assert results.load("host_cost")["chain"] == 32
    assert "32 norms in a chain" in prose and "rows of 1024 elements" in prose


def test_lesson09_answers_come_after_their_checks():
    """No number that an exercise computes is in the prose before its check cell."""
    cells = _nb().cells
    checks = {
        c.metadata["nbgrader"]["grade_id"]: i
        for i, c in enumerate(cells)
        if c.metadata.get("nbgrader", {}).get("grade", False)
    }
    before_speedup = " ".join(
        c.source for c in cells[: checks["09_step_speedup_check"]] if c.cell_type == "markdown"
    )
    before_call = " ".join(
        c.source for c in cells[: checks["09_call_us_check"]] if c.cell_type == "markdown"
    )
    for q in ("1.056x", "1.128x", "1.039x"):
        assert q not in before_speedup, q
    for q in ("4000", "1300"):
        assert q not in before_call, q

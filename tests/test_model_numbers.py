"""The README's numbers of the library in a model are the records' (benchmarks/results/):
model_h2048.json, model_h2048_compiled.json, host_cost.json. Each quote is recomputed here."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _ratios(name):
    rows = json.loads((RESULTS / name).read_text())["rows"]
    by = {(r["workload"], r["mode"], r["norm"]): r for r in rows if "step_ms" in r}
    return {
        (w, m): by[(w, m, "torch")]["step_ms"] / r["step_ms"]
        for (w, m, n), r in by.items()
        if n == "quack_edu" and (w, m, "torch") in by
    }


def _table():
    eager, compiled = _ratios("model_h2048.json"), _ratios("model_h2048_compiled.json")
    rows = [("training step", "train"), ("prefill", "prefill")]
    rows += [(f"decode, {m} row{'s' * (m > 1)}", f"decode@{m}") for m in (1, 8, 64)]
    out = []
    for label, w in rows:
        cells = [eager[(w, "eager")], compiled[(w, "default")]]
        ro = compiled.get((w, "reduce-overhead"), eager.get((w, "reduce-overhead")))
        cells.append(ro)
        out.append(f"| {label} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells))
    return out


def _readme():
    return (ROOT / "README.md").read_text()


def test_model_table_is_the_records():
    readme = _readme()
    for line in _table():
        assert line + " |" in readme, line


def _chain(norm, mode, pass_):
    rows = json.loads((RESULTS / "host_cost.json").read_text())["rows"]
    for r in rows:
        if (r["norm"], r["mode"], r["pass_"], r["M"], r["N"]) == (norm, mode, pass_, 1, 1024):
            return r["us_per_norm"]
    raise KeyError((norm, mode, pass_))


@pytest.mark.parametrize(
    ("quote", "norm", "mode", "pass_"),
    [
        ("{:.1f} us compiled", "quack_edu", "compiled", "fwd"),
        ("against {:.1f} us eager", "quack_edu", "eager", "fwd"),
        ("(QuACK {:.1f} us compiled)", "quack", "compiled", "fwd"),
        ("{:.1f} us against", "quack_edu", "compiled", "fwd+bwd"),
        ("against {:.1f} us for", "quack_edu", "eager", "fwd+bwd"),
        ("(QuACK {:.1f} us)", "quack", "compiled", "fwd+bwd"),
    ],
)
def test_host_cost_quotes_are_the_record(quote, norm, mode, pass_):
    text = re.sub(r"\s+", " ", _readme())
    assert quote.format(_chain(norm, mode, pass_)) in text


def test_the_first_records_compiled_ratios_are_quoted():
    first = _ratios("model_h2048.json")
    text = re.sub(r"\s+", " ", _readme())
    assert f"training step was {first[('train', 'default')]:.3f}" in text
    assert f"prefill {first[('prefill', 'default')]:.3f}" in text


def test_the_hidden_4096_table_is_the_records():
    eager, compiled = _ratios("model_h4096.json"), _ratios("model_h4096_compiled.json")
    readme = _readme()
    for label, w in [
        ("training step", "train"),
        ("prefill", "prefill"),
        ("decode, 1 row", "decode@1"),
    ]:
        cells = [eager[(w, "eager")], compiled[(w, "default")], compiled[(w, "reduce-overhead")]]
        line = f"| {label} | " + " | ".join(f"{c:.3f}" for c in cells) + " |"
        assert line in readme, line


def _rows(name):
    return json.loads((RESULTS / name).read_text())["rows"]


def _row(name, workload, mode, norm):
    (r,) = [
        r for r in _rows(name) if (r["workload"], r["mode"], r["norm"]) == (workload, mode, norm)
    ]
    return r


def _busy(name, mode="default"):
    """'Q ms busy a step against T ms (the norm kernels q against t ms)', training."""
    q, t = (_row(name, "train", mode, n) for n in ("quack_edu", "torch"))
    return (
        f"{q['gpu_busy_ms']:.3f} ms busy a step against {t['gpu_busy_ms']:.3f} ms (the norm "
        f"kernels {q['norm_gpu_ms']:.3f} against {t['norm_gpu_ms']:.3f} ms)"
    )


def test_the_prose_around_the_2048_table_is_the_records():
    text = re.sub(r"\s+", " ", _readme())
    table = _ratios("model_h2048_compiled.json")
    assert f"({table[('decode@1', 'default')]:.3f} for one row in the table)" in text
    rep = _ratios("model_h2048_default.json")
    opts = json.loads((RESULTS / "model_h2048_default.json").read_text())["options"]
    assert (opts["rounds"], opts["round_s"], opts["modes"]) == (9, 0.5, ["default"])
    assert (
        "repeats the torch.compile column with 9 turns of 0.5 s instead of 5 of 0.25 s: "
        f"training {rep[('train', 'default')]:.3f}, prefill {rep[('prefill', 'default')]:.3f}, "
        f"decoding 1, 8 and 64 rows {rep[('decode@1', 'default')]:.3f}, "
        f"{rep[('decode@8', 'default')]:.3f} and {rep[('decode@64', 'default')]:.3f}" in text
    )
    # "the GPU does less work" in a training step, both modes
    for mode in ("default", "reduce-overhead"):
        q, t = (_row("model_h2048_compiled.json", "train", mode, n) for n in ("quack_edu", "torch"))
        assert q["gpu_busy_ms"] < t["gpu_busy_ms"] and q["norm_gpu_ms"] < t["norm_gpu_ms"]
    assert f"the GPU does less work: {_busy('model_h2048_compiled.json')}" in text
    ro = _ratios("model_h2048_ro.json")
    rec = json.loads((RESULTS / "model_h2048_ro.json").read_text())["options"]
    assert (rec["rounds"], rec["round_s"]) == (11, 0.5)
    assert (
        f"the step ratios are {table[('train', 'default')]:.3f} and "
        f"{table[('train', 'reduce-overhead')]:.3f} in the table, "
        f"{rep[('train', 'default')]:.3f} (above) and {ro[('train', 'reduce-overhead')]:.3f} in "
        "the repeats (`model_h2048_ro.json`: reduce-overhead, 11 turns of 0.5 s, prefill "
        f"{ro[('prefill', 'reduce-overhead')]:.3f})" in text
    )
    # "where nothing needs a gradient ... op for op": the inference workloads' norms are all
    # inductor's kernels (no quack_edu kernel in their profiles); training has the kernels
    for r in _rows("model_h2048_compiled.json"):
        if r["norm"] == "quack_edu" and r["mode"] != "eager":
            ours = [k for k in r["norm_kernels"] if "quack_edu" in k["name"]]
            assert bool(ours) == (r["workload"] == "train"), (r["workload"], r["mode"])


def test_the_prose_around_the_4096_table_is_the_records():
    text = re.sub(r"\s+", " ", _readme())
    for mode in ("default", "reduce-overhead"):
        q, t = (_row("model_h4096_compiled.json", "train", mode, n) for n in ("quack_edu", "torch"))
        assert q["gpu_busy_ms"] < t["gpu_busy_ms"] and q["norm_gpu_ms"] < t["norm_gpu_ms"]
    assert f"save GPU time: {_busy('model_h4096_compiled.json')}" in text
    # the longer run of the compiled training step at 4096
    long = json.loads((RESULTS / "model_h4096_train.json").read_text())
    assert (long["options"]["rounds"], long["options"]["round_s"]) == (15, 1.0)
    assert "Repeated with 15 turns of 1 s each instead of 5 of 0.25 s" in text
    short = json.loads((RESULTS / "model_h4096_compiled.json").read_text())["options"]
    assert (short["rounds"], short["round_s"]) == (5, 0.25)
    by = {r["norm"]: r for r in long["rows"]}
    q, t = by["quack_edu"], by["torch"]
    assert (
        f"step is {q['vs_torch']:.3f}: {q['step_ms']:.3f} ms against {t['step_ms']:.3f} ms" in text
    )
    assert (
        f"({min(q['turn_ms']):.2f}-{max(q['turn_ms']):.2f} ms with `QuackRMSNorm`, "
        f"{min(t['turn_ms']):.2f}-{max(t['turn_ms']):.2f} ms with `nn.RMSNorm`)" in text
    )
    # "while either norm's turns spread over more than that"
    gap = abs(q["step_ms"] - t["step_ms"])
    assert min(max(r["turn_ms"]) - min(r["turn_ms"]) for r in (q, t)) > gap
    rows = [
        r
        for f in ("model_h4096.json", "model_h4096_compiled.json")
        for r in json.loads((RESULTS / f).read_text())["rows"]
    ]
    shares = {
        w: [r["norm_share"] * 100 for r in rows if r["workload"] == w] for w in ("train", "prefill")
    }
    t, p = shares["train"], shares["prefill"]
    assert (
        f"{min(t):.1f}-{max(t):.1f}% of a training step's GPU time and "
        f"{min(p):.1f}-{max(p):.1f}% of a prefill's" in text
    )
    dist = json.loads((RESULTS / "distributed.json").read_text())
    assert dist["status"] == "PASS" and dist["gpus"] == ["NVIDIA H200"] and dist["world_size"] == 1
    assert f"{', '.join(dist['checks'])} all PASS" in text


def test_the_module_call_quotes_are_the_record():
    rows = json.loads((RESULTS / "host_module.json").read_text())["module"]
    us = {r["call"]: r["us_per_call"] for r in rows}
    text = re.sub(r"\s+", " ", _readme())
    assert (
        f"`QuackRMSNorm` {us['QuackRMSNorm (fp32 weight)']:.1f} us, `rmsnorm_fwd` "
        f"{us['rmsnorm_fwd (fp32 tensor weight)']:.1f} us with a tensor weight and "
        f"{us['rmsnorm_fwd (fp32 Parameter weight)']:.1f} us with a Parameter, `nn.RMSNorm` with "
        f"a bf16 weight {us['nn.RMSNorm (bf16 weight)']:.1f} us" in text
    )


def test_the_chain_goal_holds_at_every_point_of_the_record():
    rows = json.loads((RESULTS / "host_cost.json").read_text())["rows"]
    us = {(r["norm"], r["mode"], r["pass_"], r["M"], r["N"]): r["us_per_norm"] for r in rows}
    ratios = []
    for pass_ in ("fwd", "fwd+bwd"):
        for M in (1, 8, 128):
            for N in (1024, 4096):
                ours = us[("quack_edu", "compiled", pass_, M, N)]
                ratios.append(ours / us[("quack_edu", "eager", pass_, M, N)])
                assert ours < us[("quack", "compiled", pass_, M, N)], (pass_, M, N)
    assert max(ratios) <= 1.25
    text = re.sub(r"\s+", " ", _readme())
    assert (
        "(M = 1, 8, 128; N = 1024, 4096; forward, and forward with backward) the compiled chain "
        f"costs {min(ratios):.2f}-{max(ratios):.2f}x the eager one per norm and less than "
        "QuACK's compiled chain" in text
    )

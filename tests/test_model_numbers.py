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


def test_the_prose_around_the_4096_table_is_the_records():
    text = re.sub(r"\s+", " ", _readme())
    compiled = _ratios("model_h4096_compiled.json")
    assert (
        "The compiled training step at hidden 4096 is the one result below 1.00: "
        f"{compiled[('train', 'default')]:.3f} here" in text
    )
    ro = _ratios("model_h2048_ro.json")[("prefill", "reduce-overhead")]
    old = _ratios("model_h2048_compiled.json")[("prefill", "reduce-overhead")]
    assert f"with today's policy: {ro:.3f} ({old:.3f} in the table above" in text
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

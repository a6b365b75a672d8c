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

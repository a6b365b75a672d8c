"""The model benchmark's plumbing on a CPU: the decoder, the norms' shared state dict, the
residual-passing form, the gradient check (and a wrong norm caught by it), the driver end to end
with a fake QuackRMSNorm, the record, --summarize, and the command line without CUDA."""

import dataclasses
import json
import math

import pytest
import torch
from torch import nn

from quack_edu.tools import model_bench as mb
from quack_edu.tools.decoder import (
    Decoder,
    ModelConfig,
    TorchNorm,
    build_models,
)

TINY = ModelConfig(hidden=64, layers=2, heads=2, ffn=128, vocab=128, seq=16, batch=2)


class FakeQuackRMSNorm(nn.RMSNorm):
    """QuackRMSNorm's interface computed with torch ops (its kernels need a GPU): the fused
    residual form, fp32 math, ``out`` in x's dtype and ``residual_out`` in the residual's."""

    use_weight, use_eps = True, True

    def forward(self, x, residual=None):
        h = x.float() if residual is None else x.float() + residual.float()
        eps = self.eps if self.use_eps else 0.0
        out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        if self.use_weight:
            out = out * self.weight.float()
        if residual is None:
            return out.to(x.dtype)
        return out.to(x.dtype), h.to(residual.dtype)


class ForgetsWeight(FakeQuackRMSNorm):
    use_weight = False


class ForgetsEps(FakeQuackRMSNorm):
    use_eps = False


def makers(**extra):
    return {"torch": mb.NORMS["torch"], **{k: (lambda c=c: (c, "fake")) for k, c in extra.items()}}


def options(**kw):
    base = dict(model=TINY, modes=("eager",), decode_m=(1, 4), rounds=2, round_s=0.0, warmup=1,
                check_seq=8, precision="fp32", budget_s=1e6)  # fmt: skip
    return mb.Options(**{**base, **kw})


def plain_prenorm(model: Decoder, tokens):
    """The textbook pre-norm decoder on the same modules: h = h + f(norm(h)), no residual
    passing."""
    S = tokens.shape[1]
    rope = (model.cos[:S, None], model.sin[:S, None])
    h = model.embed(tokens)
    for b in model.blocks:
        h = h + b.attn(b.attn_norm(h), rope)
        h = h + b.mlp(b.mlp_norm(h))
    return model.lm_head(model.norm(h))


def test_one_state_dict_runs_with_every_norm():
    models = build_models(TINY, {"torch": TorchNorm, "fake": FakeQuackRMSNorm}, "cpu")
    a, b = (m.state_dict() for m in models.values())
    assert list(a) == list(b) and "blocks.0.attn.q_norm.weight" in a
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["norm.weight"], torch.ones_like(a["norm.weight"]))  # not all ones
    plain = Decoder(TINY, nn.RMSNorm)  # a model written with nn.RMSNorm loads it too
    plain.load_state_dict(a)


def test_fused_qkv_is_the_three_projections_with_their_weights_stacked():
    """--fused-qkv: one (3 x hidden) projection split by view(B, S, 3, H, D).unbind(2) computes
    what q, k, v of the same weights compute, and its QK-norms see views whose rows are not
    evenly strided (the case the library reads in place)."""
    fused_cfg = dataclasses.replace(TINY, fused_qkv=True)
    plain = build_models(TINY, {"n": TorchNorm}, "cpu")["n"]
    fused = Decoder(fused_cfg, TorchNorm)
    state = dict(plain.state_dict())
    for i in range(TINY.layers):
        pre = f"blocks.{i}.attn."
        state[pre + "qkv.weight"] = torch.cat([state.pop(pre + n + ".weight") for n in "qkv"])
    fused.load_state_dict(state)
    seen = []
    fused.blocks[0].attn.q_norm.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    tokens = torch.randint(TINY.vocab, (2, TINY.seq))
    with torch.no_grad():
        torch.testing.assert_close(fused(tokens), plain(tokens), rtol=1e-5, atol=1e-5)
    (q,) = seen
    assert not q.is_contiguous() and q.stride()[:2] == (TINY.seq * 3 * TINY.hidden, 3 * TINY.hidden)


@pytest.mark.parametrize("norm", [TorchNorm, FakeQuackRMSNorm])
def test_residual_passing_form_is_the_plain_prenorm_decoder(norm):
    torch.manual_seed(0)
    model = build_models(TINY, {"n": norm}, "cpu")["n"]
    tokens = torch.randint(TINY.vocab, (2, TINY.seq))
    with torch.no_grad():
        got, want = model(tokens), plain_prenorm(model, tokens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_add_then_norm_and_the_quack_edu_form(monkeypatch):
    x, r = torch.randn(3, 8), torch.randn(3, 8)
    out, res = TorchNorm(8, eps=1e-6)(x, r)
    torch.testing.assert_close(res, x + r)
    torch.testing.assert_close(out, nn.RMSNorm(8, eps=1e-6)(x + r))
    cls, form = mb.NORMS["quack_edu"]()
    assert issubclass(cls, nn.RMSNorm) and form.split(" ")[0] in ("fused", "add-then-norm")

    import quack_edu

    class WithResidual(quack_edu.QuackRMSNorm):
        def forward(self, x, residual=None):
            return x

    monkeypatch.setattr(quack_edu, "QuackRMSNorm", WithResidual)
    cls, form = mb.NORMS["quack_edu"]()
    assert cls is WithResidual and form.startswith("fused")


def test_gradient_check_numbers():
    run = mb.Run(options(), mb.Device("cpu"), makers=makers(quack_edu=FakeQuackRMSNorm), log=str)
    check = run.grad_check()
    for name in ("torch", "quack_edu"):
        c = check["norms"][name]
        assert set(c["grad_err"]) == {n for n, _ in run.models[name].named_parameters()}
        assert 0 < c["grad_err_max"] < 1e-4 and 0 < c["logits_err"] < 1e-4
        assert c["within_goal"] and c["ratio_max"] <= mb.GOAL
    assert check["norms"]["torch"]["ratio_max"] == 1.0


@pytest.mark.parametrize(
    "wrong, precision", [(ForgetsWeight, "amp"), (ForgetsEps, "fp32")], ids=["weight", "eps"]
)
def test_a_wrong_norm_fails_the_gradient_check(wrong, precision):
    # amp: bf16 matmul errors (~1e-2) hide a dropped eps (~1e-3 here), not a dropped weight
    opts = options(precision=precision, norms=("torch", "wrong"))
    run = mb.Run(opts, mb.Device("cpu"), makers=makers(wrong=wrong), log=str)
    c = run.grad_check()["norms"]["wrong"]
    assert not c["within_goal"]
    assert c["ratio_max"] > 2 and c["logits_ratio"] > 2


ROW_FIELDS = {
    "workload", "mode", "norm", "tokens", "compile_s", "fullgraph", "warmup_ms", "step_ms",
    "turn_ms", "steps_per_turn", "tokens_per_s", "vs_torch", "gpu_busy_ms", "norm_gpu_ms",
    "norm_share", "norm_kernels",
}  # fmt: skip
RECORD_FIELDS = {
    "kind", "gpu", "date", "command", "versions", "clocks", "model", "options", "method",
    "norms", "skipped", "grad_check", "rows", "skipped_groups", "elapsed_s",
}  # fmt: skip


def _not_installed():
    # (QuACK itself would be built where it is installed, the GPU machine, and fail on CPU tensors)
    raise ModuleNotFoundError("No module named 'quack'")


def test_the_driver_end_to_end_with_a_fake_quack_edu():
    saved = []
    opts = options(norms=("torch", "quack_edu", "quack", "nope", "control"))
    ms = makers(quack_edu=FakeQuackRMSNorm)
    ms["quack"] = _not_installed  # a peer that does not import: skipped with its reason
    ms["control"] = mb.NORMS["control"]  # nn.RMSNorm again: the A/A control
    result = mb.Run(opts, mb.Device("cpu"), makers=ms, log=str, save=saved.append).go()
    assert saved and saved[-1] is result
    assert RECORD_FIELDS <= set(result)
    assert set(result["versions"]) >= {"torch", "triton", "nvidia-cutlass-dsl", "quack-kernels"}
    assert result["skipped"]["nope"] == "unknown norm"
    assert "No module named 'quack'" in result["skipped"]["quack"]
    assert result["norms"]["torch"]["form"].startswith("add-then-norm")
    loads = ["train", "prefill", "decode@1", "decode@4"]
    assert [(r["workload"], r["norm"]) for r in result["rows"]] == [
        (w, n) for w in loads for n in result["norms"]
    ]
    for r in result["rows"]:
        assert ROW_FIELDS <= set(r), ROW_FIELDS - set(r)
        assert r["step_ms"] > 0 and len(r["turn_ms"]) == 2 and 0 < r["norm_share"] < 1
        assert r["norm_kernels"] and r["gpu_busy_ms"] >= r["norm_gpu_ms"] > 0
    assert all(r["vs_torch"] == 1.0 for r in result["rows"] if r["norm"] == "torch")
    # the ratio round by round, torch's turn over the norm's turn of the same round
    for r in result["rows"]:
        (t,) = [t for t in result["rows"] if (t["workload"], t["norm"]) == (r["workload"], "torch")]
        want = [a / b for a, b in zip(t["turn_ms"], r["turn_ms"], strict=True)]
        assert r["vs_torch_turns"] == pytest.approx(want)
    assert result["norms"]["control"]["class"] == result["norms"]["torch"]["class"]
    assert "A/A" in result["norms"]["control"]["form"]
    assert "turns " in mb.format_row(next(r for r in result["rows"] if r["norm"] == "control"))
    # every row but torch's has its interval; the norms (not the control) a verdict
    for r in result["rows"]:
        assert ("vs_torch_ci" in r) == (r["norm"] != "torch"), r["norm"]
        assert ("verdict" in r) == (r["norm"] not in ("torch", "control")), r["norm"]
    decode = next(r for r in result["rows"] if r["workload"] == "decode@4")
    assert decode["tokens"] == 4
    json.dumps(result)  # the record is JSON as it stands


def test_compiled_mode_traces_fullgraph():
    # dynamo on the CPU (backend "eager": no inductor, no C++ compiler) through the residual
    # form, the backward and the optimizer step: the whole model is one graph
    opts = options(modes=("default",), workloads=("train", "decode"), decode_m=(2,),
                   check_seq=0, profile=False, backend="eager")  # fmt: skip
    result = mb.Run(opts, mb.Device("cpu"), makers=makers(quack_edu=FakeQuackRMSNorm)).go()
    rows = result["rows"]
    assert len(rows) == 4 and all(r["fullgraph"] is True and "step_ms" in r for r in rows)


def test_a_bf16_model():
    opts = options(precision="bf16", workloads=("train", "prefill"))
    run = mb.Run(opts, mb.Device("cpu"), makers=makers(quack_edu=FakeQuackRMSNorm), log=str)
    assert all(p.dtype == torch.bfloat16 for m in run.models.values() for p in m.parameters())
    result = run.go()
    assert result["method"]["precision"].startswith("bf16")
    assert all("step_ms" in r for r in result["rows"])
    assert result["grad_check"]["norms"]["quack_edu"]["ratio_max"] < 2  # bf16 weights: noisy


def test_budget_skips_groups_and_says_why():
    result = mb.Run(options(budget_s=0, check_seq=0), mb.Device("cpu"), makers=makers()).go()
    assert result["rows"] == [] and len(result["skipped_groups"]) == 4
    assert "predicted" in result["skipped_groups"][0]["why"]


def test_norm_kernel_rule():
    got = mb.norm_gpu_time([
        ("kernel_cutlass_FinalRMSNorm_0", 3.0),
        ("kernel_cutlass_kernel_quackrmsnormRMSNormBackward_object_at_0", 2.0),
        ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_3", 1.0),
        ("void at::native::vectorized_layer_norm_kernel<float, float, true>", 1.0),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", 10.0),
        ("triton_poi_fused_mul_silu_5", 3.0),
    ])  # fmt: skip
    assert got["gpu_busy_ms"] == pytest.approx(0.020)
    assert got["norm_gpu_ms"] == pytest.approx(0.007)
    assert got["norm_share"] == pytest.approx(0.35)
    assert got["norm_kernels"][0]["name"] == "kernel_cutlass_FinalRMSNorm_0"


def test_main_on_cpu_then_summarize(tmp_path, capsys):
    path, png = tmp_path / "m.json", tmp_path / "m.png"
    argv = ["--device", "cpu", "--hidden", "64", "--heads", "2", "--ffn", "128", "--layers",
            "1", "--seq", "8", "--batch", "1", "--vocab", "64", "--norms", "torch",
            "--modes", "eager", "--workloads", "prefill,decode", "--decode-m", "2",
            "--rounds", "1", "--round-s", "0", "--check-seq", "4", "--json", str(path)]  # fmt: skip
    assert mb.main(argv) == 0
    result = json.loads(path.read_text())
    assert result["command"].startswith("quack-edu bench --model --device cpu")
    assert result["model"]["hidden"] == 64 and result["model"]["head_dim"] == 32
    capsys.readouterr()
    assert mb.main(["--summarize", str(path), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "decode@2" in out and "gradient check" in out and "vs torch" in out
    assert png.stat().st_size > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_without_cuda_exits_2(capsys):
    from quack_edu.tools.cli import main

    assert mb.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert main(["bench", "--model", "--quick"]) == 2


def test_options_presets_and_quick():
    p = mb.argparse.Namespace
    a = dict(hidden=4096, layers=None, heads=None, ffn=None, seq=None, batch=None, vocab=32000,
             no_rope=False, workloads="train,decode", modes="eager", norms="torch",
             decode_m=None, rounds=None, round_s=None, warmup=3, budget_s=420.0,
             check_seq=None, no_profile=False, precision="amp", backend="inductor", progress=False,
             quick=False, fused_qkv=False)  # fmt: skip
    full = mb.options_from(p(**a), [])
    assert (full.model.heads, full.model.ffn, full.model.head_dim) == (32, 11008, 128)
    assert (full.model.layers, full.model.seq, full.model.batch) == (4, 4096, 1)
    assert full.decode_m == (1, 8, 64) and full.rounds == 5
    small = mb.options_from(p(**{**a, "hidden": 1024, "fused_qkv": True}), []).model
    got = (small.heads, small.ffn, small.seq, small.batch, small.fused_qkv)
    assert got == (8, 4096, 512, 8, True)
    quick = mb.options_from(p(**{**a, "quick": True, "rounds": 4}), ["--quick"])
    assert quick.model.layers == 2 and quick.decode_m == (1, 64) and quick.rounds == 4
    assert mb.groups_of(quick) == [
        ("eager", "train"),
        ("eager", "decode@1"),
        ("eager", "decode@64"),
    ]


@pytest.mark.parametrize("n", [1, 2, 5, 6, 9, 15, 40])
def test_the_median_interval_covers_95_percent(n):
    """The interval's order statistics: their coverage (exact, from the binomial) is at least
    95%, and one step narrower it would not be; below 6 values, the whole range."""
    lo, hi = mb.median_ci(list(range(n, 0, -1)))  # unsorted on purpose: n..1
    k = int(lo)  # the k-th smallest of 1..n is k
    assert hi == n + 1 - k  # symmetric: the k-th largest
    cover = lambda k: 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n  # noqa: E731
    if n < 6:
        assert (lo, hi) == (1, n)
    else:
        assert cover(k) >= 0.95 > cover(k + 1)
    assert mb.median_ci(list(range(1, 16))) == (4, 12)  # n = 15: the 4th and the 12th


def _group(ours, control=None, workload="train", mode="default"):
    rows = [{"workload": workload, "mode": mode, "norm": "quack_edu", "vs_torch_turns": ours}]
    if control is not None:
        rows.append({"workload": workload, "mode": mode, "norm": "control",
                     "vs_torch_turns": control})  # fmt: skip
    mb.judge(rows)
    return rows


@pytest.mark.parametrize(
    ("ours", "control", "verdict"),
    [
        ([1.02] * 15, None, "faster"),
        ([0.98] * 15, None, "slower"),
        ([0.998] * 15, None, "tie"),  # within TIE of 1.00
        ([1.004] * 15, None, "tie"),
        ([0.98] * 14 + [1.1], None, "slower"),  # one good round does not change it
        ([0.9, 1.1] * 7 + [1.0], None, "tie"),  # the interval spans 1.00
        ([0.98] * 15, [0.97] * 15, "tie"),  # the A/A control is as far off as we are
        ([0.98] * 15, [0.99] * 15, "slower"),  # further off than the A/A control
        ([1.03] * 15, [1.01] * 15, "faster"),
    ],
)
def test_the_verdict(ours, control, verdict):
    rows = _group(ours, control)
    assert rows[0]["verdict"] == verdict
    assert rows[0]["noise"] >= mb.TIE
    if control is not None:
        assert "verdict" not in rows[1] and rows[1]["vs_torch_ci"]
    assert verdict in mb.format_row({**rows[0], "step_ms": 1.0, "vs_torch": 1.0})


def test_groups_are_judged_apart():
    rows = _group([0.98] * 15, [0.97] * 15) + _group([0.98] * 15, workload="prefill")
    assert [r.get("verdict") for r in rows] == ["tie", None, "slower"]

"""The disk cache of compiled kernels (quack_edu.compile_cache): keys, entries, safety.

Loading an exported kernel works without a GPU (the object is linked in memory; only calling
it needs one), so the round trip itself is tested here: compiled in this process, loaded in
this one and in a fresh one. The library uses the cache in GPU mode only; the test marked
`gpu` checks there that a fresh process loads what another compiled and gets the same values.
"""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace

import pytest
import torch

from quack_edu import _env
from quack_edu import compile_cache as cc
from quack_edu.runtime import compile_kernel
from quack_edu.stages import final, final_bwd, naive

OPTS = "--enable-tvm-ffi"


def _final(**kw):
    args = dict(dtype=torch.bfloat16, N=4096, config=None, weight_dtype=torch.float32)
    args.update(kw)
    feats, vec = args.pop("features", final.Features()), args.pop("vec", 8)
    return final.FinalRMSNorm(**args, features=feats, vec=vec)


def _build(kernel):
    import cutlass.cute as cute

    return lambda: cute.compile(kernel, *kernel.compile_args(), options=OPTS)


@pytest.fixture(autouse=True)
def _fresh_stats(monkeypatch):
    monkeypatch.setattr(cc, "STATS", cc.Stats())


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A small kernel compiled once and stored: (kernel, key, folder, object bytes, meta)."""
    folder = tmp_path_factory.mktemp("kernels")
    kernel = final_bwd.PartialSum(torch.float32, 1)
    key = cc.kernel_key(kernel, OPTS)
    assert cc.store(folder, key, _build(kernel)())
    obj, meta = cc._paths(folder, key)
    return kernel, key, folder, obj.read_bytes(), meta.read_text()


def _copy_entry(stored, folder):
    kernel, key, _, data, meta = stored
    obj, js = cc._paths(folder, key)
    obj.write_bytes(data)
    js.write_text(meta)
    return kernel, key, obj, js


# -- where ----------------------------------------------------------------------------------------
def test_the_folder_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(cc.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cc.cache_dir() == tmp_path / "quack_edu" / "kernels"
    monkeypatch.setenv(cc.ENV_VAR, str(tmp_path / "k"))
    assert cc.cache_dir() == tmp_path / "k"
    for off in ("0", "off", " OFF "):
        monkeypatch.setenv(cc.ENV_VAR, off)
        assert cc.cache_dir() is None
    # the library uses it in GPU mode only (a compile-only process wants PTX, not a function)
    monkeypatch.setenv(cc.ENV_VAR, str(tmp_path / "k"))
    monkeypatch.setattr(_env, "MODE", _env.Mode("compile-only", "test"))
    assert cc.active_dir() is None
    monkeypatch.setattr(_env, "MODE", _env.Mode("gpu", "test"))
    assert cc.active_dir() == tmp_path / "k"


# -- the key --------------------------------------------------------------------------------------
def test_the_key_names_what_decides_the_code():
    base = cc.kernel_key(_final(), OPTS)
    assert cc.kernel_key(_final(), OPTS) == base  # another object, the same kernel
    cfg = final.default_config(4096, torch.bfloat16, torch.float32)
    variants = [
        _final(N=4104),
        _final(dtype=torch.float16),
        _final(weight_dtype=torch.bfloat16),
        _final(vec=4),
        _final(features=final.Features(rstd=True)),
        _final(features=final.Features(weight_offset=1.0)),
        _final(config=replace(cfg, buffers=2)),
    ]
    digests = {cc.kernel_key(k, OPTS).digest for k in variants}
    digests |= {cc.kernel_key(_final(), OPTS + " --opt-level 2").digest}
    k = final_bwd.FinalBwdRMSNorm(torch.bfloat16, 4096, None, torch.float32, vec=8)
    digests |= {cc.kernel_key(k, OPTS).digest}
    assert len(digests) == len(variants) + 2 and base.digest not in digests
    parts = base.parts
    assert parts["kernel"] == "quack_edu.stages.final.FinalRMSNorm"
    for module in ("stages.final", "stages.cluster", "primitives.copy", "config", "runtime"):
        assert f"quack_edu.{module}" in parts["modules"]
    assert "quack_edu.stages.naive" not in parts["modules"]  # not imported by final
    assert "quack_edu.rmsnorm" not in parts["modules"]
    assert parts["cutlass_dsl"] and parts["tvm_ffi"] and parts["quack_edu"]
    assert "arch='sm_90a'" in parts["dsl"]  # this machine's target (compile-only: pinned)


def test_a_patched_class_gets_another_key_or_none(monkeypatch):
    key = cc.kernel_key(_final(), OPTS)
    monkeypatch.setattr(final.FinalRMSNorm, "pdl", False)  # a switch flipped for an A/B
    assert cc.kernel_key(_final(), OPTS).digest != key.digest
    monkeypatch.setattr(final.FinalRMSNorm, "scale", lambda self, x, w, b: x)  # a learner's
    with pytest.raises(cc.Uncacheable, match="scale"):
        cc.kernel_key(_final(), OPTS)


def test_the_key_follows_the_source(monkeypatch):
    key = cc.kernel_key(_final(), OPTS)
    source, imports = cc._SOURCES["quack_edu.primitives.reduce"]
    edited = dict(cc._SOURCES)
    edited["quack_edu.primitives.reduce"] = (source + b"\n# an edit\n", imports)
    monkeypatch.setattr(cc, "_SOURCES", edited)
    monkeypatch.setattr(cc, "_DIGESTS", {})
    assert cc.kernel_key(_final(), OPTS).digest != key.digest
    # a source file newer than the process may not be the code that runs: no key
    monkeypatch.setattr(cc, "_SOURCES", {})
    monkeypatch.setattr(cc, "_DIGESTS", {})
    monkeypatch.setattr(cc, "_STARTED", 0.0)
    with pytest.raises(cc.Uncacheable, match="changed after"):
        cc.kernel_key(_final(), OPTS)


def test_relative_imports_resolve_to_modules():
    got = cc._imports(
        "quack_edu.stages.final",
        b"from ..config import (\n  A,\n  B,\n)\nfrom ..primitives import copy as c\n"
        b"    from .cluster import X\nfrom . import warp, block\nimport quack_edu.runtime\n"
        b"from P (a docstring line) so\nimport cutlass.cute as cute\n",
    )
    assert got == {
        "quack_edu.config",
        "quack_edu.primitives.copy",
        "quack_edu.stages.cluster",
        "quack_edu.stages.warp",
        "quack_edu.stages.block",
        "quack_edu.runtime",
    }


class _Outside(naive.NaiveRMSNorm):  # a subclass in another package
    pass


def test_kernels_the_key_cannot_describe_are_compiled_as_before(tmp_path):
    from quack_edu.grading.checks import KernelHole

    cfg = naive.default_config(256, torch.float32)
    hole = KernelHole("naive", "kernel", adapt=lambda answer: answer)
    learner = hole.build(naive.NaiveRMSNorm.kernel)(torch.float32, 256, cfg)  # built at run time
    odd = naive.NaiveRMSNorm(torch.float32, 256, cfg)
    odd.hook = print  # a function: its code is not in the key
    for kernel in (learner, _Outside(torch.float32, 256, cfg), odd):
        with pytest.raises(cc.Uncacheable):
            cc.kernel_key(kernel, OPTS)
        assert cc.cached_compile(kernel, OPTS, lambda: "compiled", tmp_path) == "compiled"
    assert cc.STATS.uncacheable == 3 and not list(tmp_path.iterdir())


# -- entries --------------------------------------------------------------------------------------
def test_a_stored_kernel_loads_here_and_in_a_fresh_process(stored, subprocess_env):
    tvm_ffi = pytest.importorskip("tvm_ffi")
    kernel, key, folder, data, meta = stored
    t = time.perf_counter()
    fn = cc.load(folder, key)
    here = time.perf_counter() - t
    assert type(fn) is tvm_ffi.Function, cc.STATS
    info = json.loads(meta)
    assert info["bytes"] == len(data) and info["key"] == key.digest
    assert info["parts"]["kernel"] == "quack_edu.stages.final_bwd.PartialSum"
    assert sorted(p.name for p in folder.iterdir()) == [f"{key.digest}.json", f"{key.digest}.o"]
    code = textwrap.dedent(
        f"""
        import time
        import torch, quack_edu
        from quack_edu import compile_cache as cc
        from quack_edu.stages import final_bwd
        t = time.perf_counter()
        fn = cc.cached_compile(
            final_bwd.PartialSum(torch.float32, 1), {OPTS!r}, lambda: "compiled", {str(folder)!r}
        )
        print(type(fn).__name__, cc.STATS.hits, f"{{time.perf_counter() - t:.3f}}")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    name, hits, seconds = done.stdout.split()
    print(f"loaded here in {here:.3f} s; in a fresh process in {seconds} s (key included)")
    assert (name, hits) == ("Function", "1")


def test_compile_kernel_goes_through_the_cache(monkeypatch, tmp_path):
    tvm_ffi = pytest.importorskip("tvm_ffi")
    from quack_edu.runtime import direct_call

    monkeypatch.setattr(cc, "active_dir", lambda: tmp_path)  # as in GPU mode
    kernel = final_bwd.PartialSum(torch.bfloat16, 2)
    first = compile_kernel(kernel)
    assert (cc.STATS.misses, cc.STATS.writes) == (1, 1) and hasattr(first, "__ptx__")
    again = compile_kernel(final_bwd.PartialSum(torch.bfloat16, 2))
    assert cc.STATS.hits == 1 and type(again) is tvm_ffi.Function
    assert direct_call(again) is again  # called as the compiled kernel's function inside is
    # the same signature and checks as that function: a CPU sees them in its errors (the
    # call stops at the tensors' device, checked before the launch)
    partial, out = torch.zeros(3, 64), torch.zeros(64, dtype=torch.bfloat16)
    for args in ((partial, out), (partial,), (out, out)):
        errors = []
        for fn in (direct_call(first), again):
            with pytest.raises((TypeError, ValueError)) as e:
                fn(*args)
            errors.append((type(e.value), str(e.value)))
        assert errors[0] == errors[1] and "mP: Tensor([n0, n1], float32)" in errors[0][1]
    # a compile that asks for artifacts is a fresh one, and is not stored
    ptx = compile_kernel(kernel, f"--keep-ptx --dump-dir {tmp_path}").__ptx__
    assert ptx and (cc.STATS.hits, cc.STATS.misses, cc.STATS.writes) == (1, 1, 1)
    # so is every compile of a process that keeps artifacts (CUTE_DSL_KEEP)
    monkeypatch.setattr(cc, "keeps_artifacts", lambda: True)
    assert compile_kernel(kernel) is not again and cc.STATS.hits == 1


@pytest.mark.parametrize("damage", ["flipped", "truncated", "empty", "garbage", "meta", "other"])
def test_a_broken_entry_is_dropped_and_compiled_again(stored, tmp_path, damage):
    kernel, key, obj, meta = _copy_entry(stored, tmp_path)
    data = obj.read_bytes()
    if damage == "flipped":  # loads, and would run wrong code: the recorded hash catches it
        obj.write_bytes(data[:5000] + bytes(b ^ 0xFF for b in data[5000:5400]) + data[5400:])
    elif damage == "truncated":
        obj.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        obj.write_bytes(b"")
    elif damage == "garbage":  # not an object file, with a hash that matches it
        junk = os.urandom(4096)
        info = json.loads(meta.read_text())
        info.update(bytes=len(junk), sha256=__import__("hashlib").sha256(junk).hexdigest())
        obj.write_bytes(junk)
        meta.write_text(json.dumps(info))
    elif damage == "meta":
        meta.write_text('{"format": 1, "key": ')
    else:  # written for another key (e.g. a digest collision, a renamed file)
        meta.write_text(meta.read_text().replace(key.digest, "0" * 40))
    assert cc.load(tmp_path, key) is None
    if damage != "meta":  # unreadable metadata may be a writer's rename in flight: left alone
        assert cc.STATS.dropped == 1 and not obj.exists() and not meta.exists()
    fn = cc.cached_compile(kernel, OPTS, lambda: "compiled again", tmp_path)
    assert fn == "compiled again" and cc.STATS.misses == 1


class _Exporter:
    """Stands for a compiled kernel: ``export_to_c`` writes ``data`` in pieces, slowly."""

    def __init__(self, data, fail=False):
        self.data, self.fail = data, fail

    def export_to_c(self, path, function_name):
        with open(path, "wb") as f:
            for i in range(0, len(self.data), 4096):
                f.write(self.data[i : i + 4096])
                f.flush()
                time.sleep(0.001)
                if self.fail:
                    raise OSError("disk full")


def test_writes_are_atomic_and_racing_writers_leave_a_whole_entry(stored, tmp_path):
    tvm_ffi = pytest.importorskip("tvm_ffi")
    kernel, key, _, data, _ = stored
    # a writer that dies half way leaves nothing behind, and says why
    assert not cc.store(tmp_path, key, _Exporter(data, fail=True))
    assert not list(tmp_path.iterdir()) and "disk full" in cc.STATS.errors[-1]
    # writers racing on one key (as two processes compiling it at once): readers in between
    # see no entry or a whole one, and the last rename leaves one that loads
    seen = []
    writers = [
        threading.Thread(target=cc.store, args=(tmp_path, key, _Exporter(data))) for _ in range(4)
    ]
    for w in writers:
        w.start()
    while any(w.is_alive() for w in writers):
        seen.append(cc.load(tmp_path, key))
    for w in writers:
        w.join()
    assert cc.STATS.writes == 4 and cc.STATS.dropped == 0, cc.STATS
    assert all(fn is None or type(fn) is tvm_ffi.Function for fn in seen)
    assert type(cc.load(tmp_path, key)) is tvm_ffi.Function
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".o"]  # no temporaries


def test_the_folder_is_kept_under_its_bound(tmp_path, monkeypatch):
    now = time.time()
    for i in range(5):  # five entries of 1000 + 10 bytes, used one second apart
        (tmp_path / f"{i}.o").write_bytes(b"x" * 1000)
        (tmp_path / f"{i}.json").write_bytes(b"y" * 10)
        os.utime(tmp_path / f"{i}.o", (now - 100 + i, now - 100 + i))
    dead = tmp_path / ".3.abc.tmp.o"
    dead.write_bytes(b"z")
    os.utime(dead, (now - 2 * 3600, now - 2 * 3600))
    writing = tmp_path / ".4.def.tmp.o"
    writing.write_bytes(b"z")
    assert cc.usage(tmp_path) == (5, 5050)
    assert cc.trim(tmp_path, max_bytes=3030) == 2
    assert sorted(p.name for p in tmp_path.glob("[!.]*.o")) == ["2.o", "3.o", "4.o"]
    assert not dead.exists() and writing.exists()  # a writer's file in flight is kept
    assert not (tmp_path / "0.json").exists()
    assert cc.clear(tmp_path) == 3 and cc.usage(tmp_path) == (0, 0)


def test_the_cache_command_shows_and_clears_it(stored, tmp_path, monkeypatch, capsys):
    from quack_edu.tools.cli import main

    _copy_entry(stored, tmp_path)
    monkeypatch.setenv(cc.ENV_VAR, str(tmp_path))
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path) in out and "1 kernels" in out
    assert main(["cache", "--clear"]) == 0
    assert "deleted 1" in capsys.readouterr().out and cc.usage(tmp_path) == (0, 0)
    monkeypatch.setenv(cc.ENV_VAR, "0")
    assert main(["cache"]) == 0 and "off" in capsys.readouterr().out


# -- on the GPU -----------------------------------------------------------------------------------
_GPU_RUN = """
import json, sys, time
import torch, quack_edu
from quack_edu import compile_cache as cc, rmsnorm
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(300, 4096, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
w = torch.randn(4096, device="cuda", dtype=torch.float32, generator=g, requires_grad=True)
dy = torch.randn(300, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
# what any process pays before its first norm, done apart so that the times below are the
# kernels' (compiled or loaded): importing the DSL and the stages (0.8 s on the H200's host),
# and torch's own first backward with a gradient given (it imports sympy: 3 s there)
import quack_edu.stages.final, quack_edu.stages.final_bwd
a = torch.ones(300, 8, device="cuda", requires_grad=True)
(a * 2).backward(torch.ones_like(a))
torch.cuda.synchronize()
t = time.perf_counter()
y = rmsnorm(x, w)  # the forward kernel (rstd kept for the backward)
torch.cuda.synchronize()
fwd = time.perf_counter() - t
t = time.perf_counter()
y.backward(dy)  # the backward kernel and the partial sums' kernel
torch.cuda.synchronize()
bwd = time.perf_counter() - t
torch.save({"y": y.detach().cpu(), "dx": x.grad.cpu(), "dw": w.grad.cpu()}, sys.argv[1])
print(json.dumps({"fwd_s": fwd, "bwd_s": bwd, "hits": cc.STATS.hits, "misses": cc.STATS.misses,
                  "writes": cc.STATS.writes, "errors": cc.STATS.errors}))
"""


@pytest.mark.gpu
def test_a_fresh_process_loads_what_another_compiled(tmp_path, subprocess_env):
    env = {**subprocess_env, cc.ENV_VAR: str(tmp_path / "kernels")}
    runs = []
    for name in ("compiled", "loaded"):
        done = subprocess.run(
            [sys.executable, "-c", _GPU_RUN, str(tmp_path / f"{name}.pt")],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(name, runs[-1])
    compiled, loaded = runs
    # forward, backward, the partial sums' reduction: compiled and stored, then all loaded
    assert compiled["hits"] == 0 and compiled["writes"] == compiled["misses"] >= 2, compiled
    assert loaded["hits"] == compiled["misses"] and loaded["misses"] == 0, loaded
    a, b = (torch.load(tmp_path / f"{n}.pt") for n in ("compiled", "loaded"))
    for name in a:  # the same kernels: bitwise the same values (dw is summed in a fixed order)
        assert torch.equal(a[name], b[name]), name
    # the first call of a key: load + first launch, against 0.77-1.0 s compiling it
    assert loaded["fwd_s"] < 0.5 and loaded["bwd_s"] < 0.5, loaded

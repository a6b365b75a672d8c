"""Every figure in the prose of lessons 00, 01 and 01b is checked against its record.

A figure is a percentage (``6%``, ``4.4-4.8%``), a bandwidth or a rate (``186 GB/s``,
``4.22 TB/s``, ``989 TFLOP/s``, ``206 FLOP/byte``), a time (``340 ns``, ``16 µs``), a size
(``67 MB``, ``1 KiB``), a speed-up (``10×``, ``6–14×``) or any other decimal number (``4.25``):
found in a lesson's markdown, outside inline code. Each must lie inside a passage that a test
recomputes:

* from a record: ladder.json's copy and latency.json's idle load (``_copy_quotes`` of
  ``test_lesson_numbers``), ladder.json's naive rows (``revisit_quote`` of
  ``test_lesson01_prose``), imported, not repeated here;
* from the package: the H200's datasheet figures in ``quack_edu.lessons.roofline.H200`` (with
  their sources), the byte counts of ``rmsnorm_bytes`` and of eager PyTorch (``traffic``), the
  sectors of a warp-wide load (``sectors_ref``);
* as arithmetic computed here, or a document's figure named here with its source (``DOCUMENTED``,
  ``CITED``).

A figure added to one of these lessons without such a passage fails here, naming it; a passage
whose recomputation no longer matches the prose fails too. The student notebooks' markdown must
carry the same figures as the solutions'.
"""

from __future__ import annotations

import functools
import math
import re
import tomllib

import pytest
import test_lesson_numbers as T
from conftest import ROOT
from test_lesson01_prose import revisit_quote

from quack_edu.grading.notebook import notebooks_dir, read, solutions_dir

L00, L01, L01B = "00_setup_and_roofline", "01_naive", "01b_cute_dsl"
LESSONS = (L00, L01, L01B)

#: figures of NVIDIA's documents that no record of the project holds
DOCUMENTED = {
    "hbm_gb": 141,  # H200 datasheet: 141 GB of HBM3e
    "l1_smem_kb": 256,  # Hopper tuning guide: 256 KB of combined L1 and shared memory per SM
    "warps_per_sm": 64,  # Hopper tuning guide: 2048 resident threads (64 warps) per SM
}
#: figures the lessons cite from others, as lesson 08 cites them (QuACK's README)
CITED = "6–14× faster than eager PyTorch in the forward pass, and up to 26× in the backward pass"
CITED_08 = "6-14x faster than PyTorch in the forward and up to 26x in the backward"

_N = r"\d+(?:\.\d+)?"
_FIGURE = re.compile(
    rf"[+−-]?{_N}(?:\s*[–-]\s*{_N})?\s*%"  # 6%, 4.4-4.8%
    rf"|{_N}(?:\s*/\s*{_N})*\s*(?:GB/s|TB/s|TFLOP/s)"  # 186 GB/s, 4.22 TB/s, 989 TFLOP/s
    rf"|{_N}\s*FLOP/byte"  # 206 FLOP/byte
    rf"|{_N}(?:\s*[–-]\s*{_N})?\s*(?:ns|µs|us|ms)\b"  # 340 ns, 16 µs
    rf"|{_N}\s*(?:KiB|KB|MiB|MB|GiB|GB)\b(?!/)"  # 67 MB, 1 KiB, 141 GB
    rf"|{_N}(?:[–-]{_N})?×"  # 10×, 6–14×
    r"|(?<![\w.])\d+\.\d+(?![\w.])"  # any other decimal: 4.25 (TB/s), 67 / 4.8
)
_CODE = re.compile(r"`[^`]*`")


def _words(text: str) -> str:
    return " ".join(text.split())


@functools.cache
def prose(lesson: str, where: str = "solutions") -> str:
    folder = {"solutions": solutions_dir, "notebooks": notebooks_dir}[where]()
    nb = read(folder / f"{lesson}.ipynb")
    return _words("\n".join(c.source for c in nb.cells if c.cell_type == "markdown"))


def figures(text: str) -> list[tuple[int, int, str]]:
    """(start, end, figure) of every figure outside inline code."""
    code = [m.span() for m in _CODE.finditer(text)]
    return [
        (m.start(), m.end(), m.group())
        for m in _FIGURE.finditer(text)
        if not any(a <= m.start() < b for a, b in code)
    ]


# --- the passages, recomputed ------------------------------------------------------------------


@functools.cache
def _eager() -> dict:
    """Eager PyTorch's RMSNorm (lesson 00's sequence) against a fused kernel: bytes per element
    (the M·N coefficients) and kernels, counted by ``traffic`` on meta tensors."""
    import torch

    from quack_edu.grading.exercises.lesson00 import eager_bytes_ref, eager_rmsnorm_ref
    from quack_edu.lessons.roofline import traffic
    from quack_edu.tools.bench import rmsnorm_bytes

    M = N = 4096  # M·N dominates: the M and N terms are under 1% of a byte an element
    out = {}
    for dt in (torch.bfloat16, torch.float32):
        x = torch.empty(M, N, dtype=dt, device="meta")
        w = torch.empty(N, dtype=dt, device="meta")
        out[dt] = {
            "eager": eager_bytes_ref(M, N, dt) // (M * N),
            "fused": rmsnorm_bytes(M, N, dt) // (M * N),
            "kernels": len(traffic(eager_rmsnorm_ref, x, w)),
            "ratio": eager_bytes_ref(32768, N, dt) / rmsnorm_bytes(32768, N, dt),
        }
    return {"bf16": out[torch.bfloat16], "fp32": out[torch.float32]}


def _own_00() -> list[str]:
    from quack_edu.lessons.roofline import H200, ridge

    s = H200
    hbm = f"{s.hbm_gbps / 1e3:.1f} TB/s"
    for fig in (
        f"{hbm} HBM3e",
        f"{s.bf16_tensor_tflops:.0f} TFLOPS dense BF16",
        f"{s.fp32_tflops:.0f} TFLOPS FP32",
    ):
        assert fig in s.source, fig  # the datasheet's figures, as the spec records their source
    h100 = re.search(r"an H100 SXM enables (\d+) MB", s.source).group(1)
    e16, e32 = _eager()["bf16"], _eager()["fp32"]
    ratio16, ratio32 = e16["eager"] / e16["fused"], e32["eager"] / e32["fused"]
    assert round(e16["ratio"]) == round(ratio16)  # the coefficients' ratio is the shapes'
    assert e16["kernels"] < ratio16 and e32["kernels"] > ratio32  # narrower, wider
    # 4 flops (an FMA, two multiplies) on 4 bytes (2 in, 2 out) per bf16 element
    flops, nbytes = 4, 2 + 2
    intensity = flops / nbytes
    assert int(math.log10(ridge(s) / intensity)) == 2  # two orders of magnitude below
    words = {6: "six", 8: "eight"}
    python = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    return [
        f"any Linux machine with Python {python.removeprefix('>=')} runs every lesson",
        # the table of the memory hierarchy
        f"| registers | {s.regs_per_sm // 1024}K × 32-bit per SM ({s.regs_per_sm * 4 // 1024} KB), "
        f"{s.sms} SMs |",
        f"up to {s.smem_kb_per_sm} KB shared per SM ({DOCUMENTED['l1_smem_kb']} KB with L1)",
        f"| L2 | {s.l2_mb:.0f} MB (as PyTorch reports it on an H200; an H100 SXM enables "
        f"{h100} MB)",
        f"| HBM3e | {DOCUMENTED['hbm_gb']} GB, **{hbm}** on the datasheet |",
        f"The datasheet's {hbm} is not reachable by any kernel.",
        # the roofline
        f"RMSNorm does about {flops} flops per element (an FMA for the square and the sum, two "
        f"multiplies for `x · rstd · w`) and moves {nbytes} bytes per element in bf16 "
        f"({nbytes // 2} in, {nbytes // 2} out).",
        f"An intensity of about **{intensity:.0f} FLOP/byte**.",  # after the learner's guess
        f"The ridge of the H200 is {s.bf16_tensor_tflops:.0f} TFLOP/s / {hbm} ≈ "
        f"**{ridge(s):.0f} FLOP/byte** for bf16 tensor cores, and {s.fp32_tflops:.0f} / "
        f"{s.hbm_gbps / 1e3:.1f} ≈ **{ridge(s, s.fp32_tflops):.0f} FLOP/byte** for fp32",
        # the claim, and the prediction from bytes
        f"reports its fused RMSNorm {CITED}",
        f"`eager_bytes / bytes_moved`: {e16['eager']}·M·N + … against {e16['fused']}·M·N + … "
        f"for bf16, about **{ratio16:.0f}×**. For fp32 the upcast and downcast vanish and the "
        f"ratio drops to {e32['eager']}/{e32['fused']} = {ratio32:.1f}×.",
        f"the ratio tends to the kernel count, {e16['kernels']} against 1 ({e32['kernels']} for "
        f"fp32), a little narrower than {ratio16:.0f}× for bf16 and wider than {ratio32:.1f}× "
        "for fp32.",
        f"whose intermediates fit in the {s.l2_mb:.0f} MB L2",
        # the summary
        f"RMSNorm's arithmetic intensity is about {intensity:.0f} FLOP/byte, two orders of "
        "magnitude below the H200's ridge",
        f"Eager PyTorch moves about {ratio16:.0f}× the bytes of a fused kernel in bf16 (fp32 "
        f"intermediates, {words[e16['kernels']]} kernels)",
    ]


def _own_01() -> list[str]:
    from quack_edu.grading.exercises.lesson01 import sectors_ref
    from quack_edu.lessons.roofline import H200

    lanes, sector, bf16 = 32, 32, 2
    naive = sectors_ref(2 * 4096, bf16)  # thread t reads row t: 2N bytes apart
    useful = lanes * bf16
    vec = 16  # bytes of a vector load: 8 bf16
    per_warp = lanes * sector  # each lane keeps one sector of its row
    warps = DOCUMENTED["warps_per_sm"]
    assert warps * per_warp <= DOCUMENTED["l1_smem_kb"] * 1024  # "it fits"
    return [
        f"The naive kernel (stride `2N` bytes) touches {naive} sectors, {naive * sector} bytes "
        f"of traffic, for {useful} useful bytes: {100 * useful / (naive * sector):.0f}% "
        "efficiency.",
        f"the same {useful} bytes cost {sectors_ref(bf16, bf16)} sectors",
        f"a warp moves {lanes * vec} useful bytes in {sectors_ref(vec, vec)} sectors",
        f"at M = 4096 that is {4096 // lanes} warps on a GPU with {H200.sms} SMs",
        f"({sector // bf16} bf16, the next {sector // bf16} loads), {per_warp // 1024} KiB per "
        f"warp whatever the row length, {warps * per_warp // 1024} KiB for the {warps} warps an "
        f"SM can hold: it fits in the SM's {DOCUMENTED['l1_smem_kb']} KB of L1 and shared memory",
    ]


@functools.cache
def quotes(lesson: str) -> tuple[str, ...]:
    """Every checked passage of a lesson: the records' (imported) and this file's."""
    records = [q for ls, q in T._copy_quotes() if ls == lesson]
    own = {L00: _own_00, L01: lambda: [revisit_quote(), *_own_01()], L01B: list}[lesson]()
    return tuple(_words(q) for q in records + own)


def unchecked(lesson: str, text: str | None = None) -> list[str]:
    """The figures of a lesson's prose (or of ``text``) that lie in no checked passage."""
    text = prose(lesson) if text is None else text
    spans = [m.span() for q in quotes(lesson) for m in re.finditer(re.escape(q), text)]
    return [
        f"{fig!r} in ...{text[max(0, s - 60) : e + 20]}..."
        for s, e, fig in figures(text)
        if not any(a <= s and e <= b for a, b in spans)
    ]


# --- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("lesson", [L00, L01])
def test_the_checked_passages_are_in_the_prose(lesson):
    missing = [q for q in quotes(lesson) if q not in prose(lesson)]
    assert not missing, f"{lesson}: recomputed passages the prose does not read: {missing}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_figure_in_the_prose_is_checked(lesson):
    assert unchecked(lesson) == []


@pytest.mark.parametrize("lesson", LESSONS)
def test_the_student_copy_carries_the_same_figures(lesson):
    def figs(where):
        return [f for _, _, f in figures(prose(lesson, where))]

    assert figs("notebooks") == figs("solutions")


def test_lesson00_cites_quack_as_lesson08_does():
    """QuACK's README is no record of ours: lessons 00 and 08 cite the same figures of it."""
    assert CITED_08 in _words(T._prose("08_speed_of_light"))
    assert re.findall(r"\d+", CITED) == re.findall(r"\d+", CITED_08) == ["6", "14", "26"]


def test_the_figure_finder():
    text = (
        "186 GB/s (4.4-4.8% of the copy), 6% and +31%; 4.22 TB/s × 340 ns ≈ 1.4 MB; 989 "
        "TFLOP/s / 4.8 TB/s ≈ **206 FLOP/byte**, 67 / 4.8; 16 µs, 1 KiB, 141 GB, 6–14×, 10×; "
        "up to 4.25) `13 % 4`, `Float32(0.0)`, 4 x 8, 2N bytes, 32-byte sectors"
    )
    assert [f for _, _, f in figures(text)] == [
        "186 GB/s",
        "4.4-4.8%",
        "6%",
        "+31%",
        "4.22 TB/s",
        "340 ns",
        "1.4 MB",
        "989 TFLOP/s",
        "4.8 TB/s",
        "206 FLOP/byte",
        "4.8",
        "16 µs",
        "1 KiB",
        "141 GB",
        "6–14×",
        "10×",
        "4.25",
    ]


@pytest.mark.parametrize("lesson", LESSONS)
def test_a_figure_without_a_check_is_found(lesson):
    """The scan fails on a figure no passage covers: add some to the prose and see."""
    text = prose(lesson) + " It ran at 4321 GB/s, 12.3% more, in 15 µs, 3× faster."
    bad = " ".join(unchecked(lesson, text))
    for fig in ("'4321 GB/s'", "'12.3%'", "'15 µs'", "'3×'"):
        assert fig in bad

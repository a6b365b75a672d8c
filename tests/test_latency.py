"""The pointer-chase latency tool: its kernel compiles to a chain of dependent loads (CPU), its
chain is one cycle through every slot (CPU), and on a Hopper GPU it measures plausible times."""

import tempfile
from pathlib import Path

import pytest
import torch

from quack_edu.grading.checks import Ptx
from quack_edu.tools import latency


@pytest.fixture(scope="module")
def ptx():
    with tempfile.TemporaryDirectory() as d:
        compiled = latency.compile_chase(f"--gpu-arch sm_90a --keep-ptx --dump-dir {d}")
        text = compiled.__ptx__
        if isinstance(text, str) and len(text) < 4096 and Path(text).exists():
            text = Path(text).read_text()
    return text


def test_each_load_depends_on_the_one_before(ptx):
    p = Ptx(ptx)
    loads = p.find("ld.global")
    assert len(loads) == 2, [i.text for i in loads]  # the start index, and one load a step
    # the step's address is computed from the value it loaded (the previous step's)
    chained = [ld for ld in loads if ld in p.ancestors(ld)]
    assert len(chained) == 1, [i.text for i in loads]
    assert ".reqntid 1, 1, 1" in ptx and "nounroll" in ptx


@pytest.mark.parametrize("order", ["random", "stride"])
def test_the_chain_visits_every_slot_once(order):
    nbytes, stride = 64 * 1024, 128
    nxt = latency.make_chain(nbytes, stride, order=order, seed=1, device="cpu")
    step, slots = stride // 4, nbytes // stride
    seen, i = [], 0
    for _ in range(slots):
        seen.append(i)
        i = int(nxt[i])
    assert i == 0 and sorted(seen) == [k * step for k in range(slots)]
    if order == "random":  # not address order
        assert seen[:4] != [0, step, 2 * step, 3 * step]


def test_cli_says_it_needs_a_gpu(capsys):
    from quack_edu._env import MODE

    if MODE.gpu:
        pytest.skip("a GPU is here")
    assert latency.main(["--out", "x.json"]) == 2
    assert "needs a Hopper GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_latencies_are_plausible_on_the_gpu():
    fn = latency.compile_chase()
    l2 = latency.ns_per_load(latency.BUFFERS["l2"], fn=fn)
    dram = latency.ns_per_load(latency.BUFFERS["dram"], fn=fn)
    assert 100 < l2 < 1500 and l2 * 1.3 < dram < 5000, (l2, dram)
    assert torch.cuda.is_available()

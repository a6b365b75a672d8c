#!/usr/bin/env python3
"""Compile the library's kernels (forward ``final``, backward ``final_bwd``) on a set of
configs and write each one's PTX instructions (register names erased) to a folder; or compare
two such folders: whether each kernel's PTX is the same to the byte, else whether it has the
same multiset of instructions and how many lines moved; and the compile times. For refactors
that must not change the generated code.

    python3 scripts/ptx_compare.py dump DIR        # on the tree to test
    python3 scripts/ptx_compare.py compare A B     # A: before, B: after; exits 1 if any differ
                                                   # (in bytes: a refactor must not move a line;
                                                   # in instructions where a dump has no .ptx)
"""

from __future__ import annotations

import difflib
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cases():
    import torch

    from quack_edu.stages import final, final_bwd

    bf, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    out = []
    for N in (7, 100, 1000, 3000, 4096, 8192, 16384, 65536, 131072, 262144):
        for dt, w in ((bf, bf), (bf, f32), (f16, f16), (f32, f32)):
            out.append(("fwd", N, dt, w, None))
    out += [("fwd", N, bf, bf, final.Features(residual_dtype=bf)) for N in (4096, 65536)]
    for N in (7, 100, 1000, 4096, 16384, 65536, 131072, 262144):
        for dt, w in ((bf, bf), (bf, f32), (f32, f32)):
            out.append(("bwd", N, dt, w, None))
    out.append(("bwd", 4096, bf, bf, final_bwd.BwdFeatures(dres_out_dtype=bf, db=True)))
    return out


def dump(folder: str) -> None:
    from quack_edu.runtime import compile_kernel
    from quack_edu.stages import final, final_bwd
    from quack_edu.tools.inspect import _read_artifact

    Path(folder).mkdir(parents=True, exist_ok=True)
    meta = {"cases": [], "times": {}}
    for i, (p, N, dt, w, feats) in enumerate(cases()):
        cls = final.FinalRMSNorm if p == "fwd" else final_bwd.FinalBwdRMSNorm
        k = cls(dt, N, None, w, features=feats)
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            compiled = compile_kernel(k, f"--keep-ptx --dump-dir {tmp}")
            meta["times"][str(i)] = time.perf_counter() - t
            ptx = _read_artifact(compiled.__ptx__)
        ops = [
            re.sub(r"%\w+", "R", s.strip()) for s in ptx.splitlines() if re.match(r"^\s+[a-z@]", s)
        ]
        Path(folder, f"{i}.txt").write_text("\n".join(ops))
        Path(folder, f"{i}.ptx").write_text(ptx)
        meta["cases"].append(f"{p} N={N} {dt} w={w} {feats or ''}")
    Path(folder, "meta.json").write_text(json.dumps(meta))
    print(f"{len(meta['cases'])} kernels, {sum(meta['times'].values()):.1f} s of compiling")


def compare(a: str, b: str) -> int:
    """Print each kernel's difference; 0 when every kernel's PTX is the same to the byte, else 1
    (also when the two folders hold different cases). A kernel without its .ptx in a folder
    (dumped before they were saved) is compared by its instructions only, and said to be."""
    ma = json.loads(Path(a, "meta.json").read_text())
    mb = json.loads(Path(b, "meta.json").read_text())
    if ma["cases"] != mb["cases"]:
        print(f"{a} and {b} hold different kernels: dumped by different versions of cases()")
        return 1
    different = differ_bytes = no_ptx = 0
    for i, name in enumerate(ma["cases"]):
        raw = [Path(d, f"{i}.ptx") for d in (a, b)]
        comparable = all(r.exists() for r in raw)
        identical = comparable and raw[0].read_bytes() == raw[1].read_bytes()
        no_ptx += not comparable
        differ_bytes += comparable and not identical
        A = Path(a, f"{i}.txt").read_text().splitlines()
        B = Path(b, f"{i}.txt").read_text().splitlines()
        extra = Counter(B) - Counter(A)
        missing = Counter(A) - Counter(B)
        moved = sum(1 for s in difflib.unified_diff(A, B, n=0) if s[:1] == "+" and s[:3] != "+++")
        note = ""
        if extra or missing:
            different += 1
            note = f"  +{dict(extra)} -{dict(missing)}"
        ta, tb = ma["times"][str(i)], mb["times"][str(i)]
        where = "same bytes" if identical else f"{moved:3d} lines moved"
        where += "" if comparable else " (no .ptx: bytes not compared)"
        print(f"{name[:60]:60s} {ta:5.2f} -> {tb:5.2f} s, {where}{note}")
    total_a, total_b = sum(ma["times"].values()), sum(mb["times"].values())
    n = len(ma["cases"])
    unknown = f" ({no_ptx} not compared: no .ptx)" if no_ptx else ""
    print(
        f"{different} of {n} differ in instructions, {differ_bytes} of {n} in bytes{unknown}; "
        f"compiling {total_a:.1f} -> {total_b:.1f} s"
    )
    return 1 if different or differ_bytes else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "dump":
        dump(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)

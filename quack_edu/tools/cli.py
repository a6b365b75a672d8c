"""The `quack-edu` command: doctor | ptx | cache | bench | student | grade."""

from __future__ import annotations

import argparse
import sys


def _ptx(a) -> int:
    import torch  # noqa: F401

    from .inspect import compile_report

    fields = {}
    for item in a.set or []:
        key, _, value = item.partition("=")
        fields[key] = int(value) if value.lstrip("-").isdigit() else value
    r = compile_report(a.stage, a.N, a.dtype, M=a.M, sass=a.sass, **fields)
    if a.grep:
        for line in r.lines(a.grep):
            print(line)
        print(f"# {r.count(a.grep)} instructions match {a.grep!r}", file=sys.stderr)
    elif a.sass:
        print(r.sass or "(SASS unavailable: pip install 'nvidia-cuda-nvdisasm>=13.4,<14')")
    else:
        print(r.ptx)
    print(r.summary(), file=sys.stderr)
    return 0


def _cache(a) -> int:
    from .. import compile_cache

    if a.clear:
        n = compile_cache.clear(compile_cache.cache_dir())
        print(f"deleted {n} compiled kernels")
    print(f"kernel cache: {compile_cache.describe()}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="quack-edu", description="quack-edu: RMSNorm in CuTe DSL, stage by stage"
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    sub.add_parser("doctor", help="check this machine and say which mode the lessons run in")

    ptx = sub.add_parser("ptx", help="compile a stage for sm_90a and print its PTX (no GPU needed)")
    ptx.add_argument("--stage", default="naive")
    ptx.add_argument("--N", type=int, default=4096)
    ptx.add_argument("--dtype", default="bf16", help="bf16 | fp16 | fp32")
    ptx.add_argument("--M", type=int, default=4096, help="rows, only to size the reported grid")
    ptx.add_argument("--sass", action="store_true", help="print SASS instead of PTX")
    ptx.add_argument("--grep", default=None, help="print only instructions containing this text")
    ptx.add_argument(
        "--set", action="append", metavar="FIELD=VALUE", help="override a config field"
    )

    cache = sub.add_parser(
        "cache", help="where compiled kernels are kept between processes, and their size"
    )
    cache.add_argument("--clear", action="store_true", help="delete every compiled kernel")

    sub.add_parser(
        "bench", help="benchmark stages (and peers) on the GPU; --model: a decoder", add_help=False
    )
    sub.add_parser("student", help="regenerate notebooks/ from solutions/", add_help=False)
    sub.add_parser("grade", help="execute and grade notebooks", add_help=False)

    argv = list(sys.argv[1:] if argv is None else argv)
    # bench/student/grade own their arguments
    if argv and argv[0] in ("bench", "student", "grade"):
        cmd, rest = argv[0], argv[1:]
        if cmd == "bench":
            from .bench import main as bench_main

            return bench_main(rest)
        from ..grading import cli as grading_cli

        return (grading_cli.student_main if cmd == "student" else grading_cli.grade_main)(rest)

    a = p.parse_args(argv)
    if a.cmd == "doctor":
        from .doctor import run_doctor

        return run_doctor()
    if a.cmd == "ptx":
        return _ptx(a)
    if a.cmd == "cache":
        return _cache(a)
    return 2


if __name__ == "__main__":
    sys.exit(main())

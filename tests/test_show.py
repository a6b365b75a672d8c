"""show_kernel: a stage's kernel printed with the lines new since an earlier stage marked (CPU)."""

import re

from quack_edu.lessons.show import (
    DOC_WORDS,
    doc_text,
    excerpt_text,
    kernel_diff,
    render_html,
    render_text,
    show_doc,
    show_kernel,
)


def _changed(shown):
    return [line.strip() for c, line in shown.lines if c]


def _same(shown):
    return [line.strip() for c, line in shown.lines if not c]


def test_first_stage_is_shown_whole_and_unmarked(capsys):
    show_kernel("naive")
    out = capsys.readouterr().out
    assert "@cute.kernel" in out and "def kernel(" in out
    assert "cutlass.range(self.N" in out
    assert not any(line.startswith("+") for line in out.splitlines())


def test_changed_lines_are_marked_and_kept_lines_are_not():
    (shown,) = kernel_diff("warp", "naive")
    assert shown.title == "WarpRMSNorm.kernel"
    changed, same = _changed(shown), _same(shown)
    assert any("cute.local_tile(mX" in s for s in changed)
    assert any("make_rmem_tensor_like" in s for s in changed)
    assert "tidx, _, _ = cute.arch.thread_idx()" in same
    assert "rstd = self.rstd(sum_sq, eps)" in same  # moved into an if: indentation ignored
    assert shown.removed > 0  # naive's scalar loop is gone
    text = render_text("warp", "naive")
    assert any(line.startswith("+") and "local_tile" in line for line in text.splitlines())
    assert any(line.startswith(" ") and "thread_idx" in line for line in text.splitlines())


def test_a_stage_against_itself_has_no_changes():
    for stage in ("naive", "warp", "cpasync"):
        for shown in kernel_diff(stage, stage):
            assert shown.changed == 0 and shown.removed == 0


def test_inherited_kernel_names_the_methods_that_change():
    (shown,) = kernel_diff("block", "warp")
    assert shown.changed == 0
    text = render_text("block", "warp")
    assert "the same as warp's" in text
    assert "row_sum" in text.splitlines()[-1] and "block_reduce" in text.splitlines()[-1]


def test_fn_shows_one_method_against_the_previous_stages():
    (shown,) = kernel_diff("block", "warp", fn="row_sum")
    assert shown.title == "BlockRMSNorm.row_sum"
    assert any("block_reduce" in s for s in _changed(shown))


def test_backward_shows_the_backward_kernel_and_its_partial_sum():
    bwd, partial = kernel_diff("final_bwd", "final")
    assert bwd.title == "FinalBwdRMSNorm.kernel"
    assert partial.title.startswith("PartialSum.kernel")
    assert bwd.changed > 0 and any("def kernel(self, mP" in s for _, s in partial.lines)


def test_html_highlights_changed_lines_and_escapes_source():
    page = render_html("warp", "naive")
    assert page.count('style="background:#d7f5d7"') == kernel_diff("warp", "naive")[0].changed
    assert "&lt;" in page and "row < M" not in page


def test_decorators_are_shown_after_the_kernel_was_compiled():
    # the DSL rewrites a traced function; its source must still be read with the decorator
    import torch

    from quack_edu.tools.inspect import compile_report

    compile_report("naive", 256, torch.float32)
    (shown,) = kernel_diff("naive")
    assert shown.lines[0][1] == "@cute.kernel"


def test_an_excerpt_is_the_lines_between_two_markers_numbered_as_the_kernel():
    text = excerpt_text("cluster", "tXrX = [cute.make_rmem_tensor_like", "sum_sq = self.row_sum")
    head, *body = text.splitlines()
    assert head.startswith("cluster: ClusterRMSNorm.kernel, lines ")
    assert "tXrX = [cute.make_rmem_tensor_like" in body[0] and "row_sum" not in text
    first, last = map(int, head.rsplit(" ", 1)[1].split("-"))
    assert len(body) == last - first + 1
    numbered = dict(
        (int(n), code.strip())
        for n, code in re.findall(r"^[ +]\s*(\d+)  (.*)$", render_text("cluster"), re.M)
    )
    assert body[0].split(maxsplit=1)[1].strip() == numbered[first]


def test_a_docstring_is_printed_as_far_as_a_cell_holds(capsys):
    """Issue 50: lesson 04 printed the cluster stage's 907-word docstring. show_doc prints whole
    paragraphs (a list item by item) from the top within DOC_WORDS, then where the rest is."""
    import importlib

    for name in ("warp", "block", "cluster", "cpasync", "final"):
        mod = importlib.import_module(f"quack_edu.stages.{name}")
        text = doc_text(mod)
        body, _, tail = text.rstrip("\n").rpartition("\n\n[")
        assert len(body.split()) <= DOC_WORDS, name
        assert body.split("\n")[0] == mod.__doc__.split("\n")[0]  # the title line first
        assert body in mod.__doc__  # whole lines, in order
        left = len(mod.__doc__.split()) - len(body.split())
        assert tail == f"{left} more words of this docstring: quack_edu/stages/{name}.py]"
    show_doc(importlib.import_module("quack_edu.stages.cluster"), words=60)
    out = capsys.readouterr().out
    assert out.startswith("Stage 3, cluster") and "Delta over block" not in out


def test_a_short_docstring_is_printed_whole():
    from quack_edu.stages import naive

    assert doc_text(naive) == naive.__doc__.strip() + "\n"
    # a list is cut between its items, never inside one
    doc = "Title.\n\nIntro:\n\n* one two\n  three\n* four five\n\nEnd."

    class Obj:
        __doc__ = doc

    assert doc_text(Obj, 6).startswith("Title.\n\nIntro:\n\n* one two\n  three\n\n[")

"""quack_edu.lessons.guess: a prediction written before the cell that computes its answer."""

from quack_edu.lessons.guess import compare, reveal


def test_a_number_is_compared_with_the_answer():
    assert compare(16, 15.9, "us") == "your guess: 16 us; computed: 15.9 us (+1%)"
    assert compare("memory", "memory") == "your guess: memory; computed: memory"


def test_a_guess_left_blank_is_reported_not_raised():
    assert compare(..., 15.9, "us").startswith("no guess recorded")
    assert "computed: 15.9 us" in compare(..., 15.9, "us")


def test_tuples_and_dicts_are_compared_item_by_item(capsys):
    reveal((1, 2), (1, 4), "B")
    reveal(..., {"bf16": 10.0})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[0]: your guess: 1 B; computed: 1 B (+0%)"
    assert out[1] == "[1]: your guess: 2 B; computed: 4 B (-50%)"
    assert out[2].startswith("bf16: no guess recorded")

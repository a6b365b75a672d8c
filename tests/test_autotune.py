"""The autotuner's logic on the CPU: timing and running are injected, configs are toy dataclasses.

What it must do: pick the fastest candidate, never tune a key twice (memory, then disk), keep
a readable JSON file that QUACK_EDU_AUTOTUNE_CACHE moves or turns off, survive a corrupt file,
and never let a candidate that crashes or computes the wrong thing win.
"""

import json
from dataclasses import dataclass

import pytest
import torch

from quack_edu import autotune
from quack_edu.autotune import ENV_VAR, Autotuner, cache_path, key_str


@dataclass(frozen=True)
class Cfg:
    threads: int
    cluster: int = 1


KEY = (("op", "toy"), ("gpu", "Fake H200"), ("N", 4096), ("x", "bfloat16"))
CANDIDATES = [Cfg(128), Cfg(256), Cfg(512), Cfg(256, 2)]
SPEED = {Cfg(128): 3.0, Cfg(256): 2.0, Cfg(512): 1.5, Cfg(256, 2): 1.0}  # ms


class Harness:
    """Counts runs and timings; ``wrong``/``broken`` configs misbehave."""

    def __init__(self, wrong=(), broken=()):
        self.wrong, self.broken = set(wrong), set(broken)
        self.runs, self.timed = [], []
        self.current = None

    def run(self, config):
        self.runs.append(config)
        if config in self.broken:
            raise RuntimeError("cluster too large for this GPU")
        self.current = config
        value = 7.0 if config in self.wrong else 1.0
        return [torch.full((4, 8), value), torch.ones(4)]

    def timer(self, fn):
        fn()
        self.timed.append(self.current)
        return SPEED[self.current]

    def tuner(self, **kw):
        kw.setdefault("path", False)
        return Autotuner(timer=self.timer, progress=False, log=lambda msg: None, **kw)


def test_picks_the_fastest_and_times_each_candidate_once():
    h = Harness()
    assert h.tuner().tune(KEY, CANDIDATES, h.run) == Cfg(256, 2)
    assert h.timed == CANDIDATES


def test_a_key_is_tuned_once_per_process():
    h = Harness()
    tuner = h.tuner()
    first = tuner.tune(KEY, CANDIDATES, h.run)
    runs = len(h.runs)
    calls = []
    assert tuner.tune(KEY, lambda: calls.append(1) or CANDIDATES, h.run) == first
    assert len(h.runs) == runs and not calls  # no run, and candidates not even listed
    assert tuner.cached(KEY) == first
    assert tuner.cached(KEY[:-1] + (("x", "float16"),)) is None


def test_the_disk_cache_round_trip_is_readable_and_skips_tuning(tmp_path):
    path = tmp_path / "tune.json"
    h = Harness()
    assert h.tuner(path=path).tune(KEY, CANDIDATES, h.run) == Cfg(256, 2)
    data = json.loads(path.read_text())
    entry = data["entries"][key_str(KEY)]
    assert key_str(KEY) == "op=toy, gpu=Fake H200, N=4096, x=bfloat16"
    assert entry["config"] == {"threads": 256, "cluster": 2}
    assert entry["config_class"] == "Cfg" and entry["ms"] == 1.0
    assert len(entry["candidates"]) == 4

    fresh = Harness()  # a new process: empty memory, same file
    config = fresh.tuner(path=path).tune(KEY, CANDIDATES, fresh.run)
    assert config == Cfg(256, 2) and type(config) is Cfg
    assert fresh.runs == [] and fresh.timed == []


def test_other_keys_in_the_file_survive_a_write(tmp_path):
    path = tmp_path / "tune.json"
    other = KEY[:-1] + (("x", "float32"),)
    h = Harness()
    h.tuner(path=path).tune(KEY, CANDIDATES, h.run)
    h.tuner(path=path).tune(other, CANDIDATES[:2], h.run)
    entries = json.loads(path.read_text())["entries"]
    assert set(entries) == {key_str(KEY), key_str(other)}
    assert entries[key_str(other)]["config"] == {"threads": 256, "cluster": 1}
    assert not list(tmp_path.glob("*.tmp"))  # the temporary file was renamed, not left behind


def test_a_stored_config_that_is_no_longer_a_candidate_is_retuned(tmp_path):
    path = tmp_path / "tune.json"
    h = Harness()
    h.tuner(path=path).tune(KEY, CANDIDATES, h.run)
    fresh = Harness()
    assert fresh.tuner(path=path).tune(KEY, CANDIDATES[:3], fresh.run) == Cfg(512)
    assert fresh.timed == CANDIDATES[:3]


def test_env_var_relocates_and_disables_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_path() == tmp_path / "xdg" / "quack_edu" / "autotune.json"

    target = tmp_path / "elsewhere" / "mine.json"
    monkeypatch.setenv(ENV_VAR, str(target))
    assert cache_path() == target
    h = Harness()
    h.tuner(path=None).tune(KEY, CANDIDATES, h.run)
    assert key_str(KEY) in json.loads(target.read_text())["entries"]

    for off in ("0", "off", "OFF"):
        monkeypatch.setenv(ENV_VAR, off)
        assert cache_path() is None
    h = Harness()
    tuner = h.tuner(path=None)
    assert tuner.tune(KEY, CANDIDATES, h.run) == Cfg(256, 2)  # still tunes, once
    assert tuner.tune(KEY, CANDIDATES, h.run) == Cfg(256, 2)
    assert h.timed == CANDIDATES
    assert not (tmp_path / "xdg").exists()


@pytest.mark.parametrize("content", ["{not json", '{"version": 99, "entries": {}}', "[1, 2]"])
def test_a_corrupt_or_foreign_file_is_ignored_and_replaced(tmp_path, content):
    path = tmp_path / "tune.json"
    path.write_text(content)
    h = Harness()
    logs = []
    tuner = Autotuner(timer=h.timer, path=path, progress=False, log=logs.append)
    assert tuner.tune(KEY, CANDIDATES, h.run) == Cfg(256, 2)
    assert any("ignoring" in msg for msg in logs)
    assert json.loads(path.read_text())["entries"][key_str(KEY)]["config"]["cluster"] == 2


def test_a_candidate_that_fails_is_skipped_with_a_note():
    h = Harness(broken={Cfg(256, 2)})
    tuner = h.tuner()
    assert tuner.tune(KEY, CANDIDATES, h.run) == Cfg(512)
    assert len(tuner.notes) == 1
    assert "Cfg(threads=256, cluster=2)" in tuner.notes[0]
    assert "cluster too large" in tuner.notes[0]


def test_a_candidate_with_wrong_output_never_wins():
    h = Harness(wrong={Cfg(256, 2)})  # the fastest, but it computes garbage
    tuner = h.tuner()
    assert tuner.tune(KEY, CANDIDATES, h.run) == Cfg(512)
    assert Cfg(256, 2) not in h.timed
    assert "differs" in tuner.notes[0]


def test_a_candidate_that_leaves_nan_is_rejected_by_the_default_check():
    expected = [torch.ones(3, dtype=torch.bfloat16)]
    assert autotune.outputs_match([torch.ones(3, dtype=torch.bfloat16)], expected)
    assert not autotune.outputs_match([torch.tensor([1.0, float("nan"), 1.0])], expected)
    assert not autotune.outputs_match(
        [torch.tensor([1.0, float("nan"), 1.0], dtype=torch.bfloat16)], expected
    )
    assert not autotune.outputs_match([], expected)


def test_nan_where_the_heuristic_has_nan_matches():
    # a NaN or Inf in x gives NaN rows in every config's output: tuning on such an input must
    # not reject every candidate but the heuristic
    nan_row = [torch.tensor([1.0, float("nan"), 1.0], dtype=torch.bfloat16)]
    assert autotune.outputs_match([nan_row[0].clone()], nan_row)
    assert not autotune.outputs_match([torch.ones(3, dtype=torch.bfloat16)], nan_row)


def test_the_heuristic_config_must_work():
    h = Harness(broken={CANDIDATES[0]})
    with pytest.raises(RuntimeError, match="cluster too large"):
        h.tuner().tune(KEY, CANDIDATES, h.run)


def test_bench_is_what_gets_timed():
    h = Harness()
    benched = []

    def bench(config):
        benched.append(config)
        h.current = config

    h.tuner().tune(KEY, CANDIDATES, h.run, bench=bench)
    assert benched == CANDIDATES


def test_progress_line_without_tqdm(capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tqdm(name, *args, **kw):
        if name.startswith("tqdm"):
            raise ImportError(name)
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    h = Harness()
    Autotuner(timer=h.timer, path=False, log=lambda m: None).tune(KEY, CANDIDATES, h.run)
    err = capsys.readouterr().err
    assert "tuning op=toy" in err and "4/4 configs" in err


def test_the_heuristic_none_candidate_round_trips(tmp_path):
    path = tmp_path / "tune.json"
    speed = {None: 0.5, **SPEED}
    h = Harness()
    h.timer = lambda fn: (fn(), speed[h.current])[1]
    tuner = h.tuner(path=path)
    assert tuner.tune(KEY, [None, *CANDIDATES], h.run) is None
    assert tuner.cached(KEY, "miss") is None and tuner.cached(KEY[:1], "miss") == "miss"
    assert json.loads(path.read_text())["entries"][key_str(KEY)]["config"] is None
    fresh = Harness()
    assert fresh.tuner(path=path).tune(KEY, [None, *CANDIDATES], fresh.run) is None
    assert fresh.runs == []

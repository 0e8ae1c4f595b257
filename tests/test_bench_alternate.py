"""bench.compare's Bench.alternate: which side runs when (no torch needed: fake workers)."""
from bench.compare import Bench


class _Fake:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def call(self, op, **kw):
        self.log.append(self.name)
        return {"op": op}


def _order(reps, block):
    log = []
    bench = Bench({"b2b": _Fake("b2b", log), "hf": _Fake("hf", log)}, pause=0.0, train_block=block)
    out = bench.alternate(reps, "train_step", block=bench.train_block)
    assert [len(v) for v in out.values()] == [reps, reps]
    return log


def test_alternate_one_call_a_turn_swaps_who_goes_first():
    assert _order(3, 1) == ["b2b", "hf", "hf", "b2b", "b2b", "hf"]


def test_alternate_in_blocks_runs_each_sides_steps_back_to_back():
    assert _order(5, 2) == ["b2b"] * 2 + ["hf"] * 2 + ["hf"] * 2 + ["b2b"] * 2 + ["b2b", "hf"]
    assert _order(4, 9) == ["b2b"] * 4 + ["hf"] * 4  # one block: each side all its steps

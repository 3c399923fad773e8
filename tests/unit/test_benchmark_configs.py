"""The benchmarks' coati runs are configs coati accepts: checked here, before a benchmark's hour-long run (a preset's
new default once left bench_vs_trl's config refused at start)."""

import pytest

from benchmarks.bench_vs_trl import PRECISIONS, coati_kwargs
from coati.distributed.launch import config_from_launch_kwargs


@pytest.mark.parametrize("staleness", [0, 1])
@pytest.mark.parametrize("precision", sorted(PRECISIONS))
def test_bench_vs_trl_runs_a_config_coati_accepts(precision, staleness):
    rows = [{"question": f"{i} + 1 =", "answer": str(i + 1)} for i in range(8)]
    config = config_from_launch_kwargs(**coati_kwargs("model", rows, 6, 32, 1e-5, staleness, PRECISIONS[precision][1]))
    algorithm = config.launch_config().algorithm
    assert (algorithm.dynamic_sampling, algorithm.skip_no_signal_after, algorithm.overlong_buffer_ratio) == (False, 0, 0)
    assert config.run.max_staleness == staleness

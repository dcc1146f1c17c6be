"""The benchmark's statistics and machine readers (benchmarks/stats.py, common.interleaved):
the median's confidence interval against hand-computed order statistics and an exhaustive
count of coverage, the ABBA order, the CPU model and the load. No training."""

from __future__ import annotations

import itertools
import os
import random

import pytest

from benchmarks.common import cpu_seconds, interleaved, machine
from benchmarks.stats import cpu_model, load_average, median_ci, order_statistic_coverage


def exhaustive_coverage(n: int, k: int) -> float:
    """P(x_(k) <= median <= x_(n+1-k)) by counting every above/below pattern of n draws
    (each equally likely): the interval holds the median when at least k draws lie below
    it and at least k above."""
    hits = sum(k <= sum(below) <= n - k for below in itertools.product((0, 1), repeat=n))
    return hits / 2**n


@pytest.mark.parametrize(
    ("n", "ranks", "coverage"),
    [
        # n=11: P(B<=1) = 12/2048, P(B<=2) = 67/2048; rank 3 covers only 0.935 < 0.95
        (11, (2, 10), 1 - 2 * 12 / 2048),
        # n=12: P(B<=2) = 79/4096 -> 3rd..10th, 0.961; rank 4: P(B<=3) = 299/4096 -> 0.854
        (12, (3, 10), 1 - 2 * 79 / 4096),
        (6, (1, 6), 1 - 2 / 64),  # the fewest rounds with a 95 % interval: [min, max]
        (20, (6, 15), 1 - 2 * (1 + 20 + 190 + 1140 + 4845 + 15504) / 2**20),
    ],
)
def test_median_ci_is_the_hand_computed_order_statistics(
    n: int, ranks: tuple[int, int], coverage: float
) -> None:
    values = [10.0 * (i + 1) for i in range(n)]
    random.Random(n).shuffle(values)  # order statistics: the input order must not matter
    ci = median_ci(values)
    assert ci.ranks == ranks
    assert (ci.lo, ci.hi) == (10.0 * ranks[0], 10.0 * ranks[1])
    assert ci.coverage == pytest.approx(coverage, abs=1e-12)
    assert ci.coverage >= 0.95
    if n <= 12:  # 2**n patterns: keep it fast
        assert ci.coverage == pytest.approx(exhaustive_coverage(n, ranks[0]), abs=1e-12)
        # the next narrower interval would cover less than 95 %: this one is the narrowest
        assert exhaustive_coverage(n, ranks[0] + 1) < 0.95
    else:
        assert order_statistic_coverage(n, ranks[0] + 1) < 0.95
    assert ci.median == pytest.approx(5.0 * (n + 1))


def test_coverage_matches_exhaustive_count_for_every_rank() -> None:
    for n in range(1, 13):
        for k in range(1, (n + 1) // 2 + 1):
            assert order_statistic_coverage(n, k) == pytest.approx(exhaustive_coverage(n, k))


def test_too_few_rounds_give_min_max_and_say_so() -> None:
    ci = median_ci([1.2, 0.9, 1.0, 1.1, 0.95])
    assert (ci.lo, ci.hi, ci.ranks) == (0.9, 1.2, (1, 5))
    assert ci.coverage == pytest.approx(1 - 2 / 32) and ci.coverage < ci.confidence
    with pytest.raises(ValueError, match="no values"):
        median_ci([])


def test_interleaved_alternates_who_goes_first() -> None:
    assert interleaved(0, 4, ["p", "n"]) == ["p", "n", "n", "p", "p", "n", "n", "p"]
    firsts = interleaved(0, 12, ["p", "n"])[::2]
    assert firsts.count("p") == firsts.count("n") == 6  # 12 rounds: balanced


def test_cpu_model_reads_model_name_and_skips_indices() -> None:
    x86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n"
    x86 += "model name\t: AMD EPYC 9R45 96-Core Processor\n"
    assert cpu_model(x86) == "AMD EPYC 9R45 96-Core Processor"
    assert cpu_model("processor\t: 0\ncpu\t\t: POWER9 (raw), altivec supported\n") == (
        "POWER9 (raw), altivec supported"
    )
    assert cpu_model("processor : 0\n")  # no name in cpuinfo: platform's answer, not empty
    here = cpu_model()
    assert here and not here.isdigit()


def test_machine_and_load_are_sane() -> None:
    info = machine()
    assert info["cpus"] == os.cpu_count() and 1 <= info["usable_cpus"] <= info["cpus"]
    assert info["cpu"] and info["python"].count(".") == 2
    load = load_average()
    assert load is not None and 0.0 <= load < 100 * info["cpus"]


def test_cpu_seconds_counts_this_process_and_its_children() -> None:
    import subprocess
    import sys

    own, children = cpu_seconds()
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)
    own2, children2 = cpu_seconds()
    assert own2 >= own and children2 - children >= 0.15  # the child's 0.2 s of CPU

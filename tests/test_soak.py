"""A short soak in CI: random usage patterns and injected failures leave nothing behind."""
from bench.soak import soak


def test_short_soak_leaves_nothing_behind(no_leaks):
    report = soak(seconds=6.0, seed=1)
    assert report.pools >= 3 and report.env_steps > 1000, report
    assert report.env_errors > 0, "the soak must exercise env failures"
    assert report.problems == [], report.problems


def test_short_soak_with_killed_workers_leaves_nothing_behind(no_leaks):
    report = soak(seconds=6.0, seed=2, kill_every=15)
    assert report.kills >= 5 and report.restarts >= report.kills // 2, report
    assert report.env_steps > 500, report
    assert report.problems == [], report.problems

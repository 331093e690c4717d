"""Random valid schedules of the sample workloads."""

def test_every_workload_has_several_distinct_schedules(sampled):
    for name, schs in sampled.items():
        assert len(schs) >= 4, name

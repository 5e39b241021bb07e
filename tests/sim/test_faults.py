from replayproxy.sim.config import SimConfig
from replayproxy.sim.faults import FaultDrawer


def test_no_rates_no_faults_but_first_byte_delay_applies_to_all() -> None:
    drawer = FaultDrawer(SimConfig(first_byte_delay=0.25))
    faults = [drawer.draw(10) for _ in range(200)]
    assert all(f.name is None and f.first_byte_delay_s == 0.25 for f in faults)


def test_rates_are_fractions_and_positions_fall_inside_the_answer() -> None:
    drawer = FaultDrawer(SimConfig(fail_rate=0.1, throttle_rate=0.1, reset_rate=0.2, stall_rate=0.2, seed=4))
    faults = [drawer.draw(10) for _ in range(4000)]
    names = [f.name for f in faults]
    assert 300 < names.count("http_500") < 500
    assert 250 < names.count("http_429") < 470  # 10% of the 90% not failed
    assert all(0 <= f.reset_after < 10 for f in faults if f.reset_after is not None)
    assert all(1 <= f.stall_after < 10 for f in faults if f.stall_after is not None)


def test_the_same_seed_gives_the_same_faults() -> None:
    config = SimConfig(reset_rate=0.5, stall_rate=0.5, seed=11)
    a, b = FaultDrawer(config), FaultDrawer(config)
    assert [a.draw(8) for _ in range(50)] == [b.draw(8) for _ in range(50)]

import statistics

from replayproxy.sim.sampler import OutputPlan, Sampler, SamplingParams

PROMPT = list(range(100, 140))


def test_ignore_eos_gives_exactly_max_tokens() -> None:
    plan = Sampler(8, 0).plan(PROMPT, SamplingParams(max_tokens=300, ignore_eos=True))
    assert plan.length == 300 and plan.finish_reason == "length" and all(plan.pieces)


def test_same_request_and_seed_give_the_same_text_other_seeds_differ() -> None:
    params = SamplingParams(max_tokens=50, seed=7)
    first, again = Sampler(30, 0).plan(PROMPT, params), Sampler(30, 99).plan(PROMPT, params)
    assert first == again
    other = Sampler(30, 0).plan(PROMPT, SamplingParams(max_tokens=50, seed=8))
    assert other.pieces != first.pieces


def test_greedy_depends_on_the_prompt_only() -> None:
    a = Sampler(30, 1).plan(PROMPT, SamplingParams(max_tokens=20, temperature=0, seed=1))
    b = Sampler(30, 2).plan(PROMPT, SamplingParams(max_tokens=20, temperature=0, seed=2))
    assert a == b


def test_eos_lengths_follow_the_configured_mean_and_respect_min_tokens() -> None:
    sampler = Sampler(40, 3)
    plans = [sampler.plan(PROMPT, SamplingParams(max_tokens=10_000, min_tokens=5)) for _ in range(2000)]
    lengths = [p.length for p in plans]
    assert min(lengths) >= 5
    assert 30 < statistics.mean(lengths) < 55
    eos = next(p for p in plans if p.finish_reason == "stop")
    assert eos.pieces[-1] == ""  # the EOS token counts but has no text


def test_short_max_tokens_finish_with_length() -> None:
    plan = Sampler(1000, 0).plan(PROMPT, SamplingParams(max_tokens=3))
    assert plan.length == 3 and plan.finish_reason == "length"


def _plan_with_stop(stop: str, min_tokens: int = 0) -> tuple[OutputPlan, OutputPlan]:
    params = SamplingParams(max_tokens=60, ignore_eos=True, seed=5)
    full = Sampler(30, 0).plan(PROMPT, params)
    cut = Sampler(30, 0).plan(
        PROMPT, SamplingParams(max_tokens=60, ignore_eos=True, seed=5, stop=(stop,), min_tokens=min_tokens)
    )
    return full, cut


def test_stop_string_ends_the_output_before_the_match() -> None:
    probe = Sampler(30, 0).plan(PROMPT, SamplingParams(max_tokens=60, ignore_eos=True, seed=5))
    stop = probe.pieces[10] + probe.pieces[11][:2]  # spans a token boundary
    full, cut = _plan_with_stop(stop)
    text = "".join(full.pieces)
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert "".join(cut.pieces) == text[: text.find(stop)]
    assert cut.length == 12  # the token completing the match is generated and counted


def test_stop_string_is_ignored_before_min_tokens() -> None:
    probe = Sampler(30, 0).plan(PROMPT, SamplingParams(max_tokens=60, ignore_eos=True, seed=5))
    full, cut = _plan_with_stop(probe.pieces[2], min_tokens=20)
    assert cut.length >= 20 or cut == full

from pathlib import Path

import orjson
import pytest

from replayproxy.sim.truth import TruthLog, TruthRecord


def test_each_record_is_one_flushed_json_line(tmp_path: Path) -> None:
    path = tmp_path / "truth.jsonl"
    log = TruthLog(str(path))
    log.write(
        TruthRecord(
            endpoint="chat",
            arrival_ns=1,
            id="chatcmpl-1",
            chunk_ns=[2, 3],
            kinds="rc",
            prompt_tokens=5,
            completion_tokens=1,
            cached_tokens=0,
        )
    )
    line = orjson.loads(path.read_bytes())  # readable before close: flushed per line
    assert line["id"] == "chatcmpl-1" and line["chunk_ns"] == [2, 3] and line["cached_tokens"] == 0
    assert set(line) >= {"arrival_ns", "prompt_tokens", "completion_tokens", "status", "endpoint"}
    log.close()


def test_without_a_path_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for path in (None, ""):
        log = TruthLog(path)
        log.write(TruthRecord(endpoint="chat", arrival_ns=1))
        log.close()
    assert list(tmp_path.iterdir()) == []

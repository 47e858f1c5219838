import io
import json

from router.accesslog import PIPE_BUF, AccessLog, AccessRecord


class Recording(io.StringIO):
    """Counts write calls, so the test sees how lines were grouped into writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)


def record(i: int, path: str = "/v1/chat/completions") -> AccessRecord:
    return AccessRecord("POST", path, 200, f"r{i % 4}", "home", "prefix", 1, 1.5, 2.5, 100, i)


def test_lines_are_json_and_written_only_on_flush() -> None:
    out = Recording()
    log = AccessLog(lambda: out)
    log.emit(record(1))
    log.emit(record(2))
    assert out.getvalue() == ""
    log.flush()
    lines = out.getvalue().splitlines()
    assert [json.loads(ln)["bytes_out"] for ln in lines] == [1, 2]
    assert set(json.loads(lines[0])) == {"method", "path", "status", "replica", "branch",
                                         "key_source", "attempts", "ttfb_ms", "duration_ms",
                                         "bytes_in", "bytes_out", "model"}
    log.flush()  # nothing pending: no write
    assert len(out.writes) == 1


def test_writes_are_whole_lines_of_at_most_pipe_buf() -> None:
    out = Recording()
    log = AccessLog(lambda: out)
    for i in range(200):
        log.emit(record(i, "/v1/" + "x" * (i % 50)))
    log.emit(record(999, "/v1/" + "y" * 5000))  # one line longer than PIPE_BUF: written alone
    log.flush()
    assert len(out.writes) > 1
    for w in out.writes:
        assert w.endswith("\n")
        assert len(w) <= PIPE_BUF or w.count("\n") == 1
        for line in w.splitlines():
            json.loads(line)
    assert [json.loads(ln)["bytes_out"] for ln in out.getvalue().splitlines()] == \
        [*range(200), 999]


def test_flushes_by_itself_when_much_is_pending() -> None:
    out = Recording()
    log = AccessLog(lambda: out)
    for i in range(2000):  # ~400 KB of lines
        log.emit(record(i))
    assert out.writes, "a large backlog must not wait for the next timer tick"
    log.flush()
    assert len(out.getvalue().splitlines()) == 2000


def test_a_closed_stream_loses_lines_but_does_not_raise() -> None:
    out = io.StringIO()
    out.close()
    log = AccessLog(lambda: out)
    log.emit(record(1))
    log.flush()
    log.emit(record(2))  # still usable afterwards


def test_limit_field_only_on_lines_a_limit_wrote() -> None:
    out = Recording()
    log = AccessLog(lambda: out)
    log.emit(record(1))
    log.emit(AccessRecord("-", "-", 408, limit="limits.header_timeout"))
    log.flush()
    plain, limited = (json.loads(ln) for ln in out.getvalue().splitlines())
    assert "limit" not in plain
    assert limited["limit"] == "limits.header_timeout" and limited["status"] == 408

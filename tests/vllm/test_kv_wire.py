"""Our KV-event codec against vLLM's own msgspec structs, live in the vLLM env.

The vLLM env's Python (it has vllm and msgspec; this venv has neither) builds each case of
tests/router/test_kv_wire.py's table as vLLM's ``KVEventBatch`` and encodes it; it also decodes
the bytes our ``encode_batch`` produced with vLLM's typed decoder and re-encodes them. So both
directions are checked against the installed vLLM, not against a copy of its structs: our bytes
equal vLLM's, vLLM's bytes decode to our batch, and vLLM reads ours back to the same bytes.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from typing import Any

import pytest

from loadtest.vllm_fleet import VllmEnv
from router.kv_events.wire import EventBatch, decode_batch, encode_batch
from tests.router.test_kv_wire import GOLDEN

pytestmark = pytest.mark.vllm

# Run by the vLLM env's Python: a JSON list of cases on stdin, a JSON object on stdout.
_VLLM_SIDE = r"""
import json, sys
import msgspec
import vllm
from vllm.distributed import kv_events as kv

def build(case):
    events = []
    for ev in case["events"]:
        fields = dict(ev["fields"])
        for key in ("block_hashes", "parent_block_hash"):
            if key in fields:
                fields[key] = unhex(fields[key])
        if fields.get("extra_keys") is not None:
            fields["extra_keys"] = [tuple(k) if k is not None else None for k in fields["extra_keys"]]
        events.append(getattr(kv, ev["type"])(**fields))
    return kv.KVEventBatch(ts=case["ts"], events=events,
                           data_parallel_rank=case["data_parallel_rank"])

def unhex(v):
    if isinstance(v, list):
        return [unhex(x) for x in v]
    if isinstance(v, dict):
        return bytes.fromhex(v["hex"])
    return v

enc = msgspec.msgpack.Encoder()
dec = msgspec.msgpack.Decoder(kv.KVEventBatch)
out = {"version": vllm.__version__, "cases": {}}
for case in json.load(sys.stdin):
    ours = bytes.fromhex(case["ours"])
    out["cases"][case["name"]] = {
        "vllm": enc.encode(build(case)).hex(),
        "ours_reencoded": enc.encode(dec.decode(ours)).hex(),
    }
json.dump(out, sys.stdout)
"""


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _case(name: str, batch: EventBatch) -> dict[str, Any]:
    events = []
    for event in batch.events:
        fields = {k: _jsonable(v) for k, v in asdict(event).items()}
        events.append({"type": type(event).__name__, "fields": fields})
    return {"name": name, "ts": batch.ts, "data_parallel_rank": batch.data_parallel_rank,
            "events": events, "ours": encode_batch(batch).hex()}


@pytest.fixture(scope="module")
def vllm_side(vllm_env: VllmEnv) -> dict[str, Any]:
    cases = [_case(name, batch) for name, (batch, _) in sorted(GOLDEN.items())]
    proc = subprocess.run([str(vllm_env.venv / "bin" / "python"), "-c", _VLLM_SIDE],
                          input=json.dumps(cases), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout)
    print(f"\nKV-event codec checked against vLLM {result['version']}")
    return result


def test_the_matched_vllm_version(vllm_side: dict[str, Any]) -> None:
    # router/kv_events/wire.py and docs/kv-events.md name the version this format was matched to
    assert vllm_side["version"] == "0.32.0"


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_vllm_bytes_equal_ours_and_decode_to_our_batch(vllm_side: dict[str, Any], name: str) -> None:
    batch, golden = GOLDEN[name]
    theirs = vllm_side["cases"][name]["vllm"]
    assert theirs == golden  # the golden table of the fast suite is still what vLLM emits
    assert encode_batch(batch).hex() == theirs
    assert decode_batch(bytes.fromhex(theirs)) == batch


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_vllm_reads_our_bytes(vllm_side: dict[str, Any], name: str) -> None:
    batch, _ = GOLDEN[name]
    assert vllm_side["cases"][name]["ours_reencoded"] == encode_batch(batch).hex()

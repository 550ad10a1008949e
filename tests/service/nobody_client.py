"""A profiler-service client that runs as uid/gid 65534 (nobody): a test helper, run as a script.

Usage: ``python nobody_client.py SOCKET`` with one JSON object per stdin line (``{"declare":
DeclareProcessesRequest as proto3 JSON}``, ``{"exits": ReportExitsRequest}``, ``{"stream":
[StreamDeclarationsRequest, ...]}``, optional ``"declarer"``); it answers one JSON line per
request on stdout. ``"$self"`` in a request stands for the child's own pid.

Started as root, it imports grpc and the stubs and makes one failing call first (grpc imports
lazily; nobody may not read the interpreter's library under /root), then drops to 65534 with no
supplementary groups and sets itself dumpable again (a process that changed uid is not dumpable,
and procfs then shows its /proc/<pid> as root's: prctl(2) PR_SET_DUMPABLE).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

import grpc
from google.protobuf import json_format
from gpumetrics.v1 import profiler_pb2, profiler_pb2_grpc

PR_SET_DUMPABLE = 4
NOBODY = 65534


def _warm() -> None:
    channel = grpc.insecure_channel("unix:/nonexistent/gpumetrics-warm.sock")
    try:
        profiler_pb2_grpc.ProfilerIntegrationServiceStub(channel).DeclareProcesses(
            profiler_pb2.DeclareProcessesRequest(), timeout=1
        )
    except grpc.RpcError:
        pass
    finally:
        channel.close()


def _drop() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)


def _own_pid(text: str) -> str:
    return text.replace('"$self"', str(os.getpid()))


def _answer(stub: profiler_pb2_grpc.ProfilerIntegrationServiceStub, req: dict) -> dict:
    metadata = (("gpumetrics-declarer", req["declarer"]),) if "declarer" in req else ()
    try:
        if "declare" in req:
            msg = json_format.Parse(
                _own_pid(json.dumps(req["declare"])), profiler_pb2.DeclareProcessesRequest()
            )
            resp = stub.DeclareProcesses(msg, timeout=10, metadata=metadata)
        elif "exits" in req:
            msg = json_format.Parse(
                _own_pid(json.dumps(req["exits"])), profiler_pb2.ReportExitsRequest()
            )
            resp = stub.ReportExits(msg, timeout=10, metadata=metadata)
        else:
            events = [
                json_format.Parse(_own_pid(json.dumps(e)), profiler_pb2.StreamDeclarationsRequest())
                for e in req["stream"]
            ]
            answers = stub.StreamDeclarations(iter(events), timeout=10, metadata=metadata)
            return {"stream": [json_format.MessageToDict(a) for a in answers]}
    except grpc.RpcError as err:
        return {"code": err.code().name, "details": err.details()}
    return json_format.MessageToDict(resp, always_print_fields_with_no_presence=True)


def main() -> None:
    _warm()
    _drop()
    print(json.dumps({"pid": os.getpid(), "uid": os.geteuid()}), flush=True)
    channel = grpc.insecure_channel(f"unix:{sys.argv[1]}")
    stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(channel)
    for line in sys.stdin:
        print(json.dumps(_answer(stub, json.loads(line))), flush=True)
    channel.close()


if __name__ == "__main__":
    main()

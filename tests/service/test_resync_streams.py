"""A resync belongs to the stream that began it (docs/protocol.md, "Calls").

An agent that reconnects while its old stream is still open runs its new resync on the new
stream; the old stream's end abandons only its own (issue: it aborted the new one, whose
``ResyncEnd`` was then rejected and a stale pid stayed held).
"""

from __future__ import annotations

import threading

from gpumetrics.identity.declared import DeclaredStore, Resync
from gpumetrics.v1 import profiler_pb2 as pb

from .conftest import TIMEOUT, MakeSidecar, StreamClient

AGENT = (("gpumetrics-declarer", "agent"),)


class Store(DeclaredStore):
    """The real store, telling the test when a stream's end abandoned a resync."""

    def __init__(self) -> None:
        super().__init__()
        self.aborted = threading.Event()

    def abort_resync(self, resync: Resync) -> bool:
        result = super().abort_resync(resync)
        self.aborted.set()
        return result


def test_an_old_streams_end_does_not_abort_the_new_streams_resync(sidecar: MakeSidecar) -> None:
    store = Store()
    sc = sidecar(declared=store)
    old = StreamClient(sc.profiler_stub(), AGENT)
    for pid in (10, 11, 12):
        assert old.send(declare=pb.ProcessDeclaration(pid=pid)).accepted
    assert old.send(resync_begin=pb.ResyncBegin()).accepted  # then the agent lost its link
    new = StreamClient(sc.profiler_stub(), AGENT)  # reconnected; the old stream is still open
    assert new.send(resync_begin=pb.ResyncBegin()).accepted
    assert new.send(declare=pb.ProcessDeclaration(pid=11)).accepted
    old.close()  # the server notices the old stream's end at last
    assert store.aborted.wait(TIMEOUT)
    end = new.send(resync_end=pb.ResyncEnd())
    assert (end.accepted, end.released) == (True, 2)
    assert [p for p in (10, 11, 12) if store.lookup(p)[1]] == [11]
    new.close()


def test_a_stream_ends_only_its_own_resync(sidecar: MakeSidecar) -> None:
    store = Store()
    sc = sidecar(declared=store)
    a = StreamClient(sc.profiler_stub(), AGENT)
    b = StreamClient(sc.profiler_stub(), AGENT)
    assert a.send(declare=pb.ProcessDeclaration(pid=20)).accepted
    assert a.send(resync_begin=pb.ResyncBegin()).accepted
    ended = b.send(resync_end=pb.ResyncEnd())  # b began none
    assert not ended.accepted and ended.rejection.field == "resync_end"
    assert a.send(resync_begin=pb.ResyncBegin()).accepted  # a restart on the same stream
    assert store.resyncs_in_progress == 1
    assert a.send(resync_end=pb.ResyncEnd()).released == 1
    assert store.resyncs_in_progress == 0
    a.close()
    b.close()

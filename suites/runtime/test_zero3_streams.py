"""The seed's ``record_stream``: a gathered parameter released from a consumer stream, on ``sim``
with a kernel latency (``../shared/seeds/deepspeed-zero3-release-lifetime.txt``: the fix
"first calls ``record_stream`` so that the caching allocator does not hand the block to other
work before the consumer stream's queued kernels finish").

The consumer stream's kernel reads the view until t=200 while the host is at t=0; the release
frees the padded storage from there; the next gather of a same-size parameter, on the gather
stream, must not get the block before that kernel completes. With ``record_stream`` the cache
defers the block; without it (the mutant) the gather stream reuses it at once and the
simulator's race check aborts the child.
"""

from __future__ import annotations

from . import _zero3_targets

RACE = (
    r"(?m)^sim: block #1 reused on stream zero3\.gather while stream consumer's kernel is in"
    r" flight \(until t=200\)$"
)


def test_the_next_gather_waits_for_the_consumers_kernel(death):
    report = death.run(_zero3_targets.consumer_stream).assert_clean().returned
    assert report["freed_at_once"] == [0, 0]  # size 0, and only the output live, at once
    assert report["awaiting"] == [[True, ["consumer"]]]  # cached, waiting on the consumer
    assert report["b_got_the_block"] is False and report["now_us"] == 0
    assert report["c_got_the_block"] is True  # once the consumer's kernel completed
    assert report["consumer_read"] == report["expected_read"]


def test_teeth_a_release_without_record_stream_aborts_in_the_race_check(death):
    outcome = death.run(_zero3_targets.consumer_stream, "release_without_record_stream")
    outcome.assert_aborted(match=RACE)


UNWAITED = (
    r"(?m)^sim: stream default reads block #1 while stream zero3\.gather's write \(until t=100\)"
    r" is not waited for$"
)


def test_the_op_reads_the_gathered_view_after_wait(death):
    report = death.run(_zero3_targets.read_after_wait).assert_clean().returned
    assert report["sum"] == report["expected"]


def test_teeth_a_wait_that_does_not_wait_aborts_in_the_race_check(death):
    # DeepSpeed's wait_allgather skipped: the default stream reads the view at t=0 while the
    # all-gather on the gather stream writes it until t=100
    outcome = death.run(_zero3_targets.read_after_wait, "wait_does_not_wait")
    outcome.assert_aborted(match=UNWAITED)


def test_dropping_the_allocator_after_a_legacy_layer_never_aborts(death):
    report = death.run(_zero3_targets.legacy_teardown).assert_clean().returned
    assert report == {"used_bytes": 0, "now_us": 300}  # gather, op, then the teardown's sync


def test_the_compute_overlaps_the_prefetched_gathers(death):
    # each layer's op waits for its own parameters' events only: with prefetch=2 the gathers of
    # layers k+1 and k+2 run on the gather stream while layer k computes
    report = death.run(_zero3_targets.overlap).assert_clean().returned
    assert report == {"prefetch=0": 1900, "prefetch=2": 1500}


def test_teeth_a_wait_for_the_whole_gather_stream_loses_the_overlap(death):
    report = death.run(_zero3_targets.overlap, "wait_for_the_whole_gather_stream").returned
    assert report == {"prefetch=0": 1900, "prefetch=2": 1900}  # the prefetch buys nothing

"""lsgd.comm.blocked_time.BlockedTime: the union of the regions' wall intervals, on any training thread."""

from __future__ import annotations

import threading
import time

import pytest

from lsgd.comm.blocked_time import BlockedTime
from lsgd.comm.communicator import Communicator

T = 0.05  # s


def test_a_region_counts_its_wall_time_and_nested_regions_count_once():
    b = BlockedTime()
    with b.region():
        time.sleep(T)
        with b.region():
            time.sleep(T)
    got = b.seconds()
    assert 2 * T <= got < 2 * T + 0.04
    time.sleep(T)  # outside any region: nothing
    assert b.seconds() == got


def test_regions_open_on_two_threads_at_once_count_their_union():
    """Thread A blocks for [0, 2T], thread B for [T, 3T]: the union is 3T, not 4T."""
    b = BlockedTime()
    opened = threading.Event()

    def other():
        opened.wait()
        time.sleep(T)
        with b.region():
            time.sleep(2 * T)

    t = threading.Thread(target=other)
    t.start()
    with b.region():
        opened.set()
        time.sleep(2 * T)
    t.join()
    assert 3 * T <= b.seconds() < 3 * T + 0.04


def test_a_background_thread_counts_nothing_and_add_adds():
    b = BlockedTime()

    def waiter():
        b.background()
        with b.region():
            time.sleep(T)

    t = threading.Thread(target=waiter)
    t.start()
    t.join()
    assert b.seconds() == 0.0
    b.add(0.25)
    assert b.seconds() == 0.25
    with pytest.raises(ValueError, match="blocked seconds must be >= 0"):
        b.add(-1.0)


def test_an_open_region_is_read_up_to_now():
    b = BlockedTime()
    with b.region():
        time.sleep(T)
        assert b.seconds() >= T


def test_the_communicator_shares_one_counter_with_its_waits():
    """A world of one: blocking() and add_blocked() feed blocked_s()."""
    comm = Communicator()
    with comm.blocking():
        time.sleep(T)
    comm.add_blocked(1.0)
    assert 1.0 + T <= comm.blocked_s() < 1.0 + T + 0.04

"""A stream's quality as its listener hears it: a player that starts at the first chunk's arrival and plays in
real time, pausing when the audio it has runs out and resuming when the next chunk arrives.

    play = Playback(received=t0)
    play.chunk(t1, 0.64)        # each chunk: its arrival (time.monotonic()) and its audio seconds
    play.chunk(t2, 0.64)
    play.first_packet, play.gaps, play.underrun, play.continuous

With chunk k arriving at t_k carrying d_k seconds of audio, the audio received runs out at
due_1 = t_1 + d_1 and due_k = max(t_k, due_{k-1}) + d_k; chunk k (k >= 2) finds the player waiting for
u_k = max(0, t_k - due_{k-1}) seconds; the stream's underrun is the sum of the u_k, and it is continuous when
that is 0. The gaps are t_k - t_{k-1}. (A pause shifts the rest of the playback, so a late chunk is
counted once, not again for every chunk after it.)
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Playback:
    received: float  # when the request arrived (time.monotonic())
    first: float | None = None  # the first chunk's arrival
    last: float | None = None  # the latest chunk's arrival
    due: float = 0.0  # when the audio received so far runs out
    underrun: float = 0.0  # seconds the player waited after it started
    audio: float = 0.0  # seconds of audio received
    gaps: list[float] = field(default_factory=list)  # between consecutive chunks' arrivals

    def chunk(self, now: float, seconds: float) -> None:
        """A chunk of `seconds` of audio arrived at `now`."""
        if self.first is None:
            self.first, self.due = now, now + seconds
        else:
            self.gaps.append(now - self.last)
            self.underrun += max(0.0, now - self.due)
            self.due = max(now, self.due) + seconds
        self.last = now
        self.audio += seconds

    @property
    def first_packet(self) -> float | None:
        """Seconds from the request to its first chunk (None before it)."""
        return None if self.first is None else self.first - self.received

    @property
    def continuous(self) -> bool:
        """The player never waited once it had started."""
        return self.underrun == 0.0

"""A session on a host as the client holds it: its id, what HELLO said, how its steps travel.

It is the one owner of its step layout: chosen from its MAKE reply (:meth:`HostSession.agree`),
with the observation slab it offered in that MAKE (:meth:`HostSession.offer_slab`) if the host
took it; and of its channel (:mod:`envserver.wire.channel`), offered in that MAKE too.

The session is the host's, not the socket's: a connection that replaces a failed one to the same
host resumes it (``Recovery``) by holding the very same :class:`HostSession`, its step layout and
observation slab and channel included.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from envserver.wire.channel import MOST_CHANNELS, Channel, ChannelOffer
from envserver.wire.messages import MAX_ENVELOPE_BYTES
from envserver.wire.raw import StepLayout
from envserver.wire.replies import HostInfo, MakeReply
from envserver.wire.slab import SlabOffer

__all__ = ["HostSession"]


@dataclass(eq=False)
class HostSession:
    """One session on a host.

    Attributes:
        id: The session id the host gave at HELLO; every request carries it.
        info: What the host said of itself at HELLO (version, bounds, lease); None where a
            session is held without it (tests).
        step_layout: How STEP requests go raw to this session (None: as STEP), set from its
            MAKE reply (``HostConnection.use_layout``); with the slab its observations come
            in, if the host took one.
        steps_raw: Whether a step of the whole block goes raw (``RawStep``): it has a step
            layout, and such a request is within the host's bound. Decided with the layout.
        channel: Where its steps and resets travel when nothing else is under way, if the host
            took the channel offered at MAKE (None: over ZeroMQ).
        more_channels: The other channels the host took, for the requests under way at once
            beyond the first (first-ready sub-batches): a request is posted in a free one while
            every other request under way is in a channel too.
    """

    id: bytes
    info: HostInfo | None = None
    step_layout: StepLayout | None = None
    steps_raw: bool = False
    channel: Channel | None = None
    more_channels: tuple[Channel, ...] = ()
    _offer: SlabOffer | None = field(default=None, repr=False)  # in a MAKE not yet answered
    _channel_offers: tuple[ChannelOffer, ...] = field(default=(), repr=False)  # likewise

    @property
    def max_message_bytes(self) -> int | None:
        """The host's bound on a request's size, as its HELLO reply said (None: not said)."""
        return None if self.info is None else self.info.max_message_bytes

    def offer_slab(self) -> str | None:
        """Offers the host a new slab for its observations, in the next MAKE: its name.

        None where no slab can be made (no shared-memory directory, or one this process may
        not write). The offer lasts until :meth:`agree` reads the MAKE reply (or
        :meth:`withdraw_offer`).
        """
        self.withdraw_offer()
        self._offer = SlabOffer.make()
        return None if self._offer is None else self._offer.name

    def offer_channels(self, count: int) -> list[str]:
        """Offers the host up to ``count`` channels in the same MAKE as the slab: their names.

        As many as can be made (none: no shared-memory directory, or one this process may not
        write), at most :data:`MOST_CHANNELS`. Call it after :meth:`offer_slab`; the offers
        last as long.
        """
        offers = []
        for _ in range(min(count, MOST_CHANNELS)):
            offer = ChannelOffer.make()
            if offer is None:
                break
            offers.append(offer)
        self._channel_offers = tuple(offers)
        return [offer.name for offer in offers]

    def agree(self, made: MakeReply, layout: StepLayout | None, count: int) -> None:
        """Steps raw if the MAKE reply offered ``layout`` itself, in the slab if it took that.

        Args:
            made: The MAKE reply.
            layout: The layout the client derives from the vector env's single spaces.
            count: How many envs the session holds.

        Raises:
            ProtocolError: If the host took the slab at a size the layout does not have, or the
                channel at one its file does not have.
        """
        same = layout is not None and made.step_layout == layout.describe()
        self.step_layout = layout if same else None
        bound = self.max_message_bytes
        self.steps_raw = same and (
            bound is None or layout.action_bytes * count + MAX_ENVELOPE_BYTES <= bound
        )
        offers, self._channel_offers = self._channel_offers, ()
        sizes = (made.channel, *made.more_channels)[: len(offers)]
        sizes += (None,) * (len(offers) - len(sizes))  # (a host that took none of the more)
        taken = []
        for offer, size in zip(offers, sizes):
            if size is None:
                offer.withdraw()
            else:
                taken.append(offer.accept(size))
        if taken:
            self.channel, self.more_channels = taken[0], tuple(taken[1:])
        offer, self._offer = self._offer, None
        if offer is None:
            return
        if made.obs_slab is None or self.step_layout is None:
            offer.withdraw()
            return
        self.step_layout = self.step_layout.slab_for_client(offer, made.obs_slab, count)

    def withdraw_offer(self) -> None:
        """Withdraws a slab and channel offered and not yet answered (nothing if none is)."""
        if self._offer is not None:
            self._offer.withdraw()
            self._offer = None
        for offer in self._channel_offers:
            offer.withdraw()
        self._channel_offers = ()

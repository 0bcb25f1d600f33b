"""The delay queue: schedule a record for later, and the service that delivers it when due."""

from redrive.delay.own_topics import ensure_topics
from redrive.delay.schedule import Scheduled, schedule
from redrive.delay.service import DelayService
from redrive.delay.tiers import DEFAULT_TIERS, Tier, Tiers
from redrive.errors import DelayServiceError

__all__ = ["DEFAULT_TIERS", "DelayService", "DelayServiceError", "Scheduled", "Tier", "Tiers",
           "ensure_topics", "schedule"]

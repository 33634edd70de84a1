"""Parley: agent sessions on RQ worker fleets, with durable interrupts."""

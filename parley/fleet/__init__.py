"""Running a fleet over its Redis servers: moving partitions between shards, the webhook
notifier, and `parley doctor`'s rules for what each Redis must be."""

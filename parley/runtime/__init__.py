"""The floor every process stands on: logs, metrics and health, backoff, file stamps, replica
acknowledgements, Redis error and login rules, starting local processes. Imports nothing of
Parley's but `parley.schemas`; the dispatcher and the workers import nothing else of `parley`."""

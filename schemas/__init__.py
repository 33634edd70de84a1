"""The wire contract of Parley: pydantic models and the JSON codec. No I/O here."""

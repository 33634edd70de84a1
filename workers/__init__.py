"""Everything that runs the app's code: RQ jobs for decide, LLM and tools."""

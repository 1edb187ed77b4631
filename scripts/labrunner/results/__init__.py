"""What a run leaves behind: scenario results, the manifest and summaries, provenance."""
